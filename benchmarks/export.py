"""An exported captioner (``jaxcap-export``) against ``Run.caption``: file size and CPU latency.

  python benchmarks/export.py                                 # configs/transformer.py:synthetic, random weights
  python benchmarks/export.py --workdir runs/transformer_synthetic   # a trained run (after make train)

Builds the run (the config's model at the config's sizes with freshly initialised parameters,
or ``--workdir``'s trained run: greedy decoding and beam search always run ``max_len`` steps,
so latency does not depend on the weights), exports it (``Run.export``, platforms cpu and cuda),
loads it (``jaxcap.serving.load``) and times ``caption`` on random features for each method
(greedy, beam-``--beam_size``) and batch (``--batches``) against ``Run.caption`` with the same
decoding: the median of ``--repeats`` calls after one warm-up call (compilation not timed).
Writes one JSON (``--out``; default ``benchmarks/results/export_<device>_<date>.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)

import numpy as np  # noqa: E402

from jaxcap import atomic, cli  # noqa: E402

BENCHMARK = "benchmarks/export.py"


def parse_args(argv=None):
  p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="configs/transformer.py:synthetic", help="a config, as train.py's --config")
  p.add_argument("--workdir", default="", help="a trained run to export instead of the config's random one")
  p.add_argument("--batches", default="1,8", help="images per call, comma-separated")
  p.add_argument("--beam_size", type=cli.positive_int, default=3)
  p.add_argument("--repeats", type=cli.positive_int, default=20, help="timed calls per row")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  from common import positive_ints
  args.batches = positive_ints(p, "--batches", args.batches)
  return args


def _random_run(spec: str):
  import jax
  import jax.numpy as jnp
  from jaxcap import api, config_files
  from jaxcap import data as data_lib
  from jaxcap.data import batch as batch_lib
  from jaxcap.models import registry
  from jaxcap.models.base import shift_right
  config = config_files.load(spec)
  dataset = data_lib.get_dataset(config.data)
  info = dict(dataset.info)
  model = registry.build(config.model, info)
  dummy = jax.tree.map(jnp.asarray, batch_lib.dummy(info, 1))
  params = jax.jit(lambda k: model.init(k, dummy, shift_right(dummy["captions"]), train=False))(jax.random.PRNGKey(0))
  return api.Run(config, dataset.vocab, info, model, params, step=0)


def _median_ms(fn, repeats: int) -> float:
  fn()  # compiles
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1000 * float(np.median(times))


def main(argv=None):
  args = parse_args(argv)
  if args.out:
    atomic.check_writable(args.out, f"--out={args.out}", file=True)
  import jaxcap
  from jaxcap import serving
  run = jaxcap.load(args.workdir) if args.workdir else _random_run(args.config)
  tmp = tempfile.mkdtemp(prefix="jaxcap_export_bench_")
  path = os.path.join(tmp, "captioner.jaxcap")
  try:
    start = time.perf_counter()
    meta = run.export(path, beam_size=args.beam_size)
    export_s = time.perf_counter() - start
    size = os.path.getsize(path)
    start = time.perf_counter()
    captioner = serving.load(path)
    load_s = time.perf_counter() - start
  finally:
    if os.path.exists(path):
      os.remove(path)
    os.rmdir(tmp)
  info = run.info
  print(f"{meta['model']}: file {size / 2**20:.2f} MiB (parameters {meta['params']['bytes'] / 2**20:.2f} MiB), "
        f"export {export_s:.1f} s, load {load_s:.2f} s", flush=True)
  rng = np.random.default_rng(0)
  rows = []
  for method in ("greedy", "beam"):
    for b in args.batches:
      feats = rng.normal(size=(b, int(info["max_regions"]), int(info["feature_dim"]))).astype(np.float32)
      exported = _median_ms(lambda: captioner.caption(feats, method=method), args.repeats)
      reference = _median_ms(lambda: run.caption(feats, method, args.beam_size, batch_size=b), args.repeats)
      same = [r["caption"] for r in captioner.caption(feats, method=method)] == run.caption(
          feats, method, args.beam_size, batch_size=b)
      rows.append({"method": method, "beam_size": args.beam_size if method == "beam" else 1, "batch": b,
                   "artefact_ms": exported, "run_ms": reference, "artefact_ms_per_image": exported / b,
                   "run_ms_per_image": reference / b, "same_captions": same})
      print(f"{method:>6} batch {b:>2}: artefact {exported:8.2f} ms ({exported / b:7.2f} ms/image), "
            f"Run.caption {reference:8.2f} ms ({reference / b:7.2f} ms/image), same captions: {same}", flush=True)
  import run as bench_run  # the same environment record as run.py
  env = dict(bench_run.environment(), cpu_count=os.cpu_count())
  record = {"benchmark": BENCHMARK, "environment": env, "config": args.workdir or args.config,
            "model": run.config.model.to_dict(), "decode": meta["decode"],
            "file_bytes": size, "params_bytes": meta["params"]["bytes"], "export_s": export_s,
            "load_s": load_s, "platforms": meta["platforms"], "repeats": args.repeats, "rows": rows}
  stamp = env["date"][:10]
  out = args.out or os.path.join(_HERE, "results", f"export_{env['device_kind'].lower().replace(' ', '_')}_{stamp}.json")
  atomic.write_json(out, record)
  print(f"wrote {out}")


if __name__ == "__main__":
  cli.run_script(main)
