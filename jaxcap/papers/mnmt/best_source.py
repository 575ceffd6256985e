"""Best-source selection (Caglayan et al. 2016, section 5.2): an image with several source
sentences is translated once per source, and the hypothesis with the fewest UNK tokens and,
among those, the highest log-likelihood is kept (the parenthesised column of Table 2).

Dimension legend: B images in a batch, Ls source positions, T decoded positions.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from jaxcap.data.vocab import EOS, PAD, UNK


def encode_sources(src_vocab, sentences: Sequence[Sequence[str]], src_max_len: int) -> np.ndarray:
  """Token lists -> int32 ``[n, src_max_len + 1]`` (ids, EOS, PAD), as the data layer does."""
  out = np.zeros((len(sentences), src_max_len + 1), np.int32)
  for j, toks in enumerate(sentences):
    ids = src_vocab.encode(list(toks), max_len=src_max_len, add_eos=True)
    out[j, :len(ids)] = ids
  return out


def choose(tokens_SxT: np.ndarray, logprobs_S: np.ndarray) -> int:
  """Index of the hypothesis with the fewest UNK, then the highest log-likelihood."""
  unk = [int(np.sum((row == UNK) & (np.cumsum(row == EOS) - (row == EOS) == 0))) for row in tokens_SxT]
  return min(range(len(unk)), key=lambda s: (unk[s], -float(logprobs_S[s])))


def best_source_tokens(decode: Callable[[dict], tuple], batch: dict, src_candidates: np.ndarray):
  """Decodes every candidate source of each image of ``batch`` and keeps the best.

  Args:
    decode: ``batch -> (tokens [B, T], logprobs [B])`` (greedy or the best beam).
    batch: a batch dict; its ``src`` is replaced by each candidate in turn.
    src_candidates: int32 ``[B, C, Ls]``, C sources per image (a row of PAD only is skipped).

  Returns:
    ``(tokens [B, T], chosen [B])``: the kept hypothesis and the index of its source.
  """
  b, c, _ = src_candidates.shape
  toks, lps = [], []
  for k in range(c):
    t, lp = decode(dict(batch, src=src_candidates[:, k]))
    toks.append(np.asarray(t))
    lps.append(np.where(src_candidates[:, k, 0] == PAD, -np.inf, np.asarray(lp)))
  toks, lps = np.stack(toks, 1), np.stack(lps, 1)  # [B, C, T], [B, C]
  chosen = np.array([choose(toks[i], lps[i]) for i in range(b)])
  return toks[np.arange(b), chosen], chosen
