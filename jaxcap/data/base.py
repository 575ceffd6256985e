"""CaptionDataset: vocabulary, encoded captions, attributes and random-access split sources.

Every reader (:mod:`karpathy`, :mod:`cocotalk`, :mod:`multi30k`, the synthetic scenes, a
built TFDS dir) only has to say, per split, which images exist, their reference tokens
and how to read one image's features (a :class:`FeatureReader`). Everything else —
vocabulary, truncation, attributes, validation, batch assembly — lives here, so every
layout gives identical batches for identical content.

Dimension legend: B images in a batch, N regions (``max_regions``), n regions of one image,
D region-feature size, Dg global-feature size, S captions per image (``seq_per_img``),
R references of one image, T = ``max_len + 1`` caption positions, A attributes per image,
K attribute vocabulary size, Ls = ``src_max_len + 1`` source positions, g grid side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Sequence

import numpy as np

from jaxcap.data import attributes as attributes_lib
from jaxcap.data import batch as batch_lib
from jaxcap.data.batch import check_boxes
from jaxcap.data.vocab import EOS, PAD, SPECIALS, UNK, Vocab
from jaxcap.errors import BadIndex, BadInput

SPLITS = ("train", "val", "test")


def check_split(split: str, available: Sequence[str] = SPLITS) -> str:
  if split not in available:
    raise BadInput(f"split {split!r}: unknown, expected one of {', '.join(available)}")
  return split


def grid_boxes(g: int) -> np.ndarray:
  """Boxes of a ``g x g`` grid's cells, row-major: float32 ``[g*g, 4]`` (x1, y1, x2, y2)."""
  r, c = np.meshgrid(np.arange(g), np.arange(g), indexing="ij")
  boxes = np.stack([c, r, c + 1, r + 1], axis=-1).reshape(g * g, 4)
  return (boxes / g).astype(np.float32)


def grid_to_regions(x: np.ndarray, name: str) -> np.ndarray:
  """``[g, g, C]`` or ``[g*g, C]`` grid features -> ``[g*g, C]`` regions (row-major)."""
  if x.ndim == 3:
    if x.shape[0] != x.shape[1]:
      raise BadInput(f"{name}: grid features must be [g, g, C], got shape {list(x.shape)}")
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2])
  if x.ndim == 2:
    g = int(round(np.sqrt(x.shape[0])))
    if g * g != x.shape[0]:
      raise BadInput(f"{name}: grid features [cells, C] need a square number of cells, "
                       f"got {x.shape[0]}")
    return x
  raise BadInput(f"{name}: grid features must be [g, g, C] or [g*g, C], got shape {list(x.shape)}")


def check_features(feats: np.ndarray, dim: int | None, name: str, field: str = "feat",
                   ndim: int = 2) -> np.ndarray:
  """Returns float32 features or raises a one-line BadInput naming ``name``."""
  feats = np.asarray(feats)
  if feats.ndim != ndim:
    want = "[regions, D]" if ndim == 2 else "[D]"
    raise BadInput(f"{name}: field {field!r} must be {want}, got shape {list(feats.shape)}")
  if ndim == 2 and feats.shape[0] == 0:
    raise BadInput(f"{name}: field {field!r} has zero regions, expected at least one")
  if dim is not None and feats.shape[-1] != dim:
    raise BadInput(f"{name}: field {field!r} has feature dimension {feats.shape[-1]}, "
                     f"expected {dim}")
  if not (np.issubdtype(feats.dtype, np.floating) or feats.dtype == np.float32):
    raise BadInput(f"{name}: field {field!r} has dtype {feats.dtype}, expected floating-point "
                     "features (float16 / float32 / float64)")
  feats = np.asarray(feats, dtype=np.float32)
  # The sum is finite iff every element is (inf - inf and nan propagate); one pass, no mask.
  if not np.isfinite(feats.sum(dtype=np.float64)):
    raise BadInput(f"{name}: field {field!r} contains NaN or Inf values, expected finite numbers")
  return feats


_UNIT_BOX = np.array([[0.0, 0.0, 1.0, 1.0]], np.float32)


@contextlib.contextmanager
def feature_file_errors(path: str):
  """Turns any failure reading the feature file ``path`` into a one-line BadInput naming it
  (missing, not a numpy file, corrupt); a ValueError that already names it passes as it is."""
  try:
    yield
  except FileNotFoundError:
    raise BadInput(f"{path}: feature file is missing, expected one per image") from None
  except ValueError as e:
    if str(e).startswith(path):
      raise
    raise BadInput(f"{path}: unreadable feature file ({e}); expected a numpy .npy / .npz "
                     "file") from None
  except Exception as e:  # zipfile.BadZipFile, EOFError, OSError ... all mean "corrupt".
    raise BadInput(f"{path}: unreadable feature file ({type(e).__name__}: {e}); expected a "
                     "numpy .npy / .npz file") from None


def npy_header(path: str, key: str | None = None) -> tuple[tuple, np.dtype]:
  """``(shape, dtype)`` of a ``.npy`` file (or array ``key`` of an ``.npz``) from its header,
  without reading the array. Raises a one-line BadInput naming the file when it is missing,
  not a numpy file, or shorter than its header says (truncated)."""
  import zipfile
  with feature_file_errors(path):
    if key is None:
      with open(path, "rb") as f:
        shape, dtype, offset = _read_npy_header(f)
      want = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
      size = os.path.getsize(path)
      if size < want:
        raise BadInput(f"{path}: truncated feature file ({size} bytes, its header says "
                         f"{want}), expected a complete .npy")
      return shape, dtype
    with zipfile.ZipFile(path) as z:
      member = f"{key}.npy"
      if member not in z.namelist():
        raise BadInput(f"{path}: no key {key!r} (has {[n[:-4] for n in z.namelist()]}), "
                         f"expected the features under {key!r}")
      with z.open(member) as f:
        shape, dtype, _ = _read_npy_header(f)
      return shape, dtype


def check_npy_size(f, size: int, path: str) -> None:
  """Refuses, naming ``path``, a ``.npy`` (at ``f``'s position, ``size`` bytes with its header)
  whose header declares more bytes than it holds, before ``np.load`` allocates what the header
  says (a flipped digit of its shape: gigabytes); ``f`` is left where it was."""
  start = f.tell()
  shape, dtype, offset = _read_npy_header(f)
  want = offset - start + int(np.prod(shape, dtype=object)) * dtype.itemsize
  if size < want:
    raise BadInput(f"{path}: truncated feature file ({size} bytes, its header says "
                     f"{want}), expected a complete .npy")
  f.seek(start)


def _read_npy_header(f):
  version = np.lib.format.read_magic(f)
  if version not in ((1, 0), (2, 0), (3, 0)):
    raise ValueError(f"format version {version[0]}.{version[1]}; expected np.save's 1.0, 2.0 or 3.0")
  # The header's length, checked before numpy reads that many bytes (a flipped one: gigabytes
  # allocated first): numpy refuses a header longer than 10,000 characters only once it has it.
  width = 2 if version == (1, 0) else 4
  length = int.from_bytes(f.read(width), "little")
  if length > 10_000:
    raise ValueError(f"a header of {length:,} bytes; expected at most 10,000 (numpy's limit)")
  f.seek(-width, os.SEEK_CUR)
  if version == (1, 0):
    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
  else:
    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
  offset = f.tell()
  return tuple(shape), np.dtype(dtype), offset


def resolve_features(raw: dict, name: str, feature_dim: int | None, global_dim: int | None):
  """Validates a reader's output and fills the defaults: ``(feats [n, D], boxes [n, 4],
  global_feat [Dg])`` float32. Unknown boxes span the whole image; a missing global feature
  is the mean of the regions."""
  feats = check_features(raw["feats"], feature_dim, name)
  boxes = raw.get("boxes")
  if boxes is None:
    boxes = np.broadcast_to(_UNIT_BOX, (feats.shape[0], 4))
  else:
    boxes = np.asarray(boxes, np.float32)
    if boxes.shape != (feats.shape[0], 4):
      raise BadInput(f"{name}: field 'boxes' has shape {list(boxes.shape)}, expected "
                       f"[{feats.shape[0]}, 4] to match the features")
  glob = raw.get("global_feat")
  if glob is None:
    glob = feats.mean(axis=0)
  else:
    glob = check_features(glob, global_dim, name, field="fc", ndim=1)
  return feats, boxes, glob


class FeatureReader:
  """Reads one image's features: ``read(i) -> {"feats" [n, D], "boxes" [n, 4] | None,
  "global_feat" [Dg] | None}`` (numpy, possibly memory-mapped). ``name(i)`` names the
  file or row for error messages."""

  grid = False
  # What the reader gives beyond region features, for the models that need it (checked
  # before training, jaxcap/training/validation.py::check_model_inputs): ``has_boxes`` True
  # (box files, or boxes derived from a grid), False (every region gets the whole-image box)
  # or None (unknown); ``has_image`` False for text-only data (one all-zero region).
  has_boxes: bool | None = None
  has_image = True

  def __len__(self) -> int:
    raise NotImplementedError

  def read(self, i: int) -> dict:
    raise NotImplementedError

  def name(self, i: int) -> str:
    return f"row {i}"

  def header(self, i: int) -> dict | None:
    """What image ``i``'s files say without reading the feature arrays, for the check before
    training (:mod:`jaxcap.training.validation`): ``{"feats": (shape, dtype, name),
    "global_feat": (shape, dtype, name) | None, "boxes": (boxes [n, 4] normalised, name) |
    None}``; None when the features are generated in memory (checked when read)."""
    return None


class RowFeatures(FeatureReader):
  """A reader over ``rows``, anything indexable whose row i is image i's (arrays, a TFDS data
  source); ``label`` names it in error messages, row i as ``label[i]``."""

  def __init__(self, rows, label: str):
    self.rows, self.label = rows, label

  def __len__(self) -> int:
    return len(self.rows)

  def name(self, i: int) -> str:
    return f"{self.label}[{i}]"


class ArrayFeatures(RowFeatures):
  """Features held in arrays (in memory or ``np.load(..., mmap_mode="r")``).

  Args:
    feats: ``[I, n, D]``, ``[I, g, g, D]`` (grid, needs ``grid=True``) or a list of ``[n_i, D]``.
    boxes: optional ``[I, n, 4]`` (or list), already normalised to [0, 1].
    global_feats: optional ``[I, Dg]``.
    grid: treat each image's features as grid cells (boxes derived from the grid).
    label: names the array in error messages (e.g. the ``.npy`` path).
  """

  def __init__(self, feats, boxes=None, global_feats=None, grid: bool = False,
               label: str = "features"):
    super().__init__(feats, label)
    self.feats, self.boxes, self.global_feats, self.grid = feats, boxes, global_feats, grid
    self.has_boxes = bool(grid or boxes is not None)

  def read(self, i: int) -> dict:
    feats = self.feats[i]
    boxes = None if self.boxes is None else self.boxes[i]
    if self.grid:
      feats = grid_to_regions(np.asarray(feats), self.name(i))
      boxes = grid_boxes(int(round(np.sqrt(feats.shape[0]))))
    glob = None if self.global_feats is None else self.global_feats[i]
    return {"feats": feats, "boxes": boxes, "global_feat": glob}

  def header(self, i: int) -> dict:
    def meta(a, field):
      if a is None:
        return None
      if hasattr(a, "shape") and hasattr(a, "dtype") and not isinstance(a, list):
        return tuple(a.shape[1:]), np.dtype(a.dtype), f"{self.label}[{i}] ({field})"
      x = a[i]
      return tuple(np.shape(x)), np.asarray(x[:0] if np.ndim(x) else x).dtype, f"{self.name(i)} ({field})"
    feats = meta(self.feats, "feats")
    if self.grid:
      feats = ((int(np.prod(feats[0][:-1])),) + feats[0][-1:], feats[1], feats[2])
    boxes = None
    if self.boxes is not None and not self.grid:
      boxes = (np.asarray(self.boxes[i], np.float32), self.name(i))
    return {"feats": feats, "global_feat": meta(self.global_feats, "global_feat"), "boxes": boxes}


class TextOnlyFeatures(FeatureReader):
  """No image: one all-zero region of size ``dim`` per example (text-only runs)."""

  has_boxes = False
  has_image = False

  def __init__(self, num: int, dim: int = 1):
    self.num, self.dim = num, dim

  def __len__(self) -> int:
    return self.num

  def read(self, i: int) -> dict:
    return {"feats": np.zeros((1, self.dim), np.float32), "boxes": None, "global_feat": None}


@dataclasses.dataclass
class SplitData:
  """What a reader provides for one split (all lists are aligned, one entry per image).

  Attributes:
    image_ids: COCO-style ids (int or str), unique within the split.
    refs: reference token lists per image (target language), unabridged.
    features: reads image ``i``'s features.
    src: translation-source tokens per image (one sentence), or None.
    src_file: the file ``src`` was read from, one line per image (for messages), or None.
    refs_file: the file ``refs`` were read from when it holds one line per image (Multi30k's
      target side; for messages), or None.
    attributes: explicit attribute words per image (noisy / detected), or None.
    oracle_attributes: reader-provided oracle attribute words, or None (then derived from refs).
  """

  image_ids: list
  refs: list
  features: FeatureReader
  src: list | None = None
  attributes: list | None = None
  oracle_attributes: list | None = None
  src_file: str | None = None
  refs_file: str | None = None


ATTRIBUTE_MODES = ("oracle", "noisy", "detected", "none")

_FIELDS = dict(max_len=16, min_word_count=5, max_regions=36, seq_per_img=5,
               num_attributes=1000, max_attributes=20, attributes="oracle",
               test_attributes="", attributes_file="", src_max_len=0, src_min_word_count=0,
               max_vocab_size=0, degenerate_boxes="error", vocab_file="")


def _cfg(config, key):
  if config is None:
    return _FIELDS[key]
  try:
    value = config[key]
  except (KeyError, AttributeError):
    return _FIELDS[key]
  return _FIELDS[key] if value is None else value


class CaptionDataset:
  """A captioning (or multimodal translation) dataset: see docs/DESIGN.md, section 2.

  Args:
    splits: ``{split name: SplitData}``; must contain ``"train"`` (the vocabulary source).
    config: data config (``max_len``, ``min_word_count``, ``max_regions``, ``seq_per_img``,
      ``num_attributes``, ``max_attributes``, ``attributes``, ``test_attributes`` (the test
      split's mode, "" = ``attributes``), ``attributes_file``,
      ``src_max_len``, ``src_min_word_count``); missing fields take their defaults.
    name: names the dataset in error messages.
    feature_dim, global_dim: expected sizes; probed from the first training image when None.
    max_regions: overrides ``config.max_regions`` (readers with one region per image pass 1).
  """

  def __init__(self, splits: dict[str, SplitData], config=None, name: str = "dataset",
               feature_dim: int | None = None, global_dim: int | None = None,
               max_regions: int | None = None):
    if "train" not in splits:
      raise BadInput(f"{name}: no 'train' split, expected one to build the vocabulary from")
    self.name, self.config, self._splits = name, config, dict(splits)
    self.max_len = int(_cfg(config, "max_len"))
    self.seq_per_img = int(_cfg(config, "seq_per_img"))
    self.max_regions = int(max_regions or _cfg(config, "max_regions"))
    self.max_attributes = int(_cfg(config, "max_attributes"))
    self.attr_mode = str(_cfg(config, "attributes"))
    # The test split may read other attributes than train/val (ETA^oracle: trained on
    # detected ones, tested on the ground truth).
    self.test_attr_mode = str(_cfg(config, "test_attributes")) or self.attr_mode
    for field, mode in (("attributes", self.attr_mode), ("test_attributes", self.test_attr_mode)):
      if mode not in ATTRIBUTE_MODES:
        raise BadInput(f"{name}: field '{field}' is {mode!r}, expected one of "
                         "oracle, noisy, detected, none")
    for split, data in self._splits.items():
      self._check_text(split, data)

    train = self._splits["train"]
    # max_vocab_size: the most frequent words kept (specials not counted; 0: no cap).
    max_words = int(_cfg(config, "max_vocab_size"))
    if _cfg(config, "vocab_file"):
      # A given vocabulary (an imported model's): training words outside it are UNK.
      self.vocab = Vocab.load(str(_cfg(config, "vocab_file")))
    else:
      self.vocab = Vocab.build((t for refs in train.refs for t in refs),
                               min_count=int(_cfg(config, "min_word_count")),
                               max_size=max_words + len(SPECIALS) if max_words > 0 else None)
    self.src_vocab = None
    self.src_max_len = int(_cfg(config, "src_max_len")) or self.max_len
    if train.src is not None:
      src_min = int(_cfg(config, "src_min_word_count")) or int(_cfg(config, "min_word_count"))
      self.src_vocab = Vocab.build(train.src, min_count=src_min)
    self.attribute_words = attributes_lib.top_content_words(
        (t for refs in train.refs for t in refs), int(_cfg(config, "num_attributes")),
        allowed=self.vocab.stoi)
    self.attribute_index = {w: j for j, w in enumerate(self.attribute_words)}
    detected = (self._load_detected() if "detected" in (self.attr_mode, self.test_attr_mode)
                else None)

    self._encoded = {}
    for split, data in self._splits.items():
      self._encoded[split] = self._encode_split(split, data, detected)
    self._sources = {}

    image_size = int(getattr(train.features, "image_size", 0) or 0)
    if image_size:  # image files: the run's backbone gives the feature sizes (jaxcap.models.pixels)
      feature_dim, global_dim, self.max_regions = 0, 0, 0
    elif feature_dim is None or global_dim is None:
      probe = train.features.read(0)
      feats = check_features(probe["feats"], feature_dim, train.features.name(0))
      feature_dim = feats.shape[-1] if feature_dim is None else feature_dim
      if global_dim is None:
        global_dim = feature_dim if probe["global_feat"] is None else np.shape(probe["global_feat"])[-1]
    self.info = {
        "feature_dim": int(feature_dim), "global_dim": int(global_dim),
        "max_regions": self.max_regions, "max_len": self.max_len,
        "vocab_size": len(self.vocab),
        "src_vocab_size": 0 if self.src_vocab is None else len(self.src_vocab),
        "num_attributes": len(self.attribute_words),
        "grid": bool(getattr(train.features, "grid", False)),
        "seq_per_img": self.seq_per_img, "max_attributes": self.max_attributes,
        "src_max_len": self.src_max_len if self.src_vocab is not None else 0,
    }
    if image_size:
      self.info["image_size"] = image_size

  # --- construction helpers -------------------------------------------------------------

  def _check_text(self, split: str, data: SplitData) -> None:
    n = len(data.image_ids)
    if len(data.refs) != n or len(data.features) != n:
      raise BadInput(f"{self.name} split {split!r}: {n} image ids, {len(data.refs)} reference "
                       f"lists and {len(data.features)} feature entries, expected equal counts")
    if len(set(data.image_ids)) != n:
      raise BadInput(f"{self.name} split {split!r}: image ids are not unique")
    for j, refs in enumerate(data.refs):
      if not refs:
        raise BadInput(f"{self.name} split {split!r} image {data.image_ids[j]}: field "
                         "'captions' is empty, expected at least one reference")
      for r, toks in enumerate(refs):
        if not toks:
          where = f"{data.refs_file}: line {j + 1} (split {split!r}, " if data.refs_file else \
              f"{self.name} split {split!r} ("
          raise BadInput(f"{where}image {data.image_ids[j]}): caption {r} is empty, expected at "
                           "least one word")
    if data.src is not None:
      for j, toks in enumerate(data.src):
        if not toks:
          where = f"{data.src_file}: line {j + 1}" if data.src_file else f"{self.name} split {split!r}"
          raise BadInput(f"{where} (split {split!r}, image {data.image_ids[j]}): the source "
                           "sentence is empty, expected at least one word")

  def _load_detected(self) -> dict:
    return attributes_lib.read_file(str(_cfg(self.config, "attributes_file")))

  def _encode_split(self, split: str, data: SplitData, detected: dict | None) -> dict:
    t = self.max_len + 1
    caps, attrs, labels, srcs = [], [], [], []
    mode = self.attribute_mode(split)
    for j, refs in enumerate(data.refs):
      arr = np.zeros((len(refs), t), np.int32)
      for r, toks in enumerate(refs):
        ids = self.vocab.encode(toks, max_len=self.max_len, add_eos=True)
        arr[r, :len(ids)] = ids
      caps.append(arr)
      labels.append(np.asarray(sorted({self.attribute_index[w] for toks in refs for w in toks
                                       if w in self.attribute_index}), np.int32))
      if mode == "none":
        words = []
      elif mode == "oracle":
        words = (data.oracle_attributes[j] if data.oracle_attributes is not None else
                 attributes_lib.oracle_attributes(refs, self.attribute_index, self.max_attributes))
      elif mode == "noisy":
        if data.attributes is None:
          raise BadInput(f"{self.name}: field 'attributes' is 'noisy', which only "
                           "synthetic_scenes provides; expected oracle, detected or none")
        words = data.attributes[j]
      else:
        key = str(data.image_ids[j])
        if key not in detected:
          raise BadInput(f"{_cfg(self.config, 'attributes_file')}: no attributes for image "
                           f"{key!r} (split {split!r}), expected an entry for every image")
        words = detected[key]
      # Words outside the vocabulary carry no usable id: dropped rather than UNK.
      ids = [i for i in self.vocab.encode(list(words)) if i > UNK][:self.max_attributes]
      attrs.append(np.asarray(ids, np.int32))
      if data.src is not None:
        ids = self.src_vocab.encode(data.src[j], max_len=self.src_max_len, add_eos=True)
        row = np.zeros((self.src_max_len + 1,), np.int32)
        row[:len(ids)] = ids
        srcs.append(row)
    return {"captions": caps, "attributes": attrs, "labels": labels,
            "src": srcs if data.src is not None else None}

  # --- public API -----------------------------------------------------------------------

  @property
  def splits(self) -> tuple:
    return tuple(s for s in SPLITS if s in self._splits)

  def split(self, name: str) -> "SplitSource":
    """Random-access source of split ``name`` (grain ``RandomAccessDataSource`` protocol)."""
    check_split(name, self.splits)
    if name not in self._sources:
      self._sources[name] = SplitSource(self, name)
    return self._sources[name]

  def split_data(self, name: str) -> SplitData:
    check_split(name, self.splits)
    return self._splits[name]

  def attribute_mode(self, split: str) -> str:
    """The attribute mode of ``split``: ``test_attributes`` for "test", else ``attributes``."""
    return self.test_attr_mode if split == "test" else self.attr_mode

  def image_ids(self, split: str) -> list:
    return list(self.split_data(split).image_ids)

  def references(self, split: str) -> dict:
    """``{image_id: [caption string]}`` from the unabridged (untruncated, un-UNK'd) tokens."""
    data = self.split_data(split)
    return {iid: [" ".join(toks) for toks in refs] for iid, refs in zip(data.image_ids, data.refs)}

  def train_references_ids(self, full: bool = False) -> list:
    """Word ids (no EOS/PAD) of each training image's references.

    Args:
      full: False: truncated to ``max_len`` words (the training captions); True: whole
        captions (words outside the vocabulary as UNK), as self-critical.pytorch's
        ``prepro_ngrams.py`` counts CIDEr-D document frequencies.
    """
    if full:
      return [[np.asarray(self.vocab.encode(toks), np.int32) for toks in refs]
              for refs in self._splits["train"].refs]
    out = []
    for caps in self._encoded["train"]["captions"]:
      out.append([row[(row != PAD) & (row != EOS)] for row in caps])
    return out


class SplitSource:
  """One split as a random-access source: ``len(source)``, ``source[i] -> example``.

  An example is a dict of unpadded numpy arrays: ``image_index`` int32 scalar, ``feats``
  ``[n, D]``, ``boxes`` ``[n, 4]``, ``global_feat`` ``[Dg]``, ``captions`` ``[R, T]`` (ids,
  EOS, PAD), ``attributes`` ``[a]`` (a <= A), ``attr_labels`` float32 ``[K]`` and, for
  translation, ``src`` ``[Ls]``. Features are read (and validated) on each access.
  """

  def __init__(self, dataset: CaptionDataset, split: str):
    self.dataset, self.split = dataset, split
    self.data = dataset._splits[split]
    self.enc = dataset._encoded[split]
    self.info = dataset.info
    self.seq_per_img = dataset.seq_per_img
    self.max_regions = dataset.max_regions
    self.max_attributes = dataset.max_attributes
    self.allow_degenerate = str(_cfg(dataset.config, "degenerate_boxes")) == "allow"

  def __len__(self) -> int:
    return len(self.data.image_ids)

  def __repr__(self) -> str:
    return f"SplitSource({self.dataset.name}, {self.split!r}, {len(self)} images)"

  def __getitem__(self, i: int) -> dict:
    i = int(i)
    if not 0 <= i < len(self):
      raise BadIndex(f"{self.dataset.name} split {self.split!r}: index {i} out of range "
                       f"[0, {len(self)})")
    reader = self.data.features
    raw = reader.read(i)
    labels = np.zeros((self.info["num_attributes"],), np.float32)
    labels[self.enc["labels"][i]] = 1.0
    if "pixels" in raw:  # a run from pixels: its backbone makes the features
      ex = {"image_index": np.int32(i), "pixels": raw["pixels"], "captions": self.enc["captions"][i],
            "attributes": self.enc["attributes"][i], "attr_labels": labels}
      if self.enc["src"] is not None:
        ex["src"] = self.enc["src"][i]
      return ex
    feats, boxes, glob = resolve_features(raw, reader.name(i),
                                          self.info["feature_dim"], self.info["global_dim"])
    if raw.get("boxes") is not None and not reader.grid:  # boxes from the data, not derived
      check_boxes(boxes, reader.name(i), allow_degenerate=self.allow_degenerate)
    ex = {"image_index": np.int32(i), "feats": feats, "boxes": boxes, "global_feat": glob,
          "captions": self.enc["captions"][i], "attributes": self.enc["attributes"][i],
          "attr_labels": labels}
    if self.enc["src"] is not None:
      ex["src"] = self.enc["src"][i]
    return ex

  def collate(self, examples: Sequence[dict], rng: np.random.Generator | None = None,
              batch_size: int | None = None) -> dict:
    """Pads examples into a batch (docs/DESIGN.md, section 2); pads to ``batch_size`` rows
    with ``valid=False`` when fewer examples are given. ``rng`` draws each image's reference
    rows (training's batches); None takes them in order (:func:`collate`): the same batch on
    every call."""
    return collate(examples, rng, info=self.info, seq_per_img=self.seq_per_img,
                   batch_size=batch_size, has_src=self.enc["src"] is not None)


def collate(examples: Sequence[dict], rng: np.random.Generator | None = None, *, info: dict,
            seq_per_img: int, batch_size: int | None = None, has_src: bool = False) -> dict:
  """Assembles unpadded examples into a fixed-shape numpy batch.

  Regions beyond ``max_regions`` are dropped (bottom-up features come sorted by detector
  confidence). Images with R < S references keep all R and fill the remaining rows by
  sampling their references with replacement; with R > S a random subset of S is used.
  ``rng`` None draws nothing: the first S references, or the R repeated in order.
  """
  b = len(examples) if batch_size is None else batch_size
  n, s, a = info["max_regions"], seq_per_img, info["max_attributes"]
  batch = batch_lib.zeros(info, b, seq_per_img, has_src)
  for j, ex in enumerate(examples):
    batch["image_index"][j] = ex["image_index"]
    batch["valid"][j] = True
    if "pixels" in ex:
      batch["pixels"][j] = ex["pixels"]
    else:
      k = min(ex["feats"].shape[0], n)
      batch["feats"][j, :k] = ex["feats"][:k]
      batch["feats_mask"][j, :k] = True
      batch["boxes"][j, :k] = ex["boxes"][:k]
      batch["global_feat"][j] = ex["global_feat"]
    caps = ex["captions"]
    r = caps.shape[0]
    if r == s or rng is None:
      rows = np.arange(s) % r
    elif r > s:
      rows = rng.choice(r, size=s, replace=False)
    else:
      rows = np.concatenate([np.arange(r), rng.integers(0, r, size=s - r)])
    batch["captions"][j] = caps[rows]
    at = ex["attributes"][:a]
    batch["attributes"][j, :len(at)] = at
    batch["attr_labels"][j] = ex["attr_labels"]
    if has_src:
      batch["src"][j] = ex["src"]
  return batch


def image_features_batch(fc_BxD, att_BxCxD, data_config, info: dict) -> dict:
  """The batch keys (``feats``, ``feats_mask``, ``boxes``, ``global_feat``, ``valid``,
  ``image_index``) of features as ``jaxcap-extract`` writes them (``fc [B, D]``,
  ``att [B, g*g, D]``), through the reader and collation training used
  (:class:`jaxcap.data.ArrayFeatures`, :func:`jaxcap.data.base.collate`): ``att`` cells as
  regions (grid boxes with ``data.grid``, else whole-image boxes) when ``data.att_dir`` is set,
  else ``fc`` as the one region; ``fc`` as the global feature when ``data.fc_dir`` is set, else
  the regions' mean; regions beyond ``max_regions`` dropped, the rest padded."""
  get = data_config.get
  grid = bool(get("grid", False))
  if get("att_dir"):
    if get("box_dir") and not grid:
      raise BadInput(f"caption_images: this run read region boxes from data.box_dir="
                       f"{get('box_dir')!r}; expected a run on jaxcap-extract's grid features "
                       "(data.grid=True or no box_dir), which have no box files")
    reader = ArrayFeatures(att_BxCxD, global_feats=fc_BxD if get("fc_dir") else None,
                                grid=grid, label="images")
  else:
    reader = ArrayFeatures(fc_BxD[:, None, :], global_feats=fc_BxD, label="images")
  return _features_batch([(reader.read(i), reader.name(i)) for i in range(len(fc_BxD))], info)


def region_features_batch(regions: Sequence[dict], info: dict) -> dict:
  """:func:`image_features_batch` of detected regions (:class:`jaxcap.detection.regions.RegionDetector`'s
  ``features [n, D]``, ``boxes [n, 4]`` in pixels, ``image_hw``) as the COCO reader reads the files
  ``jaxcap.detection.extract`` writes: boxes divided by the photo's width and height, the global
  feature the regions' mean (``cocobu_fc``), regions beyond ``max_regions`` dropped."""
  reads = []
  for i, r in enumerate(regions):
    h, w = r["image_hw"]
    boxes = np.asarray(r["boxes"], np.float32) / np.asarray([w, h, w, h], np.float32)
    feats = np.asarray(r["features"], np.float32)
    reads.append(({"feats": feats, "boxes": boxes, "global_feat": feats.mean(0)}, f"images[{i}] regions"))
  return _features_batch(reads, info)


def _features_batch(reads, info: dict) -> dict:
  """``[(reader output, its name)]`` -> the collated batch keys captioning reads."""
  examples = []
  for i, (raw, name) in enumerate(reads):
    feats, boxes, glob = resolve_features(raw, name, info["feature_dim"], info["global_dim"])
    examples.append({"image_index": np.int32(i), "feats": feats, "boxes": boxes,
                     "global_feat": glob,
                     "captions": np.zeros((1, int(info["max_len"]) + 1), np.int32),
                     "attributes": np.zeros((0,), np.int32),
                     "attr_labels": np.zeros((int(info["num_attributes"]),), np.float32)})
  batch = collate(examples, np.random.default_rng(0), info=info, seq_per_img=1)
  return {k: batch[k] for k in ("image_index", "valid", "feats", "feats_mask", "boxes", "global_feat")}
