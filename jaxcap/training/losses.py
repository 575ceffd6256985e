"""Losses, in float32. Metrics come back as sums and counts so they average correctly
over devices, hosts and logging windows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxcap.data.vocab import PAD


def cross_entropy(logits, targets, label_smoothing: float = 0.0):
  """Masked token cross-entropy.

  Args:
    logits: float ``[..., T, V]``.
    targets: int32 ``[..., T]``; PAD positions are ignored (EOS is a target).
    label_smoothing: mass spread uniformly over the vocabulary.

  Returns:
    ``(loss_sum, token_count)`` float32 scalars.
  """
  logits = logits.astype(jnp.float32)
  mask = (targets != PAD).astype(jnp.float32)
  if label_smoothing > 0:
    v = logits.shape[-1]
    onehot = jax.nn.one_hot(targets, v, dtype=jnp.float32)
    labels = optax.smooth_labels(onehot, label_smoothing)
    nll = optax.softmax_cross_entropy(logits, labels)
  else:
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.sum(nll * mask), jnp.sum(mask)


def masked_extra_loss(aux: dict, mask):
  """Sum over ``mask`` of a model's per-token ``aux["extra_loss"]`` (0 when absent)."""
  extra = aux.get("extra_loss") if aux else None
  if extra is None:
    return jnp.float32(0.0)
  return jnp.sum(extra.astype(jnp.float32).reshape(mask.shape) * mask)
