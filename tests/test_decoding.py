"""Tests of jaxcap.decoding against exhaustive enumeration and a NumPy reference beam search.

Two decoders are used through the protocol only: ``MarkovToy``, a cache-based model (a token
history written at position t, as a Transformer's key/value cache) whose log-probabilities are
a known function of the previous two tokens and t, and the recurrent LSTM captioner.

Beam search is checked in both modes against ``reference_beam_search`` (plain Python, the
documented semantics), and the default ``"live"`` mode against ``t5x_reference`` (t5x's
``beam_search`` written from its definition: top 2K candidates, K live non-EOS ones, finished
ones only with EOS, live ones returned only when nothing finished) and against the
``"self_critical"`` mode on 144 random tables per beam size.

Mutants tried on jaxcap/decoding.py, each failing the tests named: live mode taking the top K
instead of 2K candidates (test_matches_reference_beam_search[*-live],
test_live_at_least_as_probable_as_t5x); the alive set not re-ranked after the finishers leave
(the first K of the 2K kept, finished slots dead: test_matches_reference_beam_search[*-live]);
the cache reordered by the parents of the first K of the 2K candidates instead of the alive
picks (test_matches_reference_beam_search[*-live]: MarkovToy reads its history from the cache).

``"in_slots"`` is checked against ``their_beam_search``, the M² authors' ``BeamSearch``
(aimagelab/meshed-memory-transformer, models/beam_search/beam_search.py) transcribed in NumPy
and stepping the model's ``decode_step`` by hand, on MarkovToy and on random tiny registered
models (lstm, transformer; the M² paper's tests add its model and their fixture). Mutant
tried: an ended slot dropped instead of proposing itself
(test_in_slots_equals_their_beam_search_toy).

Diverse beam search is checked against ``reference_diverse_beam_search`` (plain Python, the
paper's Hamming-diversity definition). Mutants tried, each failing the tests named: no penalty
(test_diverse_matches_reference[*], test_diversity_makes_groups_differ); the live mode counting
only alive beams, not the candidates that ended (test_diverse_matches_reference[live-*]);
finished hypotheses ranked by the true log-probability instead of the penalised sum
(test_diverse_matches_reference[*]); alive beams ranked by the true log-probability
(test_diverse_matches_reference[*]); group g penalised by group g-1's words only
(test_diverse_matches_reference[live-gnmt-6-3], the three-group case).
"""

import dataclasses
import functools
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxcap import decoding
from jaxcap.data.vocab import BOS, EOS, PAD, UNK
from jaxcap.models import registry
from jaxcap.models.base import CaptionModel, shift_right
from tests.tiers import one_in_default


class MarkovToy(CaptionModel):
  """logits[b] at step t = t1[b, t, prev] + t2[b, t, prev2], prev2 read back from the cache."""

  tag: int = 0  # Distinct tags are distinct static arguments: a fresh trace.

  trace_log = []  # (method, leading dim) per trace, to check where encode/decode_step run.

  def encode(self, batch, train=False):
    MarkovToy.trace_log.append(("encode", batch["t1"].shape[0]))
    return {"t1": batch["t1"], "t2": batch["t2"]}

  def init_cache(self, enc, max_len):
    return {"hist": jnp.full((enc["t1"].shape[0], max_len), BOS, jnp.int32)}

  def decode_step(self, enc, cache, tokens, t, train=False):
    MarkovToy.trace_log.append(("decode_step", enc["t1"].shape[0]))
    hist = jax.lax.dynamic_update_slice_in_dim(cache["hist"], tokens[:, None], t, axis=1)
    prev2 = jnp.where(t > 0, jnp.take(hist, jnp.maximum(t - 1, 0), axis=1), BOS)
    rows = jnp.arange(tokens.shape[0])
    t1 = jnp.take(enc["t1"], t, axis=1)  # [B, V, V]
    t2 = jnp.take(enc["t2"], t, axis=1)
    logits = t1[rows, tokens] + t2[rows, prev2]
    aux = {"prev": tokens, "prev2_onehot": jax.nn.one_hot(prev2, t1.shape[-1])}
    return logits, {"hist": hist}, aux


TOY = MarkovToy()
# Most tests use these shapes, so that they share compiled functions (compiling dominates).
B, T, V, K, NS = 4, 6, 8, 3, 2000


def toy_batch(seed, b, t, v, scale=2.0, eos_bias=0.0, unk_bias=0.0, special_bias=-3.0):
  rng = np.random.default_rng(seed)
  t1 = rng.normal(size=(b, t, v, v)).astype(np.float32) * scale
  t2 = rng.normal(size=(b, t, v, v)).astype(np.float32) * scale
  t1[..., EOS] += eos_bias
  t1[..., UNK] += unk_bias
  # PAD/BOS carry real probability mass in the model; the decoders must still never emit them.
  t1[..., PAD] += special_bias
  t1[..., BOS] += special_bias
  return {"t1": t1, "t2": t2}


def np_log_softmax(x):
  x = x.astype(np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def toy_step_logprobs(batch, b, words, t):
  """NumPy log p(. | image b, words[:t]) of MarkovToy."""
  inputs = [BOS] + list(words[:t])
  prev = inputs[t]
  prev2 = inputs[t - 1] if t > 0 else BOS
  return np_log_softmax(batch["t1"][b, t, prev] + batch["t2"][b, t, prev2])


def banned(v, t, min_len=0, suppress_unk=False):
  out = np.zeros(v, bool)
  out[[PAD, BOS]] = True
  if suppress_unk:
    out[UNK] = True
  if t < min_len:
    out[EOS] = True
  return out


def penalised(logp, length, kind, alpha):
  if kind == "none":
    return logp
  if kind == "gnmt":
    return logp / ((5.0 + length) / 6.0) ** alpha
  return logp / length


def enumerate_sequences(batch, b, v, max_len, min_len=0, suppress_unk=False):
  """Every decodable sequence: words then EOS within max_len steps, or max_len words."""
  words = [w for w in range(v) if w not in (PAD, BOS, EOS) and not (suppress_unk and w == UNK)]
  out = []
  for length in range(1, max_len + 1):
    for body in itertools.product(words, repeat=length - 1):
      endings = [EOS] + (words if length == max_len else [])
      for last in endings:
        seq = list(body) + [last]
        if last == EOS and length - 1 < min_len:
          continue
        lps = [toy_step_logprobs(batch, b, seq, t)[w] for t, w in enumerate(seq)]
        out.append((seq, np.array(lps)))
  return out


def reference_beam_search(batch, b, v, k, max_len, kind="none", alpha=0.6, min_len=0,
                          suppress_unk=False, block_trigrams=False, mode="live", bad_endings=()):
  """Plain-Python beam search with the semantics documented in jaxcap.decoding.

  ``mode="self_critical"``: the K best candidates, finishers included; ``"live"``: the 2K best,
  finishers leave, the K best of the rest stay alive.
  """
  alive = [(0.0, [], [])]
  finished = []
  for t in range(max_len):
    cands = []
    for logp, seq, lps in alive:
      lp = toy_step_logprobs(batch, b, seq, t)
      lp[banned(v, t, min_len, suppress_unk)] = -np.inf
      if seq and seq[-1] in bad_endings:
        lp[EOS] = -np.inf  # no caption ends with a bad-ending word
      if block_trigrams:
        for j in range(len(seq) - 2):
          if seq[j] == seq[-2] and seq[j + 1] == seq[-1]:
            lp[seq[j + 2]] = -np.inf
      for w in range(v):
        if np.isfinite(lp[w]):
          cands.append((logp + lp[w], seq + [w], lps + [lp[w]]))
    cands.sort(key=lambda c: -c[0])
    alive = []
    for c in cands[:k if mode == "self_critical" else 2 * k]:
      if c[1][-1] == EOS or t == max_len - 1:
        finished.append((penalised(c[0], t + 1, kind, alpha),) + c)
      else:
        alive.append(c)
    alive = alive[:k]
  finished.sort(key=lambda c: -c[0])
  return finished[:k]


def t5x_reference(batch, b, v, k, max_len, kind="none", alpha=0.6):
  """t5x's ``beam_search`` (its definition, in plain Python): the best (score, logp, seq).

  Each step takes the 2K best of all live candidates by log-probability; those ending in EOS
  join the finished list scored ``logp / penalty(length)``, and the K best others stay live.
  After ``max_len`` steps the best finished sequence is returned, or, when none finished, the
  best live one (a caption cut at the length limit).
  """
  live = [(0.0, [])]
  finished = []
  for t in range(max_len):
    cands = []
    for logp, seq in live:
      lp = toy_step_logprobs(batch, b, seq, t)
      lp[banned(v, t)] = -np.inf
      cands += [(logp + lp[w], seq + [w]) for w in range(v) if np.isfinite(lp[w])]
    cands.sort(key=lambda c: -c[0])
    top = cands[:2 * k]
    finished += [(penalised(c[0], t + 1, kind, alpha), c[0], c[1]) for c in top if c[1][-1] == EOS]
    live = [c for c in top if c[1][-1] != EOS][:k]
  if finished:
    return max(finished, key=lambda c: c[0])
  return (penalised(live[0][0], max_len, kind, alpha), live[0][0], live[0][1])


def strip(tokens):
  """Sequence as a list up to and including EOS (PAD dropped)."""
  out = []
  for w in np.asarray(tokens).tolist():
    if w == PAD:
      break
    out.append(w)
    if w == EOS:
      break
  return out


def check_conventions(out, max_len, v):
  """Words, then EOS when emitted, then PAD; lengths and log-probs consistent with that."""
  tokens = np.asarray(out.tokens).reshape(-1, max_len)
  tok_lp = np.asarray(out.token_logprobs).reshape(-1, max_len)
  lengths = np.asarray(out.lengths).reshape(-1)
  for row, lp, length in zip(tokens, tok_lp, lengths):
    seq = strip(row)
    assert len(seq) == length
    assert np.all(row[length:] == PAD), row
    assert not np.isin(row[:length], [PAD, BOS]).any(), row
    assert EOS not in seq[:-1]
    assert seq[-1] == EOS or length == max_len
    assert np.all(lp[length:] == 0.0)
    assert np.all(np.isfinite(lp[:length])) and np.all(lp[:length] <= 0.0)
    assert row.max() < v
  np.testing.assert_allclose(np.asarray(out.logprobs), tok_lp.sum(-1).reshape(out.logprobs.shape),
                             rtol=1e-5, atol=1e-5)


def toy_allowed(batch, temperature, top_k, top_p):
  """allowed[b, t, prev, prev2, w]: whether filtered sampling may emit w (NumPy)."""
  b, t, v = batch["t1"].shape[:3]
  out = np.zeros((b, t, v, v, v), bool)
  for i, step, prev, prev2 in itertools.product(range(b), range(t), range(v), range(v)):
    lp = np_log_softmax(batch["t1"][i, step, prev] + batch["t2"][i, step, prev2])
    lp[banned(v, step)] = -np.inf
    out[i, step, prev, prev2] = np_filtered_probs(lp, temperature, top_k, top_p) > 0
  return out


def np_filtered_probs(lp, temperature, top_k, top_p):
  logits = lp / temperature
  if top_k:
    kth = np.sort(logits)[::-1][top_k - 1]
    logits = np.where(logits < kth, -np.inf, logits)
  p = np.exp(logits - logits.max())
  p /= p.sum()
  if top_p < 1.0:
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros_like(p, bool)
    keep[order[before < top_p]] = True
    p = np.where(keep, p, 0.0)
    p /= p.sum()
  return p


@pytest.fixture(scope="module")
def lstm():
  cfg = ml_collections.ConfigDict({"name": "lstm", "hidden_dim": 24, "embed_dim": 16,
                                   "att_dim": 16, "dropout": 0.3})
  model = registry.build(cfg, {"vocab_size": 11, "feature_dim": 6, "max_regions": 5})
  rng = np.random.default_rng(0)
  b, n = 4, 5
  mask = np.ones((b, n), bool)
  mask[1, 3:] = False
  batch = {"feats": rng.normal(size=(b, n, 6)).astype(np.float32), "feats_mask": mask,
           "image_index": np.arange(b, dtype=np.int32)}
  caps = rng.integers(4, 11, size=(b, 1, 7)).astype(np.int32)
  # Random parameters of the right shapes: tracing init (no compile) keeps the test fast.
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch, shift_right(caps))
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.4, s.dtype), shapes)
  # Make EOS likely enough that some, but not all, sequences end before max_len.
  params["params"]["out_proj"]["bias"] = params["params"]["out_proj"]["bias"].at[EOS].add(1.5)
  return model, params, batch


LSTM_T, LSTM_V = 7, 11


# ---------------------------------------------------------------------------------------------


def test_beam_size_one_equals_greedy_toy():
  batch = toy_batch(1, B, T, V, eos_bias=1.0)
  g = decoding.greedy(TOY, {}, batch, max_len=T)
  b1 = decoding.beam_search(TOY, {}, batch, beam_size=1, max_len=T, beam_mode="self_critical")
  np.testing.assert_array_equal(b1.tokens[:, 0], g.tokens)
  np.testing.assert_allclose(b1.token_logprobs[:, 0], g.token_logprobs, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(b1.scores[:, 0], g.scores, rtol=1e-6)
  # Greedy agrees with an independent NumPy arg-max decoder.
  for b in range(B):
    seq = []
    for t in range(T):
      lp = toy_step_logprobs(batch, b, seq, t)
      lp[banned(V, t)] = -np.inf
      seq.append(int(np.argmax(lp)))
      if seq[-1] == EOS:
        break
    assert strip(g.tokens[b]) == seq
  check_conventions(g, T, V)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_beam_size_one_equals_greedy_lstm(lstm):
  model, params, batch = lstm
  g = decoding.greedy(model, params, batch, max_len=LSTM_T)
  b1 = decoding.beam_search(model, params, batch, beam_size=1, max_len=LSTM_T,
                            beam_mode="self_critical")
  np.testing.assert_array_equal(b1.tokens[:, 0], g.tokens)
  np.testing.assert_allclose(b1.logprobs[:, 0], g.logprobs, rtol=1e-5)
  check_conventions(g, LSTM_T, LSTM_V)
  # The live search with one beam still collects the greedy caption when it ends: never worse.
  live = decoding.beam_search(model, params, batch, beam_size=1, max_len=LSTM_T)
  check_conventions(live, LSTM_T, LSTM_V)
  assert np.all(np.asarray(live.logprobs[:, 0]) >= np.asarray(g.logprobs) - 1e-5)


@pytest.mark.parametrize("kind", ["none", "gnmt", "average"])
def test_wide_beam_is_exhaustive(kind):
  v, max_len, b = 5, 4, 3
  batch = toy_batch(2, b, max_len, v, eos_bias=0.5)
  # At most 2**3 alive prefixes x 3 emittable tokens: K = 24 keeps every candidate.
  out = decoding.beam_search(TOY, {}, batch, beam_size=24, max_len=max_len, length_penalty=kind,
                             alpha=0.9)
  check_conventions(out, max_len, v)
  for i in range(b):
    seqs = enumerate_sequences(batch, i, v, max_len)
    scores = np.array([penalised(lps.sum(), len(s), kind, 0.9) for s, lps in seqs])
    order = np.argsort(-scores)
    best, best_lps = seqs[order[0]]
    assert strip(out.tokens[i, 0]) == best
    np.testing.assert_allclose(out.scores[i, 0], scores[order[0]], rtol=1e-5)
    np.testing.assert_allclose(out.token_logprobs[i, 0, :len(best)], best_lps, rtol=1e-5, atol=1e-6)
    # The whole returned list is the exhaustive top 24, in order.
    np.testing.assert_allclose(out.scores[i], scores[order[:24]], rtol=1e-5)
    if kind == "none":
      np.testing.assert_allclose(out.scores[i], out.token_logprobs[i].sum(-1), rtol=1e-5)
      np.testing.assert_allclose(out.scores[i], out.logprobs[i], rtol=1e-6)


def test_wide_beam_is_exhaustive_with_min_len():
  v, max_len = 5, 4  # the shapes of the test above: the same compiled search
  batch = toy_batch(3, 3, max_len, v, eos_bias=2.5)
  out = decoding.beam_search(TOY, {}, batch, beam_size=24, max_len=max_len, min_len=2)
  for i in range(3):
    seqs = enumerate_sequences(batch, i, v, max_len, min_len=2)
    scores = np.array([lps.sum() for _, lps in seqs])
    order = np.argsort(-scores)
    assert strip(out.tokens[i, 0]) == seqs[order[0]][0]
    np.testing.assert_allclose(out.scores[i, :len(seqs)], scores[order[:24]], rtol=1e-5)
    assert np.all(np.asarray(out.lengths[i]) >= 3)
  # Without the constraint the EOS-biased table does prefer short captions.
  free = decoding.beam_search(TOY, {}, batch, beam_size=24, max_len=max_len)
  assert (np.asarray(free.lengths[:, 0]) < 3).any()


def cycle_batch(seed):
  """A table with a strong 4 <-> 5 cycle: repeated trigrams are the likeliest continuations."""
  batch = toy_batch(seed, B, T, V, scale=1.0, eos_bias=-2.0)
  batch["t1"][:, :, 4, 5] += 6.0
  batch["t1"][:, :, 5, 4] += 6.0
  batch["t1"][:, :, BOS, 4] += 6.0
  return batch


@pytest.mark.parametrize("mode", ["live", "self_critical"])
@pytest.mark.parametrize("kind,extra", [
    ("none", {}), ("gnmt", {}), ("average", {}),
    ("none", {"min_len": 2, "suppress_unk": True}), ("gnmt", {"block_trigrams": True}),
    ("none", {"bad_endings": (4, 6)}),
])
def test_matches_reference_beam_search(kind, extra, mode):
  if extra.get("block_trigrams"):
    batch = cycle_batch(4)
  else:
    batch = toy_batch(4, B, T, V, scale=1.5, eos_bias=-0.5)
  out = decoding.beam_search(TOY, {}, batch, beam_size=K, max_len=T, length_penalty=kind,
                             alpha=0.7, beam_mode=mode, **extra)
  check_conventions(out, T, V)
  for i in range(B):
    ref = reference_beam_search(batch, i, V, K, T, kind, 0.7, mode=mode, **extra)
    assert len(ref) == K
    for j, (score, logp, seq, lps) in enumerate(ref):
      assert strip(out.tokens[i, j]) == seq, (i, j)
      np.testing.assert_allclose(out.scores[i, j], score, rtol=1e-5)
      np.testing.assert_allclose(out.logprobs[i, j], logp, rtol=1e-5)
      np.testing.assert_allclose(out.token_logprobs[i, j, :len(seq)], lps, rtol=1e-5, atol=1e-6)


def _top1_cases(k, mode, kind="none", alpha=0.6, seeds=36):
  """(batch, out) over ``seeds`` random B-image tables: 144 tiny models per call with B = 4."""
  for seed in range(seeds):
    batch = toy_batch(1000 + seed, B, T, V, scale=1.5, eos_bias=-0.5 + (seed % 3) * 0.5)
    yield batch, decoding.beam_search(TOY, {}, batch, beam_size=k, max_len=T, beam_mode=mode,
                                      length_penalty=kind, alpha=alpha)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_live_never_worse_than_self_critical(k):
  """Top-1 log-probability of the default search >= the old (self-critical.pytorch) search."""
  better = 0
  for (batch, live), (_, old) in zip(_top1_cases(k, "live"), _top1_cases(k, "self_critical")):
    live_lp, old_lp = np.asarray(live.logprobs[:, 0]), np.asarray(old.logprobs[:, 0])
    assert np.all(live_lp >= old_lp - 1e-5), (k, live_lp, old_lp)
    better += int((live_lp > old_lp + 1e-5).sum())
  assert better > 0  # the tables are hard enough for the two searches to differ


@pytest.mark.parametrize("k,kind", [(1, "none"), (3, "none"), (5, "none"), (3, "gnmt")])
def test_live_at_least_as_probable_as_t5x(k, kind):
  """Never below t5x's search; above it only where a caption cut at max_len wins."""
  for batch, out in _top1_cases(k, "live", kind, alpha=0.6):
    for i in range(B):
      score, logp, seq = t5x_reference(batch, i, V, k, T, kind, 0.6)
      got = float(out.scores[i, 0])
      assert got >= score - 1e-5 * abs(score), (k, i, got, score, seq)
      if got > score + 1e-5 * abs(score):
        assert len(strip(out.tokens[i, 0])) == T and strip(out.tokens[i, 0])[-1] != EOS
      else:
        assert strip(out.tokens[i, 0]) == seq


def test_trigram_blocking():
  batch = cycle_batch(5)
  plain = decoding.beam_search(TOY, {}, batch, beam_size=K, max_len=T)
  blocked = decoding.beam_search(TOY, {}, batch, beam_size=K, max_len=T, block_trigrams=True)
  assert strip(plain.tokens[0, 0])[:5] == [4, 5, 4, 5, 4]
  for seq in np.asarray(blocked.tokens).reshape(-1, T):
    seq = strip(seq)
    trigrams = [tuple(seq[x:x + 3]) for x in range(len(seq) - 2)]
    assert len(trigrams) == len(set(trigrams)), seq


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_score_is_sum_of_token_logprobs_lstm(lstm):
  """Scores and per-token log-probs agree with teacher-forced rescoring of the returned beams."""
  model, params, batch = lstm
  out = decoding.beam_search(model, params, batch, beam_size=K, max_len=LSTM_T)
  check_conventions(out, LSTM_T, LSTM_V)
  np.testing.assert_allclose(out.scores, out.token_logprobs.sum(-1), rtol=1e-5)
  lengths = np.asarray(out.lengths)
  assert (lengths < LSTM_T).any()
  logits, _ = model.apply(params, batch, shift_right(out.tokens))
  lp = np_log_softmax(np.asarray(logits))
  tf_lp = np.take_along_axis(lp, np.asarray(out.tokens)[..., None], -1)[..., 0]
  tf_lp = np.where(np.arange(LSTM_T) < lengths[..., None], tf_lp, 0.0)
  np.testing.assert_allclose(out.token_logprobs, tf_lp, rtol=1e-4, atol=1e-5)
  assert np.all(np.diff(np.asarray(out.scores), axis=-1) <= 1e-6)


def test_aux_follows_the_beams():
  batch = toy_batch(6, B, T, V, eos_bias=0.5)
  out = decoding.beam_search(TOY, {}, batch, beam_size=K, max_len=T, return_aux=True)
  plain = decoding.beam_search(TOY, {}, batch, beam_size=K, max_len=T)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  assert out.aux["prev"].shape == (B, K, T)
  assert out.aux["prev2_onehot"].shape == (B, K, T, V)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  inputs = np.asarray(shift_right(tokens))
  valid = np.arange(T) < lengths[..., None]
  np.testing.assert_array_equal(np.asarray(out.aux["prev"]), np.where(valid, inputs, 0))
  prev2 = np.asarray(shift_right(inputs))
  expect = np.where(valid[..., None], np.eye(V)[prev2], 0.0)
  np.testing.assert_array_equal(np.asarray(out.aux["prev2_onehot"]), expect)
  g = decoding.greedy(TOY, {}, batch, max_len=T, return_aux=True)
  valid_g = np.arange(T) < np.asarray(g.lengths)[:, None]
  np.testing.assert_array_equal(np.asarray(g.aux["prev"]),
                                np.where(valid_g, np.asarray(shift_right(g.tokens)), 0))


_AUX_SEARCHES = {
    "greedy": lambda batch, aux: decoding.greedy(TOY, {}, batch, max_len=T, return_aux=aux),
    "beam": lambda batch, aux: decoding.beam_search(TOY, {}, batch, beam_size=K, max_len=T, return_aux=aux),
    "in_slots": lambda batch, aux: decoding.beam_search(TOY, {}, batch, beam_size=K, max_len=T,
                                                        beam_mode="in_slots", return_aux=aux),
    "sample": lambda batch, aux: decoding.sample(TOY, {}, batch, jax.random.PRNGKey(3), max_len=T,
                                                 num_samples=2, return_aux=aux),
}


# One search per case (each compiles three programs): greedy in the quick loop, the others in
# the slow step (all four in one test took 6.3 s of CPU there, limit 2 s: tests/durations.py).
@pytest.mark.parametrize("name", one_in_default(_AUX_SEARCHES))
def test_aux_named_entries_only(name):
  """``return_aux=("prev",)`` keeps that entry, equal to ``return_aux=True``'s, and carries no
  other through the loop (the server and the exported captioner keep "attention" only); a name
  the model does not return is no entry."""
  batch = toy_batch(6, B, T, V, eos_bias=0.5)
  call = functools.partial(_AUX_SEARCHES[name], batch)
  full, kept, none = call(True), call(("prev",)), call(("no_such_entry",))
  np.testing.assert_array_equal(kept.tokens, full.tokens, err_msg=name)
  assert set(kept.aux) == {"prev"}, name
  np.testing.assert_array_equal(kept.aux["prev"], full.aux["prev"], err_msg=name)
  assert none.aux == {}, name
  np.testing.assert_array_equal(none.tokens, full.tokens, err_msg=name)


def test_aux_named_entries_are_all_the_loop_carries():
  """The carried state holds the kept entry only: no [.., V] one-hot history in the loop."""
  batch = toy_batch(6, B, T, V, eos_bias=0.5)
  jaxpr = str(jax.make_jaxpr(lambda b: decoding.beam_search(
      TOY, {}, b, beam_size=K, max_len=T, return_aux=("prev",)).tokens)(batch))
  assert f"{K},{T},{V}]" not in jaxpr.replace(" ", "")
  assert f"{K},{T},{V}]" in str(jax.make_jaxpr(lambda b: decoding.beam_search(
      TOY, {}, b, beam_size=K, max_len=T, return_aux=True).tokens)(batch)).replace(" ", "")


def test_aux_attention_lstm(lstm):
  model, params, batch = lstm
  out = decoding.beam_search(model, params, batch, beam_size=K, max_len=LSTM_T, return_aux=True)
  att = np.asarray(out.aux["attention"])
  assert att.shape == (4, K, LSTM_T, 5)
  valid = np.arange(LSTM_T) < np.asarray(out.lengths)[..., None]
  np.testing.assert_allclose(att.sum(-1), valid.astype(np.float32), atol=1e-5)
  assert np.all(att[1, :, :, 3:] == 0.0)  # image 1 has 3 real regions


def test_encode_once_and_enc_expanded_before_the_loop():
  MarkovToy.trace_log.clear()
  batch = toy_batch(7, 2, 3, 6)
  # Tracing is enough (no compile): every decode_step sees the [B*K] expanded encoding.
  jax.eval_shape(lambda b: decoding.beam_search(MarkovToy(tag=1), {}, b, beam_size=5, max_len=3),
                 batch)
  calls = MarkovToy.trace_log
  assert [c for c in calls if c[0] == "encode"] == [("encode", 2)]
  steps = [rows for name, rows in calls if name == "decode_step"]
  assert steps and all(rows == 2 * 5 for rows in steps)


class CountingToy(MarkovToy):
  """MarkovToy whose decode steps are counted as they run (not as they are traced)."""

  executed = []

  def decode_step(self, enc, cache, tokens, t, train=False):
    jax.debug.callback(lambda t: CountingToy.executed.append(int(t)), t)
    return super().decode_step(enc, cache, tokens, t, train)


@pytest.mark.parametrize("method", ["greedy", "beam", "sample", "in_slots"])
def test_decoding_stops_when_every_caption_has_ended(method):
  # EOS dominates from step 2 on (or, for the last image, only from step 4): every caption has
  # ended after step 4, so 5 of the 8 steps run; the result is the full loop's, checked
  # against the plain-Python references.
  t_max, k = 8, 3
  batch = toy_batch(11, B, t_max, V)
  batch["t1"][:, 2:, :, EOS] += 40.0
  batch["t1"][-1, 2:4, :, EOS] -= 80.0
  CountingToy.executed.clear()
  model = CountingToy(tag=7)
  if method == "greedy":
    out = decoding.greedy(model, {}, batch, max_len=t_max)
    for b in range(B):
      seq = []
      for t in range(t_max):
        lp = toy_step_logprobs(batch, b, seq, t)
        lp[banned(V, t)] = -np.inf
        seq.append(int(np.argmax(lp)))
        if seq[-1] == EOS:
          break
      assert strip(out.tokens[b]) == seq
  elif method == "sample":
    out = decoding.sample(model, {}, batch, jax.random.key(0), max_len=t_max, num_samples=2)
  else:
    mode = "in_slots" if method == "in_slots" else "live"
    if mode == "in_slots":  # their search, which runs every step, first (its steps counted too)
      theirs = their_beam_search(model, {}, batch, k, t_max)
      CountingToy.executed.clear()
    out = decoding.beam_search(model, {}, batch, beam_size=k, max_len=t_max, beam_mode=mode,
                               return_aux=mode == "in_slots")
    if mode == "live":
      for b in range(B):
        ref = reference_beam_search(batch, b, V, k, t_max)
        assert [strip(row) for row in out.tokens[b]] == [c[2] for c in ref]
    else:
      np.testing.assert_array_equal(np.asarray(out.tokens), theirs[0])
      np.testing.assert_allclose(np.asarray(out.token_logprobs), theirs[1], rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(np.asarray(out.scores), theirs[2], rtol=1e-5, atol=1e-5)
      valid = np.arange(t_max) < np.asarray(out.lengths)[..., None]
      np.testing.assert_array_equal(np.asarray(out.aux["prev"]),
                                    np.where(valid, np.asarray(shift_right(out.tokens)), 0))
  jax.block_until_ready(out.tokens)
  check_conventions(out, t_max, V)
  lengths = np.asarray(out.lengths)
  assert lengths.max() == 5 and (lengths == 3).any()
  # in_slots fills its finished set at the last step: once every slot has ended (after step 4)
  # it goes straight there; the others stop after step 4.
  assert CountingToy.executed == ([0, 1, 2, 3, 4, t_max - 1] if method == "in_slots"
                                  else list(range(5)))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_eos_handling_all_methods(lstm):
  model, params, batch = lstm
  toy_b = toy_batch(8, B, T, V, eos_bias=0.5)
  rng = jax.random.key(3)
  for mdl, prm, bat, v, t in ((TOY, {}, toy_b, V, T), (model, params, batch, LSTM_V, LSTM_T)):
    outs = [decoding.greedy(mdl, prm, bat, max_len=t),
            decoding.beam_search(mdl, prm, bat, beam_size=K, max_len=t),
            decoding.beam_search(mdl, prm, bat, beam_size=K, max_len=t, length_penalty="average"),
            decoding.sample(mdl, prm, bat, rng, max_len=t, num_samples=NS)]
    for out in outs:
      check_conventions(out, t, v)
    lengths = np.concatenate([np.asarray(o.lengths).reshape(-1) for o in outs])
    assert (lengths < t).any() and (lengths > 1).any()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_sampling_at_low_temperature_is_greedy(lstm):
  model, params, batch = lstm
  g = decoding.greedy(model, params, batch, max_len=LSTM_T)
  for temperature in (0.0, 1e-4):
    s = decoding.sample(model, params, batch, jax.random.key(0), max_len=LSTM_T, num_samples=NS,
                        temperature=temperature)
    np.testing.assert_array_equal(s.tokens, np.repeat(np.asarray(g.tokens)[:, None], NS, 1))
    np.testing.assert_allclose(s.token_logprobs[:, 0], g.token_logprobs, rtol=1e-5, atol=1e-6)
  toy_b = toy_batch(9, B, T, V)
  s = decoding.sample(TOY, {}, toy_b, jax.random.key(1), max_len=T, num_samples=NS,
                      temperature=1e-3)
  g = decoding.greedy(TOY, {}, toy_b, max_len=T)
  np.testing.assert_array_equal(s.tokens, np.repeat(np.asarray(g.tokens)[:, None], NS, 1))


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 3, 1.0), (1.3, 0, 0.7), (0.9, 4, 0.8), (0.8, 0, 0.4)])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_sampling_frequencies_and_exclusions(temperature, top_k, top_p):
  batch = toy_batch(10, B, T, V, scale=1.0, eos_bias=-1.0)
  out = decoding.sample(TOY, {}, batch, jax.random.key(11), max_len=T, num_samples=NS,
                        temperature=temperature, top_k=top_k, top_p=top_p)
  check_conventions(out, T, V)
  tokens = np.asarray(out.tokens)
  # First-token frequencies of every image against the filtered model distribution.
  for i in range(B):
    lp = toy_step_logprobs(batch, i, [], 0)
    lp[banned(V, 0)] = -np.inf
    p = np_filtered_probs(lp, temperature, top_k, top_p)
    freq = np.bincount(tokens[i, :, 0], minlength=V) / NS
    # 5 standard errors per token: seeded, and a wrong distribution fails by far.
    tol = 5 * np.sqrt(p * (1 - p) / NS) + 1e-9
    assert np.all(np.abs(freq - p) <= tol), (i, freq, p)
    # Reported log-probs are the model's own, unfiltered and at temperature 1.
    np.testing.assert_allclose(np.asarray(out.token_logprobs)[i, :, 0], lp[tokens[i, :, 0]],
                               rtol=1e-5)
  # No token at any step is one the filters exclude.
  allowed = toy_allowed(batch, temperature, top_k, top_p)
  inputs = np.asarray(shift_right(tokens))
  prev2 = np.asarray(shift_right(inputs))
  b_idx, n_idx, t_idx = np.nonzero(tokens != PAD)
  assert len(b_idx) > B * NS
  ok = allowed[b_idx, t_idx, inputs[b_idx, n_idx, t_idx], prev2[b_idx, n_idx, t_idx],
               tokens[b_idx, n_idx, t_idx]]
  assert ok.all()
  if top_k or top_p < 1.0:
    assert not allowed[..., 4:].all()  # the filters do exclude something here


def test_sampling_is_seeded(lstm):
  model, params, batch = lstm
  a = decoding.sample(model, params, batch, jax.random.key(7), max_len=LSTM_T, num_samples=NS)
  b = decoding.sample(model, params, batch, jax.random.key(7), max_len=LSTM_T, num_samples=NS)
  c = decoding.sample(model, params, batch, jax.random.key(8), max_len=LSTM_T, num_samples=NS)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert a.tokens.shape == (4, NS, LSTM_T)
  assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))
  # Samples of one image differ from each other.
  assert len({tuple(r) for r in np.asarray(a.tokens[0]).tolist()}) > 1


def test_decode_dispatch(lstm):
  model, params, batch = lstm
  cfg = decoding.default_decode_config()
  assert cfg.method == "greedy"
  cfg.method = "beam"
  cfg.max_len = LSTM_T
  cfg.beam_size = K
  np.testing.assert_array_equal(
      decoding.decode(model, params, batch, cfg).tokens,
      decoding.beam_search(model, params, batch, beam_size=K, max_len=LSTM_T).tokens)
  cfg.method = "greedy"
  np.testing.assert_array_equal(decoding.decode(model, params, batch, cfg).tokens,
                                decoding.greedy(model, params, batch, max_len=LSTM_T).tokens)
  sample_cfg = {"method": "sample", "max_len": LSTM_T, "num_samples": NS, "temperature": 0.7}
  np.testing.assert_array_equal(
      decoding.decode(model, params, batch, sample_cfg, rng=jax.random.key(2)).tokens,
      decoding.sample(model, params, batch, jax.random.key(2), max_len=LSTM_T, num_samples=NS,
                      temperature=0.7).tokens)
  with pytest.raises(ValueError, match="rng"):
    decoding.decode(model, params, batch, sample_cfg)
  with pytest.raises(ValueError, match="beamsize"):
    decoding.decode(model, params, batch, {"beamsize": 3})
  with pytest.raises(ValueError, match="method"):
    decoding.decode(model, params, batch, {"method": "viterbi"})
  with pytest.raises(ValueError, match="length_penalty"):
    decoding.beam_search(model, params, batch, beam_size=2, max_len=LSTM_T, length_penalty="wu")
  with pytest.raises(ValueError, match="beam_mode"):
    decoding.decode(model, params, batch, {"method": "beam", "beam_mode": "t5"})
  with pytest.raises(ValueError, match="top_p"):
    decoding.sample(model, params, batch, jax.random.key(0), max_len=LSTM_T, top_p=0.0)
  with pytest.raises(ValueError, match="min_len"):
    decoding.greedy(model, params, batch, max_len=LSTM_T, min_len=LSTM_T)


@pytest.mark.slow
def test_transformer_through_the_same_search():
  """The registry's Transformer (key/value caches) through the same functions, tiny sizes."""
  if "transformer" not in registry.names():
    pytest.skip("jaxcap.models.transformer is not available")
  cfg = ml_collections.ConfigDict({"name": "transformer", "dim": 16, "num_layers": 1,
                                   "num_dec_layers": 2, "num_heads": 2, "ff_dim": 32,
                                   "dropout": 0.1})
  max_len, v = 6, 13
  model = registry.build(cfg, {"vocab_size": v, "max_len": max_len, "feature_dim": 8,
                               "max_regions": 4})
  rng = np.random.default_rng(1)
  batch = {"feats": rng.normal(size=(3, 4, 8)).astype(np.float32),
           "feats_mask": np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], bool)}
  caps = np.full((3, 1, max_len), EOS, np.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch, shift_right(caps))
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype), shapes)
  g = decoding.greedy(model, params, batch, max_len=max_len)
  out = decoding.beam_search(model, params, batch, beam_size=K, max_len=max_len)
  np.testing.assert_array_equal(
      decoding.beam_search(model, params, batch, beam_size=1, max_len=max_len,
                           beam_mode="self_critical").tokens[:, 0],
      g.tokens)
  check_conventions(g, max_len, v)
  check_conventions(out, max_len, v)
  # Teacher-forced rescoring of the returned beams gives the same per-token log-probs, so the
  # key/value caches were reordered with their beams.
  logits, _ = model.apply(params, batch, shift_right(out.tokens))
  lp = np_log_softmax(np.asarray(logits))
  tf_lp = np.take_along_axis(lp, np.asarray(out.tokens)[..., None], -1)[..., 0]
  tf_lp = np.where(np.arange(max_len) < np.asarray(out.lengths)[..., None], tf_lp, 0.0)
  np.testing.assert_allclose(out.token_logprobs, tf_lp, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.scores, out.token_logprobs.sum(-1), rtol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bad_endings_greedy_and_sampling():
  """No caption ends with a bad-ending word (EOS banned right after it); others unchanged."""
  batch = toy_batch(12, B, T, V, eos_bias=1.0)
  bad = (4, 6)
  batch["t1"][:, :, 4, EOS] += 4.0  # EOS would follow word 4 often
  g = decoding.greedy(TOY, {}, batch, max_len=T, bad_endings=bad)
  for i in range(B):  # a NumPy arg-max decoder with the rule
    seq = []
    for t in range(T):
      lp = toy_step_logprobs(batch, i, seq, t)
      lp[banned(V, t)] = -np.inf
      if seq and seq[-1] in bad:
        lp[EOS] = -np.inf
      seq.append(int(np.argmax(lp)))
      if seq[-1] == EOS:
        break
    assert strip(g.tokens[i]) == seq
  s = decoding.sample(TOY, {}, batch, jax.random.key(5), max_len=T, num_samples=NS,
                      bad_endings=bad)
  free = decoding.sample(TOY, {}, batch, jax.random.key(5), max_len=T, num_samples=NS)
  def ends_bad(out):
    n = 0
    for row in np.asarray(out.tokens).reshape(-1, T):
      seq = strip(row)
      n += len(seq) > 1 and seq[-1] == EOS and seq[-2] in bad
    return n
  assert ends_bad(s) == 0 and ends_bad(free) > 0
  check_conventions(s, T, V)
  with pytest.raises(ValueError, match="remove_bad_endings"):
    decoding.decode(TOY, {}, batch, {"method": "greedy", "max_len": T, "remove_bad_endings": True})
  via_config = decoding.decode(TOY, {}, batch, {"method": "greedy", "max_len": T,
                                                "remove_bad_endings": True}, bad_endings=bad)
  np.testing.assert_array_equal(via_config.tokens, g.tokens)


def test_bad_ending_ids_from_a_vocabulary():
  from jaxcap.data.vocab import Vocab
  vocab = Vocab.build([["a", "dog", "on", "the", "grass"]], min_count=1)
  ids = decoding.bad_ending_ids(vocab)
  assert sorted(vocab.itos[i] for i in ids) == ["a", "on", "the"]


# ---------------------------------------------------------------------------------------------
# Diverse beam search (Vijayakumar et al.): G groups of K / G beams.


def reference_diverse_beam_search(batch, b, v, k, groups, strength, max_len, kind="none",
                                  alpha=0.6, mode="live"):
  """Plain-Python diverse beam search from the paper's definition, per group as in
  ``reference_beam_search``; [(score, logp, seq, lps)] group after group, each best first.

  At every step the groups choose in order; group g ranks its candidates by the running sum
  of ``log p(w) - strength * count(w)``, count(w) = how many hypotheses of groups < g took w
  at this step (self_critical: their K picks; live: their alive beams and the candidates that
  ended among the 2K). Finished hypotheses are ranked by that augmented sum (length-penalised),
  as self-critical.pytorch's ``beam_search`` ranks its ``done_beams`` by ``p``.
  """
  kg = k // groups
  alive = [[(0.0, 0.0, [], [])] for _ in range(groups)]  # (augmented, logp, seq, lps)
  finished = [[] for _ in range(groups)]
  for t in range(max_len):
    count = np.zeros(v)
    for g in range(groups):
      cands = []
      for aug, logp, seq, lps in alive[g]:
        lp = toy_step_logprobs(batch, b, seq, t)
        lp[banned(v, t)] = -np.inf
        for w in range(v):
          if np.isfinite(lp[w]):
            cands.append((aug + lp[w] - strength * count[w], logp + lp[w], seq + [w], lps + [lp[w]]))
      cands.sort(key=lambda c: -c[0])
      top = cands[:kg if mode == "self_critical" else 2 * kg]
      ended = [c for c in top if c[2][-1] == EOS or t == max_len - 1]
      alive[g] = [c for c in top if not (c[2][-1] == EOS or t == max_len - 1)][:kg]
      finished[g] += [(penalised(c[0], t + 1, kind, alpha), c[1], c[2], c[3]) for c in ended]
      taken = top if mode == "self_critical" else ended + alive[g]
      for c in taken:
        count[c[2][-1]] += 1
  out = []
  for g in range(groups):
    out += sorted(finished[g], key=lambda c: -c[0])[:kg]
  return out


def test_diversity_penalty_hand_example():
  """lambda times the number of earlier-group choices of each word, masked choices ignored."""
  words = np.array([[4, 4, 6, 2], [5, 5, 5, 7]], np.int32)
  chosen = np.array([[True, True, True, False], [True, False, True, True]])
  pen = decoding.diversity_penalty(jnp.asarray(words), jnp.asarray(chosen), 8, 0.75)
  expect = np.zeros((2, 8))
  expect[0, 4], expect[0, 6] = 2 * 0.75, 0.75
  expect[1, 5], expect[1, 7] = 2 * 0.75, 0.75
  np.testing.assert_allclose(np.asarray(pen), expect)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_diverse_groups_with_zero_strength_are_independent_searches():
  """lambda = 0: every group is the ordinary beam search of size K / G (both beam modes)."""
  batch = toy_batch(20, B, T, V, scale=1.5, eos_bias=-0.5)
  for mode in ("live", "self_critical"):
    plain = decoding.beam_search(TOY, {}, batch, beam_size=2, max_len=T, beam_mode=mode)
    div = decoding.beam_search(TOY, {}, batch, beam_size=4, max_len=T, beam_mode=mode,
                               beam_groups=2, diversity_strength=0.0)
    check_conventions(div, T, V)
    for g in range(2):
      np.testing.assert_array_equal(div.tokens[:, 2 * g:2 * g + 2], plain.tokens)
      np.testing.assert_allclose(div.scores[:, 2 * g:2 * g + 2], plain.scores, rtol=1e-6)
      np.testing.assert_allclose(div.logprobs[:, 2 * g:2 * g + 2], plain.logprobs, rtol=1e-6)


@pytest.mark.parametrize("mode,kind,k,groups", [("live", "none", 4, 2),
                                                ("self_critical", "none", 4, 2),
                                                ("live", "gnmt", 6, 3)])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_diverse_matches_reference(mode, kind, k, groups):
  """Sequences, augmented scores and true log-probs of every group equal the reference."""
  batch = toy_batch(21, B, T, V, scale=1.0, eos_bias=-0.5)
  out = decoding.beam_search(TOY, {}, batch, beam_size=k, max_len=T, beam_mode=mode,
                             length_penalty=kind, alpha=0.7, beam_groups=groups,
                             diversity_strength=0.8)
  check_conventions(out, T, V)
  differs = 0
  for i in range(B):
    ref = reference_diverse_beam_search(batch, i, V, k, groups, 0.8, T, kind, 0.7, mode)
    plain = reference_diverse_beam_search(batch, i, V, k, groups, 0.0, T, kind, 0.7, mode)
    differs += [r[2] for r in ref] != [p[2] for p in plain]
    for j, (score, logp, seq, lps) in enumerate(ref):
      assert strip(out.tokens[i, j]) == seq, (i, j)
      np.testing.assert_allclose(out.scores[i, j], score, rtol=1e-5)
      np.testing.assert_allclose(out.logprobs[i, j], logp, rtol=1e-5)
      np.testing.assert_allclose(out.token_logprobs[i, j, :len(seq)], lps, rtol=1e-5, atol=1e-6)
  assert differs > 0  # the penalty changes the result on these tables


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_diversity_makes_groups_differ(lstm):
  """On a random tiny LSTM, lambda > 0 gives more distinct group-best captions than lambda = 0;
  group 0 is never penalised, so it stays the ordinary beam search of size K / G."""
  model, params, batch = lstm
  distinct = {}
  for strength in (0.0, 3.0):
    out = decoding.beam_search(model, params, batch, beam_size=6, max_len=LSTM_T,
                               beam_mode="self_critical", beam_groups=3,
                               diversity_strength=strength)
    check_conventions(out, LSTM_T, LSTM_V)
    tops = np.asarray(out.tokens)[:, ::2]  # each group's best caption: [B, G, T]
    distinct[strength] = sum(len({tuple(strip(r)) for r in img}) for img in tops)
    plain = decoding.beam_search(model, params, batch, beam_size=2, max_len=LSTM_T,
                                 beam_mode="self_critical")
    np.testing.assert_array_equal(out.tokens[:, :2], plain.tokens)
  assert distinct[0.0] == 4  # identical groups: one caption per image
  assert distinct[3.0] > distinct[0.0], distinct


def test_diverse_options_are_checked():
  batch = toy_batch(22, 2, 3, 6)
  with pytest.raises(ValueError, match="beam_groups"):
    decoding.beam_search(TOY, {}, batch, beam_size=3, max_len=3, beam_groups=2)
  with pytest.raises(ValueError, match="diversity_strength"):
    decoding.decode(TOY, {}, batch, {"method": "beam", "max_len": 3, "beam_size": 2, "beam_groups": 2,
                                     "diversity_strength": -1.0})


# ---------------------------------------------------------------------------------------------
# beam_mode="in_slots": the Meshed-Memory Transformer authors' BeamSearch.


def their_beam_search(model, params, batch, beam_size, max_len):
  """aimagelab/meshed-memory-transformer's ``BeamSearch.apply`` / ``iter``
  (models/beam_search/beam_search.py) in NumPy float32, with ``out_size = K``, stepping the
  model's ``decode_step`` by hand: one beam at t = 0 (``cur_beam_size = 1``), the image side
  and the state gathered by the selected beams after each step (``_expand_visual`` /
  ``_expand_state``), ended beams masked by ``seq_mask`` with ``old_seq_logprob[:, :, 1:] =
  -999``, the K best of the flattened candidates by a descending sort, a final sort of the K
  places by ``seq_logprob``.

  Two things are jaxcap's: PAD and BOS get -inf in the log-probabilities (every jaxcap search
  bans them; theirs bans nothing), so their mask products ``mask * x + old * (1 - mask)`` are
  written as selects (``0 * -inf`` would be NaN). Ties: stable (lower flat index first).

  Returns:
    ``(outputs [B, K, T], log_probs [B, K, T], seq_logprob [B, K], kept, pushed, all_ended_at)``:
    their outputs, per-word log-probabilities and scores, best first; ``kept`` counts ended
    beams that held their place through a step, ``pushed`` those that lost it; the first step
    after which every place of every image has ended above -999 (None if none): jaxcap
    skips the steps between it and the last.
  """
  f32 = np.float32
  enc = model.apply(params, batch, method="encode")
  b_s = jax.tree.leaves(enc)[0].shape[0]
  cache = model.apply(params, enc, max_len, method="init_cache")
  step = jax.jit(lambda enc, cache, tok, t: model.apply(params, enc, cache, tok, t,
                                                        method="decode_step")[:2])
  seq_mask = np.ones((b_s, beam_size, 1), f32)
  seq_logprob = np.zeros((b_s, 1, 1), f32)
  outputs, log_probs = [], []
  last = np.full((b_s,), BOS, np.int32)
  selected_words = None
  kept = pushed = 0
  all_ended_at = None
  for t in range(max_len):
    cur_beam_size = 1 if t == 0 else beam_size
    logits, cache = step(enc, cache, jnp.asarray(last), jnp.int32(t))
    word_logprob = np.array(jax.nn.log_softmax(logits.astype(jnp.float32)), f32)
    word_logprob = word_logprob.reshape(b_s, cur_beam_size, -1)
    v = word_logprob.shape[-1]
    word_logprob[..., [PAD, BOS]] = -np.inf
    candidate_logprob = seq_logprob + word_logprob
    if t > 0:
      mask = (selected_words.reshape(b_s, cur_beam_size) != EOS).astype(f32)[..., None]
      seq_mask = seq_mask * mask
      word_logprob = np.where(seq_mask > 0, word_logprob, f32(0))
      old_seq_logprob = np.broadcast_to(seq_logprob, candidate_logprob.shape).copy()
      old_seq_logprob[:, :, 1:] = -999
      candidate_logprob = np.where(seq_mask > 0, candidate_logprob, old_seq_logprob)
    flat = candidate_logprob.reshape(b_s, -1)
    selected_idx = np.argsort(-flat, axis=-1, kind="stable")[:, :beam_size]
    selected_logprob = np.take_along_axis(flat, selected_idx, 1)
    selected_beam, selected_words = selected_idx // v, selected_idx % v
    if t > 0:
      ended = seq_mask[..., 0] == 0
      stay = np.take_along_axis(ended, selected_beam, 1).sum()
      kept += int(stay)
      pushed += int(ended.sum() - stay)
    rows = (np.arange(b_s)[:, None] * cur_beam_size + selected_beam).reshape(-1)
    enc = jax.tree.map(lambda x: x[rows], enc)
    cache = jax.tree.map(lambda x: x[rows], cache)
    seq_logprob = selected_logprob[..., None]
    seq_mask = np.take_along_axis(seq_mask, selected_beam[..., None], 1)
    outputs = [np.take_along_axis(o, selected_beam[..., None], 1) for o in outputs]
    outputs.append(selected_words[..., None])
    this_word_logprob = word_logprob[np.arange(b_s)[:, None], selected_beam, selected_words]
    log_probs = [np.take_along_axis(o, selected_beam[..., None], 1) for o in log_probs]
    log_probs.append(this_word_logprob[..., None])
    last = selected_words.reshape(-1).astype(np.int32)
    if all_ended_at is None and (seq_mask[..., 0] * (selected_words != EOS) == 0).all() and (
        selected_logprob > -999).all():
      all_ended_at = t
  sort_idxs = np.argsort(-seq_logprob[..., 0], axis=1, kind="stable")
  outputs = np.take_along_axis(np.concatenate(outputs, -1), sort_idxs[..., None], 1)
  log_probs = np.take_along_axis(np.concatenate(log_probs, -1), sort_idxs[..., None], 1)
  return (outputs, log_probs, np.take_along_axis(seq_logprob[..., 0], sort_idxs, 1), kept,
          pushed, all_ended_at)


@dataclasses.dataclass(frozen=True)
class Sharpened:
  """``model`` with its logits times ``sharpness`` and ``eos_shift`` added to the EOS logit,
  used through the protocol only (any hashable object with ``apply`` decodes): random tiny
  models get peaky word distributions (a beam that follows them outscores captions that
  ended early, which are then pushed out of their places) and end captions often."""

  model: Any
  sharpness: float
  eos_shift: float

  def apply(self, params, *args, method):
    out = self.model.apply(params, *args, method=method)
    if method != "decode_step":
      return out
    logits, cache, aux = out
    return (logits * self.sharpness).at[:, EOS].add(self.eos_shift), cache, aux


def _random_tiny(fields, v, seed, scale, sharpness, eos_shift):
  """A registered model at tiny sizes with random N(0, scale) variables, and a batch of 4."""
  model = registry.build(ml_collections.ConfigDict(fields),
                         {"vocab_size": v, "max_len": 8, "feature_dim": 6, "max_regions": 5})
  rng = np.random.default_rng(seed)
  mask = np.ones((4, 5), bool)
  mask[1, 3:] = False
  batch = {"feats": rng.normal(size=(4, 5, 6)).astype(np.float32), "feats_mask": mask,
           "image_index": np.arange(4, dtype=np.int32)}
  caps = rng.integers(4, v, size=(4, 1, 7)).astype(np.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch, shift_right(caps))
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * scale, s.dtype), shapes)
  return Sharpened(model, sharpness, eos_shift), params, batch


# name: (model fields, V, parameter scale, sharpness, EOS shift); the last three chosen so that
# ended captions both keep and lose their places (asserted below).
_IN_SLOTS_MODELS = {
    "lstm": ({"name": "lstm", "hidden_dim": 24, "embed_dim": 16, "att_dim": 16,
              "dropout": 0.0}, 11, 0.5, 3.0, 2.0),
    "transformer": ({"name": "transformer", "dim": 16, "num_layers": 1, "num_dec_layers": 2,
                     "num_heads": 2, "ff_dim": 32, "dropout": 0.0}, 13, 0.5, 3.0, -2.0),
}


def _check_in_slots(model, params, batch, k, max_len, v):
  """``beam_mode="in_slots"`` against :func:`their_beam_search`; returns (kept, pushed,
  skipped): skipped is whether jaxcap's search could skip steps (every place had ended
  before the last two)."""
  out = decoding.beam_search(model, params, batch, beam_size=k, max_len=max_len,
                             beam_mode="in_slots")
  check_conventions(out, max_len, v)
  tokens, lps, scores, kept, pushed, ended_at = their_beam_search(model, params, batch, k, max_len)
  np.testing.assert_array_equal(np.asarray(out.tokens), tokens, err_msg=f"K={k}, T={max_len}")
  np.testing.assert_allclose(np.asarray(out.token_logprobs), lps, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.scores), scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.logprobs), lps.sum(-1), rtol=1e-5, atol=1e-5)
  return kept, pushed, ended_at is not None and ended_at < max_len - 2


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_in_slots_equals_their_beam_search_toy():
  """MarkovToy tables (B = 4 images each), K = 1, 3, 5: equal to their search, finished
  captions kept and pushed out, steps skipped once every place has ended; K = 1 is greedy
  decoding."""
  kept = pushed = 0
  skipped = set()
  # T steps with EOS biased by seed - 1, then 10 steps with EOS favoured (+3), where every
  # place ends early enough that jaxcap skips to the last step.
  runs = [(seed, k, T, seed - 1.0) for seed, k in itertools.product(range(3), (1, 3, 5))]
  runs += [(seed, k, 10, 3.0) for seed, k in itertools.product(range(3), (1, 3, 5))]
  for seed, k, t_max, eos_bias in runs:
    batch = toy_batch(300 + seed, B, t_max, V, scale=2.0, eos_bias=eos_bias)
    n_kept, n_pushed, n_skipped = _check_in_slots(TOY, {}, batch, k, t_max, V)
    kept, pushed = kept + n_kept, pushed + n_pushed
    if n_skipped:
      skipped.add(k)
    if k == 1:
      np.testing.assert_array_equal(
          decoding.beam_search(TOY, {}, batch, beam_size=1, max_len=T,
                               beam_mode="in_slots").tokens[:, 0],
          decoding.greedy(TOY, {}, batch, max_len=T).tokens)
    if k == 3 and seed == 0:
      # decode_step's aux follows each slot's own history, zeros after EOS.
      out = decoding.beam_search(TOY, {}, batch, beam_size=k, max_len=T, beam_mode="in_slots",
                                 return_aux=True)
      valid = np.arange(T) < np.asarray(out.lengths)[..., None]
      np.testing.assert_array_equal(np.asarray(out.aux["prev"]),
                                    np.where(valid, np.asarray(shift_right(out.tokens)), 0))
  assert kept > 0 and pushed > 0 and skipped == {1, 3, 5}, (kept, pushed, skipped)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_IN_SLOTS_MODELS))
def test_in_slots_equals_their_beam_search(name):
  """``beam_mode="in_slots"`` returns what their BeamSearch returns with ``out_size = K``
  (tokens, with their word 0 = PAD after EOS; per-word log-probabilities; scores), for
  several K and max_len, on tables where finished captions keep their places and are pushed
  out."""
  fields, v, scale, sharpness, eos_shift = _IN_SLOTS_MODELS[name]
  model, params, batch = _random_tiny(fields, v, 3, scale, sharpness, eos_shift)
  kept = pushed = 0
  for k, max_len in [(2, 7), (3, 6), (5, 8)]:
    n_kept, n_pushed, _ = _check_in_slots(model, params, batch, k, max_len, v)
    kept, pushed = kept + n_kept, pushed + n_pushed
  # The tables exercise their bookkeeping: ended beams held places and lost them.
  assert kept > 0 and pushed > 0, (kept, pushed)


def test_in_slots_options_are_checked():
  batch = toy_batch(22, 2, 3, 6)
  with pytest.raises(ValueError, match="beam_groups"):
    decoding.beam_search(TOY, {}, batch, beam_size=4, max_len=3, beam_mode="in_slots",
                         beam_groups=2)
  with pytest.raises(ValueError, match="length_penalty"):
    decoding.decode(TOY, {}, batch, {"method": "beam", "max_len": 3, "beam_mode": "in_slots",
                                     "length_penalty": "gnmt"})
  # A config says so before a run starts.
  from jaxcap import config_files
  from jaxcap.training import validation
  config = config_files.load("transformer.py:synthetic")
  config.decode.update(method="beam", beam_mode="in_slots", beam_size=5)
  validation.check_config(config)
  for field, value in [("beam_groups", 5), ("length_penalty", "average")]:
    bad = config_files.load("transformer.py:synthetic")
    bad.decode.update(method="beam", beam_mode="in_slots", beam_size=5)
    bad.decode[field] = value
    with pytest.raises(ValueError, match=f"decode.{field}.*in_slots"):
      validation.check_config(bad)
