"""CLIP's byte-pair tokenizer: the token ids ``clip.tokenize`` gives (openai/CLIP).

A caption is cleaned as theirs is (``ftfy.fix_text``, HTML entities unescaped twice, runs of
white space made one space, lower case), split by their pattern (the two special tokens, English
contractions, runs of letters, single digits, runs of other non-space characters), each piece's
UTF-8 bytes mapped to printable characters (GPT-2's byte table) and merged by the ranked pairs of
``bpe_simple_vocab_16e6.txt.gz`` (its first 48,894 merges, as theirs; the file ships with jaxcap
under OpenAI's MIT license, LICENSE.bpe) with ``</w>`` marking a word's end. Ids: the 256 byte
characters (printable ones first), the same with ``</w>``, the merges, then ``<|startoftext|>`` (49406) and
``<|endoftext|>`` (49407): 49,408 in all. A caption becomes ``[sot] + ids + [eot]`` padded with
zeros to ``context_length``; a longer one is an error unless ``truncate`` (then cut to
``context_length`` with the last id made ``eot``), as theirs.
"""

from __future__ import annotations

import functools
import gzip
import html
import os
from typing import Sequence

import numpy as np

from jaxcap.errors import BadInput

VOCAB_FILE = os.path.join(os.path.dirname(__file__), "bpe_simple_vocab_16e6.txt.gz")
NUM_MERGES = 49152 - 256 - 2  # theirs: merges[1:49152-256-2+1] after the version line
SOT, EOT = "<|startoftext|>", "<|endoftext|>"
CONTEXT_LENGTH = 77
VOCAB_SIZE = 49408

_PATTERN = (r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]"""
            r"""|[^\s\p{L}\p{N}]+""")


@functools.lru_cache(maxsize=None)
def byte_table() -> dict[int, str]:
  """GPT-2's reversible byte -> printable character table: the printable Latin-1 bytes map to
  themselves, the others, in byte order, to characters from U+0100 up. Its insertion order (the
  printable bytes first) is the order of the first 256 ids."""
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  table = {b: chr(b) for b in keep}
  for extra, b in enumerate(b for b in range(256) if b not in table):
    table[b] = chr(256 + extra)
  return table


class Tokenizer:
  """``encode(text) -> ids`` and ``__call__(texts) -> int32 [N, context_length]``."""

  def __init__(self, vocab_file: str = VOCAB_FILE):
    import regex  # \p{L} / \p{N} classes (the stdlib re has none)
    with gzip.open(vocab_file, "rt", encoding="utf-8") as f:
      lines = f.read().split("\n")[1:NUM_MERGES + 1]
    merges = [tuple(line.split()) for line in lines]
    chars = list(byte_table().values())
    words = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + [SOT, EOT]
    self.ids = {w: i for i, w in enumerate(words)}
    self.words = words
    self.ranks = {m: i for i, m in enumerate(merges)}
    self.pattern = regex.compile(_PATTERN, regex.IGNORECASE)
    self.sot, self.eot = self.ids[SOT], self.ids[EOT]
    self._cache = {SOT: SOT, EOT: EOT}

  def bpe(self, piece: str) -> list[str]:
    """The merged symbols of one piece (its characters, the last one marked ``</w>``)."""
    if piece in self._cache:
      return self._cache[piece].split(" ")
    symbols = list(piece[:-1]) + [piece[-1] + "</w>"]
    while len(symbols) > 1:
      pairs = {(a, b) for a, b in zip(symbols, symbols[1:])}
      best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
      if best not in self.ranks:
        break
      merged, i = [], 0
      while i < len(symbols):  # left to right, every occurrence of the best pair
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
          merged.append(symbols[i] + symbols[i + 1])
          i += 2
        else:
          merged.append(symbols[i])
          i += 1
      symbols = merged
    self._cache[piece] = " ".join(symbols)
    return symbols

  def clean(self, text: str) -> str:
    import ftfy
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).lower()  # their whitespace_clean: \s+ -> " ", stripped

  def encode(self, text: str) -> list[int]:
    table = byte_table()
    out = []
    for piece in self.pattern.findall(self.clean(text)):
      chars = "".join(table[b] for b in piece.encode("utf-8"))
      out.extend(self.ids[s] for s in self.bpe(chars))
    return out

  def __call__(self, texts: str | Sequence[str], context_length: int = CONTEXT_LENGTH,
               truncate: bool = False) -> np.ndarray:
    if isinstance(texts, str):
      texts = [texts]
    out = np.zeros((len(texts), context_length), np.int32)
    for i, text in enumerate(texts):
      ids = [self.sot, *self.encode(text), self.eot]
      if len(ids) > context_length:
        if not truncate:
          raise BadInput(f"caption {i} ({text[:40]!r}...): {len(ids)} tokens, longer than the "
                           f"context length {context_length}; expected truncate=True to cut it")
        ids = ids[:context_length]
        ids[-1] = self.eot
      out[i, :len(ids)] = ids
    return out


@functools.lru_cache(maxsize=1)
def default() -> Tokenizer:
  return Tokenizer()


def tokenize(texts, context_length: int = CONTEXT_LENGTH, truncate: bool = False) -> np.ndarray:
  """``clip.tokenize``'s ids (int32 here; theirs int64 / int32 by torch version)."""
  return default()(texts, context_length, truncate)
