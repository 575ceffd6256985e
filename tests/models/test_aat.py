"""AAT (jaxcap/models/aat.py) against an independent NumPy loop implementation of section 3.

The NumPy reference runs one example at a time with real halting (a Python ``break``) and the
paper's product form of eqs. 11-15, so it shares nothing with the masked, log-space
implementation beyond the weights.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.models import registry
from jaxcap.models.aat import AATAttention, AATCaptioner
from jaxcap.models.base import shift_right

D, H, N, B = 16, 4, 6, 8

# These graphs are tiny and run once: XLA's backend optimisations would cost more compile time
# than they save.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


# ----------------------------------------------------------------------------------------------
# NumPy reference.


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _np_lstm(p, x, h, c):
  """flax's LSTM equations (input kernels without bias, hidden kernels with bias)."""
  gate = lambda g: x @ p["i" + g]["kernel"] + h @ p["h" + g]["kernel"] + p["h" + g]["bias"]
  i, f, g, o = _sigmoid(gate("i")), _sigmoid(gate("f")), np.tanh(gate("g")), _sigmoid(gate("o"))
  c = f * c + i * g
  return o * np.tanh(c), c


def _np_layer_norm(p, x, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _np_mha(p, q, a, mask):
  """Eqs. 4-5 for one query vector ``q [D]`` over regions ``a [N, D]``."""
  qh = np.einsum("d,dhk->hk", q, p["query"]["kernel"]) + p["query"]["bias"]
  kh = np.einsum("nd,dhk->nhk", a, p["key"]["kernel"])  # no key bias (the softmax cancels it)
  vh = np.einsum("nd,dhk->nhk", a, p["value"]["kernel"]) + p["value"]["bias"]
  logits = np.einsum("hk,nhk->hn", qh, kh) / np.sqrt(qh.shape[-1])
  logits = np.where(mask[None], logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  o = np.einsum("hn,nhk->hk", w, vh)
  return np.einsum("hk,hkd->d", o, p["out"]["kernel"]) + p["out"]["bias"]


def _np_attention_step(p, kind, h1, h, m, a, mask):
  q = h1 if kind == "base" else np.concatenate([h1, h]) @ p["query"]["kernel"] + p["query"]["bias"]
  a_hat = _np_mha(p["mha"], q, a, mask)
  h, m = _np_lstm(p["lstm"], np.concatenate([a_hat, h1]), h, m)
  return _np_layer_norm(p["norm_h"], h), _np_layer_norm(p["norm_m"], m)


def _np_confidence(p, x):  # eq. 10
  hid = np.maximum(0.0, x @ p["conf_hidden"]["kernel"] + p["conf_hidden"]["bias"])
  return _sigmoid(hid @ p["conf_out"]["kernel"] + p["conf_out"]["bias"])[0]


def np_adaptive(p, h1, h_prev, m_prev, a, mask, *, min_steps, max_steps, epsilon):
  """Eqs. 8-15 for one example, halting with a ``break``."""
  ps = [0.0 if min_steps > 0 else _np_confidence(p, h1)]
  betas, hs, ms = [ps[0]], [h1], [m_prev]
  remaining = 1.0 - ps[0]
  n_t = 0
  if remaining >= epsilon:
    h, m = h_prev, m_prev
    for n in range(1, max_steps + 1):
      h, m = _np_attention_step(p, "adaptive", h1, h, m, a, mask)
      p_n = 0.0 if n < min_steps else _np_confidence(p, h)
      betas.append(p_n * remaining)
      remaining *= 1.0 - p_n
      ps.append(p_n)
      hs.append(h)
      ms.append(m)
      n_t = n
      if remaining < epsilon:
        break
  beta = np.array(betas) / np.sum(betas)
  h2 = sum(b * x for b, x in zip(beta, hs))
  m2 = sum(b * x for b, x in zip(beta, ms))
  cost = n_t + sum(n * (1.0 - p_n) for n, p_n in enumerate(ps))  # eq. 14
  return h2, m2, n_t, np.array(ps), beta, cost


def np_fixed(p, kind, steps, h1, h, m, a, mask):
  for _ in range(steps):
    h, m = _np_attention_step(p, kind, h1, h, m, a, mask)
  return h, m


# ----------------------------------------------------------------------------------------------
# Helpers.


def _inputs(seed=0, batch=B):
  rng = np.random.default_rng(seed)
  h1, h, m = (rng.normal(size=(batch, D)).astype(np.float32) for _ in range(3))
  a = rng.normal(size=(batch, N, D)).astype(np.float32)
  mask = np.ones((batch, N), bool)
  mask[1, 3:] = False  # a padded image
  mask[2, 1:] = False
  return h1, h, m, a, mask


def _full(mdl, h1, h, m, a, mask):
  k, v = mdl.project_kv(a)
  return mdl(h1, h, m, k, v, mask)


@functools.partial(_jit, static_argnums=0)
def _init_params(mod, key, inputs):
  return mod.init(key, *inputs, method=_full)["params"]


def _init_attention(kind, seed=0, **kw):
  mod = AATAttention(D, H, kind, **kw)
  return mod, _init_params(mod, jax.random.key(seed), _inputs()), _full


@functools.partial(_jit, static_argnums=0)
def _apply(mod, params, inputs):
  return mod.apply({"params": params}, *inputs, method=_full)


def _run(mod, params, full, inputs):
  del full
  return _apply(mod, params, tuple(jnp.asarray(x) for x in inputs))


def _np_params(params):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), params)


def _tiny_batch(seed=0, b=2, s=2, t=6, v=23):
  rng = np.random.default_rng(seed)
  batch = {"feats": rng.normal(size=(b, N, 10)).astype(np.float32),
           "feats_mask": np.ones((b, N), bool)}
  batch["feats_mask"][0, 4:] = False
  caps = rng.integers(4, v, size=(b, s, t)).astype(np.int32)
  return batch, shift_right(jnp.asarray(caps))


# ----------------------------------------------------------------------------------------------
# The adaptive module against the NumPy loop.


@pytest.mark.parametrize("min_steps", [0, 2])
def test_adaptive_matches_numpy_loop_with_mixed_halting(min_steps):
  epsilon = 0.05
  mod, params, full = _init_attention("adaptive", min_steps=min_steps, max_steps=4, epsilon=epsilon)
  # Sharpen the confidence network so that confidences spread over (0, 1) and the examples
  # of the batch halt at different steps.
  params = copy.deepcopy(jax.tree.map(np.asarray, params))
  params["conf_out"]["kernel"] = params["conf_out"]["kernel"] * 6.0
  params["conf_out"]["bias"] = np.full_like(params["conf_out"]["bias"], 0.5)
  inputs = _inputs(seed=1)
  h2, m2, aux = _run(mod, params, full, inputs)
  p64 = _np_params(params)
  steps = []
  for i in range(B):
    ex = [np.asarray(x[i], np.float64) for x in inputs]
    rh2, rm2, rn, rp, rbeta, rcost = np_adaptive(p64, *ex, min_steps=min_steps, max_steps=4,
                                                 epsilon=epsilon)
    steps.append(rn)
    np.testing.assert_allclose(h2[i], rh2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(m2[i], rm2, rtol=1e-4, atol=1e-4)
    assert int(aux["attention_steps"][i]) == rn
    np.testing.assert_allclose(aux["confidences"][i, : rn + 1], rp, atol=1e-5)
    np.testing.assert_array_equal(aux["confidences"][i, rn + 1:], 0.0)
    np.testing.assert_allclose(aux["beta"][i, : rn + 1], rbeta, atol=1e-5)
    np.testing.assert_array_equal(aux["beta"][i, rn + 1:], 0.0)
    np.testing.assert_allclose(aux["time_cost"][i], rcost, rtol=1e-5)
  # The case the test is about: examples that halt at different steps, some before M_max.
  assert len(set(steps)) >= 2 and min(steps) < 4, steps
  assert min(steps) >= min_steps


def test_adaptive_paper_epsilon_runs_to_max_steps_with_untrained_weights():
  # With epsilon = 1e-4 and p near 0.5, prod(1 - p) never drops below epsilon in 4 steps.
  mod, params, full = _init_attention("adaptive", max_steps=4, epsilon=1e-4)
  inputs = _inputs(seed=2)
  h2, _, aux = _run(mod, params, full, inputs)
  p64 = _np_params(params)
  for i in range(B):
    rh2, _, rn, _, _, rcost = np_adaptive(p64, *[np.asarray(x[i], np.float64) for x in inputs],
                                          min_steps=0, max_steps=4, epsilon=1e-4)
    assert rn == int(aux["attention_steps"][i]) == 4
    np.testing.assert_allclose(h2[i], rh2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(aux["time_cost"][i], rcost, rtol=1e-5)


@pytest.mark.parametrize("kind,steps", [("base", 1), ("recurrent", 3)])
def test_fixed_modes_match_numpy(kind, steps):
  mod, params, full = _init_attention(kind, **({"steps": steps} if kind == "recurrent" else {}))
  inputs = _inputs(seed=3)
  h2, m2, aux = _run(mod, params, full, inputs)
  p64 = _np_params(params)
  for i in range(B):
    rh2, rm2 = np_fixed(p64, kind, steps, *[np.asarray(x[i], np.float64) for x in inputs])
    np.testing.assert_allclose(h2[i], rh2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(m2[i], rm2, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(aux["attention_steps"], steps)
  np.testing.assert_array_equal(aux["beta"][:, -1], 1.0)


# ----------------------------------------------------------------------------------------------
# Special cases (section 3.2.4).


def test_min_max_one_equals_base_with_the_same_weights():
  base, p_base, full = _init_attention("base", seed=4)
  ada, p_ada, _ = _init_attention("adaptive", seed=5, min_steps=1, max_steps=1)
  p_ada = dict(jax.tree.map(np.asarray, p_ada))
  for name in ("mha", "lstm", "norm_h", "norm_m"):
    p_ada[name] = jax.tree.map(np.asarray, p_base[name])
  # Base's query is h1 itself (eq. 6): W_q = [I; 0], b_q = 0 makes eq. 8 give the same query.
  p_ada["query"] = {"kernel": np.concatenate([np.eye(D), np.zeros((D, D))]).astype(np.float32),
                    "bias": np.zeros(D, np.float32)}
  inputs = _inputs(seed=6)
  hb, mb, _ = _run(base, p_base, full, inputs)
  ha, ma, aux = _run(ada, p_ada, full, inputs)
  np.testing.assert_allclose(ha, hb, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ma, mb, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(aux["attention_steps"], 1)


@pytest.mark.parametrize("m_r", [3])
def test_min_eq_max_equals_recurrent_with_the_same_weights(m_r):
  rec, p_rec, full = _init_attention("recurrent", seed=7, steps=m_r)
  ada, p_ada, _ = _init_attention("adaptive", seed=8, min_steps=m_r, max_steps=m_r)
  p_ada = dict(p_ada)
  p_ada.update(p_rec)  # the confidence network stays random: its p must not matter
  inputs = _inputs(seed=9)
  hr, mr, _ = _run(rec, p_rec, full, inputs)
  ha, ma, aux = _run(ada, p_ada, full, inputs)
  np.testing.assert_allclose(ha, hr, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ma, mr, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(aux["attention_steps"], m_r)


@pytest.mark.parametrize("bias,min_steps,epsilon", [
    (0.0, 0, 1e-4), (0.0, 0, 0.05), (30.0, 0, 0.05), (-30.0, 0, 0.05), (30.0, 2, 0.05),
    (-30.0, 2, 0.05), (3.0, 2, 0.05)])
def test_beta_sums_to_one_steps_bounded_and_cost_is_eq14(bias, min_steps, epsilon):
  max_steps = 4  # the modules of the tests above: their compiled code is reused
  mod, params, full = _init_attention("adaptive", min_steps=min_steps, max_steps=max_steps,
                                      epsilon=epsilon)
  params = dict(params)
  params["conf_out"] = {"kernel": params["conf_out"]["kernel"],
                        "bias": jnp.full_like(params["conf_out"]["bias"], bias)}
  _, _, aux = _run(mod, params, full, _inputs(seed=10))
  n_t = np.asarray(aux["attention_steps"])
  assert np.all((n_t >= min_steps) & (n_t <= max_steps))
  np.testing.assert_allclose(np.asarray(aux["beta"]).sum(-1), 1.0, rtol=1e-5)
  assert np.all(np.asarray(aux["beta"]) >= 0)
  # Eq. 14 from the returned confidences (zero beyond N(t); 1 - p = 1 at forced slots).
  p = np.asarray(aux["confidences"], np.float64)
  n = np.arange(max_steps + 1)
  taken = n[None] <= n_t[:, None]
  np.testing.assert_allclose(aux["time_cost"], n_t + np.sum(np.where(taken, n * (1 - p), 0), -1),
                             rtol=1e-5)
  if bias == 30.0:
    np.testing.assert_array_equal(n_t, min_steps)  # p ~ 1 from the first unforced step on
  if bias == -30.0:
    np.testing.assert_array_equal(n_t, max_steps)


@functools.partial(_jit, static_argnums=0)
def _grad(mod, params, inputs):
  def loss(p):
    h2, m2, aux = mod.apply({"params": p}, *inputs, method=_full)
    return jnp.sum(h2 ** 2) + jnp.sum(m2) + 1e-2 * jnp.sum(aux["time_cost"])
  return jax.grad(loss)(params)


@pytest.mark.parametrize("min_steps", [0, 2])
def test_gradients_finite_when_confidence_saturates(min_steps):
  mod, params, _ = _init_attention("adaptive", min_steps=min_steps, max_steps=4, epsilon=0.05)
  inputs = tuple(jnp.asarray(x) for x in _inputs(seed=11))
  for bias in (40.0, -40.0, 17.0, -17.0):
    p = dict(params)
    p["conf_out"] = {"kernel": params["conf_out"]["kernel"],
                     "bias": jnp.full_like(params["conf_out"]["bias"], bias)}
    leaves = jax.tree.leaves(_grad(mod, p, inputs))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves), bias
    if not (bias > 0 and min_steps == 0):  # else p_0 = 1: c_t = h1_t, nothing to learn here
      assert any(float(jnp.abs(g).max()) > 0 for g in leaves), bias


# ----------------------------------------------------------------------------------------------
# The captioner: decode_step loop vs decode_train, causality, aux, decoding.


def _model(attention="adaptive", **kw):
  kw.setdefault("dropout", 0.0)
  return AATCaptioner(vocab_size=23, dim=D, num_heads=H, attention=attention, **kw)


@functools.partial(_jit, static_argnums=(0, 4))
def _train_logits(model, params, batch, tokens, train=False, rngs=None):
  return model.apply(params, batch, tokens, train=train, rngs=rngs)


@functools.partial(_jit, static_argnums=0)
def _decode_step(model, params, enc, cache, tokens, t):
  return model.apply(params, enc, cache, tokens, t, method="decode_step")


_MODELS = {"adaptive": ("adaptive", dict(epsilon=0.3, time_cost_weight=0.5)),
           "adaptive_ln": ("adaptive", dict(epsilon=0.3, time_cost_weight=0.5, norm_h1=True)),
           "recurrent": ("recurrent", dict(steps=2)), "base": ("base", {})}


@functools.lru_cache(maxsize=None)
def _model_and_params(key):
  attention, kw = _MODELS[key]
  model = _model(attention, **kw)
  batch, tokens = _tiny_batch()
  params = _jit(model.init)(jax.random.key(0), batch, tokens)
  return model, params


@pytest.mark.parametrize("key", ["adaptive", "adaptive_ln", "recurrent", "base"])
def test_decode_step_loop_equals_decode_train(key):
  model, params = _model_and_params(key)
  attention = model.attention
  batch, tokens = _tiny_batch()
  b, s, t = tokens.shape
  logits, aux = _train_logits(model, params, batch, tokens)
  assert logits.shape == (b, s, t, 23) and logits.dtype == jnp.float32
  assert aux["extra_loss"].shape == (b * s, t)
  enc = model.apply(params, batch, method="encode")
  enc = jax.tree.map(lambda x: jnp.repeat(x, s, axis=0), enc)
  cache = model.apply(params, enc, t, method="init_cache")
  for i in range(t):
    lg, cache, a = _decode_step(model, params, enc, cache, tokens.reshape(b * s, t)[:, i], jnp.int32(i))
    np.testing.assert_allclose(lg, logits.reshape(b * s, t, -1)[:, i], rtol=1e-5, atol=1e-5)
    for key in ("extra_loss", "attention_steps", "confidences", "beta"):
      np.testing.assert_allclose(a[key], aux[key][:, i], rtol=1e-5, atol=1e-6)
  slots = np.arange(aux["beta"].shape[-1])
  if attention == "adaptive":
    assert len(np.unique(aux["attention_steps"])) >= 2  # words that halt at different steps
    n_t = aux["attention_steps"][..., None]
    cost = aux["attention_steps"] + np.sum(np.where(slots <= n_t, slots * (1 - aux["confidences"]), 0), -1)
    np.testing.assert_allclose(aux["extra_loss"], 0.5 * cost, rtol=1e-5)
  else:
    np.testing.assert_array_equal(aux["extra_loss"], 0.0)


def test_norm_h1_normalises_the_input_module_output():
  """``norm_h1`` (the released code's LayerNorm on h1): the h1 carried in the cache, which is
  also what the attention module receives, has zero mean and unit variance per row."""
  batch, tokens = _tiny_batch()
  for key, norm_h1 in (("adaptive", False), ("adaptive_ln", True)):
    model, params = _model_and_params(key)
    assert ("norm1" in params["params"]) == norm_h1
    enc = model.apply(params, batch, method="encode")
    cache = model.apply(params, enc, tokens.shape[-1], method="init_cache")
    _, cache, _ = _decode_step(model, params, enc, cache, tokens[:, 0, 0], jnp.int32(0))
    h1 = np.asarray(cache["h1"], np.float64)
    normalised = np.allclose(h1.mean(-1), 0, atol=1e-4) and np.allclose(h1.std(-1), 1, atol=1e-2)
    assert normalised == norm_h1


def test_causality():
  model, params = _model_and_params("adaptive")
  batch, tokens = _tiny_batch()
  logits, _ = _train_logits(model, params, batch, tokens)
  cut = 3
  changed = tokens.at[..., cut:].set((tokens[..., cut:] + 5) % 23)
  logits2, _ = _train_logits(model, params, batch, changed)
  np.testing.assert_allclose(logits2[..., :cut, :], logits[..., :cut, :], rtol=1e-6, atol=1e-6)
  assert float(jnp.abs(logits2[..., cut:, :] - logits[..., cut:, :]).max()) > 1e-4


def test_padding_regions_are_ignored():
  model, params = _model_and_params("adaptive")
  batch, tokens = _tiny_batch()
  logits, _ = _train_logits(model, params, batch, tokens)
  other = dict(batch, feats=np.where(batch["feats_mask"][..., None], batch["feats"], 99.0))
  logits2, _ = _train_logits(model, params, other, tokens)
  np.testing.assert_allclose(logits2, logits, rtol=1e-5, atol=1e-5)


def test_dropout_uses_the_dropout_stream():
  model = _model("base", dropout=0.5)
  batch, tokens = _tiny_batch()
  params = _jit(model.init)(jax.random.key(0), batch, tokens)
  run = lambda key: _train_logits(model, params, batch, tokens, True, {"dropout": key})[0]
  a, b = run(jax.random.key(1)), run(jax.random.key(2))
  assert float(jnp.abs(a - b).max()) > 1e-3
  np.testing.assert_array_equal(run(jax.random.key(1)), a)


def test_greedy_decoding_returns_attention_steps():
  decoding = pytest.importorskip("jaxcap.decoding")
  model, params = _model_and_params("adaptive")
  batch, _ = _tiny_batch()
  out = decoding.greedy(model, params, batch, max_len=5, return_aux=True)
  assert out.tokens.shape == (2, 5)
  n_t = np.asarray(out.aux["attention_steps"])
  assert n_t.shape == (2, 5) and np.all((n_t >= 0) & (n_t <= 4))
  assert out.aux["confidences"].shape == out.aux["beta"].shape == (2, 5, 5)


@pytest.mark.slow
def test_beam_search_runs():
  decoding = pytest.importorskip("jaxcap.decoding")
  model, params = _model_and_params("adaptive")
  batch, _ = _tiny_batch()
  beam = decoding.beam_search(model, params, batch, beam_size=3, max_len=5, return_aux=True)
  assert beam.tokens.shape == (2, 3, 5)
  assert bool(jnp.all(jnp.isfinite(beam.scores[:, 0])))
  assert beam.aux["attention_steps"].shape == (2, 3, 5)


@pytest.mark.parametrize("arg,attention,steps", [
    ("synthetic", "adaptive", 4), ("synthetic,attention=base", "base", 1),
    ("synthetic,attention=recurrent,steps=4", "recurrent", 4), ("coco", "adaptive", 4)])
def test_configs_build(arg, attention, steps):
  from configs import aat as aat_config
  cfg = aat_config.get_config(arg)
  assert cfg.model.name == "aat" and cfg.model.attention == attention
  info = {"vocab_size": 30, "max_len": 16, "feature_dim": 8}
  model = registry.build(cfg.model, info)
  assert isinstance(model, AATCaptioner)
  assert model.num_slots == steps + 1
  if arg == "coco":
    assert (model.dim, model.epsilon, model.time_cost_weight, model.min_steps, model.max_steps) == (
        1024, 1e-4, 1e-4, 0, 4)
    assert cfg.batch_size == 10 and cfg.learning_rate == 1e-4 and cfg.scst.learning_rate == 1e-5


@pytest.mark.parametrize("field,value", [("attention", "sparse"), ("min_steps", 5), ("num_heads", 3),
                                         ("epsilon", 0.0), ("dropout", 1.0), ("steps", 0),
                                         ("norm_h1", "yes")])
def test_bad_config_is_a_one_line_value_error(field, value):
  import ml_collections
  cfg = ml_collections.ConfigDict({"name": "aat", "dim": 16, "num_heads": 4, field: value})
  with pytest.raises(ValueError, match=f"model.{field}"):
    registry.build(cfg, {"vocab_size": 30, "max_len": 16})


# ----------------------------------------------------------------------------------------------
# scripts/plot_attention_steps.py: the PNG writer and the figure.


def _plot_module():
  import importlib.util
  from pathlib import Path
  path = Path(__file__).resolve().parents[2] / "scripts" / "plot_attention_steps.py"
  spec = importlib.util.spec_from_file_location("plot_attention_steps", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _decode_png(data: bytes) -> np.ndarray:
  """An independent reader for the subset written (8-bit RGB, one IDAT, filter 0)."""
  import struct
  import zlib
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  pos, chunks = 8, {}
  while pos < len(data):
    (length,) = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
    assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
    chunks[kind] = body
    pos += 12 + length
  w, h, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
  assert (depth, color) == (8, 2)
  raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(h, 1 + 3 * w)
  assert np.all(raw[:, 0] == 0)
  return raw[:, 1:].reshape(h, w, 3)


def test_png_writer_round_trips(tmp_path):
  plot = _plot_module()
  img = np.random.default_rng(0).integers(0, 256, size=(7, 11, 3)).astype(np.uint8)
  path = str(tmp_path / "x.png")
  plot.write_png(path, img)
  with open(path, "rb") as f:
    np.testing.assert_array_equal(_decode_png(f.read()), img)
  with pytest.raises(ValueError, match="png_bytes"):
    plot.png_bytes(img[..., 0])


def test_render_draws_one_box_per_taken_step():
  plot = _plot_module()
  steps = np.array([0, 2, 4])
  conf = np.zeros((3, 5))
  beta = np.zeros((3, 5))
  for t, n in enumerate(steps):
    beta[t, : n + 1] = 1.0 / (n + 1)
    conf[t, : n + 1] = 0.5
  img = plot.render(["a", "red", "<eos>"], steps, conf, beta, title="a red", scale=1)
  orange = np.all(img == plot.ORANGE, axis=-1)
  blue = np.all(img == plot.BLUE, axis=-1)
  # Outlines: each row has one orange box, and N(t) blue boxes; count box top-left corners.
  corner = lambda m: int(np.sum(m[1:, 1:] & ~m[:-1, 1:] & ~m[1:, :-1] & m[1:, 1:]))
  assert corner(orange) == 3
  assert corner(blue) == int(steps.sum())
  with pytest.raises(ValueError, match="render"):
    plot.render(["a"], steps, conf, beta)
