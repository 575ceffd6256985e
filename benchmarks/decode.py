"""Decoding throughput: images/s for greedy and beam-search decoding at COCO shapes.

Usage:
  python benchmarks/decode.py                       # Transformer baseline, d=512, 6+6 layers
  python benchmarks/decode.py --model lstm          # the soft-attention LSTM
  python benchmarks/decode.py --dtype bfloat16 --steps 20   # e.g. on a GPU

Inputs are random COCO-shaped batches (36 x 2048 regions, vocabulary 9,487, 16 words) already
on the device, as a prefetching input pipeline delivers them; parameters are randomly
initialised. Runs on whatever ``jax.devices()[0]`` is. Compilation is timed separately: the
first call of each method (compile + one run) is excluded from the steady-state numbers,
which are the median over ``--steps`` calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxcap import decoding  # noqa: E402
from jaxcap.models import registry  # noqa: E402
from jaxcap.models.base import shift_right  # noqa: E402
from common import model_config  # noqa: E402
from jaxcap.cli import positive_int  # noqa: E402  (one-line errors for bad sizes)

INFO = {"feature_dim": 2048, "global_dim": 2048, "max_regions": 36, "max_len": 16,
        "vocab_size": 9487, "src_vocab_size": 0, "num_attributes": 1000, "grid": False}


def coco_batch(batch_size: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  n, d = INFO["max_regions"], INFO["feature_dim"]
  feats = rng.standard_normal((batch_size, n, d), np.float32)
  return {
      "image_index": np.arange(batch_size, dtype=np.int32),
      "valid": np.ones(batch_size, bool),
      "feats": feats,
      "feats_mask": np.ones((batch_size, n), bool),
      "boxes": np.tile(np.array([0.0, 0.0, 1.0, 1.0], np.float32), (batch_size, n, 1)),
      "global_feat": feats.mean(1),
  }


def timed(fn, iters: int):
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  steady = statistics.median(times)
  return first, steady


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="transformer", help="a registered model name (the paper-sized model)")
  # The flag names of every benchmark script (--batch, --beam, --words, --steps); the old
  # spellings stay as aliases.
  parser.add_argument("--batch", "--batch-size", dest="batch", type=positive_int, default=100)
  parser.add_argument("--beam", "--beam-size", dest="beam", type=positive_int, default=3)
  parser.add_argument("--words", "--max-len", dest="words", type=positive_int, default=16)
  parser.add_argument("--steps", "--iters", dest="steps", type=positive_int, default=3,
                      help="timed calls; the median is reported")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="compute dtype of the Transformer (parameters stay float32)")
  parser.add_argument("--methods", default="greedy,beam",
                      help="comma-separated subset of greedy,beam,sample")
  args = parser.parse_args(argv)
  bad = [m for m in args.methods.split(",") if m not in ("greedy", "beam", "sample")]
  if bad:  # before the model is built and compiled
    parser.error(f"--methods: unknown {','.join(bad)}; expected a subset of greedy,beam,sample")

  model = registry.build(model_config(args.model, args.dtype), INFO)
  batch = coco_batch(args.batch)
  tokens = np.zeros((1, 1, args.words + 1), np.int32)
  start = time.perf_counter()
  params = jax.jit(model.init)(jax.random.key(0), jax.tree.map(lambda x: x[:1], batch),
                               shift_right(tokens))
  jax.block_until_ready(params)
  num_params = sum(x.size for x in jax.tree.leaves(params))
  print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
  print(f"model: {args.model} ({num_params / 1e6:.1f}M parameters, dtype {args.dtype}), "
        f"batch {args.batch}, 36x2048 regions, V={INFO['vocab_size']}, "
        f"max_len {args.words}; init {time.perf_counter() - start:.1f}s")
  batch = jax.device_put(batch)

  runs = {
      "greedy": ("greedy", lambda: decoding.greedy(model, params, batch, max_len=args.words)),
      "beam": (f"beam-{args.beam}",
               lambda: decoding.beam_search(model, params, batch, beam_size=args.beam,
                                            max_len=args.words)),
      "sample": ("sample x5", lambda: decoding.sample(model, params, batch, jax.random.key(1),
                                                      max_len=args.words, num_samples=5)),
  }
  for method in args.methods.split(","):
    if method not in runs:
      raise ValueError(f"--methods: unknown {method!r}; expected a subset of {sorted(runs)}")
    label, fn = runs[method]
    first, steady = timed(fn, args.steps)
    print(f"{label:>10}: {args.batch / steady:9.1f} images/s  "
          f"({steady * 1e3:8.1f} ms/batch, median of {args.steps}; "
          f"compile + first run {first:.1f}s)")


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
