"""One benchmark entry point for every registered model: training, greedy, beam and SCST steps.

  python benchmarks/run.py                                   # every model, all four, float32
  python benchmarks/run.py --models transformer,eta --what train --dtype float32,bfloat16 \
      --batch 50,200,800
  python benchmarks/run.py --models aat --what beam --eval_batch 100 --beam 3
  python benchmarks/run.py --out benchmarks/results/h100_2026-11-23.json   # the committed record

COCO shapes by default (36 x 2048 regions with boxes, vocabulary 9,487, 16 words + EOS,
5 captions per image; translation models get a 16-token source of the same vocabulary size).
Each model is the paper-sized one: a model's field defaults are its paper's settings,
so ``{"name": model, "dtype": dtype}`` is its whole config (no ml_collections needed). Inputs
are random and already on the device, so the numbers are the step itself (the input pipeline
has its own benchmark).

Rows (one per model x what x dtype x batch):
- ``train``: one cross-entropy step (``jaxcap.training.steps.train_step``: forward, backward,
  Adam) on ``--batch`` images x 5 captions; images/s = batch / step time.
- ``greedy`` / ``beam``: ``jaxcap.decoding.greedy`` / ``beam_search`` (``--beam``) on
  ``--eval_batch`` images.
- ``scst``: one self-critical step as the trainer runs it (``--samples`` samples + the greedy
  baseline on the device, the CIDEr-D reward on the host, the gradient step on the device);
  ``reward_share`` is the host reward's share of the step.

Each row: compile seconds (lowering + XLA compilation; for ``scst``, its first step, which
compiles the sampler and the gradient step); the median step time of ``--windows`` timed windows of ``--steps``
steps after ``--warmup`` untimed ones, and their spread ((max - min) / median); images/s;
model FLOPs per image; TFLOP/s; MFU against the device's dense peak (a table of known
accelerators, or ``--peak_tflops``; none for CPUs); the compiled program's memory (XLA's memory
analysis: arguments + outputs + temporaries) and the device's peak bytes in use so far.

FLOPs: the matrix-multiply FLOPs of the step's jaxpr (``dot_general`` and convolutions,
2 x M x N x K), with ``scan`` bodies counted ``length`` times. XLA's cost analysis counts a loop
body once (a scanned decoder or beam search would be undercounted 17-fold), and on GPUs it
counts the compiled module's library matmuls as 0; its lowered-HLO count (all ops, loop bodies
once) is also in the JSON as ``hlo_gflop_per_image`` for comparison.

Writes one JSON file (``--out``; default ``benchmarks/results/<device>_<date>.json``) with the
device, jax / jaxlib / CUDA versions, date, git commit, the arguments and every row; prints a
table as the rows finish. Needs only jax, flax, optax and numpy (runs on a bare GPU image).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.join(_REPO, "benchmarks"))

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import common  # noqa: E402
from jaxcap.cli import nonnegative_int, positive_int  # noqa: E402  (one-line errors for bad sizes)

WHATS = ("train", "greedy", "beam", "scst")


# ----------------------------------------------------------------------------------------------
# Timing


def timed_windows(run, *, warmup: int, windows: int, steps: int):
  """Calls ``run()`` (which returns something to block on) once untimed-for-throughput (for a
  jitted-on-first-call function that is the compilation), ``warmup`` more times, then
  ``windows`` x ``steps`` times.

  Returns ``(first call s, median step s, spread, per-window step times)``.
  """
  t0 = time.perf_counter()
  out = run()
  jax.block_until_ready(out)
  compile_s = time.perf_counter() - t0
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
  return compile_s, med, spread, times


def device_peak_bytes():
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # noqa: BLE001 - CPU backends may not implement it
    stats = {}
  return stats.get("peak_bytes_in_use")


def compiled_bytes(compiled):
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001
    return None
  if m is None:
    return None
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
  return int(sum(getattr(m, f, 0) or 0 for f in fields) - (getattr(m, "alias_size_in_bytes", 0) or 0))


# ----------------------------------------------------------------------------------------------
# The benchmarked steps


def _overrides(text: str) -> dict:
  return {k.strip(): _number(v.strip()) for k, _, v in
          (item.partition("=") for item in filter(None, text.split(",")))}


def _model(name, dtype, args, info):
  from jaxcap.models import fields, registry
  cfg = common.model_config(name, dtype, args)
  schema = fields.schema(registry.get(name))
  cfg.update({k: v for k, v in _overrides(args.set).items() if k in schema})
  return registry.build(cfg, info)


def _sig(x: float, digits: int = 6) -> float:
  """``x`` to ``digits`` significant digits (tiny smoke-test sizes must not round to 0)."""
  return float(f"{x:.{digits}g}")


def _number(text: str):
  for typ in (int, float):
    try:
      return typ(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def _init_params(model, batch, repl):
  from jaxcap.models.base import shift_right
  return jax.jit(lambda r, bt: model.init(r, bt, shift_right(bt["captions"])),
                 out_shardings=repl)(jax.random.PRNGKey(1), batch)


def bench_train(model, batch, args, mesh):
  from jaxcap.training import parallel, steps
  repl = parallel.replicated(mesh)
  params = _init_params(model, batch, repl)
  tx = optax.adam(1e-4, b1=0.9, b2=0.98, eps=1e-9)
  state = steps.create_state(params, tx, jax.random.PRNGKey(2))
  step = functools.partial(steps.train_step, model=model, tx=tx)
  flops = common.step_flops(step, state, batch)
  t0 = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  holder = {"state": state}

  def run():
    holder["state"], metrics = compiled(holder["state"], batch)
    return metrics

  timing = timed_windows(run, warmup=args.warmup, windows=args.windows, steps=args.steps)
  return (compile_s,) + timing[1:], flops, compiled


def bench_decode(model, batch, args, mesh, method):
  from jaxcap import decoding
  from jaxcap.training import parallel
  params = _init_params(model, batch, parallel.replicated(mesh))
  dec = {k: v for k, v in batch.items() if k not in ("captions",)}
  if method == "greedy":
    fn = lambda p, b: decoding.greedy(model, p, b, max_len=args.words).tokens  # noqa: E731
  else:
    fn = lambda p, b: decoding.beam_search(model, p, b, beam_size=args.beam, max_len=args.words).tokens  # noqa: E731
  flops = common.step_flops(fn, params, dec)
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(params, dec).compile()
  compile_s = time.perf_counter() - t0
  timing = timed_windows(lambda: compiled(params, dec), warmup=args.warmup, windows=args.windows,
                         steps=args.steps)
  return (compile_s,) + timing[1:], flops, compiled


def bench_scst(model, batch, args, mesh):
  """One SCST step as ``jaxcap.training.scst.make_scst_step`` runs it (see scst_step.py)."""
  from scst_step import make_scst_runner
  runner = make_scst_runner(model, batch, mesh, samples=args.samples, baseline="greedy",
                            max_len=args.words + 1, vocab=args.vocab, train_images=args.train_images)
  parts = []

  def run():
    out, times = runner()
    parts.append(times)
    return out

  result = timed_windows(run, warmup=args.warmup, windows=args.windows, steps=args.steps)
  timed = parts[1 + args.warmup:]
  reward = float(np.median([p["reward"] for p in timed]))
  share = reward / max(sum(float(np.median([p[k] for p in timed])) for k in timed[0]), 1e-12)
  return result, runner.flops, None, share


# ----------------------------------------------------------------------------------------------


def environment() -> dict:
  env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
         "device_kind": jax.devices()[0].device_kind, "platform": jax.devices()[0].platform,
         "device_count": jax.device_count(), "process_count": jax.process_count(),
         "jax": jax.__version__, "python": platform.python_version()}
  try:
    import jaxlib
    env["jaxlib"] = getattr(jaxlib, "__version__", None) or jaxlib.version.__version__
  except Exception:  # noqa: BLE001
    env["jaxlib"] = None
  try:
    import flax
    env["flax"] = flax.__version__
  except Exception:  # noqa: BLE001
    pass
  env["cuda"] = _cuda_versions()
  try:
    env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    env["git_dirty"] = bool(dirty)
  except Exception:  # noqa: BLE001 - a copy without git
    env["git_commit"] = None
  return env


def _cuda_versions():
  if jax.devices()[0].platform != "gpu":
    return None
  try:
    from jax._src.lib import cuda_versions  # private, but the only place that has them
    if cuda_versions is None:
      return None
    return {"cuda_runtime": cuda_versions.cuda_runtime_get_version(),
            "cudnn": cuda_versions.cudnn_get_version(),
            "driver": cuda_versions.cuda_driver_get_version()}
  except Exception:  # noqa: BLE001
    return None


def default_out(env) -> str:
  name = re.sub(r"[^a-z0-9]+", "_", env["device_kind"].lower()).strip("_") or env["platform"]
  return os.path.join(_REPO, "benchmarks", "results", f"{name}_{env['date'][:10]}.json")


def write_json_atomic(path: str, obj) -> None:
  """Writes ``path`` through a temporary file in the same folder: never half-written."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(obj, f, indent=1)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--models", default="all", help="comma-separated registered model names (all: every "
                 "trainable one)")
  p.add_argument("--what", default=",".join(WHATS), help=f"comma-separated subset of {','.join(WHATS)}")
  p.add_argument("--dtype", default="float32", help="comma-separated: float32,bfloat16")
  p.add_argument("--batch", default="50", help="images per train / SCST step; comma-separated to sweep")
  p.add_argument("--eval_batch", default="100", help="images per greedy / beam call; comma-separated")
  p.add_argument("--beam", type=positive_int, default=3)
  p.add_argument("--samples", type=positive_int, default=5, help="SCST samples per image")
  p.add_argument("--train_images", type=positive_int, default=5000, help="images behind the SCST reward's "
                 "document frequencies")
  p.add_argument("--steps", type=positive_int, default=10, help="steps per timed window")
  p.add_argument("--windows", type=positive_int, default=3, help="timed windows; the median is reported")
  p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps after compilation")
  p.add_argument("--peak_tflops", type=float, default=None)
  p.add_argument("--prng", default=None, choices=("threefry2x32", "rbg", "unsafe_rbg"),
                 help="jax_default_prng_impl (dropout masks, sampling); default JAX's")
  p.add_argument("--set", default="", help="model config overrides for every model, e.g. "
                 "dim=64,num_heads=2 (a field a model does not read is ignored; for quick checks)")
  p.add_argument("--out", default="", help="JSON file (default benchmarks/results/<device>_<date>.json)")
  common.add_shape_args(p)
  common.add_model_args(p)
  args = p.parse_args(argv)
  for field in ("steps", "windows", "beam", "samples", "train_images"):
    if getattr(args, field) < 1:
      p.error(f"--{field}: expected a positive integer, got {getattr(args, field)}")
  if args.warmup < 0:
    p.error(f"--warmup: expected >= 0, got {args.warmup}")
  bad = [i for i in filter(None, args.set.split(",")) if "=" not in i]
  if bad:
    p.error(f"--set: expected key=value items, got {','.join(bad)}")
  bad = [w for w in args.what.split(",") if w not in WHATS]
  if bad:
    p.error(f"--what: unknown {','.join(bad)}; expected a subset of {','.join(WHATS)}")
  bad = [d for d in args.dtype.split(",") if d not in ("float32", "bfloat16")]
  if bad:
    p.error(f"--dtype: unknown {','.join(bad)}; expected float32 and/or bfloat16")
  args.models = ",".join(common.check_models(p, "--models", args.models))
  from jaxcap.models import fields, registry
  known = set().union(*(fields.schema(registry.get(m)) for m in args.models.split(",")))
  unknown = sorted(set(_overrides(args.set)) - known)
  if unknown:
    p.error(f"--set: {unknown[0]} is a field of none of the models {args.models}; expected one "
            f"of {','.join(sorted(known))}")
  common.positive_ints(p, "--batch", args.batch)
  common.positive_ints(p, "--eval_batch", args.eval_batch)
  for field in ("regions", "feat_dim", "vocab", "words", "layers"):
    if getattr(args, field) < (0 if field == "layers" else 1):
      p.error(f"--{field}: expected a positive integer, got {getattr(args, field)}")
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.prng:
    jax.config.update("jax_default_prng_impl", args.prng)
  from jaxcap.training import parallel

  names = args.models.split(",")  # checked by parse_args: registered, trainable names
  batches = [int(b) for b in args.batch.split(",")]  # positive, checked by parse_args
  eval_batches = [int(b) for b in args.eval_batch.split(",")]
  common.check_batches(batches + eval_batches, jax.device_count())
  mesh = parallel.make_mesh()
  info = common.data_info(args)
  env = environment()
  out_path = args.out or default_out(env)
  record = {"benchmark": "benchmarks/run.py", "argv": sys.argv[1:] if argv is None else list(argv),
            "environment": env, "overrides": args.set, "shapes": {"regions": args.regions, "feat_dim": args.feat_dim,
                                           "vocab": args.vocab, "words": args.words, "captions_per_image": 5},
            "rows": []}
  print(f"devices: {env['device_count']} x {env['device_kind']}; jax {env['jax']}; commit "
        f"{(env.get('git_commit') or '?')[:10]}", flush=True)
  print(f"{'model':>18} {'what':>6} {'dtype':>8} {'batch':>5} {'compile s':>9} {'step ms':>9} {'images/s':>9} "
        f"{'GFLOP/img':>9} {'TFLOP/s':>8} {'MFU':>6} {'spread':>6} {'mem MB':>8}", flush=True)
  for name in names:
    for dtype in args.dtype.split(","):
      model = _model(name, dtype, args, info)
      for what in args.what.split(","):
        for b in (eval_batches if what in ("greedy", "beam") else batches):
          batch = common.make_batch(jax.random.PRNGKey(0), b, 5, args.regions, args.feat_dim, args.vocab,
                                    args.words + 1, src_len=args.words)
          batch = jax.device_put(batch, parallel.batch_sharding(mesh))
          share = None
          if what == "train":
            timing, flops, compiled = bench_train(model, batch, args, mesh)
          elif what == "scst":
            timing, flops, compiled, share = bench_scst(model, batch, args, mesh)
          else:
            timing, flops, compiled = bench_decode(model, batch, args, mesh, what)
          compile_s, dt, spread, times = timing
          matmul, hlo = flops
          tflops = matmul / dt / 1e12
          peak = common.peak_tflops(dtype, args.peak_tflops)
          mfu = tflops / (peak * jax.device_count()) if peak else None
          row = {"model": name, "what": what, "dtype": dtype, "batch": b,
                 "beam": args.beam if what == "beam" else None,
                 "samples": args.samples if what == "scst" else None,
                 "compile_s": round(compile_s, 2), "step_ms": round(dt * 1e3, 3),
                 "window_ms": [round(t * 1e3, 3) for t in times], "spread": round(spread, 4),
                 "images_per_s": round(b / dt, 2), "gflop_per_image": _sig(matmul / b / 1e9),
                 "hlo_gflop_per_image": _sig(hlo / b / 1e9) if np.isfinite(hlo) else None,
                 "tflops": _sig(tflops), "mfu": round(mfu, 4) if mfu is not None else None,
                 "compiled_mb": (round(compiled_bytes(compiled) / 2**20, 1)
                                 if compiled is not None and compiled_bytes(compiled) is not None else None),
                 "device_peak_mb": (round(device_peak_bytes() / 2**20, 1)
                                    if device_peak_bytes() is not None else None),
                 "reward_share": round(share, 4) if share is not None else None}
          record["rows"].append(row)
          mem = row["compiled_mb"] if row["compiled_mb"] is not None else float("nan")
          mfu_s = f"{100 * mfu:5.1f}%" if mfu is not None else "   n/a"
          print(f"{name:>18} {what:>6} {dtype:>8} {b:>5} {compile_s:9.1f} {dt * 1e3:9.2f} {b / dt:9.1f} "
                f"{matmul / b / 1e9:9.3f} {tflops:8.3f} {mfu_s:>6} {100 * spread:5.1f}% {mem:8.1f}"
                + (f"  reward {100 * share:.0f}% of the step" if share is not None else ""), flush=True)
          write_json_atomic(out_path, record)  # after every row: a crash keeps the rows so far
  print(f"wrote {out_path}")
  return record


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
