"""TFDS builders (``array_record``, no TensorFlow) for every jaxcap layout, and their reader.

``build(data_config, data_dir)`` reads a layout with its jaxcap reader (the same
``data_config`` as ``format="raw"``) and writes ``data_dir/jaxcap_<name>/1.0.0``:

- one array_record record per image, in split order (``disable_shuffling``): ``image_index``,
  ``image_id`` (text), ``feats`` ``[n, D]``, ``boxes`` ``[n, 4]``, ``global_feat`` ``[Dg]``
  (after validation, grid reshaping and box normalisation, so readers need no layout
  knowledge), ``refs`` (space-joined tokens), ``src``, ``attributes``;
- the text of every split in the builder's ``metadata.json``, so a dataset is constructed
  (vocabulary, captions) without decoding a single feature record.

The build happens in a temporary directory next to the destination and is renamed into
place at the end: a failed build leaves nothing behind. ``load(data_config)`` (what
``get_dataset`` calls for ``format="tfds"``) reads it with ``builder.as_data_source()``
and gives batches identical to the raw reader's.

Dimension legend: n regions of one image, D region-feature size, Dg global-feature size.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import tensorflow_datasets as tfds

from jaxcap.data import base
from jaxcap.data.readers import complete_data_config, reader
from jaxcap.errors import BadInput

VERSION = "1.0.0"


def _raw_splits(data_config) -> dict[str, base.SplitData]:
  data_config = complete_data_config(data_config)
  return reader(data_config.name).read_splits(data_config)


class _CaptionBuilder(tfds.core.GeneratorBasedBuilder):
  """Writes the splits of one jaxcap reader (``raw_splits``) as array_record files."""

  VERSION = tfds.core.Version(VERSION)

  def __init__(self, *, raw_splits: dict | None = None, feature_dim: int | None = None,
               max_regions: int | None = None, **kwargs):
    self._raw, self._max_regions = raw_splits, max_regions
    self._feature_dim = feature_dim
    self._dims = None
    if raw_splits is not None:
      train = raw_splits["train"]
      feats, _, glob = base.resolve_features(train.features.read(0), train.features.name(0),
                                             feature_dim, None)
      self._dims = (feats.shape[-1], glob.shape[-1], bool(getattr(train.features, "grid", False)))
    super().__init__(**kwargs)

  def _info(self):
    d, dg = (self._dims or (None, None, False))[:2]
    return tfds.core.DatasetInfo(
        builder=self,
        description="jaxcap captioning dataset (see jaxcap.data.tfds_builders).",
        features=tfds.features.FeaturesDict({
            "image_index": np.int32,
            "image_id": tfds.features.Text(),
            "feats": tfds.features.Tensor(shape=(None, d), dtype=np.float32),
            "boxes": tfds.features.Tensor(shape=(None, 4), dtype=np.float32),
            "global_feat": tfds.features.Tensor(shape=(dg,), dtype=np.float32),
            "refs": tfds.features.Sequence(tfds.features.Text()),
            "src": tfds.features.Text(),
            "attributes": tfds.features.Sequence(tfds.features.Text()),
        }),
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True,  # Record i must be image i of its split.
    )

  def _split_generators(self, dl_manager):
    d, dg, grid = self._dims
    text = {}
    for split, sd in self._raw.items():
      text[split] = {
          "image_ids": list(sd.image_ids), "refs": sd.refs, "src": sd.src,
          "attributes": sd.attributes, "oracle_attributes": sd.oracle_attributes}
    # Whether the source had boxes and images (the built records always hold boxes: the
    # whole-image box when there were none), for the models that need them.
    readers = [sd.features for sd in self._raw.values()]
    boxes = {getattr(r, "has_boxes", None) for r in readers}
    has_boxes = False if False in boxes else (True if boxes == {True} else None)
    has_image = all(getattr(r, "has_image", True) for r in readers)
    self.info.metadata["jaxcap"] = {"feature_dim": int(d), "global_dim": int(dg),
                                    "grid": grid, "max_regions": self._max_regions,
                                    "has_boxes": has_boxes, "has_image": has_image,
                                    "splits": text}
    return {split: self._generate_examples(split) for split in self._raw}

  def _generate_examples(self, split):
    sd = self._raw[split]
    d, dg, _ = self._dims
    for i in range(len(sd.image_ids)):
      feats, boxes, glob = base.resolve_features(sd.features.read(i), sd.features.name(i), d, dg)
      yield i, {
          "image_index": i, "image_id": str(sd.image_ids[i]),
          "feats": feats, "boxes": np.ascontiguousarray(boxes), "global_feat": glob,
          "refs": [" ".join(t) for t in sd.refs[i]],
          "src": " ".join(sd.src[i]) if sd.src is not None else "",
          "attributes": list((sd.attributes or sd.oracle_attributes or [[]] * (i + 1))[i]),
      }


def _builder_class(name: str):
  # One registered builder per layout, so built dirs are named after it (jaxcap_karpathy, ...).
  cls_name = "Jaxcap" + "".join(p.capitalize() for p in name.split("_"))
  cls = _BUILDERS.get(name)
  if cls is None:
    cls = type(cls_name, (_CaptionBuilder,), {"__module__": __name__,
                                              "name": f"jaxcap_{name}"})
    _BUILDERS[name] = cls
  return cls


_BUILDERS: dict = {}


def _max_regions_override(data_config) -> int | None:
  # The raw readers of global-feature-only layouts present one region (N = 1).
  if data_config.name in ("karpathy", "cocotalk") and not data_config.get("att_dir"):
    return 1
  return None


def build(data_config, data_dir: str, overwrite: bool = False) -> str:
  """Builds the TFDS dataset of ``data_config``'s layout; returns its directory.

  Args:
    data_config: a raw-format data config (see :func:`jaxcap.data.get_dataset`).
    data_dir: TFDS data dir; the result is ``data_dir/jaxcap_<name>/1.0.0``.
    overwrite: replace an existing build (otherwise it is returned as is).
  """
  final = os.path.join(data_dir, f"jaxcap_{data_config.name}", VERSION)
  if os.path.exists(os.path.join(final, "dataset_info.json")) and not overwrite:
    return final
  raw = _raw_splits(data_config)
  os.makedirs(data_dir, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".jaxcap_tfds_tmp", dir=data_dir)
  try:
    builder = _builder_class(data_config.name)(
        raw_splits=raw, feature_dim=data_config.get("feature_dim") or None,
        max_regions=_max_regions_override(data_config),
        data_dir=tmp, file_format="array_record")
    builder.download_and_prepare(file_format="array_record")
    os.makedirs(os.path.dirname(final), exist_ok=True)
    if os.path.exists(final):
      old = tempfile.mkdtemp(prefix=".jaxcap_tfds_old", dir=data_dir)
      os.replace(final, os.path.join(old, VERSION))
      shutil.rmtree(old, ignore_errors=True)
    os.replace(builder.data_dir, final)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return final


class TfdsFeatures(base.RowFeatures):
  """Reads features from a built split's array_record data source."""

  def __init__(self, source, split: str, path: str, grid: bool, has_boxes: bool | None = None,
               has_image: bool = True):
    super().__init__(source, f"{path} {split}")
    self.source, self.split, self.path, self.grid = source, split, path, grid
    self.has_boxes, self.has_image = has_boxes, has_image

  def read(self, i: int) -> dict:
    try:
      rec = self.source[i]
      return {"feats": rec["feats"], "boxes": rec["boxes"], "global_feat": rec["global_feat"]}
    except _RECORD_ERRORS as e:  # array_record's and TFDS's refusals of a damaged shard
      raise BadInput(f"{self.name(i)}: unreadable record ({type(e).__name__}: {str(e)[:160]}); "
                     "expected the split's array_record shard as tfds_builders.build wrote it") from None


def _find_build(data_config) -> str:
  path = data_config.tfds_dir or data_config.root
  for cand in (path, os.path.join(path, f"jaxcap_{data_config.name}", VERSION)):
    if cand and os.path.exists(os.path.join(cand, "dataset_info.json")):
      return cand
  raise BadInput(f"{path or '<tfds_dir unset>'}: field 'tfds_dir' holds no built jaxcap TFDS "
                   f"dataset, expected dataset_info.json there or in jaxcap_{data_config.name}/"
                   f"{VERSION} (run jaxcap.data.tfds_builders.build)")


# What a damaged build raises from TFDS, protobuf's JSON reader and array_record (each found by
# tests/test_fuzz_readers.py): JSON and UTF-8 errors (ValueError), protobuf's ParseError,
# array_record's RuntimeError ("Corrupted Riegeli", "ArrayRecord file ..."), and the key / type
# errors of a record without its features.
_RECORD_ERRORS = (RuntimeError, ValueError, KeyError, TypeError, OSError, EOFError)


def _check_meta(meta, path: str) -> None:
  """The build's ``jaxcap`` metadata (metadata.json) as :func:`build` writes it, else one line."""
  def bad(what):
    return BadInput(f"{path}/metadata.json: {what}; expected the 'jaxcap' metadata tfds_builders.build writes")
  if not isinstance(meta, dict) or not isinstance(meta.get("splits"), dict) or not meta["splits"]:
    raise bad("no 'splits' object")
  for key in ("feature_dim", "global_dim"):
    if not isinstance(meta.get(key), int) or isinstance(meta.get(key), bool) or meta[key] < 1:
      raise bad(f"{key}={meta.get(key)!r:.40}, not a positive integer")
  if meta.get("max_regions") is not None and (not isinstance(meta["max_regions"], int) or meta["max_regions"] < 1):
    raise bad(f"max_regions={meta['max_regions']!r:.40}, not a positive integer")
  if not isinstance(meta.get("grid"), bool):
    raise bad(f"grid={meta.get('grid')!r:.40}, not true / false")
  for split, text in meta["splits"].items():
    if split not in base.SPLITS or not isinstance(text, dict):
      raise bad(f"split {split!r:.40}, not one of {', '.join(base.SPLITS)} with its texts")
    for key in ("image_ids", "refs", "src", "attributes", "oracle_attributes"):
      if key not in text:
        raise bad(f"split {split}: no {key!r}")
    ids, refs = text["image_ids"], text["refs"]
    if not isinstance(ids, list) or not isinstance(refs, list) or len(ids) != len(refs):
      raise bad(f"split {split}: image_ids and refs not two lists of one length")
    if not all(isinstance(r, list) and all(isinstance(c, list) and all(isinstance(w, str) for w in c)
                                           for c in r) for r in refs):
      raise bad(f"split {split}: refs not lists of tokenised captions (lists of words)")


def load(data_config) -> base.CaptionDataset:
  """A CaptionDataset over a built TFDS dir (``data_config.tfds_dir``)."""
  path = _find_build(data_config)
  try:
    builder = tfds.builder_from_directory(path)
    meta = builder.info.metadata["jaxcap"]
    sources = builder.as_data_source()
  except Exception as e:  # noqa: BLE001 - TFDS reading the build's JSON and shards: the user's files
    # (JSONDecodeError, UnicodeDecodeError, protobuf's ParseError, array_record's RuntimeError,
    # a missing key or file; tests/test_fuzz_readers.py)
    raise BadInput(f"{path}: not a readable jaxcap TFDS build ({type(e).__name__}: "
                   f"{str(e).splitlines()[0][:160] if str(e) else 'damaged'}); expected the folder "
                   "tfds_builders.build wrote") from None
  _check_meta(meta, path)
  missing = sorted(set(meta["splits"]) - set(sources))
  if missing:
    raise BadInput(f"{path}: splits {missing} in metadata.json have no array_record shard; expected "
                   "the folder tfds_builders.build wrote")
  splits = {}
  for split, text in meta["splits"].items():
    feats = TfdsFeatures(sources[split], split, path, meta["grid"], meta.get("has_boxes"),
                         meta.get("has_image", True))
    splits[split] = base.SplitData(
        image_ids=text["image_ids"], refs=text["refs"], features=feats, src=text["src"],
        attributes=text["attributes"], oracle_attributes=text["oracle_attributes"])
  return base.CaptionDataset(splits, data_config, name=f"tfds:{path}",
                             feature_dim=meta["feature_dim"], global_dim=meta["global_dim"],
                             max_regions=meta.get("max_regions"))
