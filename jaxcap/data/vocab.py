"""Vocabulary and tokenisation (Karpathy / self-critical.pytorch conventions).

Special ids are fixed so every module can rely on them: ``PAD=0, BOS=1, EOS=2, UNK=3``;
words start at 4, ordered by decreasing training count (ties alphabetical), so a
vocabulary is a deterministic function of the training captions and the threshold.

Raw text is tokenised by :func:`tokenize`: lowercase, every character that is not a
letter, digit, apostrophe or hyphen becomes a space (the same rule as Karpathy's
``prepro`` scripts and pycocoevalcap's PTB tokenizer punctuation removal, to within
contractions), then split on whitespace. Karpathy JSONs already hold ``tokens``: those are
used as they are.
"""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Iterable, Sequence

from jaxcap.errors import BadInput

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")

_NON_WORD = re.compile(r"[^a-z0-9'\-\u00c0-\u024f\u00df]+")


def tokenize(text: str) -> list[str]:
  """Lowercases and splits raw caption text into word tokens."""
  return [t for t in _NON_WORD.sub(" ", text.lower()).split() if t.strip("'-")]


class Vocab:
  """A word <-> id mapping with fixed special ids."""

  def __init__(self, words: Sequence[str]):
    self.itos = list(SPECIALS) + [w for w in words if w not in SPECIALS]
    self.stoi = {w: i for i, w in enumerate(self.itos)}
    if len(self.stoi) != len(self.itos):
      raise BadInput("vocabulary words must be unique")

  def __len__(self) -> int:
    return len(self.itos)

  def __eq__(self, other) -> bool:
    return isinstance(other, Vocab) and self.itos == other.itos

  @classmethod
  def build(cls, token_lists: Iterable[Sequence[str]], min_count: int = 5,
            max_size: int | None = None) -> "Vocab":
    """Keeps words seen at least ``min_count`` times (everything else maps to UNK)."""
    counts = collections.Counter(t for toks in token_lists for t in toks)
    words = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                   key=lambda w: (-counts[w], w))
    if max_size is not None:
      words = words[: max(0, max_size - len(SPECIALS))]
    vocab = cls(words)
    vocab.counts = counts
    return vocab

  def encode(self, tokens: Sequence[str], max_len: int | None = None,
             add_eos: bool = False) -> list[int]:
    """Maps tokens to ids (unknown words to UNK), truncating to ``max_len`` words."""
    ids = [self.stoi.get(t, UNK) for t in tokens]
    if max_len is not None:
      ids = ids[:max_len]
    if add_eos:
      ids.append(EOS)
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Ids to a space-joined string; stops at the first EOS, skips PAD and BOS."""
    words = []
    for i in ids:
      i = int(i)
      if i == EOS:
        break
      if i in (PAD, BOS):
        continue
      words.append(self.itos[i] if 0 <= i < len(self.itos) else SPECIALS[UNK])
    return " ".join(words)

  def unk_rate(self, token_lists: Iterable[Sequence[str]]) -> float:
    total = unk = 0
    for toks in token_lists:
      for t in toks:
        total += 1
        unk += t not in self.stoi
    return unk / max(total, 1)

  def to_json(self) -> dict:
    return {"itos": self.itos}

  def save(self, path: str) -> None:
    """Writes atomically (temporary file, then rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
      json.dump(self.to_json(), f)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> "Vocab":
    try:
      with open(path) as f:
        data = json.load(f)
      itos = data["itos"]
      if not (isinstance(itos, list) and all(isinstance(w, str) for w in itos)):
        raise TypeError("'itos' is not a list of words")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: nested past the stack
      raise BadInput(f"{path}: not a jaxcap vocabulary JSON with an 'itos' list ({e})") from None
    if list(itos[: len(SPECIALS)]) != list(SPECIALS):
      raise BadInput(f"{path}: field 'itos' must start with {list(SPECIALS)}")
    return cls(itos[len(SPECIALS):])
