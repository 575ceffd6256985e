"""Decoding past the training captions' length, for every registered model.

A model's data says its captions have at most ``max_len`` words (``INFO["max_len"]`` = 6 here);
decoding may ask for more (an imported self-critical.pytorch run decodes 20 steps after training
on 16-word captions; ``Run.caption(max_len=40)``). Every table a position indexes must then
cover the length asked: each model is stepped with ``decode_step`` for 3x its training length
along fixed tokens and compared, position by position, with teacher forcing of the same tokens
(which computes every position afresh). A position table of the training length read by a
clamped lookup (the Transformer's and ETA's, before) makes the late steps reuse the last
position's encoding: those positions differ (or teacher forcing refuses the length).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.data.vocab import BOS
from jaxcap.models import registry
from tests import papers
from tests.models import test_attention_aux as aux_cases
from tests.tiers import one_in_default

LONG = 3 * aux_cases.T  # steps decoded, 3x the training length

# The models without attention, which test_attention_aux has no case for (a paper's in its
# tests/papers/<paper>/shared_cases.py DECODE_LENGTH_CASES).
EXTRA = {
    "newfc": ("newfc", dict(hidden_dim=16, embed_dim=8, dropout=0.0)),
    **papers.collected("DECODE_LENGTH_CASES"),
}
CASES = {**aux_cases.CASES, **EXTRA}


@pytest.mark.paper_gate
def test_every_decoding_model_is_covered():
  names = {name for name, _ in CASES.values()}
  assert set(registry.names()) - names == {"nearest_neighbour"}  # retrieval: no decoder


@functools.lru_cache(maxsize=None)
def _model(case):
  if case in aux_cases.CASES:
    return aux_cases._model(case)  # pylint: disable=protected-access
  name, fields = EXTRA[case]
  model = registry.build(dict(fields, name=name), aux_cases.INFO)
  batch = jax.tree.map(jnp.asarray, aux_cases.BATCH)
  params = model.init({"params": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)}, batch,
                      jnp.full((aux_cases.B, 1, aux_cases.T), BOS, jnp.int32))
  return model, params


@pytest.mark.parametrize("case", one_in_default(sorted(CASES)))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_steps_past_the_training_length_equal_teacher_forcing(case):
  model, params = _model(case)
  batch = jax.tree.map(jnp.asarray, aux_cases.BATCH)
  rng = np.random.default_rng(0)
  fed_BxT = np.concatenate([np.full((aux_cases.B, 1), BOS), rng.integers(4, aux_cases.V, (aux_cases.B, LONG - 1))], 1)
  fed_BxT = jnp.asarray(fed_BxT, jnp.int32)

  @jax.jit
  def stepped(params):
    enc = model.apply(params, batch, method="encode")
    cache = model.apply(params, enc, LONG, method="init_cache")

    def body(cache, xs):
      tok_B, t = xs
      logits, cache, _ = model.apply(params, enc, cache, tok_B, t, method="decode_step")
      return cache, logits

    _, logits_TxBxV = jax.lax.scan(body, cache, (fed_BxT.T, jnp.arange(LONG, dtype=jnp.int32)))
    return jnp.moveaxis(logits_TxBxV, 0, 1)

  forced = jax.jit(lambda params: model.apply(params, batch, fed_BxT[:, None, :])[0][:, 0])
  step = np.asarray(jax.nn.log_softmax(stepped(params)))
  tf = np.asarray(jax.nn.log_softmax(forced(params)))
  for t in range(LONG):
    np.testing.assert_allclose(step[:, t], tf[:, t], rtol=2e-5, atol=2e-5, err_msg=f"{case} position {t}")
