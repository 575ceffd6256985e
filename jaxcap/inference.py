"""Decoding a split of a dataset, data-parallel over a device mesh (and over processes).

The one prediction loop: :class:`jaxcap.api.Run` (``Run.predict``, ``Run.sample_n``, hence
``evaluate.py``) and training's validation (:meth:`jaxcap.training.train_lib.Trainer.predict`)
both call :func:`predict_split`.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

import numpy as np
import jax

from jaxcap import decoding, progress, xla_options
from jaxcap.data import batch as batch_lib
from jaxcap.data import pipeline
from jaxcap.errors import BadInput
from jaxcap.training import parallel


def _as_dict(decode_config) -> dict:
  return dict(decode_config.to_dict() if hasattr(decode_config, "to_dict") else decode_config)


def global_batch_size(batch_size: int, mesh) -> int:
  """``batch_size`` rounded up to a multiple of the mesh's devices."""
  n_dev = mesh.devices.size
  return int(math.ceil(batch_size / n_dev) * n_dev)


def decode_fn(model, vocab, decode_config, mesh, all_sequences: bool = False, cache: dict | None = None):
  """``fn(params, batch, rng) -> tokens``, jitted over ``mesh`` (batch split, params replicated):
  the best (first) sequence ``[B, T]``, or with ``all_sequences`` every beam / sample
  ``[B, K, T]``. ``cache`` (a dict) keeps the compiled functions by decoding options."""
  cfg = _as_dict(decode_config)
  key = json.dumps(cfg, sort_keys=True, default=str) + f";all={all_sequences}"
  if cache is not None and key in cache:
    return cache[key]
  data = parallel.batch_sharding(mesh)
  bad = decoding.bad_ending_ids(vocab)

  def run(params, batch, rng):
    out = decoding.decode(model, params, batch, cfg, rng=rng, bad_endings=bad)
    tokens = out.tokens
    if tokens.ndim == 3 and not all_sequences:  # beams / samples: the best (first) one
      tokens = tokens[:, 0]
    return tokens

  fn = jax.jit(run, in_shardings=(parallel.replicated(mesh), data, None), out_shardings=data,
               compiler_options=xla_options.decode_compiler_options())
  if cache is not None:
    cache[key] = fn
  return fn


def predict_split(model, params, dataset, split: str, decode_config, *, mesh, batch_size: int,
                  num_images: int = -1, seed: int = 0, all_sequences: bool = False,
                  cache: dict | None = None) -> dict:
  """Decodes a split of ``dataset`` (or its first ``num_images``): ``{image_id: caption}``, or
  with ``all_sequences`` ``{image_id: [caption, ...]}`` (every beam / sample, best first).

  ``batch_size`` images per step over the whole mesh (rounded up to a multiple of its devices);
  each process decodes its shard of every batch; batch ``k`` samples with
  ``fold_in(PRNGKey(seed), k)``.
  """
  source = dataset.split(split)
  if num_images and 0 < num_images < len(source):
    source = _Prefix(source, num_images)
  ids = dataset.image_ids(split)
  vocab = dataset.vocab
  fn = decode_fn(model, vocab, decode_config, mesh, all_sequences, cache)
  params = jax.device_put(params, parallel.replicated(mesh))
  local_bs = global_batch_size(batch_size, mesh) // jax.process_count()
  preds = {}
  rng = jax.random.PRNGKey(seed)
  batches = pipeline.eval_batches(source, local_bs, shard_index=jax.process_index(),
                                  shard_count=jax.process_count())
  # A bar once decoding has run for seconds (the first batch compiles; a CPU decodes slowly).
  total = -(-len(source) // global_batch_size(batch_size, mesh))
  for k, batch in enumerate(progress.bar(batches, f"decoding {split}", total=total, unit="batch")):
    gbatch = parallel.shard_batch(batch, mesh)
    tokens = parallel.to_host(fn(params, gbatch, jax.random.fold_in(rng, k)))
    index = parallel.to_host(gbatch["image_index"])
    valid = parallel.to_host(gbatch["valid"])
    for row, i, ok in zip(tokens, index, valid):
      if ok:
        if all_sequences:
          rows = row.reshape(-1, row.shape[-1])
          preds[ids[int(i)]] = [vocab.decode(r) for r in rows]
        else:
          preds[ids[int(i)]] = vocab.decode(row)
  return preds


def sample_n_config(decode_config, n: int, method: str = "sample") -> dict:
  """The decoding options drawing ``n`` captions per image (self-critical.pytorch's
  ``sample_n``): ``"sample"`` (n samples with the options' temperature / top-k / top-p) or
  ``"beam"`` (the n best hypotheses of a beam search of size n)."""
  if n < 1 or method not in ("sample", "beam"):
    raise BadInput(f"sample_n: expected n >= 1 and method 'sample' or 'beam', got {n}, "
                   f"{method!r}")
  cfg = _as_dict(decode_config)
  cfg["method"] = method
  if method == "sample":
    cfg["num_samples"] = n
  else:
    cfg["beam_size"] = n
  return cfg


class _Prefix:
  """The first ``n`` rows of a split source."""

  def __init__(self, source, n):
    self.source, self.n = source, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    if i >= self.n:
      raise IndexError(i)
    return self.source[i]

  def collate(self, *args, **kwargs):
    return self.source.collate(*args, **kwargs)


def decode_features(model, params, vocab, batch: dict, decode_config, *, batch_size: int = 50,
                    seed: int = 0, return_aux: bool | Sequence[str] = False):
  """Decodes a batch of a user's features (:func:`jaxcap.data.batch.from_features`) in chunks
  of ``batch_size`` images on the default device (the last chunk padded with copies of its
  first row, so every chunk has the same shapes and the decoder compiles once).

  Returns the :class:`jaxcap.decoding.DecodeOutput` as numpy arrays, one row per image.
  """
  cfg = _as_dict(decode_config)
  bad = decoding.bad_ending_ids(vocab)
  sampling = cfg.get("method") == "sample"  # unset: the default, greedy
  b = len(batch["feats"])
  size = max(1, min(int(batch_size), b))
  outs = []
  for k, start in enumerate(range(0, b, size)):
    chunk = {}
    for key, v in batch.items():
      rows = v[start:start + size]
      if len(rows) < size:
        rows = np.concatenate([rows, np.repeat(rows[:1], size - len(rows), axis=0)])
      chunk[key] = np.asarray(rows)  # the jitted decoder puts it on the device itself, at less cost
    # Only sampling draws: the key (two device calls, ~1 ms on a CPU) is made for it alone.
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), k) if sampling else None
    try:
      out = decoding.decode(model, params, chunk, cfg, rng=rng, bad_endings=bad, return_aux=return_aux)
    except KeyError as e:
      missing = e.args[0] if len(e.args) == 1 and isinstance(e.args[0], str) else None
      if isinstance(e, BadInput) or missing not in batch_lib.KEYS or missing in chunk:
        raise  # not a batch key the user's features lack: a bug, with its traceback
      name = getattr(model, "registry_name", type(model).__name__)
      raise BadInput(f"caption: model {name!r} reads batch[{e.args[0]!r}]; give it in the "
                     f"features dict (see docs/DESIGN.md, section 2)") from None
    outs.append(jax.device_get(out))
  return jax.tree.map(lambda *xs: np.concatenate(xs)[:b], *outs)
