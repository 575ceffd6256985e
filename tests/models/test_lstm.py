"""Tests of the soft-attention LSTM captioner against a NumPy implementation of its equations.

The whole model is checked against the NumPy reference (``np_encode`` + ``np_step``: the
region projection with its ReLU, the masked mean and the tanh initial states, Xu et al.'s soft
attention ``w^T tanh(W_v v + W_q h)`` over the real regions, the LSTM gate by gate, the output
layer on ``h + z``), fed the model's own random parameters: ``decode_step`` on teacher tokens
(test_steps_match_numpy) and along greedy steps from BOS (test_greedy_decode_steps_match_numpy),
and ``decode_train`` for every caption (test_teacher_forcing_matches_steps).

Mutants tried by hand on jaxcap/models/lstm.py (one at a time, restored with ``git checkout``);
each failed test_steps_match_numpy, test_greedy_decode_steps_match_numpy and
test_teacher_forcing_matches_steps, and 3 and 5 also test_padding_regions_are_ignored:
  1. no ReLU on the region projection;
  2. no tanh in the attention score;
  3. padding regions not masked in the attention;
  4. h_0 = 0 instead of tanh(W_h mean(v));
  5. the mean for the initial state over all regions, padding included;
  6. LSTM input ``[z; E y]`` instead of ``[E y; z]`` (same width, so only the values tell);
  7. output layer on ``h`` instead of ``h + z``;
  8. attention queried with the cell state c instead of h;
  9. c_0 computed with W_h (init_h) instead of W_c;
 10. c and h swapped in the initial cache.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxcap import decoding
from jaxcap.data.vocab import BOS, EOS, PAD
from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.models.lstm import LSTMCaptioner

VOCAB, H, E, A, D = 9, 6, 4, 5, 7


def make(seed=0, dropout=0.0, b=3, n=4, t=5):
  model = LSTMCaptioner(vocab_size=VOCAB, hidden_dim=H, embed_dim=E, att_dim=A, dropout=dropout)
  rng = np.random.default_rng(seed)
  mask = np.ones((b, n), bool)
  mask[0, 2:] = False
  batch = {"feats": rng.normal(size=(b, n, D)).astype(np.float32), "feats_mask": mask}
  caps = rng.integers(4, VOCAB, size=(b, 2, t)).astype(np.int32)
  params = random_params(model, batch, caps, rng)
  return model, params, batch, caps


def random_params(model, batch, caps, rng, scale=0.5):
  # Tracing init for the shapes (no compile) keeps the tests fast; values are random normal.
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch, shift_right(caps))
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * scale, s.dtype), shapes)


def jit_apply(model):
  return jax.jit(lambda prm, batch, inputs: model.apply(prm, batch, inputs))


@pytest.fixture(scope="module")
def small():
  model, params, batch, caps = make()
  return model, params, batch, caps, jit_apply(model)


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def dense(p, x):
  return x @ np.asarray(p["kernel"], np.float64) + (np.asarray(p["bias"]) if "bias" in p else 0.0)


def np_encode(p, batch):
  mask = batch["feats_mask"]
  v = np.maximum(dense(p["feat_proj"], batch["feats"].astype(np.float64)), 0.0)
  pooled = (v * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  return {"v": v, "keys": dense(p["key_proj"], v), "mask": mask,
          "h": np.tanh(dense(p["init_h"], pooled)), "c": np.tanh(dense(p["init_c"], pooled))}


def np_step(p, enc, c, h, tokens):
  """Xu et al. (2015) soft attention + an LSTM step (gates i, f, g, o), written out."""
  e = (np.tanh(enc["keys"] + dense(p["query_proj"], h)[:, None, :])
       @ np.asarray(p["att_score"]["kernel"], np.float64))[..., 0]
  alpha = np_softmax(np.where(enc["mask"], e, -np.inf))
  z = np.einsum("bn,bnh->bh", alpha, enc["v"])
  x = np.concatenate([np.asarray(p["embed"]["embedding"], np.float64)[tokens], z], -1)
  cell = p["cell"]
  gate = {g: dense(cell["i" + g], x) + dense(cell["h" + g], h) for g in "ifgo"}
  c = sigmoid(gate["f"]) * c + sigmoid(gate["i"]) * np.tanh(gate["g"])
  h = sigmoid(gate["o"]) * np.tanh(c)
  return dense(p["out_proj"], h + z), c, h, alpha


def test_from_config():
  info = {"vocab_size": 50, "feature_dim": 8}
  model = registry.build(ml_collections.ConfigDict({"name": "lstm"}), info)
  assert isinstance(model, LSTMCaptioner)
  assert (model.vocab_size, model.hidden_dim, model.embed_dim, model.att_dim) == (50, 512, 512, 512)
  assert model.dropout == 0.5
  model = registry.build(ml_collections.ConfigDict(
      {"name": "lstm", "hidden_dim": 32, "embed_dim": 16, "att_dim": 8, "dropout": 0.1}), info)
  assert (model.hidden_dim, model.embed_dim, model.att_dim, model.dropout) == (32, 16, 8, 0.1)
  with pytest.raises(ValueError, match="model.hidden_dim"):
    registry.build(ml_collections.ConfigDict({"name": "lstm", "hidden_dim": 0}), info)
  with pytest.raises(ValueError, match="model.dropout"):
    registry.build(ml_collections.ConfigDict({"name": "lstm", "dropout": 1.0}), info)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_steps_match_numpy(small):
  model, params, batch, caps, apply = small
  p = jax.tree.map(np.asarray, params["params"])
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, 5, method="init_cache")
  ref = np_encode(p, batch)
  np.testing.assert_allclose(cache["h"], ref["h"], rtol=1e-4, atol=1e-5)
  c, h = ref["c"], ref["h"]
  for t, tokens in enumerate(np.asarray(shift_right(caps[:, 0])).T):
    logits, cache, aux = model.apply(params, enc, cache, jnp.asarray(tokens), t,
                                     method="decode_step")
    ref_logits, c, h, alpha = np_step(p, ref, c, h, tokens)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(cache["c"], c, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(aux["attention"], alpha, rtol=1e-4, atol=1e-6)
  assert np.all(np.asarray(aux["attention"])[0, 2:] == 0.0)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_greedy_decode_steps_match_numpy(small):
  """``decode_step`` along 4 greedy steps from BOS (each step fed the previous argmax) equals
  the reference run on the same tokens."""
  model, params, batch, caps, apply = small
  p = jax.tree.map(np.asarray, params["params"])
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, 4, method="init_cache")
  ref = np_encode(p, batch)
  c, h = ref["c"], ref["h"]
  tokens = np.full((3,), BOS, np.int32)
  for t in range(4):
    logits, cache, _ = model.apply(params, enc, cache, jnp.asarray(tokens), t, method="decode_step")
    ref_logits, c, h, _ = np_step(p, ref, c, h, tokens)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-5, err_msg=f"step {t}")
    tokens = np.asarray(logits).argmax(-1).astype(np.int32)
    np.testing.assert_array_equal(tokens, ref_logits.argmax(-1))


def test_teacher_forcing_matches_steps(small):
  model, params, batch, caps, apply = small
  inputs = shift_right(caps)
  logits, aux = apply(params, batch, inputs)
  assert logits.shape == (3, 2, 5, VOCAB) and logits.dtype == jnp.float32
  assert aux["attention"].shape == (6, 5, 4)
  p = jax.tree.map(np.asarray, params["params"])
  ref = np_encode(p, batch)
  for s in range(2):
    c, h = ref["c"], ref["h"]
    for t in range(5):
      ref_logits, c, h, _ = np_step(p, ref, c, h, np.asarray(inputs)[:, s, t])
      np.testing.assert_allclose(logits[:, s, t], ref_logits, rtol=1e-4, atol=1e-5)


def test_padding_regions_are_ignored(small):
  model, params, batch, caps, apply = small
  changed = dict(batch, feats=batch["feats"].copy())
  changed["feats"][0, 2:] = 100.0
  a, _ = apply(params, batch, shift_right(caps))
  b, _ = apply(params, changed, shift_right(caps))
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  changed["feats"][0, 0] += 1.0
  c, _ = apply(params, changed, shift_right(caps))
  assert not np.allclose(a[0], c[0])


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_dropout_only_in_training():
  model, params, batch, caps = make(seed=1, dropout=0.5)
  inputs = shift_right(caps)

  @jax.jit
  def run(prm):
    # One compile for the four calls.
    det, _ = model.apply(prm, batch, inputs)
    det2, _ = model.apply(prm, batch, inputs, train=False, rngs={"dropout": jax.random.key(1)})
    tr1, _ = model.apply(prm, batch, inputs, train=True, rngs={"dropout": jax.random.key(1)})
    tr2, _ = model.apply(prm, batch, inputs, train=True, rngs={"dropout": jax.random.key(2)})
    return det, det2, tr1, tr2

  det, det2, tr1, tr2 = run(params)
  np.testing.assert_array_equal(det, det2)
  assert not np.allclose(tr1, det) and not np.allclose(tr1, tr2)


@pytest.mark.slow
def test_learns_captions_and_greedy_decodes_them():
  """Overfits two images' captions; greedy decoding and beam search then return them exactly."""
  model = LSTMCaptioner(vocab_size=12, hidden_dim=32, embed_dim=16, att_dim=16, dropout=0.0)
  rng = np.random.default_rng(3)
  batch = {"feats": rng.normal(size=(2, 3, D)).astype(np.float32),
           "feats_mask": np.ones((2, 3), bool)}
  caps = np.array([[[4, 5, 6, 7, EOS, PAD]], [[8, 9, 10, EOS, PAD, PAD]]], np.int32)
  params = random_params(model, batch, caps, rng, scale=0.3)
  opt = optax.adam(3e-2)

  @jax.jit
  def train(params):
    def loss_fn(prm):
      logits, _ = model.apply(prm, batch, shift_right(caps))
      nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), caps[..., None], -1)[..., 0]
      return jnp.sum(nll * (caps != PAD)) / jnp.sum(caps != PAD)

    def step(carry, _):
      prm, state = carry
      loss, grads = jax.value_and_grad(loss_fn)(prm)
      updates, state = opt.update(grads, state, prm)
      return (optax.apply_updates(prm, updates), state), loss

    (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), None, length=150)
    return params, losses

  params, losses = train(params)
  assert losses[-1] < 0.05 * losses[0]
  out = decoding.greedy(model, params, batch, max_len=6)
  np.testing.assert_array_equal(out.tokens, caps[:, 0])
  np.testing.assert_array_equal(out.lengths, [5, 4])
  beam = decoding.beam_search(model, params, batch, beam_size=2, max_len=6)
  np.testing.assert_array_equal(beam.tokens[:, 0], caps[:, 0])
