"""Pieces shared by the benchmark scripts."""

from __future__ import annotations

import argparse
import os
import re
import time

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap import config_files
from jaxcap.flops import jaxpr_matmul_flops, step_flops  # noqa: F401  (the benchmarks' names)
from jaxcap.cli import nonnegative_int, positive_int  # one-line errors for bad sizes


def add_shape_args(p: argparse.ArgumentParser) -> None:
  """``--regions --feat_dim --vocab --words --captions --src_vocab --src_words``: COCO shapes by
  default (36 x 2048, 9,487, 16 words, 5 captions; the translation source as the target)."""
  p.add_argument("--regions", type=positive_int, default=36)
  p.add_argument("--feat_dim", type=positive_int, default=2048)
  p.add_argument("--vocab", type=positive_int, default=9487)
  p.add_argument("--words", type=positive_int, default=16)
  p.add_argument("--captions", type=positive_int, default=5, help="captions per training image (1 for "
                 "a translation corpus: one target per source sentence)")
  p.add_argument("--src_vocab", type=nonnegative_int, default=0, help="translation models' source "
                 "vocabulary (0: --vocab)")
  p.add_argument("--src_words", type=nonnegative_int, default=0, help="translation source words "
                 "(0: --words)")


def add_model_args(p: argparse.ArgumentParser) -> None:
  """``--layers --dropout``: overrides of the paper-sized model (0 / unset: the model's own)."""
  p.add_argument("--layers", type=nonnegative_int, default=0, help="override encoder/decoder depth (0: config)")
  p.add_argument("--dropout", type=float, default=None, help="override the model's dropout rate")


def data_info(args) -> dict:
  """The dataset description ``registry.build`` needs, for the shapes of :func:`add_shape_args`."""
  return {"feature_dim": args.feat_dim, "global_dim": args.feat_dim, "max_regions": args.regions,
          "max_len": args.words, "vocab_size": args.vocab, "num_attributes": 1000,
          "src_vocab_size": args.src_vocab or args.vocab, "max_src_len": args.src_words or args.words,
          "grid": False, "seq_per_img": args.captions, "max_attributes": 20}


def parse_overrides(text: str) -> dict:
  """``"dim=64,modalities=text"`` -> ``{"dim": 64, "modalities": "text"}`` (ints, floats and
  true / false converted)."""
  return {k.strip(): config_files.literal(v.strip()) for k, _, v in
          (item.partition("=") for item in filter(None, text.split(",")))}


def positive_ints(parser: argparse.ArgumentParser, flag: str, text) -> list[int]:
  """``"50,200"`` (or an int) -> ``[50, 200]``; anything else is a one-line ``parser.error``
  naming ``flag`` (a 0 batch would otherwise end in a ZeroDivisionError deep in a reshape)."""
  items = [t.strip() for t in str(text).split(",")]
  try:
    values = [int(t) for t in items]
  except ValueError:
    values = None
  if not values or any(v < 1 for v in values):
    parser.error(f"{flag}: expected comma-separated positive integers, got {text!r}")
  return values


def check_dtypes(parser: argparse.ArgumentParser, flag: str, text: str) -> list[str]:
  """Comma-separated float32 / bfloat16, or a one-line ``parser.error`` naming ``flag``."""
  names = [t.strip() for t in text.split(",")]
  bad = [d for d in names if d not in ("float32", "bfloat16")]
  if bad:
    parser.error(f"{flag}: unknown {','.join(bad)}; expected float32 and/or bfloat16")
  return names


def trainable_models() -> list[str]:
  from jaxcap.models import registry
  return [n for n in registry.names() if getattr(registry.get(n), "trainable", True)]


def check_models(parser: argparse.ArgumentParser, flag: str, text: str, many: bool = True) -> list[str]:
  """Registered, trainable model names (``many``: comma-separated, ``all`` for every one) or a
  one-line ``parser.error`` naming ``flag`` and the names it accepts."""
  known = trainable_models()
  names = known if many and text == "all" else [t.strip() for t in text.split(",")] if many else [text]
  bad = [n for n in names if n not in known]
  if bad or not names:
    want = f"'all' or comma-separated names from {','.join(known)}" if many else f"one of {','.join(known)}"
    parser.error(f"{flag}: {','.join(bad) or repr(text)} is not a registered trainable model; expected {want}")
  return names


def check_batches(batches, device_count: int) -> None:
  """One line and exit when a batch does not split over the devices (data parallelism)."""
  bad = [str(b) for b in batches if int(b) % device_count]
  if bad:
    raise SystemExit(f"--batch: {','.join(bad)} images do not split evenly over {device_count} devices")


def model_config(name: str, dtype: str, args=None) -> dict:
  """The paper-sized model: the models' field defaults are the papers' settings
  (d=512, 6+6 layers, 8 heads for the Transformer and ETA; d=1024, 8 heads, M_max=4 for AAT);
  a plain dict, which ``registry.build`` takes (GPU images have no ml_collections)."""
  trainable = trainable_models()
  if name not in trainable:
    raise SystemExit(f"--model: expected one of {','.join(trainable)}, got {name!r}")
  from jaxcap.models import fields, registry
  schema = fields.schema(registry.get(name))
  c = {"name": name}
  if "dtype" in schema:  # the LSTM baselines compute in float32 only
    c["dtype"] = dtype
  if args is not None and args.layers:
    for f in ("num_layers", "num_dec_layers"):
      if f in schema:
        c[f] = args.layers
  if args is not None and args.dropout is not None:
    c["dropout"] = args.dropout
  return c


def busy_time(spans) -> float:
  """Length of the union of ``(start, end)`` intervals (kernels on several streams overlap)."""
  total, cur_s, cur_e = 0.0, None, None
  for s, e in sorted(spans):
    if cur_e is None or s > cur_e:
      if cur_e is not None:
        total += cur_e - cur_s
      cur_s, cur_e = s, e
    else:
      cur_e = max(cur_e, e)
  return total + (cur_e - cur_s if cur_e is not None else 0.0)


def timed_windows(run, *, warmup: int, windows: int, steps: int):
  """Calls ``run()`` (which returns something to block on) once untimed-for-throughput (for a
  jitted-on-first-call function that is the compilation), ``warmup`` more times, then
  ``windows`` x ``steps`` times.

  Returns ``(first call s, median step s, spread, per-window step times)``.
  """
  t0 = time.perf_counter()
  out = run()
  jax.block_until_ready(out)
  first_s = time.perf_counter() - t0
  for _ in range(warmup):  # also lets a GPU's clocks come up after compilation
    out = run()
  jax.block_until_ready(out)
  times = []
  for _ in range(max(windows, 1)):
    t0 = time.perf_counter()
    for _ in range(max(steps, 1)):
      out = run()
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / max(steps, 1))
  med = float(np.median(times))
  spread = (max(times) - min(times)) / med if med > 0 else 0.0
  return first_s, med, spread, times


_MATMUL_KERNELS = ("gemm", "xmma", "cutlass", "cublas", "sm90", "wgmma")


def _trace_events(trace_dir: str, device: bool = True):
  """``(name, start_ns, end_ns, hlo_op)`` of the newest trace's kernels (``device``: the device
  plane's stream lines) or of XLA:CPU's thunks (the host lines' events with an ``hlo_op``);
  None when there is no ``*.xplane.pb`` under ``trace_dir``."""
  import glob

  from jax.profiler import ProfileData

  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
  if not files:
    return None
  events = []
  for plane in ProfileData.from_file(files[-1]).planes:
    if plane.name.startswith("/device:") != device:
      continue
    for line in plane.lines:
      if device and not line.name.startswith("Stream"):
        continue
      for ev in line.events:
        stats = dict(ev.stats)
        if device or "hlo_op" in stats:
          events.append((ev.name, ev.start_ns, ev.end_ns, stats.get("hlo_op")))
  return events


def trace_summary(trace_dir: str, top: int = 15, hlo_text: str | None = None) -> dict:
  """Device time by kernel from a ``jax.profiler.trace`` directory (no TensorBoard needed).

  Reads the newest ``*.xplane.pb`` with ``jax.profiler.ProfileData``. On a GPU the kernels are
  the events of the device plane's stream lines; their union over the traced wall time says
  how busy the device was (the rest is launch gaps or the host). Returns ``{"busy_pct",
  "busy_ms", "traced_ms", "kernels", "kernel_ms", "matmul_ms", "top": [[name, ms, calls]]}``,
  or ``{"note": why not}`` (no trace; a CPU trace has no device plane). With ``hlo_text`` (the
  traced program's compiled HLO) it adds ``by_part`` and ``by_scope``
  (:func:`attribute_kernels`): where in the model the kernel time goes.
  """
  import collections

  events = _trace_events(trace_dir)
  if events is None:
    return {"note": f"no *.xplane.pb under {trace_dir}"}
  totals, counts, spans, by_op = collections.Counter(), collections.Counter(), [], collections.Counter()
  for name, start, end, hlo_op in events:
    totals[name] += end - start
    counts[name] += 1
    spans.append((start, end))
    by_op[hlo_op or name] += end - start
  if not spans:
    return {"note": "no device stream events in the trace (CPU run?)"}
  busy = busy_time(spans)
  wall = max(e for _, e in spans) - min(s for s, _ in spans)
  matmul = sum(ns for name, ns in totals.items() if any(k in name.lower() for k in _MATMUL_KERNELS))
  out = {"busy_pct": round(100 * busy / max(wall, 1), 1), "busy_ms": round(busy / 1e6, 3),
         "traced_ms": round(wall / 1e6, 3), "kernels": sum(counts.values()),
         "kernel_ms": round(sum(totals.values()) / 1e6, 3), "matmul_ms": round(matmul / 1e6, 3),
         "top": [[name, round(ns / 1e6, 3), counts[name]] for name, ns in totals.most_common(top)]}
  if hlo_text:
    out.update(attribute_kernels(by_op, hlo_text))
  return out


# The parts of a training step that attribute_kernels names, first match wins (op_name substrings).
_PARTS = (
    ("dropout masks", ("Dropout", "dropout", "_bernoulli", "threefry", "random_bits")),
    ("layer norm", ("LayerNorm", "norm")),
    ("attention", ("attend_kv", "attn", "mha")),
    ("feed-forward", ("ffn", "FeedForward")),
    ("embedding", ("embed", "Embed")),
    ("output logits", ("logits", "out_proj")),
)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+) = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_op_names(hlo_text: str) -> dict:
  """``{instruction name: its op_name metadata ("" without)}`` of an HLO module's text."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if m:
      meta = _OP_NAME.search(line)
      out[m.group("name")] = meta.group(1) if meta else ""
  return out


_NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
                "conditional", "after-all", "partition-id", "replica-id", "add-dependency", "opt-barrier"}
_OPCODE = re.compile(r"= (?:\([^=]*?\)|[\w\[\],{}:.\s/*]+?)\s(?P<op>[a-z][\w-]*)\(")
_CALLED = re.compile(r"(?:body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.-]+)"
                     r"|branch_computations=\{([^}]*)\}")


def program_kernels(hlo_text: str) -> dict:
  """``{"kernels", "converts"}`` of a compiled HLO module's text: the instructions that run as
  kernels (fusions, library calls, unfused ops) in the entry computation and in the bodies of
  its loops and branches, each counted once (a loop body's kernels run once per iteration but
  count once here: a count of the program, not of launches), and how many of them end in a
  dtype conversion (the root of a fusion, or an unfused convert). XLA's CPU and GPU compilers
  fuse differently: on a CPU it is a proxy of the GPU's count."""
  comps, roots, current = {}, {}, None
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY\s+)?%?([\w.-]+)\s.*\{\s*$", line)
    if head and not line.startswith(" "):
      current = "ENTRY" if line.startswith("ENTRY") else head.group(1)
      comps[current] = []
      continue
    if current is None or not _INSTRUCTION.match(line):
      continue
    m = _OPCODE.search(line)
    op = m.group("op") if m else ""
    comps[current].append((op, line))
    if line.lstrip().startswith("ROOT"):
      roots[current] = op
  if "ENTRY" not in comps:
    return {"kernels": 0, "converts": 0}
  kernels = converts = 0
  seen, todo = set(), ["ENTRY"]
  while todo:
    name = todo.pop()
    if name in seen or name not in comps:
      continue
    seen.add(name)
    for op, line in comps[name]:
      if op in ("while", "conditional", "call"):
        for a, b in _CALLED.findall(line):
          todo.extend(n.strip().lstrip("%") for n in (a or b).split(",") if n.strip())
        continue
      if op in _NOT_KERNELS or not op:
        continue
      kernels += 1
      if op == "convert":
        converts += 1
      elif op == "fusion":
        called = re.search(r"calls=%?([\w.-]+)", line)
        converts += bool(called and roots.get(called.group(1)) == "convert")
  return {"kernels": kernels, "converts": converts}


def part_of(op_name: str) -> str:
  """The part of a training step that an instruction's ``op_name`` (JAX's name stack) is in."""
  if "jvp(" not in op_name:  # outside the differentiated model and loss: the update
    return "optimizer, guard, rest"
  for part, keys in _PARTS:
    if any(k in op_name for k in keys):
      return part
  if not re.search(r"jvp\((?:\w+\()*\w+\)", op_name):  # jvp(vmap()): no model module inside, the loss
    return "loss"
  return "other model ops"


def scope_of(op_name: str) -> str:
  """``fwd|bwd <module path>``: the flax module path of an op_name, layer indices as ``*``,
  JAX's internal names (the jit of a random-bits function, loops, the op) dropped."""
  direction = "bwd" if "transpose(" in op_name else "fwd"
  kept = []
  for seg in op_name.split("/")[1:-1]:
    if "(" in seg or seg in ("while", "body", "closed_call", "cond", "branch"):
      continue
    kept.append(re.sub(r"_\d+$", "_*", seg.split(".")[-1] if "." in seg else seg))
  return f"{direction} {'/'.join(kept[-3:]) or '-'}"


def attribute_kernels(ns_by_hlo_op: dict, hlo_text: str, top: int = 12) -> dict:
  """Kernel time by part of the step and by module scope.

  ``ns_by_hlo_op``: nanoseconds per HLO instruction (a trace's ``hlo_op`` stat). A fusion is
  attributed by the name stack of its root instruction (the fusion's own metadata), which
  places a fusion that mixes parts (say a dropout select with a layer norm's scale) in one of
  them. Returns ``{"by_part": {part: ms}, "by_scope": [[scope, ms]], "unattributed_ms"}``.
  """
  import collections

  names = hlo_op_names(hlo_text)
  parts, scopes, missing = collections.Counter(), collections.Counter(), 0
  for op, ns in ns_by_hlo_op.items():
    op_name = names.get(op, "")
    if not op_name:
      missing += ns
      continue
    parts[part_of(op_name)] += ns
    scopes[scope_of(op_name)] += ns
  return {"by_part": {k: round(v / 1e6, 3) for k, v in parts.most_common()},
          "by_scope": [[k, round(v / 1e6, 3)] for k, v in scopes.most_common(top)],
          "unattributed_ms": round(missing / 1e6, 3)}


def format_trace(t: dict) -> str:
  """A :func:`trace_summary` as a table of text."""
  if "note" in t:
    return t["note"]
  lines = [f"device busy {t['busy_ms']:.2f} ms of {t['traced_ms']:.2f} ms traced ({t['busy_pct']:.0f}%), "
           f"{t['kernels']} kernels, kernel time {t['kernel_ms']:.2f} ms "
           f"(matrix-library kernels {t['matmul_ms']:.2f} ms)",
           f"{'ms':>8} {'%':>5} {'calls':>6}  kernel"]
  for name, ms, calls in t["top"]:
    lines.append(f"{ms:8.3f} {100 * ms / max(t['kernel_ms'], 1e-12):5.1f} {calls:6d}  {name[:110]}")
  if "by_part" in t:
    total = max(t["kernel_ms"], 1e-12)
    lines.append("kernel time by part of the step: " + ", ".join(
        f"{k} {100 * v / total:.0f}%" for k, v in t["by_part"].items())
        + f", unattributed {100 * t['unattributed_ms'] / total:.0f}%")
    lines += [f"{ms:8.3f} {100 * ms / total:5.1f}         {scope}" for scope, ms in t["by_scope"]]
  return "\n".join(lines)


# Dense peak TFLOP/s per device: (bfloat16, TF32, float32 without TF32), vendors' datasheets.
PEAK_TFLOPS = {"H100": (989.0, 494.7, 67.0), "H200": (989.0, 494.7, 67.0), "A100": (312.0, 156.0, 19.5),
               "TPU v4": (275.0, 275.0, 275.0), "TPU v5": (197.0, 197.0, 197.0)}
# jax_default_matmul_precision values under which a GPU runs float32 matmuls in full float32
# (None / "default" / "tensorfloat32" let XLA use TF32 on Ampere and later: the profiles'
# kernels are ``..._tf32f32_...``).
_FULL_FP32 = ("highest", "float32")


def device_peak(device_kind: str, dtype: str, precision: str | None = None):
  """Dense peak TFLOP/s of one device of ``device_kind`` for ``dtype`` matmuls at ``precision``
  (``jax_default_matmul_precision``), or None for an unknown device (CPUs)."""
  for name, (bf16, tf32, fp32) in PEAK_TFLOPS.items():
    if name.lower() in device_kind.lower():
      if dtype == "bfloat16":
        return bf16
      return fp32 if str(precision).lower() in _FULL_FP32 else tf32
  return None


def peak_tflops(dtype: str, override: float | None):
  """Dense peak TFLOP/s of this process's device for ``dtype`` at the current default matmul
  precision (``override`` where given), or None."""
  if override:
    return override
  return device_peak(jax.devices()[0].device_kind, dtype, jax.config.jax_default_matmul_precision)


def write_record(prefix: str, record: dict, out: str | None = None) -> str:
  """Writes ``record`` (atomically) to ``out``, default
  ``benchmarks/results/<prefix>_<device>_<date>.json``; prints and returns the path."""
  from jaxcap import atomic
  stamp = time.strftime("%Y-%m-%d", time.gmtime())
  device = record["environment"]["device_kind"].lower().replace(" ", "_")
  path = out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{prefix}_{device}_{stamp}.json")
  atomic.write_json(path, record)
  print(f"wrote {path}")
  return path
