"""CIDEr-D, vectorised over a whole batch of candidates and exact.

Dimension legend: I images in a reference set, R references per image (at most), M reference
captions in all, B candidates, L tokens per caption, N n-gram orders (4), E n-gram entries.

CIDEr-D (Vedantam et al. 2015) as coded in coco-caption (pycocoevalcap's ``Cider``, which
*is* CIDEr-D: clipped counts, Gaussian length penalty, x10) and in self-critical.pytorch's
``CiderD``. For a candidate c of image i with references r = 1..R_i::

  g_n(s)[w] = tf_s(w) * (log(num_images) - log(max(1, df(w))))     for n-grams w of order n
  sim_n(c, r) = sum_w min(g_n(c)[w], g_n(r)[w]) * g_n(r)[w] / (|g_n(c)| |g_n(r)|)
                * exp(-(l_c - l_r)^2 / (2 sigma^2))
  CIDEr-D(c) = 10 / (N R_i) * sum_r sum_n sim_n(c, r)

where the division is skipped when a norm is zero and, as in both reference codes, the
"length" l_s is the number of bigrams of s (``max(len - 1, 0)``), not the number of words.

Two modes differ only in where ``df`` and ``num_images`` come from:

* corpus mode (``CiderD(vocab_size)``): the references of the set being scored, one set of
  references per image. Identical to pycocoevalcap's ``Cider`` on the same captions.
* training mode (``CiderD(vocab_size, doc_freq=...)`` or :meth:`CiderD.for_training`): the
  training references, as self-critical.pytorch's ``coco-train-idxs.p``. The table is built on
  first use and cached as ``<cache_dir>/cider_df_<hash>.npz``; the hash covers the reference
  ids, the vocabulary and the options, so a changed dataset or vocabulary rebuilds it.

Token ids in (PAD = 0 and EOS = 2 end a caption). With ``count_eos=True`` (self-critical.pytorch's
convention for the SCST reward) EOS is one more word: a candidate includes its EOS when it
emitted one, and every reference ends with exactly one EOS (appended when it stops at PAD or at
the end of its array), as in that code's ``prepro_ngrams.py`` and ``array_to_str``.

Training-mode compatibility (:meth:`CiderD.for_training`, ``compat``; config field
``scst.cider_compat``):

* ``"jaxcap"`` (default, jaxcap's original reward): the caller passes the training
  references truncated to ``max_len`` words (``CaptionDataset.train_references_ids()``); the
  document frequencies are counted on them and every reference, truncated or not, ends with
  an EOS.
* ``"self_critical"``: self-critical.pytorch's ``CiderD`` exactly. The caller passes the full
  training captions (``train_references_ids(full=True)``): the document frequencies are counted
  on full captions each ending with EOS (``prepro_ngrams.py``), and the reward's references are
  that code's 16-wide label rows read by ``array_to_str``: at most ``max_len`` words, followed
  by EOS only when the caption is shorter than ``max_len`` (a caption at or over the limit has
  no EOS). Rewards differ from ``"jaxcap"`` by up to ~0.1 on Flickr8k.

Exactness: an n-gram of ids ``w_1..w_n`` is the int64 key ``sum_j (w_j + 1) * (V + 1)^(j-1)``:
digits are never zero, so keys of every order are distinct without collisions as long as
``(V + 1)^4 < 2^63`` (V <= 55107). Counting uses ``np.unique`` and the whole batch is scored
in one pass of sorted look-ups and ``np.bincount``, in float64.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from jaxcap.data.vocab import EOS, PAD
from jaxcap.errors import BadInput

_FORMAT_VERSION = 1
COMPAT_MODES = ("jaxcap", "self_critical")


# ---------------------------------------------------------------------------------------------
# Tokens -> n-gram keys.


def _check_vocab_size(vocab_size: int, n: int) -> int:
  vocab_size = int(vocab_size)
  if vocab_size < 3:
    raise BadInput(f"cider: vocab_size must be at least 3 (PAD, BOS, EOS), got {vocab_size}")
  if float(vocab_size + 1) ** n >= 2.0 ** 63:
    raise BadInput(f"cider: vocab_size {vocab_size} too large for exact int64 {n}-gram keys "
                   f"(need (vocab_size + 1)^{n} < 2^63)")
  return vocab_size


def _as_matrix(seqs) -> np.ndarray:
  """A 2-D int64 array ``[M, L]`` from a 2-D array or a list of 1-D sequences (PAD-filled)."""
  if isinstance(seqs, np.ndarray) and seqs.ndim == 2:
    return seqs.astype(np.int64, copy=False)
  seqs = list(seqs)
  len_M = np.fromiter(map(len, seqs), np.int64, count=len(seqs))
  out = np.full((len(seqs), max(int(len_M.max(initial=0)), 1)), PAD, np.int64)
  if len_M.sum():
    flat = np.concatenate([np.asarray(s).reshape(-1) for s in seqs if len(s)])
    if flat.dtype.kind not in "iu":
      raise ValueError(f"cider: token ids must be integers, got dtype {flat.dtype}")
    out[np.arange(out.shape[1])[None, :] < len_M[:, None]] = flat
  return out


def _truncate(x_MxL: np.ndarray, vocab_size: int, count_eos: bool, force_eos: bool, what: str,
              max_words: int | None = None):
  """Applies the EOS/PAD rule; returns ``(tokens [M, L'], lengths [M])``.

  Args:
    x_MxL: int64 token ids.
    vocab_size: ids must lie in ``[0, vocab_size)``.
    count_eos: keep the first EOS as a word.
    force_eos: (with ``count_eos``) end every row with exactly one EOS, appending one when the
      row stops at PAD or at the end of the array (the reference-side convention).
    what: names the input in errors.
    max_words: (references, ``compat="self_critical"``) keep at most this many words, and
      append EOS only to captions shorter than that, as self-critical.pytorch's label rows.
  """
  m, l = x_MxL.shape
  if x_MxL.size and (x_MxL.min() < 0 or x_MxL.max() >= vocab_size):
    bad = x_MxL[(x_MxL < 0) | (x_MxL >= vocab_size)][0]
    raise ValueError(f"cider: {what} holds token id {int(bad)}, expected ids in [0, {vocab_size})")
  term = (x_MxL == PAD) | (x_MxL == EOS)
  has_term = term.any(axis=1)
  first = np.where(has_term, term.argmax(axis=1), l)
  if max_words is not None:
    first = np.minimum(first, max_words)
  if not count_eos:
    return x_MxL, first
  ends_eos = has_term & (x_MxL[np.arange(m), np.minimum(first, max(l - 1, 0))] == EOS)
  if not force_eos:
    return x_MxL, first + ends_eos
  # Appending needs room for one more column when a row fills the array.
  out = np.concatenate([x_MxL, np.full((m, 1), PAD, np.int64)], axis=1)
  gets_eos = first < max_words if max_words is not None else np.ones(m, bool)
  out[np.arange(m)[gets_eos], first[gets_eos]] = EOS
  return out, first + gets_eos


def _term_counts(x_MxL: np.ndarray, len_M: np.ndarray, vocab_size: int, n: int):
  """Term frequencies of every (row, n-gram), orders 1..n.

  Returns:
    ``(row [G], key [G], order [G] in 0..n-1, tf [G] float64)``, grouped by order then row.
  """
  m, l = x_MxL.shape
  base = np.int64(vocab_size + 1)
  digits_MxL = x_MxL + 1
  key_MxW = np.zeros((m, l), np.int64)
  rows, keys, orders, tfs = [], [], [], []
  scale = np.int64(1)
  sentinel = np.iinfo(np.int64).max
  for k in range(n):
    width = l - k
    if width <= 0:
      break
    # The (k+1)-gram key at i extends the k-gram key at i by one more digit.
    key_MxW = key_MxW[:, :width] + digits_MxL[:, k:] * scale
    scale = scale * base
    count_M = np.clip(len_M - k, 0, width)
    valid_MxW = np.arange(width)[None, :] < count_M[:, None]
    # Sorting each short row puts repeats side by side: no global sort over all rows.
    sorted_MxW = np.sort(np.where(valid_MxW, key_MxW, sentinel), axis=1)
    start_MxW = valid_MxW.copy()
    start_MxW[:, 1:] &= sorted_MxW[:, 1:] != sorted_MxW[:, :-1]
    r, c = np.nonzero(start_MxW)
    # A run ends where the next run of the same row starts, or at the row's last valid entry.
    nxt_r = np.append(r[1:], -1)
    end = np.where(nxt_r == r, np.append(c[1:], 0), count_M[r])
    rows.append(r)
    keys.append(sorted_MxW[r, c])
    orders.append(np.full(len(r), k, np.int64))
    tfs.append((end - c).astype(np.float64))
  if not rows:
    z = np.zeros(0, np.int64)
    return z, z, z, np.zeros(0, np.float64)
  return (np.concatenate(rows), np.concatenate(keys), np.concatenate(orders),
          np.concatenate(tfs))


def _unique_inverse(x: np.ndarray):
  """``(sorted distinct values, index of each element in them)`` by one argsort."""
  order = np.argsort(x)
  xs = x[order]
  flag = np.ones(len(xs), bool)
  flag[1:] = xs[1:] != xs[:-1]
  inv = np.empty(len(xs), np.int64)
  inv[order] = np.cumsum(flag) - 1
  return xs[flag], inv


def _flatten_refs(refs_ids, what: str = "references"):
  """References per image -> ``(rows [M, L] int64, nref [I])``, rows image-major.

  Accepts an int array ``[I, R, L]`` or a sequence (one item per image) of 2-D arrays
  ``[R_i, L]`` or of sequences of 1-D id sequences.
  """
  if isinstance(refs_ids, np.ndarray):
    if refs_ids.ndim != 3:
      raise ValueError(f"cider: {what} array must be [images, refs, length], got shape "
                       f"{refs_ids.shape}")
    i, r, l = refs_ids.shape
    nref = np.full(i, r, np.int64)
    return refs_ids.reshape(i * r, l).astype(np.int64), nref
  rows, nref = [], []
  for idx, image_refs in enumerate(refs_ids):
    if isinstance(image_refs, np.ndarray) and image_refs.ndim == 2:
      image_refs = list(image_refs)
    if len(image_refs) == 0:
      raise ValueError(f"cider: {what}[{idx}] has no reference captions, expected at least one")
    rows.extend(image_refs)
    nref.append(len(image_refs))
  return _as_matrix(rows), np.asarray(nref, np.int64)


# ---------------------------------------------------------------------------------------------
# Document frequencies (training mode).


@dataclasses.dataclass(frozen=True)
class DocFreq:
  """Document frequencies of n-grams: in how many images' references each n-gram occurs.

  Attributes:
    keys: int64 ``[G]`` sorted n-gram keys.
    counts: float64 ``[G]`` number of images whose references hold the n-gram.
    num_images: number of images the table was counted over (``ref_len = log(num_images)``).
    vocab_size: the key base is ``vocab_size + 1``.
    n: largest n-gram order.
    count_eos: whether EOS was a word when counting.
  """

  keys: np.ndarray
  counts: np.ndarray
  num_images: int
  vocab_size: int
  n: int = 4
  count_eos: bool = False

  @property
  def ref_len(self) -> float:
    return float(np.log(float(self.num_images)))

  def lookup(self, keys: np.ndarray) -> np.ndarray:
    """``df`` of each key (0 for n-grams never seen)."""
    if len(self.keys) == 0:
      return np.zeros(len(keys), np.float64)
    pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
    return np.where(self.keys[pos] == keys, self.counts[pos], 0.0)


def _doc_freq_from_matrix(x_MxL, nref_I, vocab_size, n, count_eos) -> DocFreq:
  x_MxL, len_M = _truncate(x_MxL, vocab_size, count_eos, force_eos=True, what="references")
  return _doc_freq_core(x_MxL, len_M, nref_I, vocab_size, n, count_eos)


def _doc_freq_core(x_MxL, len_M, nref_I, vocab_size, n, count_eos,
                   chunk_images: int = 16384) -> DocFreq:
  """Document frequencies of already truncated reference rows (``len_M`` tokens each)."""
  first_M = np.concatenate([[0], np.cumsum(nref_I)])
  keys = []
  # Chunks of images bound the memory of the n-gram arrays on large training sets.
  for lo in range(0, len(nref_I), chunk_images):
    hi = min(lo + chunk_images, len(nref_I))
    rows = slice(first_M[lo], first_M[hi])
    owner_M = np.repeat(np.arange(hi - lo), nref_I[lo:hi])
    row_G, key_G, _, _ = _term_counts(x_MxL[rows], len_M[rows], vocab_size, n)
    keys.append(_image_pairs(owner_M[row_G], key_G)[0].keys)
  key_P = np.concatenate(keys) if keys else np.zeros(0, np.int64)
  # Each (image, n-gram) pair appears once, so counting keys counts images.
  ukey, counts = np.unique(key_P, return_counts=True)
  return DocFreq(ukey.astype(np.int64), counts.astype(np.float64), len(nref_I), vocab_size, n,
                 count_eos)


def _image_pairs(owner_G, key_G):
  """Distinct (image, n-gram) pairs of counted reference n-grams (one entry per reference).

  Returns:
    ``(pairs, gram [G], join [J], jinv [G])``: ``gram`` indexes the distinct n-gram keys
    ``pairs.grams [U]``; ``join = image * U + gram`` is sorted and ``jinv`` maps each entry to
    its pair.
  """
  ukey, gram_G = _unique_inverse(key_G)
  u = np.int64(max(len(ukey), 1))
  # An n-gram counts once per image however many of its references hold it.
  join_J, jinv_G = _unique_inverse(owner_G * u + gram_G)
  pairs = _Pairs(keys=ukey[join_J % u], grams=ukey,
                 df=np.bincount(join_J % u, minlength=len(ukey)).astype(np.float64))
  return pairs, gram_G, join_J, jinv_G


@dataclasses.dataclass(frozen=True)
class _Pairs:
  keys: np.ndarray   # n-gram key of each (image, n-gram) pair [J]
  grams: np.ndarray  # distinct n-gram keys [U]
  df: np.ndarray     # images holding each distinct n-gram [U]


def build_doc_freq(refs_ids, vocab_size: int, *, n: int = 4, count_eos: bool = False) -> DocFreq:
  """Counts document frequencies over a reference set (one entry per image).

  Args:
    refs_ids: per image, its reference captions as id sequences (see :meth:`CiderD.prepare_refs`).
    vocab_size: ids lie in ``[0, vocab_size)``.
    n: largest n-gram order.
    count_eos: count EOS as a word (references then end with one EOS each).
  """
  vocab_size = _check_vocab_size(vocab_size, n)
  x_MxL, nref_I = _flatten_refs(refs_ids)
  return _doc_freq_from_matrix(x_MxL, nref_I, vocab_size, n, count_eos)


def _vocab_fingerprint(vocab) -> tuple[int, bytes]:
  """``(vocab_size, bytes hashed)`` for a ``Vocab``, a list of words or a plain size."""
  if hasattr(vocab, "itos"):
    words = list(vocab.itos)
    return len(words), "\n".join(words).encode()
  if isinstance(vocab, (int, np.integer)):
    return int(vocab), f"size={int(vocab)}".encode()
  words = [str(w) for w in vocab]
  return len(words), "\n".join(words).encode()


def doc_freq_cache_path(refs_ids, cache_dir: str, vocab, *, n: int = 4,
                        count_eos: bool = False) -> str:
  """Where :func:`load_or_build_doc_freq` keeps the table for these references and vocabulary."""
  vocab_size, vocab_bytes = _vocab_fingerprint(vocab)
  x_MxL, nref_I = _flatten_refs(refs_ids)
  digest = _digest(x_MxL, nref_I, vocab_bytes, n, count_eos)
  return os.path.join(cache_dir, f"cider_df_{digest}.npz")


def _digest(x_MxL, nref_I, vocab_bytes, n, count_eos) -> str:
  # Hash the ids up to each caption's end so padding width does not change the name.
  term = (x_MxL == PAD) | (x_MxL == EOS)
  lens = np.where(term.any(axis=1), term.argmax(axis=1), x_MxL.shape[1])
  keep = np.arange(x_MxL.shape[1])[None, :] < lens[:, None]
  h = hashlib.sha256()
  h.update(f"jaxcap-cider-df-v{_FORMAT_VERSION};n={n};eos={int(count_eos)};".encode())
  h.update(vocab_bytes)
  h.update(np.ascontiguousarray(nref_I, np.int64).tobytes())
  h.update(np.ascontiguousarray(lens, np.int64).tobytes())
  h.update(np.ascontiguousarray(x_MxL[keep], np.int64).tobytes())
  return h.hexdigest()[:20]


def load_or_build_doc_freq(refs_ids, cache_dir: str, vocab, *, n: int = 4,
                           count_eos: bool = False, log=print) -> DocFreq:
  """The training document-frequency table, from ``cache_dir`` or counted and cached there.

  Args:
    refs_ids: training references per image (``CaptionDataset.train_references_ids()``).
    cache_dir: directory beside the dataset; created when missing (None: counted, not cached).
    vocab: a ``Vocab`` (its words are hashed), a list of words, or the vocabulary size.
    n: largest n-gram order.
    count_eos: count EOS as a word.
    log: one line when the table is built.

  Returns:
    The :class:`DocFreq`; the file name's hash changes with the references, the vocabulary,
    ``n`` and ``count_eos``, so a stale table is never read.
  """
  vocab_size, vocab_bytes = _vocab_fingerprint(vocab)
  vocab_size = _check_vocab_size(vocab_size, n)
  x_MxL, nref_I = _flatten_refs(refs_ids, "training references")
  if cache_dir is None:
    return _doc_freq_from_matrix(x_MxL, nref_I, vocab_size, n, count_eos)
  digest = _digest(x_MxL, nref_I, vocab_bytes, n, count_eos)
  path = os.path.join(cache_dir, f"cider_df_{digest}.npz")
  if os.path.exists(path):
    try:
      with np.load(path) as z:
        table = DocFreq(z["keys"].astype(np.int64), z["counts"].astype(np.float64),
                        int(z["num_images"]), int(z["vocab_size"]), int(z["n"]),
                        bool(z["count_eos"]))
      if (table.vocab_size, table.n, table.count_eos, table.num_images) == (
          vocab_size, n, count_eos, len(nref_I)):
        return table
    except (OSError, ValueError, KeyError) as e:
      log(f"cider: ignoring unreadable document-frequency cache {path} ({e}); rebuilding")
  table = _doc_freq_from_matrix(x_MxL, nref_I, vocab_size, n, count_eos)
  os.makedirs(cache_dir, exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    np.savez(f, keys=table.keys, counts=table.counts, num_images=table.num_images,
             vocab_size=table.vocab_size, n=table.n, count_eos=table.count_eos)
  os.replace(tmp, path)
  log(f"cider: counted document frequencies over {table.num_images} training images "
      f"({len(table.keys)} n-grams) -> {path}")
  return table


# ---------------------------------------------------------------------------------------------
# The scorer.


@dataclasses.dataclass(frozen=True)
class RefCache:
  """The reference side of CIDEr-D for one image set, computed once by :meth:`CiderD.prepare_refs`.

  Attributes:
    df: the document frequencies used for every vector (the set's own in corpus mode).
    gram_keys: int64 ``[U]`` sorted distinct n-gram keys of the references.
    join_keys: int64 ``[J]`` sorted ``image * U + gram`` for every (image, n-gram) pair.
    weights_JxR: float64 tf-idf weight of that n-gram in each reference slot (0 when absent).
    norm_IxRxN: float64 reference vector norms per order.
    len_IxR: float64 reference lengths (bigram counts).
    nref_I: int64 references per image.
  """

  df: DocFreq
  gram_keys: np.ndarray
  join_keys: np.ndarray
  weights_JxR: np.ndarray
  norm_IxRxN: np.ndarray
  len_IxR: np.ndarray
  nref_I: np.ndarray

  @property
  def num_images(self) -> int:
    return len(self.nref_I)


class CiderD:
  """Vectorised, exact CIDEr-D over token ids.

  Example (SCST)::

    scorer = CiderD.for_training(ds.train_references_ids(), cache_dir, ds.vocab)
    refs = scorer.prepare_refs(ds_refs_ids_of_the_batch)       # once per set of images
    rewards = scorer.score(samples_BxL, image_of_sample_B, refs)   # float64 [B]
  """

  def __init__(self, vocab_size: int, *, doc_freq: DocFreq | None = None, n: int = 4,
               sigma: float = 6.0, count_eos: bool = False, ref_max_len: int | None = None):
    """Corpus mode when ``doc_freq`` is None, training mode otherwise.

    Args:
      vocab_size: token ids lie in ``[0, vocab_size)``.
      doc_freq: training document frequencies (:func:`load_or_build_doc_freq`).
      n: largest n-gram order (4 for CIDEr-D).
      sigma: standard deviation of the Gaussian length penalty.
      count_eos: count EOS as a word (self-critical.pytorch's reward convention).
      ref_max_len: None: references are used as given (each ends with EOS under
        ``count_eos``). An int: :meth:`prepare_refs` keeps at most that many words of each
        reference and, under ``count_eos``, appends EOS only to shorter ones
        (``compat="self_critical"``).
    """
    self.vocab_size = _check_vocab_size(vocab_size, n)
    self.n = int(n)
    self.sigma = float(sigma)
    self.count_eos = bool(count_eos)
    if ref_max_len is not None and int(ref_max_len) < 1:
      raise BadInput(f"cider: ref_max_len must be >= 1 or None, got {ref_max_len}")
    self.ref_max_len = None if ref_max_len is None else int(ref_max_len)
    if doc_freq is not None and (doc_freq.vocab_size, doc_freq.n, doc_freq.count_eos) != (
        self.vocab_size, self.n, self.count_eos):
      raise ValueError(
          f"cider: doc_freq was counted with vocab_size={doc_freq.vocab_size}, n={doc_freq.n}, "
          f"count_eos={doc_freq.count_eos}; scorer expects {self.vocab_size}, {self.n}, "
          f"{self.count_eos}")
    self.doc_freq = doc_freq

  @classmethod
  def for_training(cls, train_refs_ids, cache_dir: str, vocab, *, n: int = 4, sigma: float = 6.0,
                   count_eos: bool = True, compat: str = "jaxcap", max_len: int | None = None,
                   log=print) -> "CiderD":
    """Training mode with the document-frequency table loaded from, or built into, ``cache_dir``.

    Args:
      train_refs_ids: the training references per image the table is counted on: truncated to
        ``max_len`` words for ``compat="jaxcap"``, full captions for ``"self_critical"``.
      compat: ``"jaxcap"`` (default) or ``"self_critical"`` (see the module docstring).
      max_len: the caption length limit (``data.max_len``); needed by ``"self_critical"``,
        whose references are then cut to it by :meth:`prepare_refs` (pass them full there too).
      Others as in :meth:`__init__` and :func:`load_or_build_doc_freq`.
    """
    if compat not in COMPAT_MODES:
      raise BadInput(f"cider: compat must be one of {COMPAT_MODES}, got {compat!r}")
    ref_max_len = None
    if compat == "self_critical":
      if not count_eos or max_len is None:
        raise BadInput("cider: compat='self_critical' needs count_eos=True and max_len "
                       f"(got count_eos={count_eos}, max_len={max_len})")
      ref_max_len = int(max_len)
    table = load_or_build_doc_freq(train_refs_ids, cache_dir, vocab, n=n, count_eos=count_eos,
                                   log=log)
    return cls(table.vocab_size, doc_freq=table, n=n, sigma=sigma, count_eos=count_eos,
               ref_max_len=ref_max_len)

  @property
  def mode(self) -> str:
    return "corpus" if self.doc_freq is None else "training"

  def _weights(self, row_G, order_G, tf_G, df_G, ref_len, len_M):
    """tf-idf weights ``[G]``, norms ``[M, N]`` and lengths ``[M]`` of counted n-grams."""
    m = len(len_M)
    weight_G = tf_G * (ref_len - np.log(np.maximum(1.0, df_G)))
    norm_MxN = np.sqrt(np.bincount(row_G * self.n + order_G, weights=weight_G * weight_G,
                                   minlength=m * self.n)).reshape(m, self.n)
    # Both reference codes take the "length" from the bigram counts.
    length_M = np.maximum(len_M - 1, 0).astype(np.float64) if self.n >= 2 else np.zeros(m)
    return weight_G, norm_MxN, length_M

  def prepare_refs(self, refs_ids) -> RefCache:
    """Precomputes the reference vectors of an image set.

    Args:
      refs_ids: per image, its references: an int array ``[I, R, L]``, or a sequence over images
        of ``[R_i, L]`` arrays or of lists of 1-D id sequences (EOS/PAD end each caption).

    Returns:
      A :class:`RefCache`; in corpus mode its document frequencies are the set's own.
    """
    x_MxL, nref_I = _flatten_refs(refs_ids)
    num_images, rmax = len(nref_I), int(nref_I.max(initial=1))
    if num_images == 0:
      raise ValueError("cider: references are empty, expected at least one image")
    x_MxL, len_M = _truncate(x_MxL, self.vocab_size, self.count_eos, force_eos=True,
                             what="references", max_words=self.ref_max_len)
    owner_M = np.repeat(np.arange(num_images), nref_I)
    slot_M = np.arange(len(owner_M)) - np.concatenate([[0], np.cumsum(nref_I)[:-1]])[owner_M]
    row_G, key_G, order_G, tf_G = _term_counts(x_MxL, len_M, self.vocab_size, self.n)
    pairs, gram_G, join_J, jinv_G = _image_pairs(owner_M[row_G], key_G)
    gram_keys = pairs.grams
    if self.doc_freq is None:
      df = DocFreq(gram_keys, pairs.df, num_images, self.vocab_size, self.n, self.count_eos)
    else:
      df = self.doc_freq
    df_G = (df.counts if self.doc_freq is None else df.lookup(gram_keys))[gram_G]
    weight_G, norm_MxN, length_M = self._weights(row_G, order_G, tf_G, df_G, df.ref_len, len_M)
    weights_JxR = np.zeros((len(join_J), rmax), np.float64)
    weights_JxR[jinv_G, slot_M[row_G]] = weight_G
    norm_IxRxN = np.zeros((num_images, rmax, self.n), np.float64)
    norm_IxRxN[owner_M, slot_M] = norm_MxN
    len_IxR = np.zeros((num_images, rmax), np.float64)
    len_IxR[owner_M, slot_M] = length_M
    return RefCache(df, gram_keys, join_J, weights_JxR, norm_IxRxN, len_IxR, nref_I)

  def score(self, cands_ids, ref_index, refs: RefCache) -> np.ndarray:
    """CIDEr-D of every candidate against its image's references.

    Args:
      cands_ids: int ``[B, L]`` candidate token ids (or a list of 1-D sequences).
      ref_index: int ``[B]``: the image (row of ``refs``) each candidate describes.
      refs: from :meth:`prepare_refs`.

    Returns:
      float64 ``[B]`` scores.
    """
    x_BxL = _as_matrix(cands_ids)
    b = x_BxL.shape[0]
    ref_index = np.asarray(ref_index, np.int64).reshape(-1)
    if len(ref_index) != b:
      raise ValueError(f"cider: ref_index has {len(ref_index)} entries, expected one per "
                       f"candidate ({b})")
    if b and (ref_index.min() < 0 or ref_index.max() >= refs.num_images):
      raise ValueError(f"cider: ref_index must lie in [0, {refs.num_images}), got values in "
                       f"[{ref_index.min()}, {ref_index.max()}]")
    x_BxL, len_B = _truncate(x_BxL, self.vocab_size, self.count_eos, force_eos=False,
                             what="candidates")
    row, key, order, tf = _term_counts(x_BxL, len_B, self.vocab_size, self.n)
    # Sorted needles let searchsorted resume from the previous hit (far fewer cache misses).
    by_key = np.argsort(key)
    row, key, order, tf = row[by_key], key[by_key], order[by_key], tf[by_key]
    weight, norm_BxN, length_B = self._weights(row, order, tf, refs.df.lookup(key),
                                               refs.df.ref_len, len_B)
    rmax = refs.weights_JxR.shape[1]
    # Join candidate n-grams with the references of their own image.
    u = len(refs.gram_keys)
    sims_BNxR = np.zeros((b * self.n, rmax), np.float64)
    if u and len(key):
      gpos = np.minimum(np.searchsorted(refs.gram_keys, key), u - 1)
      in_refs = refs.gram_keys[gpos] == key
      row, order, weight = row[in_refs], order[in_refs], weight[in_refs]
      jkey = ref_index[row] * np.int64(u) + gpos[in_refs]
      by_join = np.argsort(jkey)
      row, order, weight, jkey = row[by_join], order[by_join], weight[by_join], jkey[by_join]
      jpos = np.minimum(np.searchsorted(refs.join_keys, jkey), len(refs.join_keys) - 1)
      hit = refs.join_keys[jpos] == jkey
      w_ref_ExR = refs.weights_JxR[jpos[hit]]
      contrib_ExR = np.minimum(weight[hit][:, None], w_ref_ExR) * w_ref_ExR
      cell = row[hit] * self.n + order[hit]
      for r in range(rmax):
        sims_BNxR[:, r] = np.bincount(cell, weights=contrib_ExR[:, r], minlength=b * self.n)
    sims_BxNxR = sims_BNxR.reshape(b, self.n, rmax)
    den_BxNxR = norm_BxN[:, :, None] * refs.norm_IxRxN[ref_index].transpose(0, 2, 1)
    sims_BxNxR = np.where(den_BxNxR != 0, sims_BxNxR / np.where(den_BxNxR != 0, den_BxNxR, 1.0),
                          sims_BxNxR)
    delta_BxR = length_B[:, None] - refs.len_IxR[ref_index]
    penalty_BxR = np.e ** (-(delta_BxR ** 2) / (2 * self.sigma ** 2))
    # Unused reference slots hold zero similarity, so summing over all R is safe.
    total_B = (sims_BxNxR * penalty_BxR[:, None, :]).sum(axis=(1, 2))
    return total_B / self.n / refs.nref_I[ref_index] * 10.0

  def corpus_score(self, cands_ids, refs_ids) -> tuple[float, np.ndarray]:
    """Scores candidate ``i`` against the references of image ``i``.

    In corpus mode the document frequencies come from ``refs_ids`` (pycocoevalcap ``Cider``).

    Returns:
      ``(mean score, float64 [I] per-candidate scores)``.
    """
    refs = self.prepare_refs(refs_ids)
    x = _as_matrix(cands_ids)
    if x.shape[0] != refs.num_images:
      raise ValueError(f"cider: {x.shape[0]} candidates for {refs.num_images} images, expected "
                       "one candidate per image")
    scores = self.score(x, np.arange(refs.num_images), refs)
    return float(scores.mean()) if len(scores) else 0.0, scores


# ---------------------------------------------------------------------------------------------
# String helpers (parity with pycocoevalcap on text).


def encode_strings(candidates: Sequence[str], references: Sequence[Sequence[str]],
                   word_ids: Mapping[str, int] | None = None):
  """Whitespace-split captions -> ids, the way pycocoevalcap splits them (``str.split()``).

  Args:
    candidates: one caption per image.
    references: per image, its reference captions.
    word_ids: an existing word -> id map to extend (ids from 4 on, specials untouched).

  Returns:
    ``(cands [I, L] int64, refs list of lists of int64 arrays, vocab_size)``.
  """
  ids = dict(word_ids or {})
  nxt = max(ids.values(), default=3) + 1

  def enc(s: str) -> np.ndarray:
    nonlocal nxt
    out = []
    for w in s.split():
      i = ids.get(w)
      if i is None:
        i = ids[w] = nxt
        nxt += 1
      out.append(i)
    return np.asarray(out, np.int64)

  refs = [[enc(r) for r in image_refs] for image_refs in references]
  cands = _as_matrix([enc(c) for c in candidates])
  return cands, refs, nxt


def corpus_cider_strings(candidates: Sequence[str], references: Sequence[Sequence[str]], *,
                         n: int = 4, sigma: float = 6.0) -> tuple[float, np.ndarray]:
  """Corpus-mode CIDEr-D of text captions (already tokenised, space-separated)."""
  if len(candidates) != len(references):
    raise ValueError(f"cider: {len(candidates)} candidates for {len(references)} reference "
                     "lists, expected one candidate per image")
  cands, refs, vocab_size = encode_strings(candidates, references)
  return CiderD(vocab_size, n=n, sigma=sigma).corpus_score(cands, refs)


def cider_from_dicts(references: Mapping, predictions: Mapping) -> tuple[float, dict]:
  """Corpus-mode CIDEr-D of ``{id: [ref strings]}`` and ``{id: prediction string}``."""
  ids = list(predictions)
  mean, scores = corpus_cider_strings([predictions[i] for i in ids],
                                      [references[i] for i in ids])
  return mean, dict(zip(ids, scores.tolist()))


__all__: Iterable[str] = (
    "COMPAT_MODES", "CiderD", "DocFreq", "RefCache", "build_doc_freq", "load_or_build_doc_freq",
    "doc_freq_cache_path", "encode_strings", "corpus_cider_strings", "cider_from_dicts")
