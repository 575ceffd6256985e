"""Dropout masks from fewer random bits (``config.dropout_bits``: 32, the default, | 16 | 8).

flax's ``nn.Dropout`` draws one float32 uniform per element (``jax.random.bernoulli``), and
JAX's partitionable threefry computes one 2x32-bit hash per element whatever the width asked
for: the masks' random bits are a measured part of the Transformer's training step on GPUs
(docs/PERFORMANCE.md). With ``dropout_bits`` = k < 32, each 32-bit word drawn from the same
key gives 32 / k mask elements (k-bit integers, kept when below ``round(keep * 2**k)``), so the
hashes per mask are 32 / k times fewer. The key is the one ``nn.Dropout`` would have used (its
``make_rng``, so the per-image key layout of :mod:`jaxcap.training.steps` is kept) and the
inputs are scaled by the reciprocal of the realised keep probability, so the expectation stays
the input. The keep probability is rounded to a multiple of ``2**-k``: with k = 16 a rate of 0.1
keeps 58,982 / 65,536 = 0.899994, with k = 8 230 / 256 = 0.8984 (rates that are multiples of
1/256, e.g. 0.125, are exact); a rate that rounds to 0 keeps everything, one that rounds to 1
drops everything.

Every ``nn.Dropout`` of every model is swapped while a function is traced
(:func:`with_dropout_bits`, flax's method interceptors): no model carries a field for it.
"""

from __future__ import annotations

import functools

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.errors import BadInput

DROPOUT_BITS = (32, 16, 8)


def keep_threshold(rate: float, bits: int) -> int:
  """The k-bit integers below this are kept: ``round((1 - rate) * 2**bits)``."""
  return int(round((1.0 - rate) * (1 << bits)))


def keep_mask(key, rate: float, shape, bits: int):
  """``(mask, keep)``: a boolean keep-mask of ``shape`` from ``bits``-bit draws (32 / bits of them
  per 32-bit word of ``jax.random.bits(key)``) and its realised keep probability."""
  threshold = keep_threshold(rate, bits)
  if threshold >= 1 << bits:  # the rate rounds to 0 (the threshold would not fit k bits)
    return jnp.ones(shape, bool), 1.0
  size = int(np.prod(shape))
  per_word = 32 // bits
  words = jax.random.bits(key, (-(-size // per_word),), jnp.uint32)
  draws = jax.lax.bitcast_convert_type(words, jnp.dtype(f"uint{bits}")).reshape(-1)[:size]
  return (draws < threshold).reshape(shape), threshold / float(1 << bits)


def _dropout(module: nn.Dropout, inputs, deterministic=None, rng=None, *, bits: int):
  """``nn.Dropout.__call__`` with :func:`keep_mask` in place of ``jax.random.bernoulli``."""
  deterministic = nn.merge_param("deterministic", module.deterministic, deterministic)
  if module.rate == 0.0 or deterministic:
    return inputs
  if module.rate == 1.0:
    return jnp.zeros_like(inputs)
  if rng is None:
    rng = module.make_rng(module.rng_collection)
  shape = list(inputs.shape)
  for dim in module.broadcast_dims:
    shape[dim] = 1
  mask, keep = keep_mask(rng, module.rate, tuple(shape), bits)
  if keep == 0.0:  # the rate rounds to 1: everything dropped, as at rate 1 (no 1 / 0)
    return jnp.zeros_like(inputs)
  mask = jnp.broadcast_to(mask, inputs.shape)
  return jax.lax.select(mask, inputs / jnp.asarray(keep, inputs.dtype), jnp.zeros_like(inputs))


def _interceptor(bits: int):
  def intercept(next_fun, args, kwargs, context):
    if isinstance(context.module, nn.Dropout) and context.method_name == "__call__":
      return _dropout(context.module, *args, bits=bits, **kwargs)
    return next_fun(*args, **kwargs)
  return intercept


def with_dropout_bits(fn, bits: int):
  """``fn`` whose models' dropout masks use ``bits``-bit draws while it runs or is traced
  (jit the result: the masks are fixed in the traced program); ``fn`` itself for 32."""
  if bits not in DROPOUT_BITS:
    raise BadInput(f"config field dropout_bits: expected one of {DROPOUT_BITS}, got {bits!r}")
  if bits == 32:
    return fn

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with nn.intercept_methods(_interceptor(bits)):
      return fn(*args, **kwargs)
  return wrapped
