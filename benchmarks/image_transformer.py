"""Image Transformer / AoANet training and beam-search throughput at COCO shapes.

Defaults are the paper-sized models (``jaxcap/models/image_transformer.py``): D = 1024, 8 heads,
3 spatial-graph encoder layers and M = 3 sub-transformers (Image Transformer) or 6 AoA refiner
layers and M = 1 (AoANet); 50 images per step with 5 captions each, 36 regions x 2048 features
with boxes (random, a quarter of them nested inside another region, so the graph has all three
relations), a vocabulary of 9,487 words and 16-word captions. Reference on one H100:
self-critical.pytorch's AoANet trains at 596 images/s and decodes beam-3 at 311 images/s.

The training step is written here (jax.jit + optax.adam + masked cross-entropy) on a fixed
random batch already on the device, so it measures the model, not the input pipeline. Beam
search is ``jaxcap.decoding.beam_search`` (beam 3, 16 words).

  python benchmarks/image_transformer.py                          # paper sizes (slow on a CPU)
  python benchmarks/image_transformer.py --model aoanet
  python benchmarks/image_transformer.py --dim 256 --batch 10 --eval_batch 10   # a CPU check
  python benchmarks/image_transformer.py --dtype bfloat16

Prints one JSON line with images/s for training and beam-3 decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import add_shape_args, build_train_step, timed  # noqa: E402

from jaxcap.data.vocab import PAD  # noqa: E402
from jaxcap.models.base import shift_right  # noqa: E402
from jaxcap.models.aoanet import AoANet  # noqa: E402
from jaxcap.models.image_transformer import ImageTransformer  # noqa: E402
from jaxcap.models.fields import compute_dtype  # noqa: E402
from jaxcap.cli import nonnegative_int, positive_int  # noqa: E402  (one-line errors for bad sizes)


def random_boxes(rng, images, regions):
  """Random normalised boxes; every fourth region is put inside the region before it."""
  xy = rng.uniform(0.0, 0.7, (images, regions, 2))
  wh = rng.uniform(0.05, 0.3, (images, regions, 2))
  boxes = np.concatenate([xy, xy + wh], -1)
  for j in range(1, regions, 4):
    outer = boxes[:, j - 1]
    c = (outer[:, :2] + outer[:, 2:]) / 2
    half = (outer[:, 2:] - outer[:, :2]) / 4
    boxes[:, j] = np.concatenate([c - half, c + half], -1)
  return boxes.astype(np.float32)


def make_batch(rng, images, regions, feat_dim, seq_per_img, words, vocab):
  """A random batch in the layout of docs/DESIGN.md section 2 (captions of random lengths)."""
  feats = rng.normal(size=(images, regions, feat_dim)).astype(np.float32)
  caps = rng.integers(4, vocab, size=(images, seq_per_img, words + 1)).astype(np.int32)
  lengths = rng.integers(min(8, words), words + 1, size=(images, seq_per_img))
  pos = np.arange(words + 1)
  caps = np.where(pos == lengths[..., None], 2, caps)  # EOS
  caps = np.where(pos > lengths[..., None], PAD, caps)
  return {"feats": feats, "feats_mask": np.ones((images, regions), bool),
          "boxes": random_boxes(rng, images, regions), "captions": caps}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="image_transformer", choices=("image_transformer", "aoanet"))
  ap.add_argument("--dim", type=positive_int, default=1024)
  ap.add_argument("--heads", type=positive_int, default=8)
  ap.add_argument("--layers", type=nonnegative_int, default=0, help="encoder layers (0: the model's, 3 or 6)")
  ap.add_argument("--M", type=nonnegative_int, default=0, help="decoder sub-transformers (0: the model's, 3 or 1)")
  ap.add_argument("--batch", type=positive_int, default=50, help="images per training step")
  ap.add_argument("--seq_per_img", type=positive_int, default=5)
  add_shape_args(ap)
  ap.add_argument("--beam", type=positive_int, default=3)
  ap.add_argument("--eval_batch", type=positive_int, default=100, help="images per beam-search call")
  ap.add_argument("--steps", "--iters", dest="iters", type=nonnegative_int, default=0,
                  help="timed iterations (0: 20 on GPU/TPU, 2 on CPU)")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--skip_train", action="store_true")
  ap.add_argument("--skip_beam", action="store_true")
  args = ap.parse_args(argv)

  platform = jax.devices()[0].platform
  iters = args.iters or (2 if platform == "cpu" else 20)
  cls = ImageTransformer if args.model == "image_transformer" else AoANet
  kw = {}
  if args.layers:
    kw["num_layers"] = args.layers
    if cls is ImageTransformer:
      kw["spatial_layers"] = tuple(range(1, args.layers + 1))
  if args.M:
    kw["num_sub"] = args.M
  model = cls(vocab_size=args.vocab, dim=args.dim, num_heads=args.heads, dtype=compute_dtype(args.dtype), **kw)
  rng = np.random.default_rng(0)
  batch = jax.device_put(make_batch(rng, args.batch, args.regions, args.feat_dim, args.seq_per_img,
                                    args.words, args.vocab))
  params = jax.jit(model.init)(jax.random.key(0), batch, shift_right(batch["captions"]))
  n_params = sum(x.size for x in jax.tree.leaves(params))
  result = {"benchmark": args.model, "device": jax.devices()[0].device_kind, "platform": platform,
            "dtype": args.dtype, "dim": args.dim, "heads": args.heads, "layers": model.num_layers,
            "M": model.num_sub, "regions": args.regions, "params_M": round(n_params / 1e6, 1),
            "iters": iters}

  if not args.skip_train:
    tx = optax.adam(2e-4)
    step = build_train_step(model, tx)
    state = {"params": params, "opt": tx.init(params), "rng": jax.random.key(1)}

    def run_train():
      state["params"], state["opt"], loss, state["rng"] = step(state["params"], state["opt"], batch,
                                                               state["rng"])
      return loss

    sec, comp = timed(run_train, iters)
    result.update(train_images_per_s=round(args.batch / sec, 1), train_step_s=round(sec, 4),
                  train_batch=args.batch, train_compile_s=round(comp, 1))
    params = state["params"]

  if not args.skip_beam:
    from jaxcap import decoding
    eval_batch = make_batch(rng, args.eval_batch, args.regions, args.feat_dim, 1, args.words, args.vocab)
    eval_batch = jax.device_put({k: eval_batch[k] for k in ("feats", "feats_mask", "boxes")})

    def run_beam():
      return decoding.beam_search(model, params, eval_batch, beam_size=args.beam,
                                  max_len=args.words).tokens

    sec, comp = timed(run_beam, iters)
    result.update(beam_images_per_s=round(args.eval_batch / sec, 1), beam_size=args.beam,
                  beam_batch=args.eval_batch, beam_compile_s=round(comp, 1))
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
