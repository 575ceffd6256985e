"""Pure, jittable training steps: ``train_step(state, batch, ...) -> (state, metrics)``.

Dimension legend: B images, S captions per image, T caption positions, V vocabulary.

The RNG of a step is ``fold_in(state.rng, state.step)``, so a resumed run draws exactly the
numbers a straight run would. Each example then draws from its own key,
``fold_in(step key, image_index)`` (:func:`per_example_keys`): its dropout masks (and scheduled
sampling draws) depend on which image it is, not on the row it happens to occupy in this
step's batch layout, so one process with 8 devices, two processes with 4 each (which order the
global batch differently) and one device give the same loss on the same images.
Metrics are sums and counts (averaged by the caller).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from jaxcap.data.vocab import PAD
from jaxcap.models.base import repeat_batch, shift_right
from jaxcap.training import losses


class TrainState(train_state.TrainState):
  """flax's ``TrainState`` (``step``, ``params``, ``opt_state``; the optimiser ``tx`` and
  ``apply_gradients``) plus the run's RNG key. ``params`` is the model's whole variable dict.
  The checkpointed leaves are ``step``, ``params``, ``opt_state`` and ``rng``."""
  rng: jax.Array


PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")  # the first: JAX's default


def rng_key(seed: int, config=None) -> jax.Array:
  """The run's root key from ``config.prng_impl`` (absent in configs saved before it existed:
  JAX's default, threefry2x32). Dropout and sampling keys are folded from it, so they inherit
  its generator. threefry2x32 stays a raw ``uint32[2]`` key (the checkpoints of every earlier
  run hold one); another generator is a typed key (``jax.random.key``): a raw key does not
  carry its generator, so fold_in would read rbg's 4 words as threefry's."""
  impl = config.get("prng_impl", PRNG_IMPLS[0]) if config is not None else PRNG_IMPLS[0]
  return jax.random.PRNGKey(seed) if impl == PRNG_IMPLS[0] else jax.random.key(seed, impl=impl)


def create_state(params, tx, rng) -> TrainState:
  # Not TrainState.create: its step is a Python 0 (a weakly typed leaf); the checkpoint holds int32.
  return TrainState(step=jnp.zeros((), jnp.int32), apply_fn=None, params=params, tx=tx,
                    opt_state=tx.init(params), rng=rng)


def apply_gradients(state: TrainState, loss_fn, tx=None):
  """The update every training step shares: ``loss_fn(params) -> (loss, metrics)`` is
  differentiated and the gradients applied by the optimiser (``tx``, default ``state.tx``).

  Returns:
    ``(new state, metrics + {"grad_norm", "steps": 1})``; the non-finite guard
    (:func:`jaxcap.training.guard.guarded`) wraps the whole step around it.
  """
  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  if tx is not None:
    state = state.replace(tx=tx)
  metrics = dict(metrics, grad_norm=optax.global_norm(grads), steps=jnp.float32(1.0))
  return state.apply_gradients(grads=grads), metrics


def teacher_forced_with_sampling(model, params, batch, inputs_BxSxT, prob, rng, train=True):
  """Scheduled sampling (Bengio et al., 2015) through the decoder protocol.

  At each step, with probability ``prob`` per caption, the input word is the model's own
  sample from the previous step instead of the ground truth. Runs the model step by step
  (``decode_step`` under ``lax.scan``), so it works for every model.

  Returns:
    ``(logits [B, S, T, V], aux)`` with aux holding the stacked per-step ``extra_loss``.
  """
  b, s, t = inputs_BxSxT.shape
  rng_drop, rng_mix = jax.random.split(rng)
  enc = repeat_batch(model.apply(params, batch, train=train, method="encode", rngs={"dropout": rng_drop}), s)
  cache = model.apply(params, enc, t, method="init_cache")
  gold_TxBS = inputs_BxSxT.reshape(b * s, t).T

  def body(carry, xs):
    cache, prev_sample = carry
    step, gold_B = xs
    k_mix, k_sample, k_drop = jax.random.split(jax.random.fold_in(rng_mix, step), 3)
    use_sample = (jax.random.uniform(k_mix, gold_B.shape) < prob) & (step > 0)
    tok = jnp.where(use_sample, prev_sample, gold_B)
    logits, cache, aux = model.apply(params, enc, cache, tok, step, train=train, method="decode_step",
                                     rngs={"dropout": k_drop})
    sample = jax.random.categorical(k_sample, jax.lax.stop_gradient(logits.astype(jnp.float32)))
    extra = aux.get("extra_loss", jnp.zeros(gold_B.shape, jnp.float32))
    return (cache, sample.astype(gold_B.dtype)), (logits, extra)

  init = (cache, jnp.zeros((b * s,), inputs_BxSxT.dtype))
  _, (logits_TxBSxV, extra_TxBS) = jax.lax.scan(body, init, (jnp.arange(t), gold_TxBS))
  logits = jnp.transpose(logits_TxBSxV, (1, 0, 2)).reshape(b, s, t, -1)
  return logits, {"extra_loss": extra_TxBS.T.reshape(b, s, t)}


def per_example_keys(rng, batch):
  """``[B]`` keys ``fold_in(rng, image_index)``: an example's randomness keyed by its global
  dataset index (its row in the split), independent of its position in the batch.
  A batch without ``image_index`` (hand-made benchmark batches) falls back to the row."""
  index_B = batch.get("image_index")
  if index_B is None:
    index_B = jnp.arange(jax.tree.leaves(batch)[0].shape[0])
  return jax.vmap(lambda i: jax.random.fold_in(rng, i))(index_B.astype(jnp.uint32))


def map_examples(fn, batch, rng):
  """``fn(example, key)`` for every example of ``batch`` (vmapped), each with its
  :func:`per_example_keys` key; ``example`` is the batch restricted to that row (B = 1)."""
  one = lambda ex, key: fn(jax.tree.map(lambda x: x[None], ex), key)
  return jax.vmap(one)(batch, per_example_keys(rng, batch))


def xe_loss_fn(params, model, batch, rng, label_smoothing=0.0, ss_prob=None):
  """Cross-entropy (+ the model's own ``extra_loss``) per target token.

  The model runs once per example (vmapped, so still one batched computation) with that
  example's own dropout key (:func:`map_examples`).
  """

  def one(ex, key):
    targets = ex["captions"]
    inputs = shift_right(targets)
    if ss_prob is None:
      logits, aux = model.apply(params, ex, inputs, train=True, rngs={"dropout": key})
    else:
      logits, aux = teacher_forced_with_sampling(model, params, ex, inputs, ss_prob, key)
    loss_sum, count = losses.cross_entropy(logits, targets, label_smoothing)
    return loss_sum, count, losses.masked_extra_loss(aux, (targets != PAD).astype(jnp.float32))

  loss_sum, count, extra_sum = (jnp.sum(x) for x in map_examples(one, batch, rng))
  count = jnp.maximum(count, 1.0)
  return (loss_sum + extra_sum) / count, {"loss_sum": loss_sum, "token_count": count, "extra_sum": extra_sum}


def train_step(state: TrainState, batch: dict, *, model, tx=None, label_smoothing: float = 0.0,
               ss_prob=None):
  """One cross-entropy step (optionally with scheduled sampling probability ``ss_prob``)."""
  rng = jax.random.fold_in(state.rng, state.step)
  loss_fn = lambda params: xe_loss_fn(params, model, batch, rng, label_smoothing, ss_prob)
  return apply_gradients(state, loss_fn, tx)
