"""CIDEr-D in ``jax.numpy``: the SCST reward computed on the device, inside the jitted step.

Dimension legend: N candidates, T candidate tokens, I images whose references are given,
R references per image (at most), L reference tokens, S n-gram slots of a caption (n x its
length: one slot per (order, start position)), G entries of the document-frequency table.

The same numbers as :class:`jaxcap.evaluation.cider.CiderD` (read its module docstring: it is
the spec), computed with static shapes so that the whole reward jits:

* n-gram keys: the n-gram ``w_1..w_n`` (n <= 4) is the pair of uint32 digits
  ``hi = d_1 (V+1) + d_2``, ``lo = d_3 (V+1) + d_4`` with ``d_j = w_j + 1`` (0 where the n-gram
  is shorter). Digits are never zero, so every n-gram of every order has its own pair and
  ``(V+1)^2 <= 2^32`` (V <= 65535) keeps it exact without 64-bit integers (JAX's default is
  32-bit) and without hashing.
* term frequencies: every slot is compared with every slot of the same caption (S x S, S is
  at most 4T): the count of equal valid slots is the n-gram's tf, and only its first slot
  carries its tf-idf weight, so repeated n-grams are counted once in norms and dot products.
* candidate/reference overlap: each candidate slot is compared with every slot of each
  reference of its image (S x R x S').
* document frequencies: the host table (:class:`jaxcap.evaluation.cider.DocFreq`) is converted
  once into pair keys sorted lexicographically and their idf ``log(num_images) - log(max(1,
  df))`` (computed in float64, stored as float32); a key is found by a fixed-length binary
  search over the pairs, and an unseen n-gram gets ``log(num_images)``.

Modes are those of the host scorer: corpus mode is a table counted on the set being scored
(:func:`corpus_table`); training mode is the training table (:func:`training_table`), with
``compat="self_critical"`` meaning the references are cut to ``ref_max_len`` words and get an
EOS only when shorter than that (the table itself is then counted on full captions).
Math is float32; scores agree with the float64 host scorer to ~1e-6.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap.errors import BadInput
from jaxcap.evaluation import cider as host_cider

PAD, EOS = host_cider.PAD, host_cider.EOS
MAX_VOCAB = 65535  # (V + 1)^2 <= 2^32: two digits per uint32 half of a key


class DfTable(NamedTuple):
  """Document frequencies as device arrays (a pytree: pass it to jitted functions as an argument).

  Attributes:
    hi_G, lo_G: uint32 n-gram keys sorted by ``(hi, lo)``.
    idf_G: float32 ``log(num_images) - log(max(1, df))`` of each key.
    idf_unseen: float32 scalar ``log(num_images)`` (n-grams not in the table).
  """

  hi_G: jax.Array
  lo_G: jax.Array
  idf_G: jax.Array
  idf_unseen: jax.Array


@dataclasses.dataclass(frozen=True)
class Options:
  """Static options (hashable; part of the jit cache key).

  Attributes:
    count_eos: EOS is a word (candidates keep their first EOS; references end with one).
    ref_max_len: None, or references cut to that many words with EOS only when shorter
      (``compat="self_critical"``).
    sigma: standard deviation of the Gaussian length penalty.
    n: largest n-gram order (at most 4).
  """

  count_eos: bool = True
  ref_max_len: int | None = None
  sigma: float = 6.0
  n: int = 4


def check_vocab_size(vocab_size: int) -> int:
  vocab_size = int(vocab_size)
  if vocab_size > MAX_VOCAB:
    raise BadInput(f"cider_device: vocab_size {vocab_size} too large for exact 2 x uint32 "
                   f"n-gram keys (need vocab_size <= {MAX_VOCAB}); use scst.reward='host'")
  return vocab_size


def table_from_doc_freq(df: host_cider.DocFreq) -> DfTable:
  """The host :class:`~jaxcap.evaluation.cider.DocFreq` (int64 keys) as a sorted device table."""
  base = np.int64(check_vocab_size(df.vocab_size) + 1)
  if df.n > 4:
    raise ValueError(f"cider_device: n-gram order {df.n} > 4 does not fit two uint32 halves")
  # Host keys put w_1 in the lowest digit: peel the digits off in order.
  rest = df.keys.astype(np.int64)
  d = []
  for _ in range(4):
    d.append(rest % base)
    rest = rest // base
  hi = (d[0] * base + d[1]).astype(np.uint32)
  lo = (d[2] * base + d[3]).astype(np.uint32)
  order = np.lexsort((lo, hi))
  ref_len = np.log(float(df.num_images))
  idf = ref_len - np.log(np.maximum(1.0, df.counts.astype(np.float64)))
  return DfTable(jnp.asarray(hi[order]), jnp.asarray(lo[order]),
                 jnp.asarray(idf[order].astype(np.float32)), jnp.float32(ref_len))


def corpus_table(refs_ids, vocab_size: int, n: int = 4) -> DfTable:
  """Corpus mode (pycocoevalcap ``Cider``): document frequencies of the set being scored."""
  return table_from_doc_freq(host_cider.build_doc_freq(refs_ids, vocab_size, n=n))


def training_table(scorer: host_cider.CiderD) -> tuple[DfTable, Options]:
  """The table and options of a training-mode host scorer (:meth:`CiderD.for_training`)."""
  if scorer.doc_freq is None:
    raise ValueError("cider_device: training_table needs a training-mode CiderD (doc_freq set)")
  return table_from_doc_freq(scorer.doc_freq), Options(
      count_eos=scorer.count_eos, ref_max_len=scorer.ref_max_len, sigma=scorer.sigma, n=scorer.n)


def pad_references(refs_ids, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-image reference id lists -> ``(refs int32 [I, R, width] PAD-filled, nref int32 [I])``.

  Words past ``width`` are dropped: pass the caption length limit (``data.max_len``), at which
  both compat modes cut the references anyway (a reference that fills the row has no PAD, so
  under ``ref_max_len == width`` it gets no EOS, as a longer one).
  """
  nref_I = np.asarray([len(r) for r in refs_ids], np.int32)
  if len(nref_I) == 0 or nref_I.min() < 1:
    raise ValueError("cider_device: every image needs at least one reference caption")
  out = np.full((len(refs_ids), int(nref_I.max()), width), PAD, np.int32)
  for i, image_refs in enumerate(refs_ids):
    for r, ids in enumerate(image_refs):
      ids = np.asarray(ids).reshape(-1)[:width]
      out[i, r, :len(ids)] = ids
  return out, nref_I


# ---------------------------------------------------------------------------------------------
# Pure, jittable pieces.


def _lengths(x_MxL, count_eos: bool, force_eos: bool, max_words: int | None):
  """The host ``_truncate`` on the device: ``(tokens [M, L'], lengths [M])``.

  ``L' = L + 1`` when ``force_eos`` (room for the appended EOS), else ``L``.
  """
  m, l = x_MxL.shape
  term_MxL = (x_MxL == PAD) | (x_MxL == EOS)
  has_M = term_MxL.any(axis=1)
  first_M = jnp.where(has_M, jnp.argmax(term_MxL, axis=1), l)
  if max_words is not None:
    first_M = jnp.minimum(first_M, max_words)
  if not count_eos:
    return x_MxL, first_M
  if not force_eos:
    at_M = jnp.take_along_axis(x_MxL, jnp.minimum(first_M, max(l - 1, 0))[:, None], axis=1)[:, 0]
    return x_MxL, first_M + (has_M & (at_M == EOS)).astype(first_M.dtype)
  out_MxL1 = jnp.concatenate([x_MxL, jnp.full((m, 1), PAD, x_MxL.dtype)], axis=1)
  gets_M = (first_M < max_words) if max_words is not None else jnp.ones((m,), bool)
  put_MxL1 = gets_M[:, None] & (jnp.arange(l + 1)[None, :] == first_M[:, None])
  return jnp.where(put_MxL1, EOS, out_MxL1), first_M + gets_M.astype(first_M.dtype)


def _keys(x_MxL, len_M, vocab_size: int, n: int):
  """Pair keys of every (order, start) slot: ``(hi [M, S], lo [M, S], valid [M, S])``, S = n L,
  slots order-major (slot ``k L + p`` is the (k+1)-gram starting at p)."""
  m, l = x_MxL.shape
  base = jnp.uint32(vocab_size + 1)
  d_MxL = x_MxL.astype(jnp.uint32) + jnp.uint32(1)
  # Digit j of the n-gram at p is token p + j; beyond the caption it is masked by `valid`.
  d_MxLp = jnp.concatenate([d_MxL, jnp.zeros((m, 3), jnp.uint32)], axis=1)
  dig = [d_MxLp[:, j:j + l] for j in range(4)]
  zero = jnp.zeros_like(dig[0])
  his, los, valids = [], [], []
  for k in range(n):
    dj = [dig[j] if j <= k else zero for j in range(4)]
    his.append(dj[0] * base + dj[1])
    los.append(dj[2] * base + dj[3])
    valids.append(jnp.arange(l)[None, :] + k < len_M[:, None])
  return (jnp.concatenate(his, axis=1), jnp.concatenate(los, axis=1),
          jnp.concatenate(valids, axis=1))


def _lookup_idf(table: DfTable, hi, lo):
  """idf of each key: lower-bound binary search over the sorted pairs, a fixed number of steps."""
  g = table.hi_G.shape[0]
  if g == 0:
    return jnp.full(hi.shape, table.idf_unseen, jnp.float32)

  def halve(_, bounds):
    lo_i, hi_i = bounds
    mid = (lo_i + hi_i) // 2
    at = jnp.minimum(mid, g - 1)
    t_hi, t_lo = table.hi_G[at], table.lo_G[at]
    less = (t_hi < hi) | ((t_hi == hi) & (t_lo < lo))
    active = lo_i < hi_i
    return jnp.where(active & less, mid + 1, lo_i), jnp.where(active & ~less, mid, hi_i)

  # A loop, not unrolled steps: the program (and its compile time) stays small.
  lo_i, _ = jax.lax.fori_loop(0, int(np.ceil(np.log2(g + 1))), halve,
                              (jnp.zeros(hi.shape, jnp.int32), jnp.full(hi.shape, g, jnp.int32)))
  pos = jnp.minimum(lo_i, g - 1)
  found = (table.hi_G[pos] == hi) & (table.lo_G[pos] == lo)
  return jnp.where(found, table.idf_G[pos], table.idf_unseen)


def _vectors(hi_MxS, lo_MxS, valid_MxS, table: DfTable, n: int):
  """tf-idf weight on each n-gram's first slot (0 elsewhere) ``[M, S]``, its idf ``[M, S]`` and
  the norms per order ``[M, n]``."""
  m, s = hi_MxS.shape
  eq_MxSxS = ((hi_MxS[:, :, None] == hi_MxS[:, None, :]) & (lo_MxS[:, :, None] == lo_MxS[:, None, :])
              & valid_MxS[:, :, None] & valid_MxS[:, None, :])
  tf_MxS = eq_MxSxS.sum(axis=2).astype(jnp.float32)
  earlier_SxS = jnp.arange(s)[None, :] < jnp.arange(s)[:, None]  # [i, j]: j before i
  first_MxS = valid_MxS & ~(eq_MxSxS & earlier_SxS[None]).any(axis=2)
  idf_MxS = _lookup_idf(table, hi_MxS, lo_MxS)
  w_MxS = jnp.where(first_MxS, tf_MxS * idf_MxS, 0.0)
  norm_MxN = jnp.sqrt((w_MxS * w_MxS).reshape(m, n, s // n).sum(axis=2))
  return w_MxS, idf_MxS, norm_MxN


@functools.partial(jax.jit, static_argnames=("vocab_size", "options"))
def score(tokens_NxT, ref_index_N, refs_IxRxL, nref_I, table: DfTable, *, vocab_size: int,
          options: Options = Options()):
  """CIDEr-D of each candidate against the references of its image (pure; jits as a whole).

  Args:
    tokens_NxT: int candidate ids (EOS/PAD end a caption); ids must lie in ``[0, vocab_size)``.
    ref_index_N: int, the row of ``refs_IxRxL`` each candidate describes.
    refs_IxRxL: int reference ids, PAD-filled (:func:`pad_references`); rows past ``nref_I``
      are ignored.
    nref_I: int references per image (>= 1).
    table: the document frequencies (:func:`corpus_table`, :func:`training_table`).
    vocab_size: key base (static).
    options: static :class:`Options`.

  Returns:
    float32 ``[N]`` scores.
  """
  n = options.n
  i, r, _ = refs_IxRxL.shape
  x_NxT, len_N = _lengths(tokens_NxT.astype(jnp.int32), options.count_eos, False, None)
  y_MxL, len_M = _lengths(refs_IxRxL.reshape(i * r, -1).astype(jnp.int32), options.count_eos,
                          options.count_eos, options.ref_max_len)
  c_hi, c_lo, c_valid = _keys(x_NxT, len_N, vocab_size, n)
  r_hi, r_lo, r_valid = _keys(y_MxL, len_M, vocab_size, n)
  w_NxS, idf_NxS, norm_NxN = _vectors(c_hi, c_lo, c_valid, table, n)
  _, _, rnorm_MxN = _vectors(r_hi, r_lo, r_valid, table, n)
  s = c_hi.shape[1]
  sr = r_hi.shape[1]
  # Each candidate's own image: its references' keys [N, R, S'].
  g_hi = r_hi.reshape(i, r, sr)[ref_index_N]
  g_lo = r_lo.reshape(i, r, sr)[ref_index_N]
  g_valid = r_valid.reshape(i, r, sr)[ref_index_N]
  eq = ((c_hi[:, :, None, None] == g_hi[:, None]) & (c_lo[:, :, None, None] == g_lo[:, None])
        & g_valid[:, None])
  # The reference's weight of a candidate n-gram: its tf there times the same idf.
  wr_NxSxR = eq.sum(axis=3).astype(jnp.float32) * idf_NxS[:, :, None]
  contrib_NxSxR = jnp.minimum(w_NxS[:, :, None], wr_NxSxR) * wr_NxSxR  # 0 off first slots
  num_NxNxR = contrib_NxSxR.reshape(-1, n, s // n, r).sum(axis=2)
  rnorm_NxRxN = rnorm_MxN.reshape(i, r, n)[ref_index_N]
  den_NxNxR = norm_NxN[:, :, None] * jnp.swapaxes(rnorm_NxRxN, 1, 2)
  sim_NxNxR = jnp.where(den_NxNxR != 0, num_NxNxR / jnp.where(den_NxNxR != 0, den_NxNxR, 1.0),
                        num_NxNxR)
  # Both reference codes take the "length" from the bigram counts.
  clen_N = jnp.maximum(len_N - 1, 0).astype(jnp.float32)
  rlen_NxR = jnp.maximum(len_M - 1, 0).astype(jnp.float32).reshape(i, r)[ref_index_N]
  delta_NxR = clen_N[:, None] - rlen_NxR
  penalty_NxR = jnp.exp(-(delta_NxR * delta_NxR) / jnp.float32(2 * options.sigma ** 2))
  nref_N = nref_I[ref_index_N]
  used_NxR = jnp.arange(r)[None, :] < nref_N[:, None]
  total_N = jnp.where(used_NxR, (sim_NxNxR * penalty_NxR[:, None, :]).sum(axis=1), 0.0).sum(axis=1)
  return total_N / jnp.float32(n) / nref_N.astype(jnp.float32) * jnp.float32(10.0)


__all__ = ("DfTable", "Options", "MAX_VOCAB", "check_vocab_size", "table_from_doc_freq",
           "corpus_table", "training_table", "pad_references", "score")
