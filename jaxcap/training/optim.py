"""Optimiser and learning-rate schedules (optax)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxcap.errors import BadInput


def noam_schedule(scale: float, dim: int, warmup: int):
  """Vaswani et al.: ``scale * d^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (step from 1)."""
  import jax.numpy as jnp

  def fn(step):
    s = jnp.maximum(step + 1, 1).astype(jnp.float32)
    return scale * dim ** -0.5 * jnp.minimum(s ** -0.5, s * warmup ** -1.5)

  return fn


def step_decay_schedule(lr: float, rate: float, every_steps: int):
  """``lr * rate^floor(step / every_steps)`` (self-critical's ×0.8 every k epochs)."""
  return optax.exponential_decay(lr, transition_steps=max(1, every_steps), decay_rate=rate, staircase=True)


def scst_start_step(config, steps_per_epoch: int) -> int:
  """The step at which self-critical training replaces cross-entropy (-1: never).

  ``scst.start_epoch`` (when >= 0) counts epochs of the training split and takes precedence
  over ``scst.start_step``.
  """
  epoch = int(config.scst.start_epoch)
  if epoch >= 0:
    return epoch * int(steps_per_epoch)
  return int(config.scst.start_step)


def make_schedule(config, steps_per_epoch: int):
  """The cross-entropy schedule, joined to the SCST learning rate at the SCST start step."""
  if config.schedule == "noam":
    xe = noam_schedule(config.learning_rate, config.model.get("dim", 512), config.warmup_steps)
  elif config.schedule == "step":
    xe = step_decay_schedule(config.learning_rate, config.decay_rate,
                             int(config.decay_every_epochs * steps_per_epoch))
  elif config.schedule == "constant":
    xe = optax.constant_schedule(config.learning_rate)
  else:
    raise BadInput(f"config field schedule: expected 'noam', 'step' or 'constant', got {config.schedule!r}")
  start = scst_start_step(config, steps_per_epoch)
  if start == 0:
    return optax.constant_schedule(config.scst.learning_rate)
  if start > 0:
    return optax.join_schedules([xe, optax.constant_schedule(config.scst.learning_rate)], [start])
  return xe


def _zero_collections(names):
  """Sets the updates of the variable collections ``names`` to zero (non-trainable constants,
  e.g. TPGN's mean training feature), whatever the gradient or the weight decay says."""
  names = tuple(names)

  def mask(params):
    return {k: jax.tree.map(lambda _: k in names, v) for k, v in params.items()}

  return optax.masked(optax.set_to_zero(), mask)


class FreezeState(NamedTuple):
  count: Any  # int32 updates seen
  inner: Any  # the inner transformation's state, untouched while frozen


def freeze_for(num_updates: int, inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """``inner`` after its first ``num_updates`` updates, which are zero and leave ``inner``'s
  state (Adam's moments, its count) as it was: ``inner`` starts when the freeze ends, as a
  fresh optimiser of the joint phase would (ExpansionNet v2's features-then-joint phases)."""

  def init(params):
    return FreezeState(jnp.zeros([], jnp.int32), inner.init(params))

  def update(updates, state, params=None):
    new_updates, new_inner = inner.update(updates, state.inner, params)
    frozen = state.count < num_updates
    new_updates = jax.tree.map(lambda u: jnp.where(frozen, jnp.zeros_like(u), u), new_updates)
    new_inner = jax.tree.map(lambda old, new: jnp.where(frozen, old, new), state.inner, new_inner)
    return new_updates, FreezeState(optax.safe_int32_increment(state.count), new_inner)

  return optax.GradientTransformation(init, update)


def _gradient_parts(config) -> list:
  """What is done to the gradient before the optimiser: the L2 term, clipping."""
  parts = []
  l2 = float(config.get("l2", 0.0))
  if l2 > 0:
    # L2 on the cost, lambda * sum(w^2) (coupled, before Adam's scaling): gradient + 2 lambda w.
    parts.append(optax.add_decayed_weights(2.0 * l2))
  if config.grad_clip_value > 0:
    parts.append(optax.clip(config.grad_clip_value))
  if config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  return parts


def _adam(config, learning_rate):
  """Adam (AdamW with ``weight_decay``) of ``config`` at ``learning_rate`` (number or schedule)."""
  if config.weight_decay > 0:
    return optax.adamw(learning_rate, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                       weight_decay=config.weight_decay)
  return optax.adam(learning_rate, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)


def backbone_label(params) -> Any:
  """``"backbone"`` for the leaves under ``params/backbone`` (:class:`jaxcap.models.pixels.FromPixels`),
  ``"captioner"`` for every other leaf."""
  def label(path, _):
    keys = [getattr(k, "key", None) for k in path[:2]]
    return "backbone" if keys == ["params", "backbone"] else "captioner"
  return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(config, steps_per_epoch: int, frozen_collections=()):
  """The optimiser of ``config``; updates of ``frozen_collections`` (top-level keys of the
  variables dict) are zeroed. A run from pixels (``config.backbone.name`` set) gives the
  backbone's parameters their own Adam, at the constant ``backbone.learning_rate`` and held still
  for the first ``backbone.freeze_steps`` updates (:func:`freeze_for`); the L2 term and the
  clipping act on all gradients together, as in a features run."""
  schedule = make_schedule(config, steps_per_epoch)
  parts = _gradient_parts(config)
  backbone = config.get("backbone")
  if backbone is not None and backbone.get("name"):
    parts.append(optax.multi_transform(
        {"captioner": _adam(config, schedule),
         "backbone": freeze_for(int(backbone.freeze_steps), _adam(config, float(backbone.learning_rate)))},
        backbone_label))
  else:
    parts.append(_adam(config, schedule))
  if frozen_collections:
    parts.append(_zero_collections(frozen_collections))
  return optax.chain(*parts), schedule
