"""config.dropout_bits: masks from 16- or 8-bit draws keep their rate (binomial bounds), are
independent within a 32-bit word, keep the expectation, keep the per-image key layout, and
leave evaluation and the 32-bit default untouched."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.training import dropout, steps, train_lib, validation
from tests.models.test_transformer import make_batch
from tests.training.test_train import tiny_config

N = 1 << 21  # mask elements per draw


def within_binomial(count, n, p, z=5.0):
  return abs(count - n * p) <= z * np.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("rate", [0.1, 0.125, 0.3])
def test_keep_rate_within_binomial_bounds(bits, rate):
  mask, keep = dropout.keep_mask(jax.random.PRNGKey(bits), rate, (N,), bits)
  assert keep == dropout.keep_threshold(rate, bits) / 2 ** bits
  assert abs(keep - (1 - rate)) <= 2.0 ** -(bits + 1)  # the nearest multiple of 2**-bits
  count = int(np.asarray(mask).sum())
  assert within_binomial(count, N, keep)
  if bits == 16 or rate == 0.125:  # the configured rate itself is within the bounds
    assert within_binomial(count, N, 1 - rate)


@pytest.mark.parametrize("bits", [16, 8])
def test_rates_that_round_to_0_or_1_keep_or_drop_everything(bits):
  # The threshold of a rate below 2**-(bits+1) is 2**bits, which a k-bit integer cannot hold.
  tiny, huge = 2.0 ** -(bits + 2), 1 - 2.0 ** -(bits + 2)
  mask, keep = dropout.keep_mask(jax.random.PRNGKey(0), tiny, (4096,), bits)
  assert keep == 1.0 and bool(np.asarray(mask).all())
  x = jnp.linspace(1.0, 2.0, 4096).reshape(64, 64)
  for rate, want in ((tiny, x), (huge, jnp.zeros_like(x))):
    f = dropout.with_dropout_bits(
        lambda x: Drop(rate).apply({}, x, True, rngs={"dropout": jax.random.PRNGKey(1)}), bits)
    np.testing.assert_array_equal(jax.jit(f)(x), want)
    grad = jax.grad(lambda x: f(x).sum())(x)
    np.testing.assert_array_equal(grad, (want != 0).astype(np.float32))


@pytest.mark.parametrize("bits", [16, 8])
def test_draws_sharing_a_word_are_independent(bits):
  # Elements 0..32/bits-1 of each word: every pair of positions agrees as often as two
  # independent Bernoulli(keep) draws do, and each position alone keeps at the rate.
  per_word = 32 // bits
  mask, keep = dropout.keep_mask(jax.random.PRNGKey(7), 0.3, (N,), bits)
  m = np.asarray(mask).reshape(-1, per_word)
  for i in range(per_word):
    assert within_binomial(m[:, i].sum(), len(m), keep)
    for j in range(i + 1, per_word):
      both = int((m[:, i] & m[:, j]).sum())
      assert within_binomial(both, len(m), keep * keep), (i, j)


class Drop(nn.Module):
  rate: float

  @nn.compact
  def __call__(self, x, train):
    return nn.Dropout(self.rate)(x, deterministic=not train)


@pytest.mark.parametrize("bits", [16, 8])
def test_dropout_layer_keeps_the_expectation_and_uses_the_layer_key(bits):
  x = jnp.ones((512, 1024))
  plain = lambda key: Drop(0.3).apply({}, x, True, rngs={"dropout": key})
  cheap = jax.jit(dropout.with_dropout_bits(plain, bits))
  y = np.asarray(cheap(jax.random.PRNGKey(0)))
  keep = dropout.keep_threshold(0.3, bits) / 2 ** bits
  assert set(np.unique(y)) == {0.0, np.float32(1 / keep)}
  assert abs(y.mean() - 1.0) < 5 * np.sqrt((1 - keep) / keep / y.size)
  # Other keys, other masks; the same key, the same mask; not flax's mask.
  assert not np.array_equal(y, np.asarray(cheap(jax.random.PRNGKey(1))))
  np.testing.assert_array_equal(y, np.asarray(cheap(jax.random.PRNGKey(0))))
  assert not np.array_equal(y != 0, np.asarray(plain(jax.random.PRNGKey(0))) != 0)
  # Evaluation is untouched, and 32 bits is flax's own layer.
  evaluate = dropout.with_dropout_bits(lambda: Drop(0.3).apply({}, x, False), bits)
  np.testing.assert_array_equal(evaluate(), x)
  assert dropout.with_dropout_bits(plain, 32) is plain


@pytest.mark.slow
def test_the_model_keeps_its_per_image_key_layout():
  # A training forward pass through steps.map_examples: each image's masks come from its own
  # index, so permuting the batch permutes the logits.
  import ml_collections
  cfg = ml_collections.ConfigDict(dict(name="transformer", dim=32, num_layers=1, num_dec_layers=1,
                                       num_heads=4, ff_dim=48, dropout=0.3))
  model = registry.build(cfg, {"vocab_size": 23, "max_len": 6, "feature_dim": 12})
  batch = make_batch()
  batch["image_index"] = np.array([4, 9, 2], np.int32)
  params = model.init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"]))

  def logits(b):
    one = lambda ex, key: model.apply(params, ex, shift_right(ex["captions"]), train=True,
                                      rngs={"dropout": key})[0][0]
    return steps.map_examples(one, b, jax.random.PRNGKey(5))

  f = jax.jit(dropout.with_dropout_bits(logits, 8))
  perm = np.array([2, 0, 1])
  out = np.asarray(f(batch))
  np.testing.assert_allclose(np.asarray(f(jax.tree.map(lambda a: a[perm], batch))), out[perm], rtol=1e-6)
  assert not np.allclose(out, np.asarray(jax.jit(logits)(batch)))  # the switch is in the program


@pytest.mark.slow
def test_training_with_8_bit_masks(tmp_path):
  config = tiny_config(num_train_steps=3, dropout_bits=8, **{"model.dropout": 0.3})
  validation.check_config(config)
  state = train_lib.Trainer(config, str(tmp_path / "b8"), dataset=None).fit()
  assert int(state.step) == 3 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))


def test_bad_dropout_bits_is_a_one_line_error():
  with pytest.raises(ValueError, match="dropout_bits") as e:
    validation.check_config(tiny_config(dropout_bits=12))
  assert "\n" not in str(e.value)
