"""Pieces shared by the benchmark scripts (jax, flax and optax only; no ml_collections)."""

from __future__ import annotations

import argparse


class Config(dict):
  """``cfg.name`` / ``cfg.get(...)`` / attribute assignment: all a model's ``from_config`` reads."""

  __getattr__ = dict.__getitem__
  __setattr__ = dict.__setitem__


def add_shape_args(p: argparse.ArgumentParser) -> None:
  """``--regions --feat_dim --vocab --words``, COCO shapes by default (36 x 2048, 9,487, 16)."""
  p.add_argument("--regions", type=int, default=36)
  p.add_argument("--feat_dim", type=int, default=2048)
  p.add_argument("--vocab", type=int, default=9487)
  p.add_argument("--words", type=int, default=16)


def data_info(args) -> dict:
  """The dataset description ``registry.build`` needs, for the shapes of :func:`add_shape_args`."""
  return {"feature_dim": args.feat_dim, "global_dim": args.feat_dim, "max_regions": args.regions,
          "max_len": args.words, "vocab_size": args.vocab, "num_attributes": 1000, "src_vocab_size": 0,
          "grid": False, "seq_per_img": 5, "max_attributes": 20}


def check_batches(batches, device_count: int) -> None:
  """One line and exit when a batch does not split over the devices (data parallelism)."""
  bad = [str(b) for b in batches if int(b) % device_count]
  if bad:
    raise SystemExit(f"--batch: {','.join(bad)} images do not split evenly over {device_count} devices")
