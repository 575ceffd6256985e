"""Vocabulary on real text: the COCO Karpathy-test references (COCO annotation format)."""

import collections
import json

import numpy as np

from jaxcap.data.vocab import EOS, UNK, Vocab, tokenize


def test_coco_karpathy_test_vocabulary(shared_data):
  with open(shared_data / "coco_karpathy_test" / "captions_karpathy_test2014.json") as f:
    anns = json.load(f)["annotations"]
  assert len(anns) == 25000
  toks = [tokenize(a["caption"]) for a in anns]
  assert all(toks)
  train, held = toks[:20000], toks[20000:]
  vocab = Vocab.build(train, min_count=5)
  counts = collections.Counter(w for t in train for w in t)
  kept = {w for w, c in counts.items() if c >= 5}
  assert set(vocab.itos[4:]) == kept and len(vocab) == len(kept) + 4
  # Independent UNK rate: fraction of held-out tokens outside the kept words.
  flat = [w for t in held for w in t]
  want = sum(w not in kept for w in flat) / len(flat)
  assert abs(vocab.unk_rate(held) - want) < 1e-12
  assert 0.0 < want < 0.05
  print(f"COCO Karpathy-test vocabulary: {len(vocab)} ids, held-out UNK rate {want:.4f}")
  # Round trip: every in-vocabulary caption decodes to itself.
  n_exact = 0
  for t in held:
    ids = vocab.encode(t, add_eos=True)
    assert ids[-1] == EOS
    dec = vocab.decode(ids + [0, 0]).split()
    assert dec == [w if w in kept else "<unk>" for w in t]
    n_exact += UNK not in ids
  assert n_exact > 0.5 * len(held)


def test_tokenize_rule_on_coco_raw_text(shared_data):
  with open(shared_data / "coco_karpathy_test" / "captions_karpathy_test2014.json") as f:
    caps = [a["caption"] for a in json.load(f)["annotations"][:2000]]
  for c in caps:
    for t in tokenize(c):
      assert t == t.lower() and not any(ch in t for ch in ".,;:!?\"()")
  assert tokenize("A man's dog, running.") == ["a", "man's", "dog", "running"]


def test_save_load_round_trip(tmp_path):
  v = Vocab.build([["b", "a", "b"], ["c", "b", "a"]], min_count=1)
  assert v.itos[4:] == ["b", "a", "c"]  # by count, ties alphabetical
  v.save(str(tmp_path / "v.json"))
  assert Vocab.load(str(tmp_path / "v.json")) == v
  np.testing.assert_array_equal(v.encode(["a", "zzz"], add_eos=True), [5, UNK, EOS])
