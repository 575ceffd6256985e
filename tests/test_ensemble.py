"""Tests of jaxcap.ensemble: several captioners decoded through one averaged distribution.

Two different tiny models share a vocabulary of V = 11: ``MarkovToy`` (a cache-based table
model, tests/test_decoding.py) and the recurrent LSTM captioner; one batch holds the inputs of
both. The NumPy reference is the definition (self-critical.pytorch's AttEnsemble): the
members' step distributions, each computed on its own (the LSTM by teacher forcing, which runs
``decode_train`` rather than ``decode_step``; the table model from its tables), are averaged as
probabilities and the ensemble's token log-probabilities must be the log of that mean.

Mutants tried on jaxcap/ensemble.py: averaging log-probabilities instead of probabilities
(fails test_step_logprobs_are_the_mean_of_member_probabilities[*], test_weights); averaging the
members' raw logits as if they were log-probabilities (the same tests); the weights ignored
(log c_m dropped: fails test_weights). Two mutants pass, as they should: with equal weights the
missing log(1/M), and weights divided by M instead of their sum, shift every log-probability
of a step by one constant, which the search's log_softmax removes (no output changes).
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxcap import decoding, ensemble
from jaxcap.data.vocab import EOS
from jaxcap.models import registry
from jaxcap.models.base import shift_right
from tests.test_decoding import (MarkovToy, banned, check_conventions, np_log_softmax, strip,
                                 toy_batch, toy_step_logprobs)

B, T, V, K = 4, 6, 11, 3
TOY = MarkovToy(tag=7)  # its own static argument: traces of test_decoding.py are not reused


@pytest.fixture(scope="module")
def members():
  """(lstm, lstm_vars, batch) with the toy's tables in the batch too."""
  cfg = ml_collections.ConfigDict({"name": "lstm", "hidden_dim": 16, "embed_dim": 8,
                                   "att_dim": 8, "dropout": 0.0})
  lstm = registry.build(cfg, {"vocab_size": V, "feature_dim": 6, "max_regions": 5})
  rng = np.random.default_rng(3)
  batch = {"feats": rng.normal(size=(B, 5, 6)).astype(np.float32),
           "feats_mask": np.ones((B, 5), bool), "image_index": np.arange(B, dtype=np.int32)}
  caps = rng.integers(4, V, size=(B, 1, T)).astype(np.int32)
  shapes = jax.eval_shape(lstm.init, jax.random.key(0), batch, shift_right(caps))
  variables = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.4, s.dtype), shapes)
  variables["params"]["out_proj"]["bias"] = variables["params"]["out_proj"]["bias"].at[EOS].add(1.0)
  batch.update(toy_batch(30, B, T, V, scale=1.0, eos_bias=-0.5))
  return lstm, variables, batch


def lstm_step_logprobs(lstm, variables, batch, tokens_BxSxT):
  """float64 ``[B, S, T, V]``: the LSTM's log p(. | prefix) by teacher forcing."""
  logits, _ = lstm.apply(variables, batch, shift_right(jnp.asarray(tokens_BxSxT)))
  return np_log_softmax(np.asarray(logits))


def reference_token_logprobs(members, tokens_BxSxT, weights=(1.0, 1.0)):
  """NumPy: log of the weighted mean of the toy's and the LSTM's probabilities of each token."""
  lstm, variables, batch = members
  lp_lstm = lstm_step_logprobs(lstm, variables, batch, tokens_BxSxT)
  c = np.asarray(weights, np.float64) / sum(weights)
  out = np.zeros(tokens_BxSxT.shape)
  for b, s in np.ndindex(*tokens_BxSxT.shape[:2]):
    seq = strip(tokens_BxSxT[b, s])
    for t, w in enumerate(seq):
      p = c[0] * np.exp(toy_step_logprobs(batch, b, seq, t)) + c[1] * np.exp(lp_lstm[b, s, t])
      out[b, s, t] = np.log(p[w])
  return out


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_ensemble_of_one_equals_the_model(members):
  lstm, variables, batch = members
  for cfg in ({"method": "greedy", "max_len": T},
              {"method": "beam", "beam_size": K, "max_len": T}):
    single = decoding.decode(lstm, variables, batch, cfg)
    ens = ensemble.ensemble_decode([lstm], [variables], batch, cfg)
    np.testing.assert_array_equal(ens.tokens, single.tokens)
    np.testing.assert_allclose(ens.token_logprobs, single.token_logprobs, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_ensemble_of_a_model_with_itself_equals_the_model(members):
  lstm, variables, batch = members
  cfg = {"method": "beam", "beam_size": K, "max_len": T}
  single = decoding.decode(lstm, variables, batch, cfg)
  ens = ensemble.ensemble_decode([lstm, lstm], [variables, variables], batch, cfg)
  np.testing.assert_array_equal(ens.tokens, single.tokens)
  np.testing.assert_allclose(ens.scores, single.scores, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("method,mode", [("greedy", None), ("beam", "live"),
                                         ("beam", "self_critical")])
def test_step_logprobs_are_the_mean_of_member_probabilities(members, method, mode):
  """Two different models: every token's log-prob is log(mean of the members' probabilities),
  which also shows each member's cache followed its beams; greedy takes the mixture's arg-max."""
  lstm, variables, batch = members
  cfg = {"method": method, "beam_size": K, "max_len": T, "beam_mode": mode or "live"}
  out = ensemble.ensemble_decode([TOY, lstm], [{}, variables], batch, cfg)
  check_conventions(out, T, V)
  tokens = np.asarray(out.tokens)
  tokens_BxSxT = tokens[:, None] if tokens.ndim == 2 else tokens
  expect = reference_token_logprobs(members, tokens_BxSxT)
  got = np.asarray(out.token_logprobs).reshape(tokens_BxSxT.shape)
  np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-5)
  assert (np.asarray(out.lengths) < T).any()
  if method == "greedy":
    lp_lstm = lstm_step_logprobs(lstm, variables, batch, tokens_BxSxT)
    for b in range(B):
      seq = strip(tokens[b])
      for t, w in enumerate(seq):
        p = 0.5 * np.exp(toy_step_logprobs(batch, b, seq, t)) + 0.5 * np.exp(lp_lstm[b, 0, t])
        p[banned(V, t)] = 0.0
        assert w == int(np.argmax(p)), (b, t)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_weights(members):
  lstm, variables, batch = members
  out = ensemble.ensemble_decode([TOY, lstm], [{}, variables], batch,
                                 {"method": "greedy", "max_len": T}, weights=(3.0, 1.0))
  tokens = np.asarray(out.tokens)[:, None]
  np.testing.assert_allclose(np.asarray(out.token_logprobs)[:, None],
                             reference_token_logprobs(members, tokens, (3.0, 1.0)),
                             rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="weights"):
    ensemble.Ensemble((TOY, lstm), (1.0,))


def test_vocabulary_checks(members):
  from jaxcap.data.vocab import Vocab
  lstm, variables, batch = members
  a = Vocab(["dog", "cat"])
  ensemble.check_same_vocab([a, Vocab(["dog", "cat"])], ["runs/a", "runs/b"])
  with pytest.raises(ValueError, match="runs/b has another vocabulary"):
    ensemble.check_same_vocab([a, Vocab(["cat", "dog"])], ["runs/a", "runs/b"])
  small = MarkovToy(tag=8)
  toy_b = dict(batch, **toy_batch(31, B, T, 9))  # a 9-word table beside the 11-word LSTM
  with pytest.raises(ValueError, match="vocabularies differ"):
    ensemble.ensemble_decode([small, lstm], [{}, variables], toy_b,
                             {"method": "greedy", "max_len": T})
