"""The decoder protocol shared by every jaxcap model (see docs/DESIGN.md, section 3).

A model's dataclass fields are its config schema (:mod:`jaxcap.models.fields`): the registry
builds it from ``config.model`` with one shared validator, so a model has no ``from_config``.

Dimension legend: B images, S captions per image, T time steps, V vocabulary, K beams.

A model implements ``encode``, ``init_cache``, ``decode_step`` and ``decode_train``;
``decode_train_grouped`` and ``__call__`` (teacher forcing for training) are provided here.
Greedy decoding, sampling and beam search in :mod:`jaxcap.decoding` only ever call these methods, so one search serves
Transformer key/value caches and recurrent states alike.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.data.vocab import BOS


def repeat_batch(tree, n: int):
  """Repeats every leaf ``n`` times along axis 0: ``[B, ...] -> [B*n, ...]`` (image-major)."""
  if n == 1:
    return tree
  return jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), tree)


def shift_right(captions):
  """Decoder inputs: BOS followed by the captions without their last position."""
  bos = jnp.full(captions.shape[:-1] + (1,), BOS, captions.dtype)
  return jnp.concatenate([bos, captions[..., :-1]], axis=-1)


class CaptionModel(nn.Module):
  """Base class: subclasses implement the four protocol methods."""

  trainable = True
  # True when ``decode_train(enc, tokens, train, group=S)`` accepts ``enc`` for B / S images,
  # each serving S consecutive rows of ``tokens`` (see ``decode_train_grouped``).
  decode_train_groups = False

  def required_inputs(self) -> tuple[str, ...]:
    """What the model reads that a dataset may lack: ``"image"`` (image features, not a
    text-only placeholder), ``"boxes"`` (region boxes), ``"attributes"`` (attribute words),
    ``"src"`` (a translation source). The trainer and ``evaluate.py`` refuse data without them
    (:func:`jaxcap.training.validation.check_model_inputs`), as :meth:`jaxcap.api.Run.caption`
    refuses features without them."""
    return ("image",)

  def encode(self, batch: dict, train: bool = False) -> Any:
    raise NotImplementedError

  def init_cache(self, enc: Any, max_len: int) -> Any:
    raise NotImplementedError

  def decode_step(self, enc, cache, tokens, t, train: bool = False):
    raise NotImplementedError

  def decode_train(self, enc, tokens, train: bool = False):
    raise NotImplementedError

  def decode_train_grouped(self, enc, tokens_BxSxT, train: bool = False):
    """Teacher-forced logits of S captions per image from the per-image encoding.

    A model whose image side enters the decoder only through attention (each query attends on
    its own) sets ``decode_train_groups``: its ``decode_train(..., group=S)`` attends the S
    captions' queries to one copy of the image keys/values, which saves the S-fold copy and its
    gradient (the Transformer and ETA do). Otherwise ``enc`` is repeated S times (image-major).

    Args:
      enc: ``encode``'s output for B images.
      tokens_BxSxT: int32 decoder inputs.

    Returns:
      ``(logits [B, S, T, V] float32, aux dict with [B*S, ...] leaves)``.
    """
    b, s, t = tokens_BxSxT.shape
    tokens = tokens_BxSxT.reshape(b * s, t)
    if self.decode_train_groups:
      logits, aux = self.decode_train(enc, tokens, train=train, group=s)
    else:
      logits, aux = self.decode_train(repeat_batch(enc, s), tokens, train=train)
    return logits.reshape(b, s, t, -1), aux

  def __call__(self, batch: dict, tokens, train: bool = False):
    """Teacher-forced logits.

    Args:
      batch: a batch dict (docs/DESIGN.md, section 2).
      tokens: int32 ``[B, S, T]`` decoder inputs (``shift_right(batch["captions"])``).
      train: enables dropout.

    Returns:
      ``(logits [B, S, T, V] float32, aux dict)``.
    """
    return self.decode_train_grouped(self.encode(batch, train=train), tokens, train=train)
