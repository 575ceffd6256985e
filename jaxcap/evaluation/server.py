"""The COCO captioning evaluation server's result files, from a folder of features without references.

The server (codalab's COCO Captioning Challenge) scores ``captions_<set>_<alg>_results.json``
files: a JSON array with one ``{"image_id": int, "caption": str}`` per image of the set, every
image once (test2014: 40,775 images; val2014: 40,504), zipped together for a submission. Their
features come in the community's per-image layout (self-critical.pytorch's ``cocotest_bu_att/``
and ``cocotest_bu_fc/``, or ``cocobu_att/`` for val2014): ``<image_id>.npz`` (key ``feat``) or
``.npy`` region features, ``<image_id>.npy`` global features and boxes. Which images belong to
the set comes from COCO's ``image_info_test2014.json`` / ``captions_val2014.json`` (``--image_info``)
or else from the folder's file names.
"""

from __future__ import annotations

import os
import re

import numpy as np

from jaxcap import atomic
from jaxcap.data import karpathy
from jaxcap.errors import BadInput
from jaxcap.evaluation import files

SETS = {"test2014": 40775, "val2014": 40504}
_ALG = re.compile(r"^[A-Za-z0-9-]+$")


def results_name(which: str, alg: str) -> str:
  return f"captions_{which}_{alg}_results.json"


def check_alg(alg: str) -> str:
  if not _ALG.match(alg or ""):
    raise BadInput(f"--alg={alg}: expected letters, digits and '-' (the server reads the "
                   "algorithm's name between underscores)")
  return alg


def read_image_info(path: str) -> list[int]:
  """The image ids of a COCO annotation or image-info file (``{"images": [{"id": ...}]}``)."""
  data = files.read_json(path, "COCO's image_info_test2014.json or captions_val2014.json")
  images = data.get("images") if isinstance(data, dict) else None
  if not isinstance(images, list) or not images:
    raise BadInput(f"--image_info={path}: no 'images' list; expected COCO's image_info_test2014.json "
                   "or captions_val2014.json")
  ids = []
  for k, im in enumerate(images):
    if not isinstance(im, dict) or not isinstance(im.get("id"), int) or isinstance(im.get("id"), bool):
      raise BadInput(f"--image_info={path}: images[{k}] has no integer 'id'")
    ids.append(im["id"])
  return sorted(set(ids))


def folder_ids(folder: str, flag: str) -> list[int]:
  """The integer ids named by a feature folder's ``<id>.npz`` / ``<id>.npy`` files."""
  ids, bad = set(), []
  for name in os.listdir(folder):
    stem, ext = os.path.splitext(name)
    if ext not in (".npz", ".npy"):
      continue
    if stem.isdigit():
      ids.add(int(stem))
    else:
      bad.append(name)
  if bad:
    raise BadInput(f"{flag}={folder}: {os.path.join(folder, sorted(bad)[0])} is not named by an "
                   "integer COCO image id; expected <image_id>.npz / .npy files")
  if not ids:
    raise BadInput(f"{flag}={folder}: no <image_id>.npz / .npy feature files")
  return sorted(ids)


def features_reader(ids: list[int], att_dir: str | None, fc_dir: str | None,
                    box_dir: str | None, grid: bool = False) -> karpathy.DirFeatures:
  """A reader of the ids' features; every file is checked to exist first (one line naming the
  first missing one and the count)."""
  for flag, d, exts in (("--att_dir", att_dir, (".npz", ".npy")), ("--fc_dir", fc_dir, (".npy",)),
                        ("--box_dir", box_dir, (".npy",))):
    if not d:
      continue
    if not os.path.isdir(d):
      raise BadInput(f"{flag}={d}: not a directory; expected a folder of <image_id> feature files")
    present = set(os.listdir(d))
    missing = [i for i in ids if not any(f"{i}{e}" in present for e in exts)]
    if missing:
      raise BadInput(f"{flag}={d}: no features for {len(missing)} of the {len(ids)} images, e.g. "
                     f"{os.path.join(d, str(missing[0]) + exts[0])}; expected one file per image")
  return karpathy.DirFeatures([str(i) for i in ids], att_dir or "", fc_dir or "", box_dir or "",
                              grid=grid)


def chunk_features(reader, indices, info: dict, truncate: bool = False) -> dict:
  """The batch arrays of ``reader``'s images ``indices``: region features padded to the run's
  ``max_regions`` with their mask (one compiled shape for every chunk), global features and
  boxes when the files have them. More regions than the run was trained with is an error
  unless ``truncate`` (the run's ``data.truncate_regions``: the first ``max_regions`` kept)."""
  reads = [reader.read(i) for i in indices]
  n_max, f_dim = int(info["max_regions"]), int(info["feature_dim"])
  feats = np.zeros((len(reads), n_max, f_dim), np.float32)
  mask = np.zeros((len(reads), n_max), bool)
  boxes = np.zeros((len(reads), n_max, 4), np.float32) if all(r["boxes"] is not None for r in reads) else None
  for j, (i, r) in enumerate(zip(indices, reads)):
    x = np.asarray(r["feats"], np.float32).reshape(-1, np.shape(r["feats"])[-1])
    if truncate:
      x = x[:n_max]
    if x.shape[0] > n_max or x.shape[1] != f_dim:
      raise BadInput(f"{reader.name(i)}: features of shape {list(x.shape)}; expected at most "
                     f"{n_max} regions of {f_dim} values (the run's training features)")
    feats[j, :len(x)], mask[j, :len(x)] = x, True
    if boxes is not None:
      if len(r["boxes"]) < len(x):  # a box file of another image, or of fewer regions
        raise BadInput(f"{reader.name(i)}: {len(x)} regions but {len(r['boxes'])} boxes in its box "
                       "file; expected one box per region")
      boxes[j, :len(x)] = r["boxes"][:len(x)]
  out = {"feats": feats, "feats_mask": mask}
  if all(r["global_feat"] is not None for r in reads):
    out["global_feat"] = np.stack([np.asarray(r["global_feat"], np.float32).reshape(-1) for r in reads])
  if boxes is not None:
    out["boxes"] = boxes
  return out


def check_results(path: str, which: str | None = None, expected_ids=None) -> list[dict]:
  """Reads a results file and checks the server's format: a JSON array of objects with exactly
  an integer ``image_id`` and a string ``caption``, every image once; with
  ``expected_ids``, exactly those images. One-line ``BadInput`` naming the file otherwise."""
  base = os.path.basename(path)
  m = re.match(r"^captions_(test2014|val2014)_([A-Za-z0-9-]+)_results\.json$", base)
  if not m or (which and m.group(1) != which):
    raise BadInput(f"{path}: expected the name captions_{which or '<test2014|val2014>'}_<alg>_results.json")
  data = files.read_json(path, "an array of {image_id, caption}")
  if not isinstance(data, list) or not data:
    raise BadInput(f"{path}: expected a non-empty JSON array of {{image_id, caption}}")
  seen = set()
  for k, r in enumerate(data):
    if not isinstance(r, dict) or set(r) != {"image_id", "caption"}:
      raise BadInput(f"{path}: entry {k} must have exactly 'image_id' and 'caption'")
    if not isinstance(r["image_id"], int) or isinstance(r["image_id"], bool):
      raise BadInput(f"{path}: entry {k}: image_id {r['image_id']!r} is not an integer")
    if not isinstance(r["caption"], str):
      raise BadInput(f"{path}: entry {k} (image {r['image_id']}): caption must be a string")
    if r["image_id"] in seen:
      raise BadInput(f"{path}: image {r['image_id']} appears twice; expected every image once")
    seen.add(r["image_id"])
  if expected_ids is not None and seen != set(expected_ids):
    extra, missing = sorted(seen - set(expected_ids)), sorted(set(expected_ids) - seen)
    raise BadInput(f"{path}: {len(missing)} image(s) missing (e.g. {missing[:1]}) and "
                   f"{len(extra)} not in the set (e.g. {extra[:1]}); expected every image once")
  return data


def write_results(path: str, captions: dict) -> list[dict]:
  """``{image_id: caption}`` as the server's array (sorted by id), written atomically and
  checked by reading it back (:func:`check_results`)."""
  data = [{"image_id": int(i), "caption": str(c)} for i, c in sorted(captions.items())]
  atomic.write_json(path, data)
  return check_results(path, expected_ids=list(captions))
