"""jaxcap input data: datasets (docs/DESIGN.md, section 2) and the grain pipeline.

``get_dataset(data_config)`` picks a reader by ``data_config.name``; every reader returns a
:class:`jaxcap.data.base.CaptionDataset`, so batches look the same whatever the layout.
"""

from __future__ import annotations

import importlib

from jaxcap.data.base import CaptionDataset, SplitData, SplitSource, collate  # noqa: F401
from jaxcap.data.synthetic import load_synthetic, synthetic_splits  # noqa: F401
from jaxcap.data.vocab import Vocab, tokenize  # noqa: F401

# Each data.name's reader module, imported when first used (the real-data readers pull in
# h5py); each has ``read_splits(config) -> {split: SplitData}`` and ``load(config) ->
# CaptionDataset`` (the TFDS builder writes what read_splits returns).
_READERS = {"synthetic_scenes": "synthetic", "karpathy": "karpathy", "cocotalk": "cocotalk",
            "multi30k": "multi30k"}
NAMES = tuple(_READERS)


def reader(name: str):
  """The reader module of ``data.name`` = ``name``."""
  if name not in _READERS:
    raise ValueError(f"data.name {name!r}: unknown, expected one of {', '.join(NAMES)}")
  return importlib.import_module(f"jaxcap.data.{_READERS[name]}")


# Every field that get_dataset reads, with its default (documented there), in groups: files,
# text and batches, attributes (ETA), translation (Multi30k), synthetic_scenes.
_DEFAULTS = dict(
    format="raw", tfds_dir="", root="", dataset_json="", att_dir="", fc_dir="", box_dir="",
    label_h5="", grid=False, use_restval=True,
    max_len=16, min_word_count=5, max_regions=36, seq_per_img=5,
    num_attributes=1000, max_attributes=20, attributes="oracle", test_attributes="",
    attributes_file="",
    task="caption", feature_dim=0, src_max_len=0, src_min_word_count=0, src_lang="en",
    tgt_lang="de", features_npy="", text_only=False, test_split_file="test_2016_flickr",
    num_train=10000, num_val=500, num_test=500, seed=0, noise=0.5, attr_noise=0.0,
    num_workers=0, validate_features="all", validate_sample=100, truncate_regions=False,
    degenerate_boxes="error", missing_boxes="error")

# What a dataset sets differently. cocotalk.json's vocabulary is already thresholded. Multi30k
# sentences run to ~40 words (captions' 16 would cut targets), one target sentence per line.
_DATASET_DEFAULTS = {
    "synthetic_scenes": dict(feature_dim=128, max_regions=10),
    "cocotalk": dict(dataset_json="cocotalk.json", label_h5="cocotalk_label.h5", min_word_count=1),
    "multi30k": dict(task="translate", max_len=40, seq_per_img=1, max_regions=196, grid=True),
}


def default_data_config(name: str = "synthetic_scenes"):
  """A data config (``ml_collections.ConfigDict``) with every field :func:`get_dataset` reads."""
  import ml_collections
  if name not in NAMES:
    raise ValueError(f"data.name {name!r}: unknown, expected one of {', '.join(NAMES)}")
  return ml_collections.ConfigDict({"name": name, **_DEFAULTS, **_DATASET_DEFAULTS.get(name, {})})


def complete_data_config(data_config):
  """``data_config`` with every field it leaves out at its default (:func:`default_data_config`
  of its ``name``): readers and checks read each field directly, its default written once."""
  import ml_collections
  defaults = default_data_config(data_config.get("name", "synthetic_scenes")).to_dict()
  return ml_collections.ConfigDict({**defaults, **dict(data_config)})


def get_dataset(data_config) -> CaptionDataset:
  """Builds the dataset named by ``data_config.name``.

  Fields (defaults from :func:`default_data_config`):
    name: ``synthetic_scenes`` | ``karpathy`` | ``cocotalk`` | ``multi30k``.
    format: ``raw`` (read the layout in place) or ``tfds`` (a dir written by
      :func:`jaxcap.data.tfds_builders.build`, in ``tfds_dir``; identical batches).
    root: dataset directory; the paths below are relative to it unless absolute.
    dataset_json: Karpathy ``dataset_*.json`` or ``cocotalk.json``.
    att_dir, fc_dir, box_dir: self-critical feature dirs (``<id>.npz`` key ``feat`` /
      ``<id>.npy``); ``fc_dir`` alone gives one region per image (N = 1).
    label_h5: cocotalk's ``cocotalk_label.h5``.
    grid: att files (or Multi30k arrays) are ``[g, g, C]`` / ``[g*g, C]`` grids.
    use_restval: Karpathy ``restval`` images join ``train``.
    max_len: caption words kept (T = max_len + 1 with EOS).
    min_word_count: vocabulary threshold (words seen fewer times become UNK).
    max_regions: N, regions padded / truncated to this.
    seq_per_img: S, captions per image in a batch.
    num_attributes: K, attribute vocabulary (top content words of the training refs).
    max_attributes: A, attribute ids per image.
    attributes: ``oracle`` | ``noisy`` (synthetic only) | ``detected`` | ``none``.
    test_attributes: the same for the test split ("" = ``attributes``); e.g. ETA^oracle trains
      on ``detected`` / ``noisy`` and tests on ``oracle``.
    attributes_file: JSON ``{image_id: [words]}`` used when ``attributes == "detected"``.
    task: ``caption`` | ``translate`` (synthetic_scenes: English source -> German target;
      multi30k always translates ``src_lang`` -> ``tgt_lang``).
    feature_dim: expected region-feature size (0: taken from the first training image).
    src_max_len: source words kept (0: ``max_len``); src_min_word_count (0: min_word_count).
    src_lang, tgt_lang, features_npy, text_only, test_split_file: Multi30k (see
      :mod:`jaxcap.data.multi30k`).
    num_train, num_val, num_test, seed, noise, attr_noise: synthetic_scenes sizes and knobs.
    num_workers: grain worker processes of the training iterator (0: read in this process).
    validate_features: checked before the first step (jaxcap/training/validation.py): every
      feature file's header (shape, dtype; the arrays are not read) and boxes of the splits in
      use: ``all`` | ``sample`` (``validate_sample`` images per split, evenly spread: datasets
      too large to scan) | ``off``.
    truncate_regions: an image with more regions than ``max_regions`` is an error before
      training; True keeps its first ``max_regions`` (bottom-up features come sorted by
      detector confidence).
    degenerate_boxes: zero-area boxes (x1 == x2 or y1 == y2) in box files: ``error`` (a
      detector never emits one; it means broken coordinates) | ``allow`` (the Image Transformer
      treats such a box as overlapping nothing: a neighbour of every region;
      :func:`jaxcap.data.base.check_boxes`).
    missing_boxes: a model that builds on region boxes (the Image Transformer's spatial graph)
      on region features without boxes (no ``box_dir``): ``error`` | ``whole_image`` (every
      region gets the whole-image box, said once when the run starts; the graph then carries
      nothing).
  """
  data_config = complete_data_config(data_config)
  if data_config.format == "tfds":
    from jaxcap.data import tfds_builders
    return tfds_builders.load(data_config)
  return reader(data_config.name).load(data_config)
