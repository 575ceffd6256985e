"""model.vocab_pad_multiple: the output layer's product at an aligned width is the same model
(parameters, logits, gradients, cached decoding, greedy and beam captions), and it does pad."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap import decoding
from jaxcap.models import layers, registry
from jaxcap.models.base import shift_right
from tests.models.test_transformer import B, F, N, T, V, make_batch


def build(name="transformer", **kw):
  cfg = ml_collections.ConfigDict(dict(name=name, dim=32, num_layers=1, num_dec_layers=2, num_heads=4,
                                       ff_dim=48, dropout=0.0, **kw))
  return registry.build(cfg, {"vocab_size": V, "max_len": T - 1, "feature_dim": F})


def eta_batch():
  batch = make_batch(3)
  batch["attributes"] = np.random.RandomState(1).randint(4, V, (B, 5)).astype(np.int32)
  return batch


@pytest.mark.parametrize("n, multiple", [(23, 8), (23, 128), (256, 128), (5, 1)])
def test_padded_dot_equals_dot_general(n, multiple):
  r = np.random.RandomState(n)
  x, w = r.randn(2, 3, 16).astype(np.float32), r.randn(16, n).astype(np.float32)
  dims = (((2,), (0,)), ((), ()))
  np.testing.assert_allclose(layers.PaddedDot(multiple)(x, w, dims), jax.lax.dot_general(x, w, dims),
                             rtol=1e-6, atol=1e-6)
  assert layers.PaddedDot(multiple) == layers.PaddedDot(multiple)
  assert hash(layers.PaddedDot(multiple)) == hash(layers.PaddedDot(multiple))


def _output_widths(model, params, batch, tokens):
  """Which of V and 128 are the last dimension of a dot_general's result."""
  jaxpr = jax.make_jaxpr(lambda p: model.apply(p, batch, tokens)[0])(params)
  return {e.outvars[0].aval.shape[-1] for e in jaxpr.eqns if e.primitive.name == "dot_general"
          and e.outvars[0].aval.shape[-1] in (V, 128)}


@pytest.mark.parametrize("name, kw, batch_fn", [
    ("transformer", {}, make_batch),
    ("transformer", {"share_embeddings": True}, make_batch),
    pytest.param("transformer", {"dtype": "bfloat16"}, make_batch, marks=pytest.mark.slow),
    pytest.param("eta", {}, eta_batch, marks=pytest.mark.slow),
    ("eta", {"variant": "late_fusion", "share_embeddings": True}, eta_batch),
])
@pytest.mark.slow
def test_padded_output_layer_is_the_same_model(name, kw, batch_fn):
  plain, padded = build(name, **kw), build(name, vocab_pad_multiple=128, **kw)
  batch = batch_fn()
  tokens = shift_right(batch["captions"])
  params = plain.init(jax.random.PRNGKey(0), batch, tokens)
  padded_params = padded.init(jax.random.PRNGKey(0), batch, tokens)
  # The same parameters (names, shapes and initial values): checkpoints are interchangeable.
  assert jax.tree.structure(params) == jax.tree.structure(padded_params)
  for a, c in zip(jax.tree.leaves(params), jax.tree.leaves(padded_params)):
    np.testing.assert_array_equal(a, c)
  # It pads: the logits' product is 128 wide (only V wide without the switch).
  assert _output_widths(padded, params, batch, tokens) == {128}
  assert _output_widths(plain, params, batch, tokens) == {V}

  tol = dict(rtol=2e-2, atol=2e-2) if kw.get("dtype") == "bfloat16" else dict(rtol=1e-5, atol=1e-5)
  out = [m.apply(params, batch, tokens)[0] for m in (plain, padded)]
  assert out[1].shape == out[0].shape and out[1].dtype == jnp.float32
  np.testing.assert_allclose(out[1], out[0], **tol)
  w = jax.random.normal(jax.random.PRNGKey(6), tokens.shape + (V,))
  grads = [jax.grad(lambda p, m=m: jnp.sum(w * jax.nn.log_softmax(m.apply(p, batch, tokens)[0])))(params)
           for m in (plain, padded)]
  for (path, a), c in zip(jax.tree_util.tree_leaves_with_path(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(c, a, err_msg=jax.tree_util.keystr(path), **tol)
  if kw.get("dtype") == "bfloat16":
    return
  for search in (lambda m: decoding.greedy(m, params, batch, max_len=T - 1),
                 lambda m: decoding.beam_search(m, params, batch, beam_size=3, max_len=T - 1)):
    a, c = search(plain), search(padded)
    np.testing.assert_array_equal(c.tokens, a.tokens)
    np.testing.assert_allclose(c.scores, a.scores, rtol=1e-5, atol=1e-5)


def test_bad_pad_multiple_is_a_one_line_error():
  with pytest.raises(ValueError, match="vocab_pad_multiple") as e:
    build(vocab_pad_multiple=0)
  assert "\n" not in str(e.value)
