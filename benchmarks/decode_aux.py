"""What asking decoding for its per-step aux (attention weights) costs, and that not asking
costs nothing.

  python benchmarks/decode_aux.py                     # Transformer, configs/transformer.py:synthetic
  python benchmarks/decode_aux.py --config configs/eta.py:synthetic --batch 50 --repeats 20

Every model computes its aux (e.g. the Transformer's cross-attention weights of every layer and
head) inside ``decode_step``; ``jaxcap.decoding`` keeps it only with ``return_aux=True`` and
otherwise XLA removes it as dead code. This script times greedy decoding and beam search
(``--beam``, live mode) of one batch of validation images of the config's dataset at the
config's model sizes on random parameters (the speed does not depend on their values), with
``return_aux`` False and True, and, for the Transformer, a copy of the model whose
``decode_step`` never builds the attention aux (row ``no aux code``: the decoder as it was
before it reported attention). It also checks the dead-code claim on the program itself: the
optimised HLO of ``return_aux=False`` is compared with that copy's
(``same_program_as_no_aux_code``; its control, ``control_program_with_aux_differs``: the
``return_aux=True`` program is not the same). Times are the median of ``--repeats`` calls after a
compiling one, the variants taken in turn. Writes one JSON (``--out``; default
``benchmarks/results/decode_aux_<device>_<date>.json``) with the environment (device,
versions, commit) and one row per (method, return_aux).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxcap import cli, config_files, decoding  # noqa: E402
from jaxcap.data import get_dataset, pipeline  # noqa: E402
from jaxcap.models import registry  # noqa: E402
import common  # noqa: E402  (benchmarks/: write_record)

BENCHMARK = "benchmarks/decode_aux.py"


def parse_args(argv=None):
  p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="configs/transformer.py:synthetic",
                 help="a config file and argument, as train.py's --config")
  p.add_argument("--batch", type=int, default=50, help="images per decoding call")
  p.add_argument("--beam", type=int, default=3, help="beam size of the beam-search rows")
  p.add_argument("--repeats", type=int, default=10, help="timed calls per row (the median is kept)")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  for name in ("batch", "beam", "repeats"):
    if getattr(args, name) < 1:
      p.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
  return args


def _without_aux(model):
  """A copy of ``model`` (same fields, same parameters) whose ``decode_step`` never builds the
  cross-attention aux (``transformer.cross_attention_aux`` returns ``{}`` while it is traced):
  the decoder as it was before it reported attention. None for a model that does not build its
  aux with that function alone."""
  from jaxcap.models import transformer
  cls = type(model)
  if not issubclass(cls, transformer.TransformerCaptioner):
    return None

  class NoAux(cls):
    def decode_step(self, enc, cache, tokens, t, train=False):
      saved = transformer.cross_attention_aux
      transformer.cross_attention_aux = lambda *a, **k: {}
      try:
        return super().decode_step(enc, cache, tokens, t, train)
      finally:
        transformer.cross_attention_aux = saved

  NoAux.__name__ = NoAux.__qualname__ = cls.__name__  # the same HLO module names
  # dataclasses.fields: the constructor's fields (__dataclass_fields__ also lists the ClassVar
  # hooks a CaptionModel declares).
  fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)
            if f.name not in ("parent", "name")}
  return NoAux(**fields)


def _hlo(jitted, *args, **static) -> str:
  """The optimised HLO, without the names and metadata that differ between two traces."""
  text = jitted.lower(*args, **static).compile().as_text()
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  text = re.sub(r"\.\d+", "", text)  # instruction / computation numbering
  # The source-location tables (FileNames, FunctionNames, StackFrames, ...: numbered lines)
  # name the Python code that traced each op, which differs between two models by design.
  return "\n".join(line for line in text.splitlines()
                   if not line.startswith("HloModule") and not re.match(r"^\s*\d+ ", line)
                   and not re.match(r"^[A-Z][A-Za-z]+$", line.strip()))


def _time(call, repeats: int) -> dict:
  t0 = time.perf_counter()
  jax.block_until_ready(call())
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - t0)
  return {"first_call_s": first, "median_ms": 1e3 * float(np.median(times)),
          "min_ms": 1e3 * float(np.min(times)), "max_ms": 1e3 * float(np.max(times))}


def main(argv=None):
  args = parse_args(argv)
  config = config_files.load(args.config)
  dataset = get_dataset(config.data)
  model = registry.build(config.model, dataset.info)
  batch = next(iter(pipeline.eval_batches(dataset.split("val"), args.batch, num_threads=0)))
  batch = jax.tree.map(jnp.asarray, batch)
  tokens = jnp.full(batch["captions"].shape[:2] + (2,), 1, jnp.int32)
  params = model.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}, batch, tokens)
  max_len = int(config.decode.max_len) if "decode" in config else 16

  calls = {
      "greedy": lambda m, aux: decoding.greedy(m, params, batch, max_len=max_len, return_aux=aux),
      f"beam-{args.beam}": lambda m, aux: decoding.beam_search(m, params, batch, beam_size=args.beam,
                                                               max_len=max_len, return_aux=aux),
  }
  baseline = _without_aux(model)
  rows = []
  for method, call in calls.items():
    if method == "greedy":
      jitted, static = decoding._greedy_jit, dict(max_len=max_len, return_aux=False)
      opts = decoding._common_opts(0, False)
    else:
      jitted = decoding._beam_search_jit
      static = dict(beam_size=args.beam, max_len=max_len, beam_mode="live", groups=1,
                    block_trigrams=False, return_aux=False)
      opts = dict(decoding._common_opts(0, False), penalty=decoding._penalty_coefficients("none", 0.6),
                  diversity=jnp.float32(0.5))
    same = control = None
    if baseline is not None:
      plain = _hlo(jitted, model, params, batch, opts, **static)
      same = plain == _hlo(jitted, baseline, params, batch, opts, **static)
      # The comparison's control: the program that returns the aux must differ.
      control = plain != _hlo(jitted, model, params, batch, opts, **dict(static, return_aux=True))
    # Interleaved, so that a change of the machine's load hits every row alike.
    variants = [("no aux code", baseline, False)] if baseline is not None else []
    variants += [("return_aux=False", model, False), ("return_aux=True", model, True)]
    for label, m, aux in variants:
      timing = _time(lambda: call(m, aux), args.repeats)
      row = {"method": method, "variant": label, "return_aux": aux, **timing}
      if label == "return_aux=False":
        row["same_program_as_no_aux_code"] = same
        row["control_program_with_aux_differs"] = control
      rows.append(row)
      print(f"{method:8s} {label:17s} {timing['median_ms']:8.1f} ms "
            f"(min {timing['min_ms']:.1f}, max {timing['max_ms']:.1f})"
            + (f"  optimised HLO equal to the decoder without aux code: {same}"
               if label == "return_aux=False" else ""))

  import run as bench_run  # the same environment record as run.py
  env = dict(bench_run.environment(), cpu_count=os.cpu_count())  # git_commit / git_dirty included
  record = {"benchmark": BENCHMARK, "environment": env, "config": args.config,
            "model": dict(config.model), "batch": args.batch, "max_len": max_len,
            "repeats": args.repeats, "rows": rows}
  common.write_record("decode_aux", record, args.out)
  return record


if __name__ == "__main__":
  cli.run_script(main)
