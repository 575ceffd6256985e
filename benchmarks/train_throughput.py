"""Training throughput (images/s, 1 image = 5 captions) and model FLOPs utilisation.

  python benchmarks/train_throughput.py [--model transformer] [--batch 50] [--dtype float32,bfloat16]

COCO shapes by default: 36 x 2048 regions, vocabulary 9,487, 16 words (+EOS), 5 captions per
image, the paper-sized model (d=512, 6+6 layers, 8 heads). Random inputs made on the device,
so the number is the step itself (the input pipeline has its own benchmark). FLOPs per step
come from XLA's cost analysis of the lowered (not yet optimised) step; MFU = achieved FLOP/s / peak FLOP/s,
where the peak is taken from ``--peak_tflops`` or a table of known accelerators (none for CPUs).
Needs only jax, flax and optax (it runs on a bare GPU image).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.join(_REPO, "benchmarks"))

import numpy as np
import jax
import jax.numpy as jnp
import optax

from common import (add_model_args, add_shape_args, check_batches, check_dtypes, check_models,  # noqa: E402
                    data_info, make_batch, model_config, peak_tflops, positive_ints, summarize_trace)
from jaxcap.cli import nonnegative_int, positive_int  # noqa: E402  (one-line errors for bad sizes)

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="transformer")
  p.add_argument("--batch", default="50", help="images per step; comma-separated to sweep")
  p.add_argument("--dtype", default="float32,bfloat16")
  p.add_argument("--steps", type=positive_int, default=10, help="steps per timed window")
  p.add_argument("--windows", type=positive_int, default=3, help="timed windows; the median window is reported")
  p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps after compilation")
  add_shape_args(p)
  add_model_args(p)
  p.add_argument("--peak_tflops", type=float, default=None)
  p.add_argument("--prng", default=None, choices=("threefry2x32", "rbg", "unsafe_rbg"),
                 help="jax_default_prng_impl for the dropout masks (default: JAX's)")
  p.add_argument("--profile", default="", help="trace 3 steps of each row under this directory and "
                 "print the device time by kernel")
  args = p.parse_args()
  check_models(p, "--model", args.model, many=False)
  positive_ints(p, "--batch", args.batch)
  check_dtypes(p, "--dtype", args.dtype)

  if args.prng:
    jax.config.update("jax_default_prng_impl", args.prng)
  from jaxcap.models import registry
  from jaxcap.training import parallel, steps

  mesh = parallel.make_mesh()
  check_batches(args.batch.split(","), jax.device_count())
  info = data_info(args)
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; jax {jax.__version__}")
  print(f"{'model':>12} {'dtype':>9} {'batch':>6} {'compile s':>9} {'step ms':>9} {'images/s':>9} "
        f"{'GFLOP/img':>9} {'TFLOP/s':>8} {'MFU':>6} {'spread':>6}")
  for dtype in args.dtype.split(","):
    cfg = model_config(args.model, dtype, args)
    model = registry.build(cfg, info)
    for b in (int(x) for x in args.batch.split(",")):
      batch = make_batch(jax.random.PRNGKey(0), b, 5, args.regions, args.feat_dim, args.vocab, args.words + 1)
      batch = jax.device_put(batch, parallel.batch_sharding(mesh))
      tx = optax.adam(1e-4, b1=0.9, b2=0.98, eps=1e-9)
      from jaxcap.models.base import shift_right
      params = jax.jit(lambda r, bt: model.init(r, bt, shift_right(bt["captions"])),
                       out_shardings=parallel.replicated(mesh))(jax.random.PRNGKey(1), batch)
      state = steps.create_state(params, tx, jax.random.PRNGKey(2))
      fn = jax.jit(lambda s, bt: steps.train_step(s, bt, model=model, tx=tx), donate_argnums=0)
      t0 = time.perf_counter()
      lowered = fn.lower(state, batch)
      compiled = lowered.compile()
      compile_s = time.perf_counter() - t0
      # The HLO before backend optimisation: on GPUs the compiled module's matmuls are library
      # calls that XLA's cost analysis counts as 0 FLOPs.
      cost = lowered.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      flops = float(cost.get("flops", 0.0)) if cost else 0.0
      for _ in range(args.warmup):  # also lets the GPU clocks come up after compilation
        state, m = compiled(state, batch)
        jax.block_until_ready(m)
      windows = []
      for _ in range(args.windows):
        t0 = time.perf_counter()
        for _ in range(args.steps):
          state, m = compiled(state, batch)
        jax.block_until_ready(m)
        windows.append((time.perf_counter() - t0) / args.steps)
      dt = float(np.median(windows))
      spread = 100 * (max(windows) - min(windows)) / dt
      tflops = flops / dt / 1e12
      peak = peak_tflops(dtype, args.peak_tflops)
      mfu = f"{100 * tflops / (peak * jax.device_count()):5.1f}%" if peak else "  n/a"
      print(f"{args.model:>12} {dtype:>9} {b:>6} {compile_s:9.1f} {dt * 1e3:9.1f} {b / dt:9.1f} "
            f"{flops / b / 1e9:9.2f} {tflops:8.3f} {mfu:>6} {spread:5.1f}%", flush=True)
      if args.profile:
        trace_dir = os.path.join(args.profile, f"{args.model}_{dtype}_{b}")
        with jax.profiler.trace(trace_dir):
          for _ in range(3):
            state, m = compiled(state, batch)
          jax.block_until_ready(m)
        print(summarize_trace(trace_dir), flush=True)
      del state, params

if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
