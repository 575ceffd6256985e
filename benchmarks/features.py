"""Feature-extraction speed: the Flax backbones of ``jaxcap.features`` (what ``jaxcap-extract``
runs per batch), images/s by backbone, image side, dtype and batch.

  python benchmarks/features.py                                  # resnet101 and vit_b16, float32
  python benchmarks/features.py --backbones resnet101 --sizes 224,448 --dtype float32,bfloat16 --batch 32

Random weights and random uint8 images already on the device, so a row is the jitted forward
pass alone (decoding the files is ``jaxcap-extract``'s, on the host's threads). A ViT runs at its
own fixed side only. Each row: compile seconds, the median step time of ``--windows`` timed
windows of ``--steps`` calls and their spread, images/s, matmul + convolution GFLOP per image
(from the jaxpr), TFLOP/s and MFU (dense peak of a known accelerator). Writes one JSON
(``--out``; default ``benchmarks/results/features_<device>_<date>.json``) after every row.
Needs jax, flax and numpy only.
"""

from __future__ import annotations

import argparse
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

import common  # noqa: E402
from jaxcap import atomic  # noqa: E402


def parse_args(argv=None):
  from jaxcap import features
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--backbones", default="resnet101,vit_b16",
                 help=f"comma-separated subset of {','.join(features.names())}")
  p.add_argument("--sizes", default="224,448", help="image sides (a ViT runs at its own only)")
  p.add_argument("--dtype", default="float32", help="comma-separated: float32,bfloat16")
  p.add_argument("--batch", default="32", help="images per call; comma-separated to sweep")
  p.add_argument("--steps", type=int, default=5, help="calls per timed window")
  p.add_argument("--windows", type=int, default=3)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  bad = [b for b in args.backbones.split(",") if b not in features.names()]
  if bad:
    p.error(f"--backbones: unknown {bad[0]}; expected a subset of {','.join(features.names())}")
  common.check_dtypes(p, "--dtype", args.dtype)
  common.positive_ints(p, "--batch", args.batch)
  common.positive_ints(p, "--sizes", args.sizes)
  if min(args.steps, args.windows) < 1 or args.warmup < 0:
    p.error("--steps and --windows: expected positive integers, --warmup a non-negative one")
  return args


def main(argv=None):
  import run as bench_run  # the same environment record as run.py
  from jaxcap import features

  args = parse_args(argv)
  env = bench_run.environment()
  name = re.sub(r"[^a-z0-9]+", "_", env["device_kind"].lower()).strip("_") or env["platform"]
  out = args.out or os.path.join(_REPO, "benchmarks", "results", f"features_{name}_{env['date'][:10]}.json")
  record = {"benchmark": "benchmarks/features.py", "argv": sys.argv[1:] if argv is None else list(argv),
            "environment": env, "rows": []}
  print(f"devices: {env['device_count']} x {env['device_kind']}; jax {env['jax']}", flush=True)
  print(f"{'backbone':>10} {'size':>5} {'dtype':>8} {'batch':>5} {'compile s':>9} {'step ms':>9} "
        f"{'images/s':>9} {'GFLOP/img':>9} {'MFU':>6} {'spread':>6}", flush=True)
  for backbone in args.backbones.split(","):
    for dtype in args.dtype.split(","):
      module = features.build(backbone, dtype=dtype)
      fixed = getattr(module, "image_size", None)
      sizes = [fixed] if fixed else [int(s) for s in args.sizes.split(",")]
      variables = features.random_variables(module)
      apply = jax.jit(module.apply)
      for size in sizes:
        for b in (int(x) for x in args.batch.split(",")):
          images = jax.random.randint(jax.random.PRNGKey(b), (b, size, size, 3), 0, 256, jnp.int32)
          images = jax.device_put(images.astype(jnp.uint8))
          t0 = time.perf_counter()
          lowered = apply.lower(variables, images)
          compiled = lowered.compile()
          compile_s = time.perf_counter() - t0
          matmul, _ = common.step_flops(module.apply, variables, images, lowered=lowered)
          _, dt, spread, times = common.timed_windows(lambda: compiled(variables, images),  # noqa: B023
                                                      warmup=args.warmup, windows=args.windows, steps=args.steps)
          peak = common.peak_tflops(dtype, None)
          tflops = matmul / dt / 1e12
          mfu = tflops / (peak * jax.device_count()) if peak else None
          row = {"backbone": backbone, "size": size, "dtype": dtype, "batch": b, "compile_s": round(compile_s, 2),
                 "step_ms": round(dt * 1e3, 3), "window_ms": [round(t * 1e3, 3) for t in times],
                 "spread": round(spread, 4), "images_per_s": round(b / dt, 2),
                 "gflop_per_image": float(f"{matmul / b / 1e9:.6g}"), "tflops": float(f"{tflops:.6g}"),
                 "mfu": round(mfu, 4) if mfu is not None else None}
          print(f"{backbone:>10} {size:>5} {dtype:>8} {b:>5} {compile_s:9.1f} {dt * 1e3:9.2f} {b / dt:9.1f} "
                f"{matmul / b / 1e9:9.2f} {(f'{100 * mfu:5.1f}%' if mfu is not None else '   n/a'):>6} "
                f"{100 * spread:5.1f}%", flush=True)
          record["rows"].append(row)
          atomic.write_json(out, record)
  print(f"wrote {out}")
  return record


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)
