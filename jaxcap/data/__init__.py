"""jaxcap input data: datasets (docs/DESIGN.md, section 2) and the grain pipeline.

``get_dataset(data_config)`` picks a reader by ``data_config.name``; every reader returns a
:class:`jaxcap.data.base.CaptionDataset`, so batches look the same whatever the layout.

The names below are imported on first use (PEP 562): ``from jaxcap.data import batch`` (what
an exported captioner, :mod:`jaxcap.serving`, reads its inputs with) then loads that module
alone, not the datasets and readers.
"""

from __future__ import annotations

import importlib

# name -> the module that defines it (``from jaxcap.data import Vocab`` as before).
_LAZY = {"CaptionDataset": "base", "SplitData": "base", "SplitSource": "base", "collate": "base",
         "NAMES": "readers", "complete_data_config": "readers", "default_data_config": "readers",
         "reader": "readers", "load_synthetic": "synthetic", "synthetic_splits": "synthetic",
         "Vocab": "vocab", "tokenize": "vocab"}


def __getattr__(name):
  if name in _LAZY:
    value = getattr(importlib.import_module(f"jaxcap.data.{_LAZY[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value
  raise AttributeError(f"module 'jaxcap.data' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_LAZY))


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
    detections_hdf5: karpathy only, instead of the folders: one HDF5 file with a dataset
      ``<id>_features`` ``[n, D]`` per image (the M² authors' ``coco_detections.hdf5``;
      :class:`jaxcap.data.karpathy.HDF5Detections`): real regions only, no boxes.
    label_h5: cocotalk's ``cocotalk_label.h5``.
    grid: att files (or Multi30k arrays) are ``[g, g, C]`` / ``[g*g, C]`` grids.
    use_restval: Karpathy ``restval`` images join ``train``.
    max_len: caption words kept (T = max_len + 1 with EOS).
    min_word_count: vocabulary threshold (words seen fewer times become UNK).
    vocab_file: a jaxcap ``vocab.json`` to use instead of building the vocabulary from the
      training captions (an imported model's; training words outside it become UNK).
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
    num_workers: grain worker processes of the training iterator (0: read in this process;
      -1: chosen from this host's cores, :func:`jaxcap.data.pipeline.auto_workers`).
    validate_features: checked before the first step (jaxcap/training/validation.py): every
      feature file's header (shape, dtype; the arrays are not read) and boxes of the splits in
      use, or (a run from image files) every image decoded whole, on threads: ``all`` |
      ``sample`` (``validate_sample`` images per split, evenly spread: datasets too large to
      scan) | ``off``.
    truncate_regions: an image with more regions than ``max_regions`` is an error before
      training; True keeps its first ``max_regions`` (bottom-up features come sorted by
      detector confidence).
    degenerate_boxes: zero-area boxes (x1 == x2 or y1 == y2) in box files: ``error`` (a
      detector never emits one; it means broken coordinates) | ``allow`` (the Image Transformer
      treats such a box as overlapping nothing: a neighbour of every region;
      :func:`jaxcap.data.batch.check_boxes`).
    missing_boxes: a model that builds on region boxes (the Image Transformer's spatial graph)
      on region features without boxes (no ``box_dir``): ``error`` | ``whole_image`` (every
      region gets the whole-image box, said once when the run starts; the graph then carries
      nothing).
  """
  from jaxcap.data.readers import complete_data_config, reader
  data_config = complete_data_config(data_config)
  if data_config.format == "tfds":
    from jaxcap.data import tfds_builders
    return tfds_builders.load(data_config)
  return reader(data_config.name).load(data_config)
