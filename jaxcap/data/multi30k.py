"""Multi30k (WMT16 multimodal translation, task 1): aligned text + per-line image features.

Layout under ``root`` (the files as distributed, plain or ``.gz``):

- ``raw/<file>.<lang>[.gz]`` (or ``<file>.<lang>[.gz]`` directly in ``root``): one sentence
  per line, source and target aligned by line; ``<file>`` is ``train``, ``val`` and
  ``test_split_file`` (default ``test_2016_flickr``) for jaxcap's train / val / test;
- ``image_splits/<file>.txt`` (optional): the Flickr30k image for each line, whose stem is
  the image id (the line number otherwise);
- ``features_npy`` (optional): a path with ``{split}`` in it (e.g. ``feats/{split}.npy``,
  relative to ``root``) to ``[lines, 196, C]`` or ``[lines, 14, 14, C]`` arrays, opened with
  ``mmap_mode="r"`` so only the rows a batch needs are read. ``grid=True`` (the default
  here) gives each cell a box. ``text_only=True`` runs without features (one zero region of
  size ``feature_dim`` or 1).

Each line is one example: the target sentence is the single reference, the source sentence
is ``src``. Sentences are tokenised with :func:`jaxcap.data.vocab.tokenize` (a line of
punctuation only keeps its whitespace tokens; a blank line is an error).
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from jaxcap.data import base
from jaxcap.data.vocab import tokenize
from jaxcap.errors import BadInput


def _find(root: str, stem: str) -> str:
  for d in (os.path.join(root, "raw"), root):
    for ext in (".gz", ""):
      path = os.path.join(d, stem + ext)
      if os.path.exists(path):
        return path
  raise BadInput(f"{os.path.join(root, 'raw', stem)}[.gz]: text file is missing")


def read_lines(path: str) -> list[str]:
  """Lines of a plain or gzip text file (UTF-8), without line ends."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8", newline="") as f:
      lines = f.read().split("\n")
  except (OSError, UnicodeDecodeError, EOFError, zlib.error) as e:  # zlib.error: damaged .gz data
    raise BadInput(f"{path}: unreadable text file ({e})") from None
  # Only "\n" separates lines (str.splitlines would also split on U+2028 and misalign files);
  # a final newline does not start another sentence.
  if lines and lines[-1] == "":
    lines.pop()
  return [l.rstrip("\r") for l in lines]


def _tokens(line: str) -> list[str]:
  # A line of symbols only (train.de has "@@") would tokenise to nothing and drop the pair;
  # keeping its lowercase whitespace tokens keeps the 29,000 lines aligned. A blank line
  # stays empty and is reported.
  return tokenize(line) or line.lower().split()


def read_splits(config) -> dict[str, base.SplitData]:
  root = config.root
  src_lang, tgt_lang = config.src_lang, config.tgt_lang
  files = {"train": "train", "val": "val", "test": config.test_split_file}
  text_only = bool(config.text_only)
  pattern = config.features_npy
  if not text_only and not pattern:
    raise BadInput("multi30k: field 'features_npy' is empty, expected a '{split}' path to "
                     "[lines, 196, C] features (or set text_only=True)")
  out = {}
  for split, stem in files.items():
    src_path, tgt_path = _find(root, f"{stem}.{src_lang}"), _find(root, f"{stem}.{tgt_lang}")
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
      raise BadInput(f"{tgt_path}: {len(tgt_lines)} lines, expected {len(src_lines)} to align "
                       f"with {src_path}")
    n = len(src_lines)
    ids = list(range(n))
    img_path = os.path.join(root, "image_splits", f"{stem}.txt")
    if os.path.exists(img_path):
      names = [l.strip() for l in read_lines(img_path) if l.strip()]
      if len(names) != n:
        raise BadInput(f"{img_path}: {len(names)} image names, expected {n} (one per line)")
      stems = [os.path.splitext(s)[0] for s in names]
      if len(set(stems)) == n:
        ids = stems
    if text_only:
      feats = base.TextOnlyFeatures(n, int(config.feature_dim or 1))
    else:
      path = pattern.format(split=stem)
      path = path if os.path.isabs(path) else os.path.join(root, path)
      try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
      except FileNotFoundError:
        raise BadInput(f"{path}: feature file is missing, expected [{n}, 196, C] .npy") from None
      except (OSError, ValueError, EOFError, SyntaxError) as e:  # numpy's refusals of a damaged file
        raise BadInput(f"{path}: unreadable feature file ({type(e).__name__}: {e})") from None
      if arr.ndim not in (3, 4) or arr.shape[0] != n:
        raise BadInput(f"{path}: features have shape {list(arr.shape)}, expected [{n}, 196, C] "
                         f"or [{n}, 14, 14, C] (one row per line)")
      feats = base.ArrayFeatures(arr, grid=bool(config.grid) or arr.ndim == 4,
                                 label=path)
    out[split] = base.SplitData(
        image_ids=ids, refs=[[_tokens(t)] for t in tgt_lines],
        features=feats, src=[_tokens(s) for s in src_lines], src_file=src_path, refs_file=tgt_path)
  return out


def load(config) -> base.CaptionDataset:
  return base.CaptionDataset(read_splits(config), config, name=f"multi30k:{config.root}",
                             feature_dim=config.get("feature_dim") or None,
                             max_regions=1 if config.text_only else None)
