"""self-critical.pytorch's preprocessed ``cocotalk.json`` + ``cocotalk_label.h5``.

``cocotalk.json`` holds ``ix_to_word`` (``{"1": word, ...}``) and ``images`` (``split``,
``id``, optional ``width`` / ``height``) in the same order as the h5 rows; the h5 holds
``labels`` ``[M, L]`` (word ids, 0 = end/pad), ``label_start_ix`` / ``label_end_ix``
(1-based, inclusive) per image. Captions are decoded back to words, self-critical's
``UNK`` becomes jaxcap's UNK, and the vocabulary is rebuilt from the training words with
``min_word_count`` (default 1 here: cocotalk's vocabulary is already thresholded).

The references are the h5 labels, i.e. already truncated to the h5's ``L`` (16 in
self-critical); score against the COCO annotations for official numbers.
Features come from the same ``att_dir`` / ``fc_dir`` / ``box_dir`` layout as
:mod:`jaxcap.data.karpathy`, keyed by ``id``. h5py is imported only here.
"""

from __future__ import annotations

import json

import numpy as np

from jaxcap.data import base, karpathy
from jaxcap.errors import BadInput


def read_labels(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(labels [M, L], start [I], end [I])`` from a cocotalk label h5 (0-based start, end excl.)."""
  try:
    import h5py
  except ImportError:
    raise BadInput(f"{path}: reading cocotalk label files needs h5py (pip install h5py)") from None
  try:
    with h5py.File(path, "r") as f:
      missing = [k for k in ("labels", "label_start_ix", "label_end_ix") if k not in f]
      if missing:
        raise BadInput(f"{path}: no dataset {missing[0]!r}, expected labels, label_start_ix, "
                         "label_end_ix")
      labels = np.asarray(f["labels"][()], np.int64)
      start = np.asarray(f["label_start_ix"][()], np.int64) - 1
      end = np.asarray(f["label_end_ix"][()], np.int64)
  except BadInput:
    raise
  except Exception as e:
    raise BadInput(f"{path}: unreadable cocotalk label file ({type(e).__name__}: {e})") from None
  if labels.ndim != 2 or start.ndim != 1 or end.ndim != 1:
    raise BadInput(f"{path}: labels {list(labels.shape)}, label_start_ix {list(start.shape)}, "
                   f"label_end_ix {list(end.shape)}; expected [captions, length], [images], [images]")
  return labels, start, end


def read_splits(config) -> dict[str, base.SplitData]:
  root = config.root
  json_path = karpathy._resolve(root, config.dataset_json or "cocotalk.json")
  h5_path = karpathy._resolve(root, config.get("label_h5", "") or "cocotalk_label.h5")
  try:
    with open(json_path) as f:
      info = json.load(f)
  except (OSError, ValueError, RecursionError) as e:
    raise BadInput(f"{json_path}: not a cocotalk JSON with 'ix_to_word' and 'images' "
                   f"({type(e).__name__})") from None
  if isinstance(info, dict) and "ix_to_word" not in info and "images" in info:
    # data.name=cocotalk over a config made for Karpathy's JSON (e.g. configs/<model>.py:coco).
    raise BadInput(f"{json_path}: a Karpathy dataset JSON, not cocotalk.json (no 'ix_to_word'); "
                     "use --config configs/<model>.py:cocotalk, which reads cocotalk.json + "
                     "cocotalk_label.h5 with cocotalk's vocabulary (data.min_word_count=1)")
  try:
    ix_to_word, images = info["ix_to_word"], info["images"]
  except (KeyError, TypeError) as e:
    raise BadInput(f"{json_path}: not a cocotalk JSON with 'ix_to_word' and 'images' ({e})") from None
  if not isinstance(ix_to_word, dict) or not isinstance(images, list):
    raise BadInput(f"{json_path}: 'ix_to_word' a {type(ix_to_word).__name__} and 'images' a "
                   f"{type(images).__name__}; expected an object {{id: word}} and a list")
  words = {}
  for k, w in ix_to_word.items():
    if not (k.isdigit() and k.isascii() and int(k) >= 1) or not isinstance(w, str) or not w:
      raise BadInput(f"{json_path}: ix_to_word entry {k!r:.30}: {w!r:.30}; expected a word id "
                     "(an integer >= 1 as a string) mapped to a word")
    words[int(k)] = "<unk>" if w == "UNK" else w
  labels, start, end = read_labels(h5_path)
  if len(start) != len(images) or len(end) != len(images):
    raise BadInput(f"{h5_path}: {len(start)} images in label_start_ix and {len(end)} in "
                   f"label_end_ix, expected {len(images)} as in {json_path}")
  bad = np.flatnonzero((start < 0) | (end < start) | (end > len(labels)))
  if bad.size:  # a slice past the labels would silently give an image fewer captions
    j = int(bad[0])
    raise BadInput(f"{h5_path}: image {j}'s label_start_ix / label_end_ix {start[j] + 1} / "
                   f"{end[j]} are not a range of its {len(labels)} labels (1-based, inclusive)")
  by_split = {s: {"keys": [], "refs": [], "sizes": []} for s in base.SPLITS}
  for j, img, split in karpathy.kept_images(images, config, json_path):
    refs = []
    for row in labels[start[j]:end[j]]:
      toks = []
      for i in row:
        if i == 0:
          break
        if int(i) not in words:
          raise BadInput(f"{h5_path}: label id {int(i)} of image {img.get('id')} is not in "
                           f"{json_path} ix_to_word")
        toks.append(words[int(i)])
      refs.append(toks)
    image_id = img.get("id")
    if not isinstance(image_id, int) or isinstance(image_id, bool):
      raise BadInput(f"{json_path}: images[{j}] has id {image_id!r:.40}; expected an integer "
                     "(the image's COCO id)")
    karpathy.add_image(by_split[split], image_id, refs, img)
  return karpathy.dir_splits(by_split, root, config)


def load(config) -> base.CaptionDataset:
  return karpathy.dataset(read_splits(config), config, f"cocotalk:{config.root}")
