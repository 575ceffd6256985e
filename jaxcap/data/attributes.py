"""Semantic-attribute labels: the top-K content words of the training references.

ETA's semantic encoder and an attribute detector both need, per image, which of the K
(default 1,000) most frequent *content* words of the training references occur among that
image's references. A content word is any token that is not in :data:`STOP_WORDS` and
is not a pure number: the list below holds English and German function words
(articles, pronouns, prepositions, auxiliaries, conjunctions) and the spatial relation
words of ``synthetic_scenes``, so the attributes are objects, colours, sizes and actions.

Dimension legend: K attribute vocabulary size, A attributes kept per image.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Iterable, Sequence

from jaxcap.errors import BadInput


STOP_WORDS = frozenset("""
a an the this that these those there here it its it's they them their theirs he him his
she her hers we us our you your i me my one ones some any each every all both other
another such no not nor only own same so than too very s t can will just don should now
is are was were be been being am has have had having do does did doing get gets got
of in on at by for with about against between into through during before after above
below to from up down out off over under again further then once near next beside
behind inside outside onto upon around along across toward towards while
and but or because as until if what which who whom whose where when why how
left right top bottom front back middle side
der die das den dem des ein eine einer eines einem einen und oder ist sind mit von zu
im in auf an am bei aus fur für über unter vor hinter neben zwischen sich es sie er
""".split())


def is_content_word(word: str) -> bool:
  """True for words that can be attributes (not a stop word, not a number)."""
  return bool(word) and word not in STOP_WORDS and not word.replace(".", "").isdigit()


def top_content_words(token_lists: Iterable[Sequence[str]], k: int = 1000,
                      allowed: Iterable[str] | None = None) -> list[str]:
  """The ``k`` most frequent content words (ties alphabetical), restricted to ``allowed``."""
  allowed = None if allowed is None else set(allowed)
  counts = collections.Counter(
      t for toks in token_lists for t in toks
      if is_content_word(t) and (allowed is None or t in allowed))
  return sorted(counts, key=lambda w: (-counts[w], w))[:k]


def oracle_attributes(refs: Sequence[Sequence[str]], index: dict[str, int],
                      max_attributes: int) -> list[str]:
  """Attribute words of one image: its references' top-K content words.

  Ordered by how many of the image's references name the word (most first), ties by the
  word's global rank, so truncation to ``max_attributes`` keeps the most salient ones.
  """
  per_ref = collections.Counter(w for toks in refs for w in set(toks) if w in index)
  words = sorted(per_ref, key=lambda w: (-per_ref[w], index[w]))
  return words[:max_attributes]


def write_file(path: str, table: dict) -> None:
  """Writes an attributes file, ``{image_id: [words]}`` JSON, atomically (temporary file, then
  rename): what ``jaxcap/papers/eta/train_attributes.py`` writes and ``data.attributes_file`` reads."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump({str(k): list(v) for k, v in table.items()}, f)
  os.replace(tmp, path)


def read_file(path: str) -> dict:
  """``{str(image_id): [words]}`` from an attributes file; a one-line BadInput names the file
  (and the config field that points at it) when it is missing or malformed."""
  try:
    with open(path) as f:
      table = json.load(f)
    if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
      raise TypeError("not an object of word lists")
  except (OSError, ValueError, TypeError) as e:
    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    raise BadInput(f"{path or '<attributes_file unset>'}: field 'attributes_file' is not "
                     f"usable ({why}); expected a JSON object {{image_id: [words]}} (written "
                     "by jaxcap/papers/eta/train_attributes.py)") from None
  return {str(k): v for k, v in table.items()}
