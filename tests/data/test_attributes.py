"""Attribute labels: top-K content words against an independent count."""

import collections

import numpy as np

from jaxcap.data import attributes


def test_top_k_matches_plain_count():
  rng = np.random.default_rng(0)
  words = ["dog", "cat", "the", "a", "runs", "on", "red", "12", "ball", "of", "grass"]
  refs = [[[words[j] for j in rng.integers(0, len(words), 6)] for _ in range(5)]
          for _ in range(30)]
  counts = collections.Counter(w for img in refs for r in img for w in r
                               if w not in {"the", "a", "on", "of", "12"})
  want = sorted(counts, key=lambda w: (-counts[w], w))[:4]
  top = attributes.top_content_words((r for img in refs for r in img), k=4)
  assert top == want


def test_oracle_orders_by_reference_support():
  index = {"dog": 0, "ball": 1, "grass": 2, "cat": 3}
  refs = [["a", "dog", "dog", "grass"], ["dog", "ball"], ["ball", "on", "grass"], ["dog"]]
  # dog: 3 refs, ball: 2, grass: 2 (tie broken by rank: ball before grass); cat absent.
  assert attributes.oracle_attributes(refs, index, 5) == ["dog", "ball", "grass"]
  assert attributes.oracle_attributes(refs, index, 1) == ["dog"]


def test_stop_words_and_numbers_are_not_content():
  for w in ("the", "of", "left", "inside", "und", "der", "3", "1.5"):
    assert not attributes.is_content_word(w)
  for w in ("dog", "red", "circle", "frau"):
    assert attributes.is_content_word(w)
