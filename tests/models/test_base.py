"""The base class's derived teacher forcing (jaxcap/models/base.py): a model that writes only its
step gets ``decode_step`` and ``decode_train`` from ``CaptionModel``.

Two toy recurrent models with the same parameters and the same step, one split into
``step_features`` + ``output_layer`` (the output layer hoisted out of the scan) and one with only
``decode_step`` (the whole step scanned). The step reads the time index ``t`` and reports it and
the token it was fed in aux, so that a scan that feeds the wrong token, drops or shifts ``t``,
or stacks the aux along the wrong axis shows directly as well as in the logits.

Mutants tried by hand on ``CaptionModel._scan_step`` (each made the tests here fail; then
restored): the tokens fed one step late (``jnp.roll(tokens, 1, axis=1)``); ``t`` fed as 0 at
every step; the carry not threaded (every step from ``init_cache``); aux / outputs stacked along
axis 0 (``out_axes=0``); and, in ``decode_train``, the hoisted output layer applied to the
features of the first step only.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.models.base import CaptionModel

B, T, F, H, V = 3, 5, 4, 6, 11
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


class _ToyBase(CaptionModel):
  """``h_t = tanh(W x_t + U h_{t-1} + (t + 1) w)``, ``x_t = Dropout(E y_t)``, logits
  ``= O Dropout(h_t)``; ``h_0 = tanh(I v)``."""

  dropout: float = 0.3

  def setup(self):
    self.img = nn.Dense(H)
    self.embed = nn.Embed(V, H)
    self.w_in = nn.Dense(H)
    self.w_rec = nn.Dense(H, use_bias=False)
    self.w_time = self.param("w_time", nn.initializers.normal(1.0), (H,))
    self.out = nn.Dense(V)
    self.drop = nn.Dropout(self.dropout)

  def encode(self, batch, train=False):
    return {"h0": jnp.tanh(self.img(batch["global_feat"]))}

  def init_cache(self, enc, max_len):
    return {"h": enc["h0"]}

  def _features(self, enc, cache, tokens_B, t, train):
    x_BxH = self.drop(self.embed(tokens_B), deterministic=not train)
    h_BxH = jnp.tanh(self.w_in(x_BxH) + self.w_rec(cache["h"]) + (t + 1) * self.w_time)
    aux = {"t": jnp.full(tokens_B.shape, t, jnp.int32), "token": tokens_B, "norm": jnp.sum(h_BxH ** 2, -1)}
    return self.drop(h_BxH, deterministic=not train), {"h": h_BxH}, aux


class SplitToy(_ToyBase):
  """Defines only ``step_features`` and ``output_layer``."""

  def step_features(self, enc, cache, tokens_B, t, train=False):
    return self._features(enc, cache, tokens_B, t, train)

  def output_layer(self, features, train=False):
    return self.out(features).astype(jnp.float32)


class StepToy(_ToyBase):
  """Defines only ``decode_step`` (the same step)."""

  def decode_step(self, enc, cache, tokens_B, t, train=False):
    features, cache, aux = self._features(enc, cache, tokens_B, t, train)
    return self.out(features).astype(jnp.float32), cache, aux


def _inputs():
  rng = np.random.default_rng(0)
  batch = {"global_feat": jnp.asarray(rng.normal(size=(B, F)), jnp.float32)}
  tokens = jnp.asarray(rng.integers(0, V, size=(B, T)), jnp.int32)
  return batch, tokens


@functools.lru_cache(maxsize=None)
def _params():
  batch, tokens = _inputs()
  return _jit(SplitToy().init)(jax.random.key(0), batch, tokens[:, None, :])


def _stepwise(model, params, batch, tokens):
  """``decode_step`` in a Python loop: logits ``[B, T, V]`` and aux stacked on axis 1."""
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, T, method="init_cache")
  step = _jit(lambda p, c, y, t: model.apply(p, enc, c, y, t, method="decode_step"))
  logits, auxes = [], []
  for t in range(T):
    lg, cache, aux = step(params, cache, tokens[:, t], jnp.int32(t))
    logits.append(lg)
    auxes.append(aux)
  return np.stack(logits, 1), {k: np.stack([a[k] for a in auxes], 1) for k in auxes[0]}


@pytest.mark.parametrize("model", [SplitToy(), StepToy()], ids=["split_step", "decode_step_only"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_derived_decode_train_equals_decode_step_loop(model):
  params = _params()  # both toys have the same parameter tree
  batch, tokens = _inputs()
  enc = model.apply(params, batch, method="encode")
  logits, aux = _jit(lambda p: model.apply(p, enc, tokens, method="decode_train"))(params)
  want_logits, want_aux = _stepwise(model, params, batch, tokens)
  assert logits.shape == (B, T, V) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, want_logits, rtol=1e-6, atol=1e-6)
  assert set(aux) == {"t", "token", "norm"}
  np.testing.assert_array_equal(aux["t"], np.broadcast_to(np.arange(T), (B, T)))
  np.testing.assert_array_equal(aux["token"], tokens)
  np.testing.assert_allclose(aux["norm"], want_aux["norm"], rtol=1e-6, atol=1e-6)
  # __call__ (S = 1 caption per image) is the same teacher forcing.
  call_logits, _ = model.apply(params, batch, tokens[:, None, :])
  np.testing.assert_allclose(call_logits[:, 0], want_logits, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_hoisted_output_layer_keeps_the_per_step_dropout_stream():
  """With dropout on, the split step (output layer outside the scan) draws the same masks as
  the whole step scanned: the dropout of ``step_features`` stays inside the loop."""
  params = _params()
  batch, tokens = _inputs()
  rngs = {"dropout": jax.random.key(7)}
  run = lambda m: _jit(lambda p: m.apply(p, batch, tokens[:, None, :], train=True, rngs=rngs))(params)
  split_logits, split_aux = run(SplitToy())
  step_logits, step_aux = run(StepToy())
  eval_logits, _ = run(SplitToy(dropout=0.0))
  assert not np.allclose(split_logits, eval_logits)  # dropout is on
  np.testing.assert_allclose(split_logits, step_logits, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(split_aux["norm"], step_aux["norm"], rtol=1e-6, atol=1e-6)


def test_default_decode_step_composes_the_split_step():
  params = _params()
  batch, tokens = _inputs()
  model = SplitToy()
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, T, method="init_cache")
  logits, new_cache, aux = model.apply(params, enc, cache, tokens[:, 0], jnp.int32(2), method="decode_step")
  feats, want_cache, want_aux = model.apply(params, enc, cache, tokens[:, 0], jnp.int32(2),
                                            method="step_features")
  np.testing.assert_array_equal(logits, model.apply(params, feats, method="output_layer"))
  np.testing.assert_array_equal(new_cache["h"], want_cache["h"])
  np.testing.assert_array_equal(aux["t"], np.full((B,), 2))
  # teacher_forced_features: the scanned step_features themselves, [B, T, H].
  feats_BxTxH, _ = model.apply(params, enc, tokens, method="teacher_forced_features")
  assert feats_BxTxH.shape == (B, T, H)
  np.testing.assert_allclose(model.apply(params, feats_BxTxH, method="output_layer"),
                             model.apply(params, enc, tokens, method="decode_train")[0], rtol=1e-6, atol=1e-6)


def test_a_model_without_a_step_says_so():
  class NoStep(CaptionModel):
    def encode(self, batch, train=False):
      return {"x": batch["global_feat"]}

    def init_cache(self, enc, max_len):
      return {}

  batch, tokens = _inputs()
  with pytest.raises(NotImplementedError, match="neither decode_step nor step_features"):
    NoStep().init(jax.random.key(0), batch, tokens[:, None, :])
