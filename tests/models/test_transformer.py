"""The Transformer baseline and the shared layers against NumPy, causality, cache, masking."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap.models import layers, registry
from jaxcap.models.base import repeat_batch, shift_right

V, B, N, F, T = 23, 3, 5, 12, 7


def build(dropout=0.0, **kw):
  cfg = ml_collections.ConfigDict(dict(name="transformer", dim=32, num_layers=2, num_dec_layers=2,
                                       num_heads=4, ff_dim=48, dropout=dropout, **kw))
  return registry.build(cfg, {"vocab_size": V, "max_len": T - 1, "feature_dim": F})


def make_batch(seed=0):
  r = np.random.RandomState(seed)
  mask = np.ones((B, N), bool)
  mask[1, 3:] = False
  mask[2, 1:] = False
  return {"feats": r.randn(B, N, F).astype(np.float32), "feats_mask": mask,
          "captions": r.randint(4, V, (B, 2, T)).astype(np.int32)}


@pytest.fixture(scope="module")
def model_and_params():
  model, batch = build(), make_batch()
  params = model.init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"]))
  return model, params


def np_mha(p, q_in, kv_in, mask, heads):
  """MultiHead(Q, K, V) of Vaswani et al. in NumPy from the flax parameters."""
  q = np.einsum("bld,dhk->blhk", q_in, p["query"]["kernel"]) + p["query"]["bias"]
  k = np.einsum("bmd,dhk->bmhk", kv_in, p["key"]["kernel"])  # no key bias (the softmax cancels it)
  v = np.einsum("bmd,dhk->bmhk", kv_in, p["value"]["kernel"]) + p["value"]["bias"]
  s = np.einsum("blhk,bmhk->bhlm", q, k) / np.sqrt(q.shape[-1])
  s = np.where(mask[:, None], s, -1e9)
  w = np.exp(s - s.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  o = np.einsum("bhlm,bmhk->blhk", w, v)
  return np.einsum("blhk,hkd->bld", o, p["out"]["kernel"]) + p["out"]["bias"]


def test_multihead_attention_matches_numpy():
  r = np.random.RandomState(1)
  q_in, kv_in = r.randn(2, 3, 16).astype(np.float32), r.randn(2, 6, 16).astype(np.float32)
  mask = r.rand(2, 3, 6) > 0.3
  mask[..., 0] = True
  mha = layers.MultiHeadAttention(num_heads=4, dim=16)
  params = mha.init(jax.random.PRNGKey(0), q_in, kv_in, mask)
  got = mha.apply(params, q_in, kv_in, mask)
  p = jax.tree.map(np.asarray, params["params"])
  np.testing.assert_allclose(got, np_mha(p, q_in, kv_in, mask, 4), rtol=1e-4, atol=1e-5)


def test_sinusoidal_positions_match_the_formula():
  table = layers.sinusoidal_positions(10, 8)
  for pos in (0, 3, 9):
    for i in range(4):
      assert abs(table[pos, 2 * i] - np.sin(pos / 10000 ** (2 * i / 8))) < 1e-6
      assert abs(table[pos, 2 * i + 1] - np.cos(pos / 10000 ** (2 * i / 8))) < 1e-6


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_decoder_is_causal(model_and_params):
  model, params = model_and_params
  batch = make_batch()
  tokens = shift_right(batch["captions"])
  logits, _ = model.apply(params, batch, tokens)
  changed = tokens.at[:, :, 4:].set((tokens[:, :, 4:] + 5) % V)
  logits2, _ = model.apply(params, batch, changed)
  np.testing.assert_allclose(logits[:, :, :4], logits2[:, :, :4], atol=1e-5)
  assert np.abs(np.asarray(logits[:, :, 4:] - logits2[:, :, 4:])).max() > 1e-3


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_cached_decode_step_reproduces_teacher_forced_logits(model_and_params):
  model, params = model_and_params
  batch = make_batch()
  tokens = shift_right(batch["captions"])[:, 0]
  full, _ = model.apply(params, model.apply(params, batch, method="encode"), tokens, method="decode_train")
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, T, method="init_cache")
  step = jax.jit(lambda c, tok, t: model.apply(params, enc, c, tok, t, method="decode_step"))
  outs = []
  for t in range(T):
    logits, cache, _ = step(cache, tokens[:, t], jnp.int32(t))
    outs.append(logits)
  np.testing.assert_allclose(np.stack(outs, 1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_grouped_cross_attention_equals_repeating_the_image(model_and_params):
  """Training attends each image's S captions to one copy of its keys/values (group=S); it
  must give the logits and parameter gradients of the S-fold repeated encoding."""
  model, params = model_and_params
  batch = make_batch(3)
  tokens = shift_right(batch["captions"])
  b, s, t = tokens.shape

  def grouped(p):
    return model.apply(p, batch, tokens)[0]

  def repeated(p):
    enc = repeat_batch(model.apply(p, batch, method="encode"), s)
    return model.apply(p, enc, tokens.reshape(b * s, t), method="decode_train")[0].reshape(b, s, t, -1)

  np.testing.assert_allclose(grouped(params), repeated(params), rtol=1e-5, atol=1e-5)
  w = jax.random.normal(jax.random.PRNGKey(5), (b, s, t, V))
  g1 = jax.grad(lambda p: jnp.sum(w * jax.nn.log_softmax(grouped(p))))(params)
  g2 = jax.grad(lambda p: jnp.sum(w * jax.nn.log_softmax(repeated(p))))(params)
  for (path, a), c in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_padding_regions_do_not_change_the_output(model_and_params):
  model, params = model_and_params
  batch = make_batch()
  tokens = shift_right(batch["captions"])
  base, _ = model.apply(params, batch, tokens)
  noisy = dict(batch, feats=np.where(batch["feats_mask"][..., None], batch["feats"], 1e3).astype(np.float32))
  other, _ = model.apply(params, noisy, tokens)
  np.testing.assert_allclose(base, other, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bfloat16_compute_keeps_float32_params_and_logits():
  model, batch = build(dtype="bfloat16"), make_batch()
  tokens = shift_right(batch["captions"])
  params = model.init(jax.random.PRNGKey(0), batch, tokens)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  logits, _ = model.apply(params, batch, tokens)
  assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


def test_bad_dtype_is_a_one_line_error():
  with pytest.raises(ValueError, match="dtype"):
    build(dtype="float8")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_fused_attention_mha_matches_numpy():
  """attention_impl="xla" (jax.nn.dot_product_attention) computes the same MultiHead(Q, K, V)
  with a per-key mask (as lengths), a full mask and the causal mask, at odd lengths (padded
  by one row for cuDNN) and even ones."""
  r = np.random.RandomState(2)
  mha = layers.MultiHeadAttention(num_heads=4, dim=16, attention_impl="xla")
  params = mha.init(jax.random.PRNGKey(0), r.randn(2, 5, 16).astype(np.float32), r.randn(2, 7, 16).astype(np.float32))
  p = jax.tree.map(np.asarray, params["params"])
  for l, m in ((5, 7), (6, 6), (5, 5)):
    q, kv = r.randn(2, l, 16).astype(np.float32), r.randn(2, m, 16).astype(np.float32)
    key_mask = np.ones((2, 1, m), bool)
    key_mask[1, 0, m - 2:] = False
    np.testing.assert_allclose(mha.apply(params, q, kv, key_mask),
                               np_mha(p, q, kv, np.broadcast_to(key_mask, (2, l, m)), 4), rtol=1e-4, atol=1e-5)
    full = r.rand(2, l, m) > 0.4
    full[..., 0] = True
    np.testing.assert_allclose(mha.apply(params, q, kv, full), np_mha(p, q, kv, full, 4), rtol=1e-4, atol=1e-5)
    if l == m:
      causal = np.broadcast_to(np.tril(np.ones((l, l), bool))[None], (2, l, l))
      np.testing.assert_allclose(mha.apply(params, q, kv, None, is_causal=True), np_mha(p, q, kv, causal, 4),
                                 rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mha.apply(params, q, kv), np_mha(p, q, kv, np.ones((2, l, m), bool), 4),
                               rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="attention weights"):
    mha.apply(params, q, kv, key_mask, return_weights=True)
  no_keys = np.zeros((2, 1, m), bool)  # a filler image of a batch: finite, whatever its value
  assert np.isfinite(np.asarray(mha.apply(params, q, kv, no_keys))).all()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_cudnn_attention_traces_through_the_training_step_and_decoding(monkeypatch):
  """attention_impl="cudnn" cannot run without a GPU, but jax's cuDNN wrapper checks shapes and
  batches the kernel while tracing: the per-image vmapped training step (forward and backward),
  greedy and beam search trace with the cuDNN primitives in them, the checks for a GPU aside."""
  import functools
  import optax
  from jaxcap import decoding
  from jaxcap.training import steps
  fa = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
  for name in ("check_cudnn_version", "check_compute_capability", "is_cuda_compute_capability_equal"):
    if not hasattr(fa, name):
      pytest.skip(f"this jax's cuDNN wrapper has no {name}")
  monkeypatch.setattr(fa, "check_cudnn_version", lambda *a, **k: 91000)
  monkeypatch.setattr(fa, "check_compute_capability", lambda *a, **k: True)
  monkeypatch.setattr(fa, "is_cuda_compute_capability_equal", lambda *a, **k: False)
  model, batch = build(dtype="bfloat16", attention_impl="cudnn"), make_batch()
  params = build(dtype="bfloat16").init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"]))
  batch = dict(batch, valid=np.ones((B,), bool), image_index=np.arange(B, dtype=np.int32))
  tx = optax.adam(1e-4)
  step = functools.partial(steps.train_step, model=model, tx=tx)
  train = str(jax.make_jaxpr(step)(steps.create_state(params, tx, jax.random.PRNGKey(1)), batch))
  assert "dot_product_attention_fwd" in train and "dot_product_attention_bwd" in train
  images = {k: v for k, v in batch.items() if k != "captions"}
  for decode in (lambda p, b: decoding.greedy(model, p, b, max_len=T),
                 lambda p, b: decoding.beam_search(model, p, b, beam_size=2, max_len=T)):
    assert "dot_product_attention" in str(jax.make_jaxpr(decode)(params, images))


@pytest.mark.slow
def test_fused_attention_transformer_equals_einsum(model_and_params):
  """The whole Transformer with attention_impl="xla": the einsum model's parameters give the same
  teacher-forced logits and parameter gradients (no dropout), and the same cached decoding."""
  model, params = model_and_params
  fused = build(attention_impl="xla")
  batch = make_batch(4)
  tokens = shift_right(batch["captions"])
  np.testing.assert_allclose(fused.apply(params, batch, tokens)[0], model.apply(params, batch, tokens)[0],
                             rtol=1e-5, atol=1e-5)
  w = jax.random.normal(jax.random.PRNGKey(6), tokens.shape + (V,))
  grads = [jax.grad(lambda p, m=m: jnp.sum(w * jax.nn.log_softmax(m.apply(p, batch, tokens)[0])))(params)
           for m in (model, fused)]
  for (path, a), c in zip(jax.tree_util.tree_leaves_with_path(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))
  outs = []
  for m in (model, fused):
    enc = m.apply(params, batch, method="encode")
    cache = m.apply(params, enc, T, method="init_cache")
    step = []
    for t in range(3):
      logits, cache, _ = m.apply(params, enc, cache, tokens[:, 0, t], jnp.int32(t), method="decode_step")
      step.append(logits)
    outs.append(np.stack(step, 1))
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_fused_attention_keeps_every_other_dropout():
  """With dropout, attention_impl="xla" still drops out (the residual, FFN and embedding dropouts):
  its training logits differ from its deterministic ones."""
  model, batch = build(dropout=0.3, attention_impl="xla"), make_batch()
  tokens = shift_right(batch["captions"])
  params = model.init(jax.random.PRNGKey(0), batch, tokens)
  det, _ = model.apply(params, batch, tokens)
  drop, _ = model.apply(params, batch, tokens, train=True, rngs={"dropout": jax.random.PRNGKey(1)})
  assert np.abs(np.asarray(drop - det)).max() > 1e-2


def test_bad_attention_is_a_one_line_error():
  with pytest.raises(ValueError, match="attention_impl"):
    build(attention_impl="flash")
  with pytest.raises(ValueError, match="bfloat16"):
    build(attention_impl="cudnn")  # float32
