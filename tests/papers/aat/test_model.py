"""AAT (jaxcap/papers/aat/model.py) against independent NumPy implementations of section 3.

Two references, both fed the model's own parameters and written from the paper's equations:

* The attention module (eqs. 4-15): one example at a time with real halting (a Python
  ``break``) and the paper's product form of eqs. 11-15, so it shares nothing with the masked,
  log-space implementation beyond the weights (``np_adaptive``, ``np_fixed``).
* The whole model (``np_captioner``): the linear projection of the regions and their
  mean ``a_bar`` over the real regions (section 3.1), the input module (eq. 1, with
  ``c_{t-1} = h2_{t-1}``), the attention module, the output layer (eq. 2) and the time cost
  ``lambda L^a_t`` (eq. 14), one caption at a time from a zero state. It is compared with
  ``decode_train``'s logits and with the ``decode_step`` loop for base, recurrent with 2 and 4
  steps, adaptive with M_min = 0 and with M_min = 1 (words halting at different steps), and the
  released code's variant (every switch of the model docstring's deviations 1, 2, 4, 8 on).
  ``test_time_cost_enters_both_losses_as_eqs_16_and_17`` checks the training losses
  (``training/steps.py::xe_loss_fn``, ``training/scst.py``) against eqs. 16-17 built from the
  reference's log-probabilities and time costs.

Mutation check: each mutant was applied to the code by hand (a script replacing one
line, then restoring it), and the whole-model / module / loss tests were run with ``-x``;
the first failing test is listed (all 38 were caught; [k] = test_whole_model_matches_numpy_reference[k]).

  eq. 1's two inputs swapped ([a_bar + c, W_e y])          [adaptive]
  a_bar dropped from eq. 1                                 [adaptive]
  c_{t-1} dropped from eq. 1                               [adaptive]
  c_{t-1} taken from h1_{t-1} instead of h2_{t-1}          [adaptive]
  a_bar averaged over padded regions too                   [adaptive]
  ReLU after the feature projection                        [adaptive]
  ReLU on the word embedding always / never (switch)       [adaptive] / [released]
  LayerNorm on h1 ignored (norm_h1 switch)                 [released]
  output layer fed h1_t instead of c_t = h2_t              [adaptive]
  tanh before the output layer                             [adaptive]
  LSTM_2 fed [a_hat, q] instead of [a_hat, h1] (eq. 9)     [adaptive]
  LSTM_2's two inputs swapped                              [adaptive]
  LayerNorm_h dropped / LayerNorm_m dropped                [adaptive] / [adaptive]
  ReLU on the query of eq. 8                               [adaptive]
  eq. 8's query inputs swapped ([h2, h1])                  [adaptive]
  LayerNorm on the query ignored (norm_query switch)       [released]
  W^O never / always applied (attention_out_proj switch)   [adaptive] / [released]
  recurrent steps not chained (each from h2_{t-1})         [recurrent2]
  recurrent: one step fewer / capped at 2 steps            [recurrent2] / [recurrent4]
  base: query h2_{t-1} instead of h1_t (eq. 6)             [base]
  halting one step late (N(t) + 1)                         [adaptive]
  halting ignores epsilon (always M_max)                   [adaptive]
  halting on 1 - p_n instead of the product (eq. 11)       [adaptive]
  M_min ignored (p_0 not forced to 0)                      [adaptive_min1]
  beta not normalised                                      [adaptive]
  beta without the remaining mass prod (1 - p_n')          [adaptive]
  slot 0's memory zero instead of m2_{t-1} (eq. 13)        [adaptive]
  slot 0's hidden h2_{t-1} instead of h1_t (eq. 12)        [adaptive]
  time cost without N(t) / counting (n + 1)(1 - p_n)       [adaptive] / [adaptive]
  time cost not multiplied by lambda                       [adaptive]
  cross-entropy loss without the extra loss                test_time_cost_enters_both_losses_as_eqs_16_and_17
  extra loss averaged per caption instead of per word      test_time_cost_enters_both_losses_as_eqs_16_and_17
  SCST loss without the extra loss                         test_time_cost_enters_both_losses_as_eqs_16_and_17
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.models import registry
from jaxcap.papers.aat.model import AATAttention, AATCaptioner
from jaxcap.models.base import shift_right
from tests.models import np_cells
from tests.tiers import one_in_default

D, H, N, B = 16, 4, 6, 8

# These graphs are tiny and run once: XLA's backend optimisations would cost more compile time
# than they save.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


# ----------------------------------------------------------------------------------------------
# NumPy reference.


_sigmoid, _np_lstm = np_cells.sigmoid, np_cells.lstm


def _np_layer_norm(p, x, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _np_dense_heads(p, x):
  """``x W + b`` into heads; a projection without a bias (e.g. keys) adds none."""
  return np.einsum("...d,dhk->...hk", x, p["kernel"]) + p.get("bias", 0.0)


def _np_mha(p, q, a, mask, out_proj=True):
  """Eqs. 4-5 for one query vector ``q [D]`` over regions ``a [N, D]``: Concat(heads) W^O."""
  qh, kh, vh = _np_dense_heads(p["query"], q), _np_dense_heads(p["key"], a), _np_dense_heads(p["value"], a)
  logits = np.einsum("hk,nhk->hn", qh, kh) / np.sqrt(qh.shape[-1])
  logits = np.where(mask[None], logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  o = np.einsum("hn,nhk->hk", w, vh)
  if not out_proj:
    return o.reshape(-1)  # Concat(head_1, ..., head_h)
  return np.einsum("hk,hkd->d", o, p["out"]["kernel"]) + p["out"]["bias"]


def _np_attention_step(p, kind, h1, h, m, a, mask, norm_query=False, out_proj=True):
  q = h1 if kind == "base" else np.concatenate([h1, h]) @ p["query"]["kernel"] + p["query"]["bias"]
  if norm_query:
    q = _np_layer_norm(p["norm_q"], q)
  a_hat = _np_mha(p["mha"], q, a, mask, out_proj)  # eqs. 6 / 8
  h, m = _np_lstm(p["lstm"], np.concatenate([a_hat, h1]), h, m)  # eqs. 7 / 9
  return _np_layer_norm(p["norm_h"], h), _np_layer_norm(p["norm_m"], m)


def _np_confidence(p, x):  # eq. 10
  hid = np.maximum(0.0, x @ p["conf_hidden"]["kernel"] + p["conf_hidden"]["bias"])
  return _sigmoid(hid @ p["conf_out"]["kernel"] + p["conf_out"]["bias"])[0]


def np_adaptive(p, h1, h_prev, m_prev, a, mask, *, min_steps, max_steps, epsilon, **step_kw):
  """Eqs. 8-15 for one example, halting with a ``break``."""
  ps = [0.0 if min_steps > 0 else _np_confidence(p, h1)]
  betas, hs, ms = [ps[0]], [h1], [m_prev]
  remaining = 1.0 - ps[0]
  n_t = 0
  if remaining >= epsilon:
    h, m = h_prev, m_prev
    for n in range(1, max_steps + 1):
      h, m = _np_attention_step(p, "adaptive", h1, h, m, a, mask, **step_kw)
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


def np_fixed(p, kind, steps, h1, h, m, a, mask, **step_kw):
  for _ in range(steps):
    h, m = _np_attention_step(p, kind, h1, h, m, a, mask, **step_kw)
  return h, m


def np_project(p, feats, mask):
  """Section 3.1: ``A`` = the linear projection of the regions to d; ``a_bar`` = their mean
  over the k real regions."""
  a = feats @ p["feat_proj"]["kernel"] + p["feat_proj"]["bias"]
  return a, a[mask].mean(0)


def np_input_module(p, token, a_bar, c_prev, h1, m1, *, embed_relu=False, norm_h1=False):
  """Eq. 1: ``LSTM_1([W_e Pi_t, a_bar + c_{t-1}], (h1, m1))`` (+ the released code's options)."""
  e = p["embed"]["embedding"][token]
  if embed_relu:
    e = np.maximum(e, 0.0)
  h1, m1 = _np_lstm(p["lstm1"], np.concatenate([e, a_bar + c_prev]), h1, m1)
  if norm_h1:
    h1 = _np_layer_norm(p["norm1"], h1)
  return h1, m1


def np_output_module(p, c):
  """Eq. 2 before the softmax: ``W_p c_t + b_p``."""
  return c @ p["logits_proj"]["kernel"] + p["logits_proj"]["bias"]


def np_captioner(p, feats, mask, tokens, model):
  """The whole model for one caption (teacher forcing), from section 3's equations.

  Args:
    p: the captioner's float64 params; feats ``[N, F]``, mask ``[N]``, tokens ``[T]`` inputs.
    model: the :class:`AATCaptioner` whose hyper-parameters and switches to follow.

  Returns:
    ``(logits [T, V], extra [T] = lambda L^a_t (eq. 14; 0 unless adaptive), N(t) [T],
    beta [T, S])``.
  """
  a, a_bar = np_project(p, feats, mask)
  z = np.zeros(model.dim)
  h1, m1, h2, m2 = z, z, z, z  # c_0 = h2_0 = 0
  step_kw = dict(norm_query=model.norm_query, out_proj=model.attention_out_proj)
  core = p["core"]
  logits, extra, n_t, betas = [], [], [], []
  for token in tokens:
    # c_{t-1} = h2_{t-1}: the attention module's previous output (sections 3.2.1-3.2.3).
    h1, m1 = np_input_module(p, token, a_bar, h2, h1, m1, embed_relu=model.embed_relu,
                             norm_h1=model.norm_h1)
    if model.attention == "adaptive":
      h2, m2, n, _, beta, cost = np_adaptive(core, h1, h2, m2, a, mask, min_steps=model.min_steps,
                                             max_steps=model.max_steps, epsilon=model.epsilon,
                                             **step_kw)
      beta = np.pad(beta, (0, model.max_steps + 1 - len(beta)))
      extra.append(model.time_cost_weight * cost)
    else:
      n = 1 if model.attention == "base" else model.steps
      h2, m2 = np_fixed(core, model.attention, n, h1, h2, m2, a, mask, **step_kw)
      beta = np.eye(n + 1)[n]
      extra.append(0.0)
    logits.append(np_output_module(p, h2))  # c_t = h2_t
    n_t.append(n)
    betas.append(beta)
  return np.array(logits), np.array(extra), np.array(n_t), np.array(betas)


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
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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


@pytest.mark.slow
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


# Hyper-parameters of the whole-model tests. epsilon = 0.3 makes the random confidences halt
# words at different steps; lambda = 0.5 makes the time cost visible next to the
# cross-entropy. "released" turns on every switch for the released code's departures from the
# paper (model docstring, deviations 1, 2, 4, 8).
_MODELS = {
    "adaptive": ("adaptive", dict(epsilon=0.3, time_cost_weight=0.5)),
    "adaptive_min1": ("adaptive", dict(epsilon=0.3, time_cost_weight=0.5, min_steps=1)),
    "released": ("adaptive", dict(epsilon=0.3, time_cost_weight=0.5, norm_h1=True, norm_query=True,
                                  attention_out_proj=False, embed_relu=True)),
    "recurrent2": ("recurrent", dict(steps=2)),
    "recurrent4": ("recurrent", dict(steps=4)),
    "base": ("base", {}),
}


@functools.lru_cache(maxsize=None)
def _model_and_params(key):
  attention, kw = _MODELS[key]
  model = _model(attention, **kw)
  batch, tokens = _tiny_batch()
  params = _jit(model.init)(jax.random.key(0), batch, tokens)
  return model, params


def _reference(model, params, batch, tokens_BxSxT):
  """np_captioner for every caption: ``(logits [B*S, T, V], extra, N(t) [B*S, T], beta)``."""
  p64 = _np_params(params["params"])
  b, s, _ = tokens_BxSxT.shape
  feats, mask = np.asarray(batch["feats"], np.float64), np.asarray(batch["feats_mask"])
  tokens = np.asarray(tokens_BxSxT)
  outs = [np_captioner(p64, feats[i], mask[i], tokens[i, j], model) for i in range(b) for j in range(s)]
  return tuple(np.stack(x) for x in zip(*outs))


@pytest.mark.parametrize("key", one_in_default(list(_MODELS)))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_whole_model_matches_numpy_reference(key):
  """decode_train logits and the decode_step loop against np_captioner (section 3, eqs. 1-15),
  for base, recurrent with 2 and 4 steps, adaptive with M_min = 0 and 1, and the released
  code's variant."""
  model, params = _model_and_params(key)
  attention = model.attention
  batch, tokens = _tiny_batch()
  b, s, t = tokens.shape
  ref_logits, ref_extra, ref_steps, ref_beta = _reference(model, params, batch, tokens)
  logits, aux = _train_logits(model, params, batch, tokens)
  assert logits.shape == (b, s, t, 23) and logits.dtype == jnp.float32
  assert aux["extra_loss"].shape == (b * s, t)
  np.testing.assert_allclose(logits.reshape(b * s, t, -1), ref_logits, rtol=2e-4, atol=2e-4)
  np.testing.assert_array_equal(aux["attention_steps"], ref_steps)
  np.testing.assert_allclose(aux["beta"], ref_beta, atol=1e-5)
  np.testing.assert_allclose(aux["extra_loss"], ref_extra, rtol=1e-5, atol=1e-6)
  # decode_step, one word at a time from init_cache, gives the same words.
  enc = model.apply(params, batch, method="encode")
  enc = jax.tree.map(lambda x: jnp.repeat(x, s, axis=0), enc)
  cache = model.apply(params, enc, t, method="init_cache")
  for i in range(t):
    lg, cache, a = _decode_step(model, params, enc, cache, tokens.reshape(b * s, t)[:, i], jnp.int32(i))
    np.testing.assert_allclose(lg, ref_logits[:, i], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(lg, logits.reshape(b * s, t, -1)[:, i], rtol=1e-5, atol=1e-5)
    for name in ("extra_loss", "attention_steps", "confidences", "beta"):
      np.testing.assert_allclose(a[name], aux[name][:, i], rtol=1e-5, atol=1e-6)
  if attention == "adaptive":
    assert len(np.unique(ref_steps)) >= 2, ref_steps  # words that halt at different steps
    assert ref_steps.min() >= model.min_steps
  else:
    np.testing.assert_array_equal(aux["extra_loss"], 0.0)
  if model.min_steps == 1:  # eq. 15 with M_min = 1: p_0 = 0, so the non-visual step has no weight
    np.testing.assert_array_equal(aux["beta"][..., 0], 0.0)
    np.testing.assert_array_equal(aux["confidences"][..., 0], 0.0)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_input_output_modules_and_mean_one_step_from_a_random_state():
  """Eq. 1 (LSTM_1 on [W_e Pi_t, a_bar + c_{t-1}]), a_bar over the real regions only, and
  eq. 2 (W_p c_t + b_p) for one decode_step from a random (non-zero) state."""
  model, params = _model_and_params("adaptive")
  p64 = _np_params(params["params"])
  batch, tokens = _tiny_batch()
  batch = dict(batch, feats_mask=np.array([[True] * 4 + [False] * 2, [True] * 2 + [False] * 4]))
  enc = model.apply(params, batch, method="encode")
  enc = jax.tree.map(lambda x: jnp.repeat(x, 2, axis=0), enc)  # the 2 captions per image
  rng = np.random.default_rng(5)
  cache = {k: rng.normal(size=(4, D)).astype(np.float32) for k in ("h1", "m1", "h2", "m2")}
  toks = tokens.reshape(4, -1)[:, 2]
  logits, new, _ = _decode_step(model, params, enc, cache, toks, jnp.int32(2))
  for r in range(4):
    i = r // 2
    a, a_bar = np_project(p64, np.asarray(batch["feats"][i], np.float64), batch["feats_mask"][i])
    np.testing.assert_allclose(enc["mean"][r], a_bar, rtol=1e-5, atol=1e-5)
    h1, m1 = np_input_module(p64, int(toks[r]), a_bar, cache["h2"][r], cache["h1"][r], cache["m1"][r])
    np.testing.assert_allclose(new["h1"][r], h1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(new["m1"][r], m1, rtol=1e-4, atol=1e-5)
    h2, m2, *_ = np_adaptive(p64["core"], h1, cache["h2"][r], cache["m2"][r], a, batch["feats_mask"][i],
                             min_steps=0, max_steps=4, epsilon=model.epsilon)
    np.testing.assert_allclose(new["h2"][r], h2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new["m2"][r], m2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[r], np_output_module(p64, np.asarray(new["h2"][r], np.float64)),
                               rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# Eqs. 16-17: the time cost through the training losses.


@functools.partial(_jit, static_argnums=0)
def _train_losses(model, params, batch, samples, advantage):
  from jaxcap.training import scst, steps
  xe, metrics = steps.xe_loss_fn(params, model, batch, jax.random.key(0))
  logits, aux = scst.sample_logits(model, params, batch, samples, jax.random.key(1))
  rl, _ = scst.scst_loss(logits, samples.reshape(-1, samples.shape[-1]), advantage.reshape(-1),
                         aux["extra_loss"])
  return xe, metrics, rl


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_time_cost_enters_both_losses_as_eqs_16_and_17():
  """The cross-entropy step's loss is eq. 16 summed over the captions, and the SCST loss eq. 17
  (with eq. 18's gradient term), each divided by the token count: lambda weighs the time cost
  of every word against that word's log-likelihood, as the paper writes it."""
  from jaxcap.data.vocab import EOS, PAD
  model, params = _model_and_params("adaptive")
  lam = model.time_cost_weight
  batch, inputs = _tiny_batch()
  targets = np.concatenate([np.asarray(inputs)[..., 1:], np.full((2, 2, 1), EOS, np.int32)], -1)
  targets[0, 1, 3], targets[0, 1, 4:] = EOS, PAD  # a shorter caption: PAD targets do not count
  targets[1, 0, 5] = 7  # one that fills max_len without EOS
  samples = targets.copy()
  samples[1, 1, 2], samples[1, 1, 3:] = EOS, PAD
  advantage = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
  xe, metrics, rl = _train_losses(model, params, dict(batch, captions=targets), samples, advantage)

  def log_probs(tokens):  # NumPy teacher forcing on shift_right(tokens)
    logits, extra, _, _ = _reference(model, params, batch, shift_right(jnp.asarray(tokens)))
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    flat = tokens.reshape(4, -1)
    return np.take_along_axis(logp, flat[..., None], -1)[..., 0], extra, flat != PAD

  logp, extra, mask = log_probs(targets)
  # Eq. 16 per caption: -sum_t log p(y*_t) + lambda sum_t L^a_t, over the target words.
  eq16 = -np.sum(logp * mask, 1) + np.sum(extra * mask, 1)
  np.testing.assert_allclose(xe, eq16.sum() / mask.sum(), rtol=1e-4)
  np.testing.assert_allclose(metrics["extra_sum"], np.sum(extra * mask), rtol=1e-4)
  assert np.sum(extra * mask) > 0.1 * np.sum(-logp * mask)  # the time cost does matter here
  logp, extra, mask = log_probs(samples)
  # Eq. 17 with eq. 18's surrogate per sample: -(r - b) sum_t log p(w_t) + lambda sum_t L^a_t.
  eq17 = -advantage.reshape(-1) * np.sum(logp * mask, 1) + np.sum(extra * mask, 1)
  np.testing.assert_allclose(rl, eq17.sum() / mask.sum(), rtol=1e-4)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_causality():
  model, params = _model_and_params("adaptive")
  batch, tokens = _tiny_batch()
  logits, _ = _train_logits(model, params, batch, tokens)
  cut = 3
  changed = tokens.at[..., cut:].set((tokens[..., cut:] + 5) % 23)
  logits2, _ = _train_logits(model, params, batch, changed)
  np.testing.assert_allclose(logits2[..., :cut, :], logits[..., :cut, :], rtol=1e-6, atol=1e-6)
  assert float(jnp.abs(logits2[..., cut:, :] - logits[..., cut:, :]).max()) > 1e-4


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_padding_regions_are_ignored():
  model, params = _model_and_params("adaptive")
  batch, tokens = _tiny_batch()
  logits, _ = _train_logits(model, params, batch, tokens)
  other = dict(batch, feats=np.where(batch["feats_mask"][..., None], batch["feats"], 99.0))
  logits2, _ = _train_logits(model, params, other, tokens)
  np.testing.assert_allclose(logits2, logits, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_dropout_uses_the_dropout_stream():
  model = _model("base", dropout=0.5)
  batch, tokens = _tiny_batch()
  params = _jit(model.init)(jax.random.key(0), batch, tokens)
  run = lambda key: _train_logits(model, params, batch, tokens, True, {"dropout": key})[0]
  a, b = run(jax.random.key(1)), run(jax.random.key(2))
  assert float(jnp.abs(a - b).max()) > 1e-3
  np.testing.assert_array_equal(run(jax.random.key(1)), a)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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
    ("synthetic,attention=recurrent,steps=4", "recurrent", 4), ("coco", "adaptive", 4),
    ("synthetic,norm_h1=True,norm_query=True,attention_out_proj=False,embed_relu=True", "adaptive", 4)])
def test_configs_build(arg, attention, steps):
  from jaxcap.papers.aat.configs import aat as aat_config
  cfg = aat_config.get_config(arg)
  assert cfg.model.name == "aat" and cfg.model.attention == attention
  info = {"vocab_size": 30, "max_len": 16, "feature_dim": 8}
  model = registry.build(cfg.model, info)
  assert isinstance(model, AATCaptioner)
  assert model.num_slots == steps + 1
  released = "norm_query" in arg  # the released code's variants; otherwise the paper's reading
  assert (model.norm_h1, model.norm_query, model.attention_out_proj, model.embed_relu) == (
      released, released, not released, released)
  if arg == "coco":
    assert (model.dim, model.epsilon, model.time_cost_weight, model.min_steps, model.max_steps) == (
        1024, 1e-4, 1e-4, 0, 4)
    assert cfg.batch_size == 10 and cfg.learning_rate == 1e-4 and cfg.scst.learning_rate == 1e-5


@pytest.mark.parametrize("field,value", [("attention", "sparse"), ("min_steps", 5), ("num_heads", 3),
                                         ("epsilon", 0.0), ("dropout", 1.0), ("steps", 0),
                                         ("norm_h1", "yes"), ("norm_query", 1),
                                         ("attention_out_proj", "no"), ("embed_relu", None)])
def test_bad_config_is_a_one_line_value_error(field, value):
  import ml_collections
  cfg = ml_collections.ConfigDict({"name": "aat", "dim": 16, "num_heads": 4, field: value})
  with pytest.raises(ValueError, match=f"model.{field}"):
    registry.build(cfg, {"vocab_size": 30, "max_len": 16})
