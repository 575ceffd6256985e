"""CLIP's tokenizer against ``clip.tokenize`` (tokens.json, written by openai-clip's own
tokenize: make_fixtures.py): punctuation, contractions, non-ASCII text, HTML entities, mojibake,
special tokens and captions past 77 tokens, cut with ``truncate=True`` and refused without."""

import json
import os

import numpy as np
import pytest

from jaxcap.clip import tokenizer

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.fixture(scope="module")
def cases():
  with open(os.path.join(FIXTURES, "tokens.json"), encoding="utf-8") as f:
    return json.load(f)


def test_ids_equal_clip_tokenize(cases):
  assert len(cases) >= 19 and sum(c["refused_without_truncate"] for c in cases) >= 2
  got = tokenizer.tokenize([c["text"] for c in cases], truncate=True)
  assert got.shape == (len(cases), 77) and got.dtype == np.int32
  for row, case in zip(got, cases):
    assert row[row != 0].tolist() == case["ids"], case["text"]
    assert row[len(case["ids"]):].tolist() == [0] * (77 - len(case["ids"]))


def test_too_long_is_refused_without_truncate(cases):
  for case in cases:
    if case["refused_without_truncate"]:
      with pytest.raises(ValueError, match="longer than the context length 77; expected truncate=True"):
        tokenizer.tokenize(case["text"])
    else:
      tokenizer.tokenize(case["text"])


def test_vocabulary_layout():
  tok = tokenizer.default()
  assert len(tok.words) == tokenizer.VOCAB_SIZE == 49408
  assert (tok.sot, tok.eot) == (49406, 49407)
  assert tok.words[:3] == ["!", '"', "#"] and tok.words[256] == "!</w>"
