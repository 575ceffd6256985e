"""The data readers by ``data.name`` and every data field's default, written once.

Its own module (not the package's ``__init__``) so that the TFDS builder, which
``get_dataset`` imports, can use it without importing the package it is part of.
"""

from __future__ import annotations

import importlib

from jaxcap.errors import BadInput

# Each data.name's reader module, imported when first used (the real-data readers pull in
# h5py); each has ``read_splits(config) -> {split: SplitData}`` and ``load(config) ->
# CaptionDataset`` (the TFDS builder writes what read_splits returns).
_READERS = {"synthetic_scenes": "synthetic", "karpathy": "karpathy", "cocotalk": "cocotalk",
            "multi30k": "multi30k"}
NAMES = tuple(_READERS)


def reader(name: str):
  """The reader module of ``data.name`` = ``name``."""
  if name not in _READERS:
    raise BadInput(f"data.name {name!r}: unknown, expected one of {', '.join(NAMES)}")
  return importlib.import_module(f"jaxcap.data.{_READERS[name]}")


# Every field that jaxcap.data.get_dataset reads, with its default (documented there), in
# groups: files, text and batches, attributes (ETA), translation (Multi30k), synthetic_scenes,
# the loader and the run-start checks.
_DEFAULTS = dict(
    format="raw", tfds_dir="", root="", dataset_json="", att_dir="", fc_dir="", box_dir="",
    detections_hdf5="", images_dir="", image_size=0,
    label_h5="", grid=False, use_restval=True,
    max_len=16, min_word_count=5, max_regions=36, seq_per_img=5, vocab_file="",
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
  """A data config (``ml_collections.ConfigDict``) with every field that
  :func:`jaxcap.data.get_dataset` reads."""
  import ml_collections
  if name not in NAMES:
    raise BadInput(f"data.name {name!r}: unknown, expected one of {', '.join(NAMES)}")
  return ml_collections.ConfigDict({"name": name, **_DEFAULTS, **_DATASET_DEFAULTS.get(name, {})})


def complete_data_config(data_config):
  """``data_config`` with every field it leaves out at its default (:func:`default_data_config`
  of its ``name``): readers and checks read each field directly, its default written once."""
  import ml_collections
  defaults = default_data_config(data_config.get("name", "synthetic_scenes")).to_dict()
  return ml_collections.ConfigDict({**defaults, **dict(data_config)})
