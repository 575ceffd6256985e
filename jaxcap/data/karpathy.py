"""Karpathy ``dataset_{coco,flickr8k,flickr30k}.json`` + self-critical.pytorch feature dirs.

Read in place, one file per image and per access (no conversion step):

- ``att_dir/<id>.npz`` (key ``feat``, ``[n, D]``; bottom-up features have 10-100 regions), or
  ``att_dir/<id>.npy``; a ``[g, g, D]`` grid (``prepro_feats.py``'s layout) is read as its
  ``g*g`` cells, row-major, as self-critical.pytorch's loader reshapes it; with ``grid=True``
  each file is a ``[g, g, C]`` or ``[g*g, C]`` grid whose cells become regions with boxes
  derived from the grid;
- ``fc_dir/<id>.npy`` (``[Dg]``); without ``att_dir`` it is the single region (N = 1);
- ``box_dir/<id>.npy`` (``[n, 4]`` x1 y1 x2 y2 pixels), divided by the image's ``width`` /
  ``height`` when the JSON entry has them, otherwise by the largest x2 / y2 of that image
  (so boxes still land in [0, 1]);
- or, instead of the folders, ``detections_hdf5``: one HDF5 file with a dataset
  ``<id>_features`` (``[n, D]``) per image, the M² authors' ``coco_detections.hdf5`` layout
  (:class:`HDF5Detections`).

``<id>`` is ``cocoid`` for COCO and the file-name stem for Flickr. Images of split
``restval`` join ``train`` (self-critical's 113,287 COCO training images) unless
``use_restval=False``. Captions are the entries' ``tokens`` (or :func:`vocab.tokenize` of
``raw`` when absent).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading

import numpy as np

from jaxcap import atomic
from jaxcap.data import base
from jaxcap.data import batch as batch_lib
from jaxcap.data.vocab import tokenize
from jaxcap.errors import BadInput


def _resolve(root: str, path: str) -> str:
  if not path:
    return ""
  return path if os.path.isabs(path) else os.path.join(root, path)


# numpy parses each .npy header with ast.literal_eval, which CPython 3.11 (3.11.7 here) can
# break when loader threads call it at once ("SystemError: AST constructor recursion depth
# mismatch", CPython gh-106905): one file at a time there, in parallel on newer Pythons.
_LOAD_LOCK = threading.Lock() if sys.version_info < (3, 12) else contextlib.nullcontext()


def load_array(path: str, key: str | None = None) -> np.ndarray:
  """``np.load`` of one feature file with a one-line BadInput when missing or unreadable."""
  with base.feature_file_errors(path), _LOAD_LOCK:
    with open(path, "rb") as f:
      if key is None:
        base.check_npy_size(f, os.fstat(f.fileno()).st_size, path)
        return np.load(f, allow_pickle=False)
      with np.load(f, allow_pickle=False) as z:
        if key not in z.files:
          raise BadInput(f"{path}: no key {key!r} (has {z.files}), expected the features "
                           f"under {key!r}")
        member = z.zip.getinfo(f"{key}.npy" if f"{key}.npy" in z.zip.namelist() else key)
        with z.zip.open(member) as m:
          base.check_npy_size(m, member.file_size, path)
        x = z[key]
        if not isinstance(x, np.ndarray):  # numpy hands back the bytes of a member that is no .npy
          raise BadInput(f"{path}: key {key!r} is not a .npy array; expected the features under {key!r}")
        return x


class DirFeatures(base.FeatureReader):
  """Per-image feature files in self-critical.pytorch's directory layout."""

  def __init__(self, keys: list[str], att_dir: str = "", fc_dir: str = "", box_dir: str = "",
               grid: bool = False, sizes: list | None = None):
    if not att_dir and not fc_dir:
      raise BadInput("karpathy: fields 'att_dir' and 'fc_dir' are both empty, expected at "
                       "least one feature directory")
    for field, d in (("att_dir", att_dir), ("fc_dir", fc_dir), ("box_dir", box_dir)):
      if d and not os.path.isdir(d):
        raise BadInput(f"{d}: field {field!r} is not a directory, expected the feature files' "
                         "directory")
    self.keys, self.att_dir, self.fc_dir, self.box_dir = keys, att_dir, fc_dir, box_dir
    self.grid, self.sizes = grid, sizes
    self.has_boxes = bool(grid or box_dir)
    self._att_ext = None
    if grid and not att_dir:
      raise BadInput("karpathy: field 'grid' is set but 'att_dir' is empty, expected grid "
                       "feature files in att_dir")

  def __len__(self) -> int:
    return len(self.keys)

  def name(self, i: int) -> str:
    d = self.att_dir or self.fc_dir
    ext = (self._att_ext or ".npz") if self.att_dir else ".npy"
    return os.path.join(d, f"{self.keys[i]}{ext}")

  def _read_att(self, key: str) -> np.ndarray:
    stem = os.path.join(self.att_dir, key)
    if self._att_ext is None:  # Decided once: a stat per read would cost on network disks.
      self._att_ext = ".npy" if (not os.path.exists(stem + ".npz")
                                 and os.path.exists(stem + ".npy")) else ".npz"
    if self._att_ext == ".npz":
      return load_array(stem + ".npz", "feat")
    return load_array(stem + ".npy")

  def read(self, i: int) -> dict:
    key = self.keys[i]
    glob = load_array(os.path.join(self.fc_dir, f"{key}.npy")) if self.fc_dir else None
    if glob is not None and glob.ndim != 1:
      glob = glob.reshape(-1) if glob.size == glob.shape[-1] else glob
    if not self.att_dir:
      return {"feats": glob[None, :] if glob.ndim == 1 else glob, "boxes": None,
              "global_feat": glob}
    feats = self._read_att(key)
    boxes = None
    if self.grid:
      feats = base.grid_to_regions(feats, self.name(i))
      boxes = base.grid_boxes(int(round(np.sqrt(feats.shape[0]))))
    else:
      if feats.ndim == 3:  # prepro_feats' [g, g, D] grid: its cells, as self-critical's loader
        feats = feats.reshape(-1, feats.shape[-1])
      if self.box_dir:
        boxes = self.read_boxes(i)
    return {"feats": feats, "boxes": boxes, "global_feat": glob}

  def read_boxes(self, i: int, allow_degenerate: bool = True) -> np.ndarray:
    """Image ``i``'s boxes normalised to [0, 1], validated with :func:`jaxcap.data.batch.check_boxes`
    (finite, x1 <= x2, y1 <= y2, inside the image up to ``batch.BOX_TOLERANCE``; a box outside
    the image is an error, not clipped). Zero-area boxes are checked by the caller (the split
    source, with ``data.degenerate_boxes``)."""
    path = os.path.join(self.box_dir, f"{self.keys[i]}.npy")
    boxes = load_array(path)
    if boxes.ndim != 2 or boxes.shape[-1] != 4:
      raise BadInput(f"{path}: boxes must be [regions, 4], got shape {list(boxes.shape)} "
                       "(expected x1, y1, x2, y2 per region)")
    with np.errstate(over="ignore"):  # a value beyond float32's range becomes Inf: refused below
      boxes = boxes.astype(np.float32)
    if not np.all(np.isfinite(boxes)):
      raise BadInput(f"{path}: field 'boxes' contains NaN, Inf or values beyond float32's range, "
                       "expected finite pixel coordinates")
    size = self.sizes[i] if self.sizes else None
    if size:
      w, h = size
    else:
      w = max(float(boxes[:, 2].max(initial=0.0)), 1.0)
      h = max(float(boxes[:, 3].max(initial=0.0)), 1.0)
    boxes = batch_lib.check_boxes(boxes / np.array([w, h, w, h], np.float32), path,
                             allow_degenerate=allow_degenerate)
    return np.clip(boxes, 0.0, 1.0)  # only float rounding (<= BOX_TOLERANCE) is clipped

  def header(self, i: int) -> dict:
    key = self.keys[i]
    glob = None
    if self.fc_dir:
      path = os.path.join(self.fc_dir, f"{key}.npy")
      shape, dtype = base.npy_header(path)
      if len(shape) != 1 and int(np.prod(shape)) == (shape[-1] if shape else 0):
        shape = (shape[-1],)  # [1, Dg] is read as [Dg]
      glob = (shape, dtype, path)
    if not self.att_dir:
      return {"feats": ((1,) + glob[0][-1:] if len(glob[0]) == 1 else glob[0], glob[1], glob[2]),
              "global_feat": glob, "boxes": None}
    stem = os.path.join(self.att_dir, key)
    if self._att_ext is None:
      self._att_ext = ".npy" if (not os.path.exists(stem + ".npz")
                                 and os.path.exists(stem + ".npy")) else ".npz"
    path = stem + self._att_ext
    shape, dtype = base.npy_header(path, "feat" if self._att_ext == ".npz" else None)
    if self.grid:
      if len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != shape[1]):
        raise BadInput(f"{path}: grid features must be [g, g, C] or [g*g, C], got shape "
                         f"{list(shape)}")
      shape = (int(np.prod(shape[:-1])), shape[-1])
    elif len(shape) == 3:  # as read() reshapes it
      shape = (shape[0] * shape[1], shape[2])
    boxes = None
    if self.box_dir and not self.grid:
      boxes = (self.read_boxes(i), os.path.join(self.box_dir, f"{key}.npy"))
    return {"feats": (shape, dtype, path), "global_feat": glob, "boxes": boxes}


# What h5py raises for a damaged file's structures (tests/test_fuzz_readers.py found each):
# KeyError / RuntimeError from libhdf5's object lookups, ValueError for impossible datatypes,
# OSError for unreadable data blocks, TypeError for datatypes NumPy has no match for.
_HDF5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)
# One image's regions: 100 x 2048 float32 is 204,800 values; a dataset declaring far more is not
# one image's detections (and would be allocated whole by ds[()]).
MAX_HDF5_ELEMENTS = 1 << 24


class HDF5Detections(base.FeatureReader):
  """Region features of every image in one HDF5 file, dataset ``<key>_features`` ``[n, D]``:
  the layout of the M² authors' ``coco_detections.hdf5`` (their ``ImageDetectionsField`` reads
  ``'%d_features' % image_id``). Only the real regions are returned (``feats_mask`` marks them
  after collation, which zero-pads to ``max_regions``); their loader's zero rows up to 50 are
  ``max_regions = 50`` with ``truncate_regions`` (their ``[:max_detections]``). The file's
  ``<key>_boxes`` are pixel coordinates and it holds no image sizes, so boxes are not read
  (``has_boxes`` False: a model built on boxes is refused before training)."""

  has_boxes = False

  def __init__(self, keys: list[str], path: str):
    if not os.path.isfile(path):
      raise BadInput(f"{path}: field 'detections_hdf5' is not a file, expected an HDF5 file "
                       "with a dataset <image_id>_features per image")
    self.keys, self.path = keys, path
    self._file = None
    self._lock = threading.Lock()

  def __getstate__(self):  # loader worker processes open their own handle
    return {"keys": self.keys, "path": self.path}

  def __setstate__(self, state):
    self.__init__(state["keys"], state["path"])

  def __len__(self) -> int:
    return len(self.keys)

  def name(self, i: int) -> str:
    return f"{self.path}:{self.keys[i]}_features"

  def _dataset(self, i: int):
    with self._lock:
      if self._file is None:
        import h5py
        try:
          self._file = h5py.File(self.path, "r")
        except OSError as e:
          raise BadInput(f"{self.path}: unreadable HDF5 file ({e}); expected the detections "
                           "file (datasets <image_id>_features)") from None
    key = f"{self.keys[i]}_features"
    try:
      present = key in self._file
      ds = self._file[key] if present else None
      shape, dtype = (ds.shape, ds.dtype) if hasattr(ds, "shape") else (None, None)
    except _HDF5_ERRORS as e:  # libhdf5's refusals of a damaged file, as h5py raises them
      raise BadInput(f"{self.name(i)}: unreadable in this HDF5 file ({type(e).__name__}: "
                     f"{str(e)[:160]}); expected the detections file") from None
    if not present:
      raise BadInput(f"{self.path}: no dataset {key!r} for image {self.keys[i]}; expected one "
                       "<image_id>_features [regions, D] per image")
    if not hasattr(ds, "shape"):
      raise BadInput(f"{self.name(i)}: is an HDF5 group, expected a [regions, D] dataset")
    if len(shape) != 2 or dtype.kind not in "fiu" or math.prod(shape) > MAX_HDF5_ELEMENTS:
      raise BadInput(f"{self.name(i)}: {dtype} {list(shape)}; expected a numeric [regions, D] "
                     f"dataset of at most {MAX_HDF5_ELEMENTS:,} values")
    return ds

  def read(self, i: int) -> dict:
    ds = self._dataset(i)
    try:
      feats = np.asarray(ds[()])
    except _HDF5_ERRORS as e:
      raise BadInput(f"{self.name(i)}: unreadable ({type(e).__name__}: {str(e)[:160]}); expected "
                     "the detections file's [regions, D] features") from None
    return {"feats": feats, "boxes": None, "global_feat": None}

  def header(self, i: int) -> dict:
    ds = self._dataset(i)
    return {"feats": (tuple(ds.shape), np.dtype(ds.dtype), self.name(i)), "global_feat": None,
            "boxes": None}


def image_key(entry: dict, path: str = "karpathy") -> int | str:
  """COCO ``cocoid``, else the file-name stem (Flickr); ``path`` names the JSON in errors."""
  if "cocoid" in entry:
    try:
      return int(entry["cocoid"])
    except (TypeError, ValueError, OverflowError):
      raise BadInput(f"{path}: an image entry has 'cocoid' {entry['cocoid']!r:.40}; expected an "
                     "integer id") from None
  if "filename" in entry:
    if not isinstance(entry["filename"], str):
      raise BadInput(f"{path}: an image entry has 'filename' {entry['filename']!r:.40}; expected "
                     "the image's file name")
    return os.path.splitext(os.path.basename(entry["filename"]))[0]
  raise BadInput("karpathy: image entry has neither 'cocoid' nor 'filename'")


def read_splits(config) -> dict[str, base.SplitData]:
  """Parses the Karpathy JSON and returns ``{split: SplitData}``."""
  root = config.root
  if root and not os.path.isdir(root):
    raise BadInput(f"{root}: field 'root' of the karpathy data config is not a directory, "
                     "expected the dataset directory")
  if not config.dataset_json:
    raise BadInput("karpathy: field 'dataset_json' is empty, expected the Karpathy JSON "
                     "(e.g. dataset_coco.json)")
  path = _resolve(root, config.dataset_json)
  try:
    with open(path) as f:
      images = json.load(f)["images"]
    if not isinstance(images, list):
      raise TypeError(f"'images' is a {type(images).__name__}")
  except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: arrays nested past the stack
    raise BadInput(f"{path}: not a Karpathy dataset JSON with an 'images' list ({e}); "
                     "expected e.g. dataset_coco.json") from None
  by_split = {s: {"keys": [], "refs": [], "sizes": []} for s in base.SPLITS}
  for n, entry, split in kept_images(images, config, path):
    if not isinstance(entry.get("sentences"), list):
      raise BadInput(f"{path}: images[{n}] has no list 'sentences', expected a list")
    refs = []
    for k, s in enumerate(entry["sentences"]):
      if not isinstance(s, dict):
        raise BadInput(f"{path}: images[{n}].sentences[{k}] is a {type(s).__name__}, expected "
                         "an object with 'tokens' or 'raw'")
      if "tokens" in s:
        toks = s["tokens"]
        if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
          raise BadInput(f"{path}: images[{n}].sentences[{k}].tokens is a "
                           f"{type(toks).__name__}, expected a list of words (strings)")
        refs.append(list(toks))
      else:
        refs.append(tokenize(s.get("raw", "")))
    add_image(by_split[split], image_key(entry, path), refs, entry, path)
  return dir_splits(by_split, root, config)


def kept_images(images, config, path: str):
  """Yields ``(n, entry, split)`` for each image of a Karpathy-style ``images`` list (Karpathy's
  JSON, cocotalk.json) that a split keeps: ``restval`` is ``train`` with ``use_restval`` (the
  default) and left out without it (Karpathy's extra training images, on purpose); a split
  other than train, val, test, restval is an error naming ``path``."""
  use_restval = bool(config.use_restval)
  for n, entry in enumerate(images):
    if not isinstance(entry, dict):
      raise BadInput(f"{path}: images[{n}] is a {type(entry).__name__}, expected an object (an "
                     "image entry)")
    split = entry.get("split")
    if split == "restval":
      if not use_restval:
        continue
      split = "train"
    if split not in base.SPLITS:
      raise BadInput(f"{path}: images[{n}] has split {split!r}, expected one of train, val, "
                       "test, restval")
    yield n, entry, split


def add_image(rec: dict, key, refs, entry: dict, path: str = "karpathy") -> None:
  """Appends one image (its key, references, its file ``<filepath>/<filename>`` and optional
  width / height) to a split record; ``path`` names the JSON in errors."""
  w, h = entry.get("width"), entry.get("height")
  try:
    size = (float(w), float(h)) if w and h else None
    file = os.path.join(entry.get("filepath") or "", entry.get("filename") or "")
  except (TypeError, ValueError):
    raise BadInput(f"{path}: image {key!r:.40} has 'width' {w!r:.20}, 'height' {h!r:.20}, 'filepath' "
                   f"{entry.get('filepath')!r:.40}, 'filename' {entry.get('filename')!r:.40}; expected "
                   "numbers and strings") from None
  rec["keys"].append(key)
  rec["refs"].append(refs)
  rec.setdefault("files", []).append(file)
  rec["sizes"].append(size)


def dir_splits(by_split: dict, root: str, config) -> dict[str, base.SplitData]:
  """``{split: SplitData}`` of split records whose features are self-critical feature dirs."""
  att_dir = _resolve(root, config.att_dir)
  fc_dir = _resolve(root, config.fc_dir)
  box_dir = _resolve(root, config.box_dir)
  hdf5 = _resolve(root, config.get("detections_hdf5", ""))
  images_dir = _resolve(root, config.get("images_dir", ""))
  if images_dir:
    return _image_splits(by_split, images_dir, config)
  if hdf5:
    others = [f for f in ("att_dir", "fc_dir", "box_dir", "grid") if config.get(f)]
    if others:
      raise BadInput(f"karpathy: fields 'detections_hdf5' and {others[0]!r} are both set; "
                       "expected one source of region features (detections_hdf5 alone: the "
                       "global feature is the regions' mean)")
  out = {}
  for split, rec in by_split.items():
    if not rec["keys"]:
      continue
    if hdf5:
      feats = HDF5Detections([str(k) for k in rec["keys"]], hdf5)
    else:
      feats = DirFeatures([str(k) for k in rec["keys"]], att_dir, fc_dir, box_dir,
                          grid=bool(config.grid), sizes=rec["sizes"])
    out[split] = base.SplitData(image_ids=rec["keys"], refs=rec["refs"], features=feats)
  return out


class ImageFiles(base.FeatureReader):
  """Image files read and resized to ``size x size`` on each access (a run from pixels:
  ``data.images_dir``): ``read(i) -> {"pixels": uint8 [size, size, 3]}``, as
  ``jaxcap-extract --size size`` reads them (:func:`jaxcap.images.read_image`: EXIF orientation,
  RGB, bilinear resize to the square)."""

  grid = True  # the backbone's grid cells are the regions, with grid boxes
  has_boxes = True

  def __init__(self, paths: list[str], image_size: int):
    self.paths, self.image_size = paths, int(image_size)

  def __len__(self) -> int:
    return len(self.paths)

  def name(self, i: int) -> str:
    return self.paths[i]

  def read(self, i: int) -> dict:
    from jaxcap.images import read_image
    return {"pixels": self._opened(i, lambda path: read_image(path, self.image_size))}

  def check_file(self, i: int) -> None:
    """The file is there and decodes whole (the check before training: a truncated PNG whose
    header reads would otherwise stop the run at the step that first draws it, after its
    folder was written). Thread-safe: the check runs on a pool of threads."""
    from jaxcap.images import opened

    def decode(path):
      with opened(path, path) as img:
        img.load()
    self._opened(i, decode)

  def _opened(self, i: int, fn):
    """``fn(path)`` of image ``i``; a missing or unreadable file is one line naming it."""
    from jaxcap.images import unreadable_reason
    path = self.paths[i]
    if not os.path.isfile(path):
      raise BadInput(f"{path}: no such image file (data.images_dir); expected the image of "
                       "its dataset JSON entry")
    try:
      return fn(path)
    except Exception as e:  # Pillow's errors of a damaged or foreign file
      raise BadInput(f"{path}: {unreadable_reason(e)}; expected an image file") from None


def _image_splits(by_split: dict, images_dir: str, config) -> dict[str, base.SplitData]:
  """``{split: SplitData}`` whose images are files under ``images_dir`` (``data.images_dir``)."""
  others = [f for f in ("att_dir", "fc_dir", "box_dir", "detections_hdf5") if config.get(f)]
  if others:
    raise BadInput(f"karpathy: fields 'images_dir' and {others[0]!r} are both set; expected "
                     "one source of images (images_dir: a run from pixels, config.backbone)")
  if not os.path.isdir(images_dir):
    raise BadInput(f"{images_dir}: config field data.images_dir is not a directory; expected "
                     "the folder of the dataset JSON's images (COCO's: the one holding train2014/, val2014/)")
  size = config.get("image_size", 0)
  if not (isinstance(size, int) and size >= 8):
    raise BadInput(f"config field data.image_size: expected the side in pixels the images are "
                     f"resized to (an int >= 8, the backbone's input) with data.images_dir, got {size!r}")
  out = {}
  for split, rec in by_split.items():
    if rec["keys"]:
      paths = [os.path.join(images_dir, f) for f in rec["files"]]
      out[split] = base.SplitData(image_ids=rec["keys"], refs=rec["refs"],
                                  features=ImageFiles(paths, size))
  return out


def dataset(splits: dict, config, name: str) -> base.CaptionDataset:
  """The dataset of feature-dir splits (one region per image without ``att_dir``)."""
  return base.CaptionDataset(splits, config, name=name, feature_dim=config.get("feature_dim") or None,
                             max_regions=None if config.get("att_dir") or config.get("detections_hdf5") else 1)


def load(config) -> base.CaptionDataset:
  return dataset(read_splits(config), config, f"karpathy:{config.dataset_json}")


# -------------------------------------------------- Karpathy's JSON from a captions file
def read_captions(path: str) -> dict[str, list[str]]:
  """``{file name: [caption, ...]}`` of a captions file: a JSON object ``{"<file>": ["caption",
  ...]}``, a JSON list ``[{"image": "<file>", "caption": "..."}]`` or Flickr8k's token file
  (``<file>#<n>\\t<caption>`` per line)."""
  return read_captions_and_splits(path)[0]


def read_captions_and_splits(path: str) -> tuple[dict[str, list[str]], dict[str, str] | None]:
  """``({file name: [caption, ...]}, {file name: split} or None)``: the captions of
  :func:`read_captions` and, for a JSON list whose items name a ``"split"`` (every item, one of
  train / val / test, one per image), each image's split."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise BadInput(f"{path}: not UTF-8 text ({e}); expected JSON or Flickr8k's "
                     "<file>#<n><TAB><caption> lines") from None
  out: dict[str, list[str]] = {}
  splits: dict[str, str] | None = None
  if text.lstrip()[:1] in ("{", "["):
    try:
      data = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested past the stack
      raise BadInput(f"{path}: invalid JSON ({e}); expected "
                       '{"<file>": ["caption", ...]} or [{"image": ..., "caption": ...}]') from None
    if isinstance(data, dict):
      for name, caps in data.items():
        if isinstance(caps, str):
          caps = [caps]
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
          raise BadInput(f"{path}: entry {name!r} is a {type(caps).__name__}; "
                           "expected a list of caption strings")
        out.setdefault(name, []).extend(caps)
    else:
      for n, item in enumerate(data):
        if not (isinstance(item, dict) and isinstance(item.get("image"), str)
                and isinstance(item.get("caption"), str)):
          raise BadInput(f"{path}: item [{n}] is not an object with string "
                           "'image' and 'caption'; expected [{\"image\": ..., \"caption\": ...}]")
        out.setdefault(item["image"], []).append(item["caption"])
        has_split = "split" in item
        if n == 0:
          splits = {} if has_split else None
        elif has_split != (splits is not None):
          raise BadInput(f"{path}: item [{n}] has {'a' if has_split else 'no'} 'split', "
                           f"item [0] {'none' if has_split else 'one'}; expected a split on every "
                           "item or on none")
        if splits is not None:
          split = item["split"]
          if split not in base.SPLITS:
            raise BadInput(f"{path}: item [{n}] has split {split!r}; expected one "
                             f"of {', '.join(base.SPLITS)}")
          if splits.setdefault(item["image"], split) != split:
            raise BadInput(f"{path}: item [{n}] puts {item['image']!r} in {split!r}, "
                             f"an earlier item in {splits[item['image']]!r}; expected one split "
                             "per image")
  else:
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      key, tab, caption = line.partition("\t")
      if not tab:
        raise BadInput(f"{path}: line {n} has no tab; expected "
                         "<file>#<n><TAB><caption> (Flickr8k's token format) or a JSON file")
      out.setdefault(key.strip().split("#")[0], []).append(caption.strip())
  if not out:
    raise BadInput(f"{path}: no captions; expected at least one image's captions")
  return out, splits


def karpathy_json(captions: dict[str, list[str]], names: list[str], val: int, test: int,
                  seed: int, name: str, splits: dict[str, str] | None = None) -> dict:
  """Karpathy's ``{"images": [...], "dataset": name}`` of the captioned file ``names``; their
  split is ``splits[name]`` when given, else drawn from ``val``, ``test`` and ``seed``."""
  names = sorted(names)
  if splits is not None:
    split = {n: splits[n] for n in names}
  else:
    if val + test > len(names):
      raise BadInput(f"--val={val} --test={test}: {len(names)} captioned images; expected "
                       "val + test <= the captioned images")
    order = np.random.default_rng(seed).permutation(len(names))
    split = {}
    for rank, i in enumerate(order):
      split[names[i]] = "val" if rank < val else "test" if rank < val + test else "train"
  images, sentid = [], 0
  for imgid, fname in enumerate(names):
    sents = []
    for raw in captions[fname]:
      sents.append({"tokens": tokenize(raw), "raw": raw, "imgid": imgid, "sentid": sentid})
      sentid += 1
    images.append({"filename": fname, "imgid": imgid, "split": split[fname], "sentences": sents,
                   "sentids": [s["sentid"] for s in sents]})
  return {"images": images, "dataset": name}


def write_captions_json(out_dir: str, name: str, captions: dict[str, list[str]], names: list[str],
                        failed: set, val: int, test: int, seed: int,
                        splits: dict[str, str] | None = None, warn=print) -> str:
  """``<out_dir>/dataset_<name>.json`` (:func:`karpathy_json`) for the captioned images of
  ``names`` that were extracted (not in ``failed``), written atomically; ``warn`` gets one line
  about captioned files that are not in the folder. Returns a one-line summary."""
  usable = [n for n in names if n in captions and n not in failed]
  missing = sorted(set(captions) - set(names))
  if missing:
    warn(f"{len(missing)} captioned file(s) not in the images folder (left out), e.g. {missing[0]}")
  data = karpathy_json(captions, usable, val, test, seed, name, splits)
  path = os.path.join(out_dir, f"dataset_{name}.json")
  atomic.write_json(path, data)
  counts = ", ".join(f"{s} {sum(e['split'] == s for e in data['images'])}" for s in ("train", "val", "test"))
  return (f"wrote {path}: {len(usable)} images ({counts}), "
          f"{sum(len(e['sentences']) for e in data['images'])} captions")


# -------------------------------------------------- Karpathy's own JSON as jaxcap-extract's captions
def read_karpathy_captions(path: str) -> dict | None:
  """Karpathy's ``dataset_coco.json`` / ``dataset_flickr8k.json`` / ``dataset_flickr30k.json``
  given as ``jaxcap-extract --captions``: ``{"images", "dataset", "files"}``, ``files`` each
  entry's ``(image path under the images folder, feature file stem)``: ``<filepath>/<filename>``
  (COCO's ``train2014/`` / ``val2014/``; Flickr has no ``filepath``) and ``str(cocoid)``, else
  the file-name stem (:func:`image_key`, what self-critical's ``prepro_feats.py`` names them
  and this module reads). None for a file in another format (:func:`read_captions_and_splits`);
  one-line ``BadInput`` for a Karpathy JSON with a bad entry."""
  try:
    with open(path, encoding="utf-8") as f:
      if f.read(1) != "{":
        return None
      f.seek(0)
      data = json.load(f)
  except (UnicodeDecodeError, ValueError, RecursionError):
    return None  # read_captions_and_splits says what is wrong with it
  if not (isinstance(data, dict) and isinstance(data.get("images"), list)):
    return None
  files, seen = [], {}
  for n, entry in enumerate(data["images"]):
    if not (isinstance(entry, dict) and isinstance(entry.get("filename"), str)
            and isinstance(entry.get("sentences"), list)):
      raise BadInput(f"{path}: images[{n}] is not an object with a string 'filename' and a list "
                       "'sentences'; expected Karpathy's dataset JSON (e.g. dataset_coco.json)")
    if entry.get("split") not in base.SPLITS + ("restval",):
      raise BadInput(f"{path}: images[{n}] has split {entry.get('split')!r}, expected one of "
                       "train, val, test, restval")
    stem = str(image_key(entry, path))
    if stem in seen:
      raise BadInput(f"{path}: images[{n}] has the id {stem} of images[{seen[stem]}]; expected "
                       "one entry per image (its features are named <id>.npy / <id>.npz)")
    seen[stem] = n
    files.append((os.path.join(entry.get("filepath") or "", entry["filename"]), stem))
  return {"images": data["images"], "dataset": data.get("dataset"), "files": files}


def write_karpathy_subset(out_dir: str, name: str, data: dict, extracted: set) -> str:
  """``<out_dir>/dataset_<name>.json``: the entries of :func:`read_karpathy_captions`'s ``data``
  whose features were extracted (their stems in ``extracted``), as they are (splits, tokens,
  ids), written atomically. Returns a one-line summary."""
  images = [e for e, (_, stem) in zip(data["images"], data["files"]) if stem in extracted]
  path = os.path.join(out_dir, f"dataset_{name}.json")
  atomic.write_json(path, {"images": images, "dataset": data.get("dataset") or name})
  counts = ", ".join(f"{s} {sum(e['split'] == s for e in images)}" for s in ("train", "restval", "val", "test"))
  return (f"wrote {path}: {len(images)} images ({counts}), "
          f"{sum(len(e['sentences']) for e in images)} captions")
