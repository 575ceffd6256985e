"""jaxcap.models.layers: the embedding (gathered in float32 then cast) and the attention products."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.models import layers


def _params(vocab=7, dim=16):
  return nn.Embed(vocab, dim).init(jax.random.PRNGKey(0), jnp.zeros((1,), jnp.int32))


def test_the_same_rows_as_flax_in_every_dtype():
  params = _params()
  tokens = jnp.asarray([[0, 3, 3, 6], [1, 2, 5, 0]], jnp.int32)
  for dtype in (jnp.float32, jnp.bfloat16, None):
    ours = layers.Embed(7, 16, dtype=dtype).apply(params, tokens)
    flax_ = nn.Embed(7, 16, dtype=dtype).apply(params, tokens)
    assert ours.dtype == flax_.dtype
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(flax_, np.float32))


def test_bfloat16_gradient_accumulates_a_frequent_row_in_float32():
  # 4,096 uses of one word (a padding or common token): its row's gradient is their sum
  params = _params()
  tokens = jnp.zeros((4096,), jnp.int32)
  cot = jax.random.uniform(jax.random.PRNGKey(1), (4096, 16), minval=0.5, maxval=1.5).astype(jnp.bfloat16)
  exact = np.asarray(cot, np.float64).sum(0)

  def grad(module):
    f = lambda p: jnp.sum(module.apply(p, tokens).astype(jnp.float32) * cot.astype(jnp.float32))
    return np.asarray(jax.grad(f)(params)["params"]["embedding"][0], np.float64)

  ours = np.abs(grad(layers.Embed(7, 16, dtype=jnp.bfloat16)) / exact - 1).max()
  flax_ = np.abs(grad(nn.Embed(7, 16, dtype=jnp.bfloat16)) / exact - 1).max()
  assert ours < 1e-5, ours          # float32 accumulation of 4,096 terms
  assert flax_ > 1e-3, flax_        # bfloat16 accumulation: what the subclass avoids


@pytest.mark.parametrize("b, l", [(1, 1), (3, 1), (3, 2)])
def test_query_key_and_weighted_values_are_the_batched_products(b, l):
  # One query of several rows takes the CPU's product-and-sum form; the values are the einsums'.
  rng = np.random.default_rng(b + l)
  q = jnp.asarray(rng.normal(size=(b, l, 4, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(b, 7, 4, 8)), jnp.float32)
  w = jax.nn.softmax(jnp.asarray(rng.normal(size=(b, 4, l, 7)), jnp.float32), axis=-1)
  np.testing.assert_allclose(jax.jit(layers.query_key)(q, k), np.einsum("blhd,bmhd->bhlm", q, k),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jax.jit(layers.weighted_values)(w, k), np.einsum("bhlm,bmhd->blhd", w, k),
                             rtol=1e-5, atol=1e-5)
  # Shapes and dtypes as the einsums': [B, H, L, M] and [B, L, H, D]; bfloat16 in, bfloat16 out
  # (summed in float32).
  assert layers.query_key(q, k).shape == (b, 4, l, 7) and layers.weighted_values(w, k).shape == (b, l, 4, 8)
  bf = lambda x: x.astype(jnp.bfloat16)  # noqa: E731
  got = jax.jit(layers.weighted_values)(bf(w), bf(k))
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(got), np.einsum("bhlm,bmhd->blhd", np.float32(bf(w)), np.float32(bf(k))),
                             rtol=1e-2, atol=1e-2)
