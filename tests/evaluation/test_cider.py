"""CIDEr-D: corpus mode against pycocoevalcap's Cider, training mode against a NumPy reference.

``compat="self_critical"`` is checked against ``self_critical_ciderd``, self-critical.pytorch's
pipeline written from its definition. Mutants tried on jaxcap/evaluation/cider.py and
jaxcap/training/scst.py, each failing the test named: EOS appended to every reference
(test_self_critical_compat_*), references not cut at ``max_len`` (test_self_critical_compat_*),
the Rewarder counting df on the truncated references
(test_self_critical_compat_from_a_dataset).
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from jaxcap.evaluation import cider

PAD, EOS = 0, 2
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
COCO = DATA / "coco_karpathy_test" / "captions_karpathy_test2014.json"


def _pycoco_cider(cands: list[str], refs: list[list[str]]):
  coco_cider = pytest.importorskip("pycocoevalcap.cider.cider")
  gts = {i: list(r) for i, r in enumerate(refs)}
  res = {i: [c] for i, c in enumerate(cands)}
  mean, scores = coco_cider.Cider().compute_score(gts, res)
  return float(mean), np.asarray(scores, np.float64)


def _words(ids) -> str:
  """Ids up to the first EOS/PAD as the space-joined words pycocoevalcap sees."""
  out = []
  for i in ids:
    if i in (PAD, EOS):
      break
    out.append(f"w{int(i)}")
  return " ".join(out)


def _random_caption(rng, vocab_lo, vocab_hi, max_len, width):
  """Ids with a random length, ended by EOS then PAD (or filling the row), junk after EOS."""
  n = int(rng.integers(0, max_len + 1))
  row = rng.integers(vocab_lo, vocab_hi, size=width)
  if n < width:
    row[n] = EOS
    row[n + 1:] = rng.choice([PAD, PAD, 7], size=width - n - 1)  # junk after EOS is ignored
  return row


@pytest.mark.parametrize("seed,vocab_hi", [(0, 9), (1, 15), (2, 40)])
def test_corpus_mode_matches_pycocoevalcap_on_random_ids(seed, vocab_hi):
  rng = np.random.default_rng(seed)
  num_images, width = 60, 14
  cands = np.stack([_random_caption(rng, 4, vocab_hi, 12, width) for _ in range(num_images)])
  refs = [[_random_caption(rng, 4, vocab_hi, 12, width) for _ in range(rng.integers(1, 7))]
          for _ in range(num_images)]
  mean, scores = cider.CiderD(vocab_hi).corpus_score(cands, refs)
  ref_mean, ref_scores = _pycoco_cider([_words(c) for c in cands],
                                       [[_words(r) for r in rr] for rr in refs])
  np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-6)
  assert abs(mean - ref_mean) < 1e-6
  assert ref_scores.max() > 0  # the data must exercise overlaps, not just zeros


def test_corpus_mode_exact_with_large_ids():
  # Ids near the largest vocabulary the int64 keys allow still give distinct n-grams.
  rng = np.random.default_rng(3)
  vocab = 55107
  words = rng.choice(np.arange(vocab - 12, vocab), size=(40, 10))
  words[:, -1] = np.where(rng.random(40) < 0.5, EOS, words[:, -1])
  refs = [[rng.choice(np.arange(vocab - 12, vocab), size=rng.integers(1, 9)) for _ in range(4)]
          for _ in range(40)]
  _, scores = cider.CiderD(vocab).corpus_score(words, refs)
  _, ref_scores = _pycoco_cider([_words(c) for c in words],
                                [[_words(r) for r in rr] for rr in refs])
  np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match="too large"):
    cider.CiderD(vocab + 1)


def test_edge_cases_match_pycocoevalcap():
  cands = [
      "",                                    # empty candidate
      "a dog runs on the beach with a ball near the water at sunset today",  # longer than refs
      "a a a a a a a a",                     # repeated n-grams: counts clipped by the refs
      "a dog runs",                          # identical to a reference
      "zebra",                               # one word, not in any reference
      "dog",                                 # one word that is in the references
  ]
  refs = [["a dog runs", "the dog is running on sand", "a a dog"]] * len(cands)
  refs = [list(r) for r in refs]
  refs[4] = ["a cat", ""]                    # an empty reference
  mean, scores = cider.corpus_cider_strings(cands, refs)
  ref_mean, ref_scores = _pycoco_cider(cands, refs)
  np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-6)
  assert abs(mean - ref_mean) < 1e-6
  assert scores[0] == 0.0
  keyed_mean, keyed = cider.cider_from_dicts({f"im{i}": r for i, r in enumerate(refs)},
                                             {f"im{i}": c for i, c in enumerate(cands)})
  assert keyed_mean == pytest.approx(ref_mean, abs=1e-6)
  assert [keyed[f"im{i}"] for i in range(len(cands))] == pytest.approx(list(ref_scores), abs=1e-6)


def _normalise(text: str) -> str:
  return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def _coco_human_split():
  if not COCO.exists():
    pytest.skip(f"real data absent: {COCO}")
  with open(COCO) as f:
    data = json.load(f)
  by_image = collections.defaultdict(list)
  for ann in data["annotations"]:
    by_image[ann["image_id"]].append(_normalise(ann["caption"]))
  ids = sorted(by_image)
  return [by_image[i][0] for i in ids], [by_image[i][1:] for i in ids]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_corpus_mode_matches_pycocoevalcap_on_coco_karpathy_test():
  cands, refs = _coco_human_split()
  mean, scores = cider.corpus_cider_strings(cands, refs)
  ref_mean, ref_scores = _pycoco_cider(cands, refs)
  assert len(scores) == len(cands) == 5000
  np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-6)
  assert abs(mean - ref_mean) < 1e-6


def test_score_with_prepared_refs_matches_corpus_score():
  # Many candidates per image in any order (the SCST case) against refs prepared once.
  rng = np.random.default_rng(4)
  refs = [[rng.integers(4, 12, size=rng.integers(2, 9)) for _ in range(5)] for _ in range(7)]
  cands = np.stack([_random_caption(rng, 4, 12, 9, 11) for _ in range(7 * 5)])
  ref_index = rng.permutation(np.repeat(np.arange(7), 5))
  scorer = cider.CiderD(12)
  got = scorer.score(cands, ref_index, scorer.prepare_refs(refs))
  # Each candidate alone in a corpus whose refs are the same 7 images gives the same df.
  for k in range(0, len(cands), 6):
    per_image_cands = [np.zeros(1, np.int64)] * 7
    per_image_cands[ref_index[k]] = cands[k]
    _, want = scorer.corpus_score(per_image_cands, refs)
    assert abs(got[k] - want[ref_index[k]]) < 1e-12


# ---------------------------------------------------------------------------------------------
# Training mode: an independent reimplementation of self-critical.pytorch's CiderD formula.


def _tokens(ids, count_eos: bool, is_ref: bool) -> list[int]:
  out = []
  for i in ids:
    i = int(i)
    if i == EOS:
      if count_eos:
        out.append(EOS)
      return out
    if i == PAD:
      break
    out.append(i)
  if count_eos and is_ref:
    out.append(EOS)  # prepro_ngrams.py appends <eos> to every reference
  return out


def _grams(tokens, n=4):
  c = collections.Counter()
  for k in range(1, n + 1):
    for i in range(len(tokens) - k + 1):
      c[tuple(tokens[i:i + k])] += 1
  return c


def numpy_ciderd(cands, ref_index, refs, train_refs, count_eos, n=4, sigma=6.0):
  """CIDEr-D with df from training refs (Vedantam et al. 2015; self-critical.pytorch CiderD).

  g(s)[w] = tf * (log(#training images) - log(max(1, df(w)))), cosine of clipped vectors per
  order, Gaussian penalty on the length difference, mean over orders and refs, times 10.
  """
  df = collections.Counter()
  for image_refs in train_refs:
    df.update(set().union(*[_grams(_tokens(r, count_eos, True), n) for r in image_refs]))
  log_images = math.log(len(train_refs))

  def vec(tokens):
    v = [dict() for _ in range(n)]
    for g, tf in _grams(tokens, n).items():
      v[len(g) - 1][g] = tf * (log_images - math.log(max(1.0, df[g])))
    norms = np.array([math.sqrt(sum(x * x for x in d.values())) for d in v])
    return v, norms, len(tokens)

  out = []
  for c, i in zip(cands, ref_index):
    vc, nc, lc = vec(_tokens(c, count_eos, False))
    total = 0.0
    for r in refs[i]:
      vr, nr, lr = vec(_tokens(r, count_eos, True))
      # Word count instead of the code's bigram count: the difference is the same whenever
      # both captions have n-grams, and the similarity is 0 otherwise.
      penalty = math.exp(-((lc - lr) ** 2) / (2 * sigma ** 2))
      for k in range(n):
        dot = sum(min(x, vr[k].get(g, 0.0)) * vr[k].get(g, 0.0) for g, x in vc[k].items())
        if nc[k] > 0 and nr[k] > 0:
          dot /= nc[k] * nr[k]
        total += dot * penalty
    out.append(10.0 * total / n / len(refs[i]))
  return np.asarray(out)


@pytest.mark.parametrize("count_eos", [False, True])
def test_training_mode_matches_numpy_ciderd(tmp_path, count_eos):
  rng = np.random.default_rng(5)
  vocab = 14
  train_refs = [[_random_caption(rng, 4, vocab, 9, 12) for _ in range(rng.integers(1, 6))]
                for _ in range(80)]
  batch_refs = [[_random_caption(rng, 4, vocab, 9, 12) for _ in range(5)] for _ in range(6)]
  samples = np.stack([_random_caption(rng, 4, vocab, 11, 12) for _ in range(6 * 5)])
  ref_index = np.repeat(np.arange(6), 5)
  scorer = cider.CiderD.for_training(train_refs, str(tmp_path), vocab, count_eos=count_eos,
                                     log=lambda s: None)
  assert scorer.mode == "training"
  got = scorer.score(samples, ref_index, scorer.prepare_refs(batch_refs))
  want = numpy_ciderd(samples, ref_index, batch_refs, train_refs, count_eos)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
  assert want.max() > 0


def test_count_eos_counts_the_emitted_eos():
  refs = [[np.array([5, 6, 7])], [np.array([5, 8])]]
  with_eos = np.array([[5, 6, 7, EOS], [5, 6, 7, PAD]])  # the second never emitted EOS
  scorer = cider.CiderD(10, count_eos=True)
  s = scorer.score(with_eos, np.array([0, 0]), scorer.prepare_refs(refs))
  assert s[0] > s[1]
  plain = cider.CiderD(10)
  s_plain = plain.score(with_eos, np.array([0, 0]), plain.prepare_refs(refs))
  assert s_plain[0] == s_plain[1]


# ---------------------------------------------------------------------------------------------
# The document-frequency cache.


def test_doc_freq_cache_reused_and_rebuilt(tmp_path):
  rng = np.random.default_rng(6)
  refs = [[rng.integers(4, 20, size=rng.integers(1, 8)) for _ in range(5)] for _ in range(30)]
  lines = []
  first = cider.load_or_build_doc_freq(refs, str(tmp_path), 20, log=lines.append)
  files = sorted(os.listdir(tmp_path))
  assert len(files) == 1 and files[0].startswith("cider_df_") and files[0].endswith(".npz")
  assert len(lines) == 1

  # Same references (even padded differently): the cached table is read, nothing is counted.
  padded = [np.stack([np.pad(r, (0, 12 - len(r))) for r in image_refs]) for image_refs in refs]
  again = cider.load_or_build_doc_freq(padded, str(tmp_path), 20, log=lines.append)
  assert len(lines) == 1 and sorted(os.listdir(tmp_path)) == files
  np.testing.assert_array_equal(again.keys, first.keys)
  np.testing.assert_array_equal(again.counts, first.counts)

  # Changed references: a new table under a new name, counted from the new references.
  changed = [list(r) for r in refs]
  changed[0] = [np.array([19, 19, 19, 19])]
  rebuilt = cider.load_or_build_doc_freq(changed, str(tmp_path), 20, log=lines.append)
  assert len(lines) == 2 and len(os.listdir(tmp_path)) == 2
  want = cider.build_doc_freq(changed, 20)
  np.testing.assert_array_equal(rebuilt.keys, want.keys)
  np.testing.assert_array_equal(rebuilt.counts, want.counts)
  assert not np.array_equal(rebuilt.counts, first.counts) or len(rebuilt.keys) != len(first.keys)

  # Changed vocabulary (same size, different words): rebuilt as well.
  words_a = [f"w{i}" for i in range(20)]
  words_b = words_a[:-1] + ["other"]
  cider.load_or_build_doc_freq(refs, str(tmp_path), words_a, log=lines.append)
  cider.load_or_build_doc_freq(refs, str(tmp_path), words_b, log=lines.append)
  assert len(lines) == 4 and len(os.listdir(tmp_path)) == 4
  assert not any(".tmp" in f for f in os.listdir(tmp_path))


def test_doc_freq_counts_images_not_references():
  refs = [[np.array([4, 5]), np.array([4, 5, 6])], [np.array([4])]]
  table = cider.build_doc_freq(refs, 10)
  base = 11
  key = lambda *ids: sum((i + 1) * base ** j for j, i in enumerate(ids))  # noqa: E731
  df = dict(zip(table.keys.tolist(), table.counts.tolist()))
  assert df[key(4)] == 2 and df[key(4, 5)] == 1 and df[key(5, 6)] == 1 and df[key(4, 5, 6)] == 1
  assert table.num_images == 2


def test_corrupt_cache_is_rebuilt(tmp_path):
  refs = [[np.array([4, 5, 6])], [np.array([5, 6])]]
  path = cider.doc_freq_cache_path(refs, str(tmp_path), 10)
  with open(path, "wb") as f:
    f.write(b"not an npz")
  lines = []
  table = cider.load_or_build_doc_freq(refs, str(tmp_path), 10, log=lines.append)
  assert any("unreadable" in s for s in lines)
  np.testing.assert_array_equal(table.counts, cider.build_doc_freq(refs, 10).counts)


# ---------------------------------------------------------------------------------------------
# Errors.


def test_bad_inputs_raise_clear_errors():
  scorer = cider.CiderD(10)
  refs = scorer.prepare_refs([[np.array([4, 5])]])
  with pytest.raises(ValueError, match="token id 12"):
    scorer.score(np.array([[4, 12]]), np.array([0]), refs)
  with pytest.raises(ValueError, match="ref_index"):
    scorer.score(np.array([[4, 5]]), np.array([1]), refs)
  with pytest.raises(ValueError, match="one per candidate"):
    scorer.score(np.array([[4, 5]]), np.array([0, 0]), refs)
  with pytest.raises(ValueError, match="no reference captions"):
    scorer.prepare_refs([[np.array([4])], []])
  with pytest.raises(ValueError, match="one candidate per image"):
    scorer.corpus_score(np.array([[4, 5]]), [[np.array([4])], [np.array([5])]])
  with pytest.raises(ValueError, match="doc_freq was counted"):
    cider.CiderD(10, doc_freq=cider.build_doc_freq([[np.array([4])]], 11))


# ---------------------------------------------------------------------------------------------
# compat="self_critical": self-critical.pytorch's CiderD pipeline, written from its definition.


def self_critical_ciderd(cands, ref_index, full_refs, full_train_refs, max_len, n=4, sigma=6.0):
  """self-critical.pytorch's SCST reward, step by step (strings of ids, ``"0"`` = its EOS/PAD).

  * ``prepro_ngrams.py``: every full training caption + ``<eos>``; df = number of images whose
    captions hold the n-gram; ``ref_len = log(#images)``.
  * ``prepro_labels.py`` + the loader: a reference is a ``max_len``-wide label row (words cut
    there, 0 after); ``array_to_str`` writes ids up to and including the first 0, so a caption
    of ``max_len`` words or more has no end token.
  * A sample row (ids, 0 after its end token) through ``array_to_str`` likewise.
  * ``CiderScorer``: tf-idf per order, "length" = number of bigrams, clipped cosine, Gaussian
    penalty, mean over orders and references, times 10.
  """

  def words(ids):
    return [str(int(i)) for i in ids if int(i) not in (PAD, EOS)]

  def array_to_str(row):
    out = []
    for x in row:
      out.append(x)
      if x == "0":
        break
    return out

  def label_row(ids):
    w = words(ids)[:max_len]
    return w + ["0"] * (max_len - len(w))

  def cand_row(ids):
    out = []
    for i in ids:
      i = int(i)
      if i in (PAD, EOS):
        out.append("0")  # the end token; PAD only ever follows it
        break
      out.append(str(i))
    return out

  def precook(toks):
    c = collections.Counter()
    for k in range(1, n + 1):
      for i in range(len(toks) - k + 1):
        c[tuple(toks[i:i + k])] += 1
    return c

  df = collections.Counter()
  for image_refs in full_train_refs:
    df.update(set().union(*[set(precook(words(r) + ["0"])) for r in image_refs]))
  ref_len = np.log(float(len(full_train_refs)))

  def counts2vec(cnts):
    vec = [dict() for _ in range(n)]
    norm = [0.0] * n
    length = 0
    for gram, tf in cnts.items():
      k = len(gram) - 1
      vec[k][gram] = float(tf) * (ref_len - np.log(max(1.0, df[gram])))
      norm[k] += vec[k][gram] ** 2
      if k == 1:
        length += tf
    return vec, [np.sqrt(x) for x in norm], length

  out = []
  for c, i in zip(cands, ref_index):
    vh, nh, lh = counts2vec(precook(array_to_str(cand_row(c))))
    score = np.zeros(n)
    for r in full_refs[i]:
      vr, nr, lr = counts2vec(precook(array_to_str(label_row(r))))
      val = np.zeros(n)
      for k in range(n):
        for gram in vh[k]:
          val[k] += min(vh[k][gram], vr[k].get(gram, 0.0)) * vr[k].get(gram, 0.0)
        if nh[k] != 0 and nr[k] != 0:
          val[k] /= nh[k] * nr[k]
        val[k] *= np.e ** (-(float(lh - lr) ** 2) / (2 * sigma ** 2))
      score += val
    out.append(np.mean(score) / len(full_refs[i]) * 10.0)
  return np.asarray(out)


def _sc_data(seed, vocab, max_len):
  """Full captions of 0..2*max_len words: many at, over and under the limit."""
  rng = np.random.default_rng(seed)

  def cap():
    length = int(rng.choice([max_len, max_len + 1, rng.integers(0, 2 * max_len + 1)]))
    return rng.integers(4, vocab, size=length)

  train = [[cap() for _ in range(rng.integers(1, 6))] for _ in range(60)]
  samples = []
  for _ in range(40):  # decoder rows: max_len wide, EOS then PAD, or no EOS at the limit
    row = rng.integers(4, vocab, size=max_len)
    k = int(rng.integers(0, max_len + 1))
    if k < max_len:
      row[k], row[k + 1:] = EOS, PAD
    samples.append(row)
  return train, np.stack(samples), rng.integers(0, 60, size=40)


def test_self_critical_compat_matches_its_definition(tmp_path):
  vocab, max_len = 12, 6
  train, samples, ref_index = _sc_data(7, vocab, max_len)
  scorer = cider.CiderD.for_training(train, str(tmp_path), vocab, compat="self_critical",
                                     max_len=max_len, log=lambda s: None)
  got = scorer.score(samples, ref_index, scorer.prepare_refs(train))
  want = self_critical_ciderd(samples, ref_index, train, train, max_len)
  assert want.max() > 0.5
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
  # The default ("jaxcap": df on references cut to max_len, EOS after every reference) is
  # another reward on the same data.
  cut = [[r[:max_len] for r in refs] for refs in train]
  default = cider.CiderD.for_training(cut, str(tmp_path), vocab, log=lambda s: None)
  other = default.score(samples, ref_index, default.prepare_refs(cut))
  assert np.abs(other - want).max() > 1e-3


def test_self_critical_compat_from_a_dataset(tmp_path):
  """Rewarder with scst.cider_compat='self_critical' reads the full captions of the dataset."""
  from jaxcap.data import synthetic
  from jaxcap.training import scst
  from tests.training.test_train import tiny_config
  from jaxcap import data as data_lib
  config = tiny_config()
  config.data.max_len = 5  # most synthetic captions are longer: truncation matters
  ds = data_lib.get_dataset(config.data)
  full = ds.train_references_ids(full=True)
  assert max(len(r) for refs in full for r in refs) > 5
  assert all(len(r) <= 5 for refs in ds.train_references_ids() for r in refs)
  rw = scst.Rewarder(ds, str(tmp_path), cider_compat="self_critical")
  rng = np.random.default_rng(0)
  index = rng.integers(0, len(full), size=16)
  samples = np.full((16, 5), PAD, np.int64)  # a reference's first words, some ended by EOS
  for row, i in enumerate(index):
    words = full[i][rng.integers(len(full[i]))][:rng.integers(2, 6)]
    samples[row, :len(words)] = words
    if len(words) < 5:
      samples[row, len(words)] = EOS
  want = self_critical_ciderd(samples, index, full, full, 5)
  np.testing.assert_allclose(rw(samples, index), want, rtol=0, atol=1e-9)
  with pytest.raises(ValueError, match="scst.cider_compat"):
    scst.Rewarder(ds, str(tmp_path), cider_compat="pytorch")
