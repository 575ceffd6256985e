"""jaxcap input data: datasets (docs/DESIGN.md, section 2) and the grain pipeline.

``get_dataset(data_config)`` picks a reader by ``data_config.name``; every reader returns a
:class:`jaxcap.data.base.CaptionDataset`, so batches look the same whatever the layout.
"""

from __future__ import annotations

from jaxcap.data.base import CaptionDataset, SplitData, SplitSource, collate  # noqa: F401
from jaxcap.data.synthetic import load_synthetic, synthetic_splits  # noqa: F401
from jaxcap.data.vocab import Vocab, tokenize  # noqa: F401

NAMES = ("synthetic_scenes", "karpathy", "cocotalk", "multi30k")


def default_data_config(name: str = "synthetic_scenes"):
  """A data config (``ml_collections.ConfigDict``) with every field :func:`get_dataset` reads."""
  import ml_collections
  if name not in NAMES:
    raise ValueError(f"data.name {name!r}: unknown, expected one of {', '.join(NAMES)}")
  c = ml_collections.ConfigDict()
  c.name = name
  c.format = "raw"
  c.tfds_dir = ""
  c.root = ""
  c.dataset_json = ""
  c.att_dir = ""
  c.fc_dir = ""
  c.box_dir = ""
  c.label_h5 = ""
  c.grid = False
  c.use_restval = True
  c.max_len = 16
  c.min_word_count = 5
  c.max_regions = 36
  c.seq_per_img = 5
  c.num_attributes = 1000
  c.max_attributes = 20
  c.attributes = "oracle"
  c.test_attributes = ""
  c.attributes_file = ""
  c.task = "caption"
  c.feature_dim = 0
  c.src_max_len = 0
  c.src_min_word_count = 0
  c.src_lang = "en"
  c.tgt_lang = "de"
  c.features_npy = ""
  c.text_only = False
  c.test_split_file = "test_2016_flickr"
  # synthetic_scenes
  c.num_train = 10000
  c.num_val = 500
  c.num_test = 500
  c.seed = 0
  c.noise = 0.5
  c.attr_noise = 0.0
  if name == "synthetic_scenes":
    c.feature_dim = 128
    c.max_regions = 10
  elif name == "cocotalk":
    c.dataset_json = "cocotalk.json"
    c.label_h5 = "cocotalk_label.h5"
    c.min_word_count = 1  # cocotalk.json's vocabulary is already thresholded.
  elif name == "multi30k":
    c.task = "translate"
    c.max_len = 40  # Multi30k sentences run to ~40 words; captions' 16 would cut targets.
    c.seq_per_img = 1  # One target sentence per line.
    c.max_regions = 196
    c.grid = True
  return c


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
  """
  name = data_config.name
  if data_config.get("format", "raw") == "tfds":
    from jaxcap.data import tfds_builders
    return tfds_builders.load(data_config)
  if name == "synthetic_scenes":
    return load_synthetic(data_config)
  if name == "karpathy":
    from jaxcap.data import karpathy
    return karpathy.load(data_config)
  if name == "cocotalk":
    from jaxcap.data import cocotalk
    return cocotalk.load(data_config)
  if name == "multi30k":
    from jaxcap.data import multi30k
    return multi30k.load(data_config)
  raise ValueError(f"data.name {name!r}: unknown, expected one of {', '.join(NAMES)}")
