"""TPGN (jaxcap/papers/tpgn/model.py) against independent NumPy code written from the paper's eqs. 3-19.

The reference works one example at a time in float64 with ``np.tensordot`` per gate and builds
the d^2 x d^2 block-diagonal ``S_t`` explicitly (``np.kron``), so it shares nothing with the
model's batched einsums beyond the parameters it is fed. v̄ and every bias are set to random
non-zero values first, so that a missing centring or bias shows.

Mutants tried by hand (each made one test here fail, then was reverted):
  * sigmoid -> identity on the S subnet's input gate (``s_step``): S-step and whole-model tests fail;
  * tanh dropped on the U subnet's candidate ``g`` (``u_step``): U-step and whole-model tests fail;
  * ``- D_1 W_e x`` term deleted (``s_step``): S-step and whole-model tests fail;
  * ``- D_2 W_e x`` sign flipped to ``+`` (``u_step``): U-step and whole-model tests fail;
  * v̄ centring skipped in eq. 9 (``initial_state``): S_0 and whole-model tests fail;
  * ``unbind(cache["S"], u)`` (Ŝ_{t-1}) instead of Ŝ_t in ``_step``: whole-model and ablation tests fail;
  * u_t reshaped transposed in ``unbind`` (``"bij,bjk->bki"`` layout): block-diagonal test fails;
  * U subnet fed the new Ŝ_t instead of Ŝ_{t-1}: whole-model test fails;
  * ``b_u`` dropped from eq. 17: whole-model test fails;
  * role ablation zeroing the nearest-centroid *complement*: ablation test fails.

Mutant audit (each failed test_whole_teacher_forced_forward_matches_numpy, both cases):
  * tanh dropped on the S subnet's candidate g (``s_step``);
  * tanh dropped on u_t (eq. 17);
  * forget and input gates swapped in the S subnet's cell update.
decode_step is checked through its equality with teacher forcing on arbitrary tokens
(test_decode_step_loop_equals_teacher_forcing), which covers greedy steps.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.models import registry
from jaxcap.papers.tpgn import model as tpgn_lib
from jaxcap.models.base import shift_right
from jaxcap.papers.tpgn.model import TPGN

D, F, V = 3, 7, 13
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


# ----------------------------------------------------------------------------------------------
# NumPy reference (float64, one example at a time).


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_s_step(p, S_prev, c_prev, p_prev, e):
  """Eqs. 3-8 for one example: ``S_prev, c_prev [d, d]``, ``p_prev [d]``, ``e = W_e x [E]``."""
  pre = []
  for g in range(4):  # f, i, o, c
    z = (np.tensordot(p["W_1"][g], p_prev, axes=([2], [0]))          # W_1 p_{t-1}
         - np.tensordot(p["D_1"][g], e, axes=([2], [0]))             # - D_1 W_e x_{t-1}
         + np.tensordot(p["U_1"][g], S_prev, axes=([2, 3], [0, 1]))  # + U_1 Ŝ_{t-1}
         + p["b_1"][g])
    pre.append(z)
  f, i, o = _sigmoid(pre[0]), _sigmoid(pre[1]), _sigmoid(pre[2])
  g = np.tanh(pre[3])
  c = f * c_prev + i * g
  return o * np.tanh(c), c


def np_u_step(p, S_prev, c_prev, p_prev, e):
  """Eqs. 10-15 for one example: ``c_prev, p_prev [d]``."""
  pre = [S_prev @ p["w_2"][g] - p["D_2"][g] @ e + p["U_2"][g] @ p_prev + p["b_2"][g] for g in range(4)]
  f, i, o = _sigmoid(pre[0]), _sigmoid(pre[1]), _sigmoid(pre[2])
  g = np.tanh(pre[3])
  c = f * c_prev + i * g
  return o * np.tanh(c), c


def np_s0(p, v_bar, v):
  """Eq. 9 (+ its bias): ``C_s (v - v̄) + b_s``."""
  return np.tensordot(p["C_s"], v - v_bar, axes=([2], [0])) + p["b_s"]


def np_block_diag(S_hat):
  """The paper's ``S_t``: d copies of Ŝ_t along the diagonal, d^2 x d^2."""
  return np.kron(np.eye(S_hat.shape[0]), S_hat)


def np_forward(variables, v, tokens, *, lexical="learned", zero_centroids=None, zero_k=-1):
  """Teacher-forced logits ``[T, V]`` (and ``u [T, d^2]``) of one caption, eqs. 3-19."""
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), variables["params"])
  consts = jax.tree.map(lambda x: np.asarray(x, np.float64), variables["constants"])
  W_e = p["embedding"] if "embedding" in p else consts["embedding"]  # [V, E], rows are words
  W_x = W_e if lexical == "tied" else p["W_x"]
  d = p["b_s"].shape[0]
  S = np_s0(p, consts["feat_mean"], np.asarray(v, np.float64))
  c1, pv, c2 = np.zeros((d, d)), np.zeros(d), np.zeros(d)
  logits, us = [], []
  for x in tokens:
    e = W_e[int(x)]
    S_new, c1 = np_s_step(p, S, c1, pv, e)
    p_new, c2 = np_u_step(p, S, c2, pv, e)
    u = np.tanh(p["W_u"] @ p_new + p["b_u"])  # eq. 17
    if zero_k >= 0:
      k = np.argmin(((zero_centroids - u) ** 2).sum(-1))
      if k == zero_k:
        u = np.zeros_like(u)
    f = np_block_diag(S_new) @ u  # eq. 16
    logits.append(W_x @ f + p["b_x"])  # eq. 18 (softmax in the loss)
    us.append(u)
    S, pv = S_new, p_new
  return np.stack(logits), np.stack(us)


# ----------------------------------------------------------------------------------------------
# Helpers.


def _tiny_batch(seed=0, b=2, s=2, t=5):
  rng = np.random.default_rng(seed)
  batch = {"global_feat": rng.normal(size=(b, F)).astype(np.float32)}
  caps = rng.integers(4, V, size=(b, s, t)).astype(np.int32)
  return batch, shift_right(jnp.asarray(caps))


def _randomise(variables, seed=1, scale=0.5):
  """Every bias and v̄ random and non-zero; weights scaled up so gates leave their linear range."""
  rng = np.random.default_rng(seed)
  out = {}
  for coll, tree in variables.items():
    out[coll] = {}
    for name, x in tree.items():
      x = np.asarray(x)
      if name.startswith("b_") or name == "feat_mean":
        x = rng.normal(scale=scale, size=x.shape)
      else:
        x = x * 1.5
      out[coll][name] = jnp.asarray(x, jnp.float32)
  return out


@functools.lru_cache(maxsize=None)
def _model_and_vars(lexical="learned", train_embedding=True, zero=-1):
  model = TPGN(vocab_size=V, feature_dim=F, d=D, lexical=lexical, train_embedding=train_embedding,
               zero_role_cluster=zero)
  batch, tokens = _tiny_batch()
  variables = _jit(model.init)(jax.random.key(0), batch, tokens)
  return model, _randomise(variables)


@functools.partial(_jit, static_argnums=0)
def _logits(model, variables, batch, tokens):
  return model.apply(variables, batch, tokens)


@functools.partial(_jit, static_argnums=0)
def _decode_step(model, variables, enc, cache, tokens, t):
  return model.apply(variables, enc, cache, tokens, t, method="decode_step")


def _np_vars(variables):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), variables)


# ----------------------------------------------------------------------------------------------
# One step of each subnet, eq. 9 and eq. 16.


def _random_state(rng, b=4, d=D, e=D):
  return (rng.normal(size=(b, d, d)), rng.normal(size=(b, d, d)), rng.normal(size=(b, d)),
          rng.normal(size=(b, d)), rng.normal(size=(b, e)))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_s_step_matches_numpy_with_biases():
  model, variables = _model_and_vars()
  S, c1, p, _, e = (np.asarray(x, np.float32) for x in _random_state(np.random.default_rng(2)))
  got_S, got_c = model.apply(variables, S, c1, p, e, method="s_step")
  ref = _np_vars(variables)["params"]
  for i in range(S.shape[0]):
    rS, rc = np_s_step(ref, *(np.asarray(x[i], np.float64) for x in (S, c1, p, e)))
    np.testing.assert_allclose(got_S[i], rS, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_c[i], rc, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_u_step_matches_numpy_with_biases():
  model, variables = _model_and_vars()
  S, _, p, c2, e = (np.asarray(x, np.float32) for x in _random_state(np.random.default_rng(3)))
  got_p, got_c = model.apply(variables, S, c2, p, e, method="u_step")
  ref = _np_vars(variables)["params"]
  for i in range(S.shape[0]):
    rp, rc = np_u_step(ref, *(np.asarray(x[i], np.float64) for x in (S, c2, p, e)))
    np.testing.assert_allclose(got_p[i], rp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_c[i], rc, rtol=1e-5, atol=1e-5)


def test_initial_state_is_eq9_centred_on_the_stored_mean():
  model, variables = _model_and_vars()
  batch, _ = _tiny_batch(seed=4)
  enc = model.apply(variables, batch, method="encode")
  ref = _np_vars(variables)
  for i in range(2):
    want = np_s0(ref["params"], ref["constants"]["feat_mean"], batch["global_feat"][i].astype(np.float64))
    np.testing.assert_allclose(enc["S0"][i], want, rtol=1e-5, atol=1e-5)
  # An image equal to v̄ starts from the bias alone.
  at_mean = {"global_feat": np.asarray(variables["constants"]["feat_mean"])[None]}
  np.testing.assert_allclose(model.apply(variables, at_mean, method="encode")["S0"][0],
                             variables["params"]["b_s"], atol=1e-6)


@pytest.mark.parametrize("d", [2, 4])
def test_reshaped_unbinding_equals_the_block_diagonal_product(d):
  rng = np.random.default_rng(d)
  S = rng.normal(size=(3, d, d))
  u = rng.normal(size=(3, d * d))
  got = np.asarray(tpgn_lib.unbind(jnp.asarray(S), jnp.asarray(u)))
  for i in range(3):
    np.testing.assert_allclose(got[i], np_block_diag(S[i]) @ u[i], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# The whole model.


@pytest.mark.parametrize("lexical,train_embedding", [("learned", True), ("tied", False)])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_whole_teacher_forced_forward_matches_numpy(lexical, train_embedding):
  model, variables = _model_and_vars(lexical, train_embedding)
  assert ("embedding" in variables["params"]) == train_embedding
  assert ("W_x" in variables["params"]) == (lexical == "learned")
  batch, tokens = _tiny_batch(seed=5)
  logits, aux = _logits(model, variables, batch, tokens)
  b, s, t = tokens.shape
  assert logits.shape == (b, s, t, V) and logits.dtype == jnp.float32
  assert aux["unbinding"].shape == (b * s, t, D * D)
  for i in range(b):
    for j in range(s):
      want, want_u = np_forward(variables, batch["global_feat"][i], np.asarray(tokens[i, j]), lexical=lexical)
      np.testing.assert_allclose(logits[i, j], want, rtol=1e-4, atol=1e-4)
      np.testing.assert_allclose(aux["unbinding"][i * s + j], want_u, rtol=1e-5, atol=1e-5)


def test_decode_step_loop_equals_teacher_forcing():
  model, variables = _model_and_vars()
  batch, tokens = _tiny_batch(seed=6)
  b, s, t = tokens.shape
  logits, aux = _logits(model, variables, batch, tokens)
  enc = jax.tree.map(lambda x: jnp.repeat(x, s, axis=0), model.apply(variables, batch, method="encode"))
  cache = model.apply(variables, enc, t, method="init_cache")
  flat = tokens.reshape(b * s, t)
  for i in range(t):
    lg, cache, a = _decode_step(model, variables, enc, cache, flat[:, i], jnp.int32(i))
    np.testing.assert_allclose(lg, logits.reshape(b * s, t, -1)[:, i], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a["unbinding"], aux["unbinding"][:, i], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_gradients_finite_and_constants_get_none():
  model, variables = _model_and_vars("learned", False)
  batch, tokens = _tiny_batch(seed=7)

  @_jit
  def grad(v):
    return jax.grad(lambda v: jnp.sum(model.apply(v, batch, tokens)[0] ** 2))(v)

  g = grad(variables)
  for name, x in g["params"].items():
    assert bool(jnp.all(jnp.isfinite(x))), name
    assert float(jnp.abs(x).max()) > 0, name
  for name, x in g["constants"].items():  # v̄ and the fixed W_e are read through stop_gradient
    np.testing.assert_array_equal(x, 0.0)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_optimizer_never_moves_the_constants_even_with_weight_decay():
  import ml_collections
  from jaxcap import config_common as common
  from jaxcap.training import optim
  cfg = common.base_config("synthetic")
  cfg.weight_decay = 0.1
  cfg.schedule = "constant"
  cfg.learning_rate = 0.1
  tx, _ = optim.make_optimizer(cfg, 10, frozen_collections=TPGN.frozen_collections)
  _, variables = _model_and_vars()
  grads = jax.tree.map(jnp.ones_like, variables)
  updates, _ = tx.update(grads, tx.init(variables), variables)
  np.testing.assert_array_equal(updates["constants"]["feat_mean"], 0.0)
  assert float(jnp.abs(updates["params"]["U_1"]).max()) > 0
  assert isinstance(cfg, ml_collections.ConfigDict)


def test_role_cluster_ablation_zeroes_u_for_that_cluster():
  model, variables = _model_and_vars()
  batch, tokens = _tiny_batch(seed=8)
  _, aux = _logits(model, variables, batch, tokens)
  u = np.asarray(aux["unbinding"]).reshape(-1, D * D)
  # Two centroids: the first word's u of caption 0 and the mean of the rest; cluster 0 is small.
  centroids = np.stack([u[0], u[1:].mean(0)]).astype(np.float32)
  ablated = TPGN(vocab_size=V, feature_dim=F, d=D, zero_role_cluster=0)
  av = tpgn_lib.with_role_centroids(variables, centroids)
  logits, aux2 = _logits(ablated, av, batch, tokens)
  b, s, t = tokens.shape
  hits = 0
  for i in range(b):
    for j in range(s):
      want, want_u = np_forward(av, batch["global_feat"][i], np.asarray(tokens[i, j]),
                                zero_centroids=centroids.astype(np.float64), zero_k=0)
      np.testing.assert_allclose(logits[i, j], want, rtol=1e-4, atol=1e-4)
      hits += int(np.sum(np.all(want_u == 0, -1)))
  assert 0 < hits < b * s * t  # some words ablated, not all
  # A zeroed u leaves only the lexical bias.
  zero_rows = np.all(np.asarray(aux2["unbinding"]) == 0, -1).reshape(b, s, t)
  np.testing.assert_allclose(np.asarray(logits)[zero_rows],
                             np.broadcast_to(variables["params"]["b_x"], (int(zero_rows.sum()), V)), atol=1e-6)
  # Off (-1) ignores the collection: equals the unablated model.
  base, _ = _logits(model, variables, batch, tokens)
  off, _ = _logits(model, av, batch, tokens)
  np.testing.assert_array_equal(off, base)
  with pytest.raises(ValueError, match="ablation"):
    ablated.apply(variables, batch, tokens)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_greedy_and_beam_search_through_the_shared_decoder():
  from jaxcap import decoding
  model, variables = _model_and_vars()
  batch, _ = _tiny_batch(seed=9)
  out = decoding.greedy(model, variables, batch, max_len=5, return_aux=True)
  assert out.tokens.shape == (2, 5) and out.aux["unbinding"].shape == (2, 5, D * D)
  beam = decoding.beam_search(model, variables, batch, beam_size=3, max_len=5)
  assert beam.tokens.shape == (2, 3, 5)
  assert bool(jnp.all(jnp.isfinite(beam.scores[:, 0])))
  # K=1 beam search is greedy decoding in self-critical.pytorch's mode (the default "live" mode
  # also keeps a finished caption beside its one live beam, so it may find a likelier one).
  one = decoding.beam_search(model, variables, batch, beam_size=1, max_len=5, beam_mode="self_critical")
  np.testing.assert_array_equal(one.tokens[:, 0], out.tokens)


# ----------------------------------------------------------------------------------------------
# v̄ from the training split, GloVe, configs.


def test_prepare_variables_stores_the_training_mean(tiny_synthetic):
  info = dict(tiny_synthetic.info)
  model = TPGN(vocab_size=info["vocab_size"], feature_dim=info["global_dim"], d=2)
  from jaxcap.data import pipeline
  batch = next(iter(pipeline.eval_batches(tiny_synthetic.split("train"), 8, num_threads=0)))
  variables = _jit(model.init)(jax.random.key(0), {"global_feat": batch["global_feat"]},
                               shift_right(jnp.asarray(batch["captions"])))
  np.testing.assert_array_equal(variables["constants"]["feat_mean"], 0.0)
  out = model.prepare_variables(jax.device_get(variables), tiny_synthetic)
  src = tiny_synthetic.split("train")
  want = np.mean([np.asarray(src[i]["global_feat"], np.float64) for i in range(len(src))], 0)
  np.testing.assert_allclose(out["constants"]["feat_mean"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out["params"]["U_1"], variables["params"]["U_1"])


def test_prepare_variables_loads_a_fixed_glove_embedding(tiny_synthetic, tmp_path):
  path = tmp_path / "glove.txt"
  path.write_text("red 1 2\ncircle 3 5\nzebra 7 7\n")
  info = dict(tiny_synthetic.info)
  model = TPGN(vocab_size=info["vocab_size"], feature_dim=info["global_dim"], d=2,
               glove_path=str(path), train_embedding=False)
  variables = _jit(model.init)(jax.random.key(0), {"global_feat": np.zeros((2, info["global_dim"]), np.float32)},
                               jnp.zeros((2, 1, 3), jnp.int32))
  assert "embedding" not in variables["params"]
  out = model.prepare_variables(jax.device_get(variables), tiny_synthetic)
  table = np.asarray(out["constants"]["embedding"])
  stoi = tiny_synthetic.vocab.stoi
  np.testing.assert_allclose(table[stoi["circle"]] - table[stoi["red"]], [2, 3], atol=1e-5)
  np.testing.assert_allclose(table.mean(0), 0.0, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_synthetic():
  from jaxcap import config_common as common
  from jaxcap import data as data_lib
  d = common.data_config("synthetic")
  d.num_train, d.num_val, d.num_test = 40, 8, 8
  return data_lib.get_dataset(d)


def test_load_glove_centres_and_fills_missing_words(tmp_path):
  path = tmp_path / "glove.txt"
  path.write_text("a 1 2 3\ncircle 3 2 1\nred 0 0 6\nunused 9 9 9\n")
  words = ["<pad>", "a", "circle", "red", "blue"]
  table = tpgn_lib.load_glove(str(path), words, 3)
  assert table.shape == (5, 3)
  np.testing.assert_allclose(table.mean(0), 0.0, atol=1e-6)
  np.testing.assert_allclose(table[1] - table[2], [-2, 0, 2], atol=1e-5)  # file vectors kept
  np.testing.assert_allclose(table[3] - table[1], [-1, -2, 3], atol=1e-5)
  with pytest.raises(ValueError, match="model.glove_path"):
    tpgn_lib.load_glove(str(path), words, 4)


@pytest.mark.parametrize("arg,d", [("synthetic", 16), ("flickr8k", 25), ("coco", 25),
                                   ("synthetic,d=25,lexical=tied", 25)])
def test_configs_build(arg, d):
  from jaxcap.papers.tpgn.configs import tpgn as tpgn_config
  cfg = tpgn_config.get_config(arg)
  model = registry.build(cfg.model, {"vocab_size": 30, "global_dim": 11, "feature_dim": 5})
  assert isinstance(model, TPGN) and model.d == d and model.feature_dim == 11
  if arg == "coco":
    assert model.lexical == "learned" and model.train_embedding and cfg.decode.beam_size == 3


@pytest.mark.parametrize("field,value", [("d", 0), ("lexical", "transposed"), ("dropout", 1.0),
                                         ("train_embedding", "no"), ("zero_role_cluster", -2),
                                         ("glove_path", 3)])
def test_bad_config_is_a_one_line_value_error(field, value):
  import ml_collections
  cfg = ml_collections.ConfigDict({"name": "tpgn", field: value})
  with pytest.raises(ValueError, match=f"model.{field}"):
    registry.build(cfg, {"vocab_size": 30, "global_dim": 8})


@pytest.mark.slow
def test_mean_feature_is_stored_once_and_survives_resume_and_weight_decay(tmp_path):
  """The trainer fills v̄ from the training split at the start, checkpoints it, and neither the
  optimiser (with weight decay) nor a resume changes it."""
  from jaxcap.papers.tpgn.configs import tpgn as tpgn_config
  from jaxcap.training import train_lib
  c = tpgn_config.get_config("synthetic")
  c.data.num_train, c.data.num_val, c.data.num_test = 96, 16, 16
  c.model.d, c.batch_size, c.eval_batch_size, c.eval_num_images = 3, 8, 8, 16
  c.num_train_steps, c.eval_every_steps, c.checkpoint_every_steps, c.log_every_steps = 2, 2, 2, 2
  c.weight_decay = 0.01
  c.test_after_training = False
  trainer = train_lib.Trainer(c, str(tmp_path))
  state = trainer.fit()
  src = trainer.dataset.split("train")
  want = np.mean([np.asarray(src[i]["global_feat"], np.float64) for i in range(len(src))], 0)
  np.testing.assert_allclose(state.params["constants"]["feat_mean"], want, rtol=1e-5, atol=1e-6)
  c.num_train_steps = 4
  resumed = train_lib.Trainer(c, str(tmp_path))
  state2 = resumed.fit()
  assert int(state2.step) == 4
  np.testing.assert_array_equal(state2.params["constants"]["feat_mean"], state.params["constants"]["feat_mean"])
  np.testing.assert_array_equal(resumed.load().params["constants"]["feat_mean"],
                                state.params["constants"]["feat_mean"])
