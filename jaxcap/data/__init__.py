"""jaxcap input data: datasets (docs/DESIGN.md, section 2) and the grain pipeline.

``get_dataset(data_config)`` picks a reader by ``data_config.name``; every reader returns a
:class:`jaxcap.data.base.CaptionDataset`, so batches look the same whatever the layout.
"""

from __future__ import annotations

from jaxcap.data.base import CaptionDataset, SplitData, SplitSource, collate  # noqa: F401
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


class _SyntheticFeatures:
  """Feature reader over ``SyntheticScenes.features`` (regions, or the grid as regions)."""

  has_boxes = True
  has_image = True

  def __init__(self, scenes, split: str, grid: bool):
    self.scenes, self.split, self.grid = scenes, split, grid

  def __len__(self) -> int:
    return self.scenes.num_images(self.split)

  def name(self, i: int) -> str:
    return f"synthetic_scenes {self.split}[{i}]"

  def read(self, i: int) -> dict:
    from jaxcap.data import base
    f = self.scenes.features(self.split, i)
    if self.grid:
      feats = base.grid_to_regions(f["grid"], self.name(i))
      boxes = base.grid_boxes(f["grid"].shape[0])
    else:
      feats, boxes = f["feats"], f["boxes"]
    return {"feats": feats, "boxes": boxes, "global_feat": f["global_feat"]}


def synthetic_splits(data_config) -> dict[str, SplitData]:
  """The synthetic scenes as ``{split: SplitData}`` (captioning or En -> De translation)."""
  from jaxcap.data.synthetic import SyntheticScenes
  kwargs = dict(num_train=data_config.num_train, num_val=data_config.num_val,
                num_test=data_config.num_test, seed=data_config.seed,
                feature_dim=data_config.feature_dim)
  for key in ("noise", "attr_noise", "grid_size", "global_dim", "num_refs", "material_signal",
              "p_omit_colour"):
    if key in data_config:
      kwargs[key] = data_config[key]
  scenes = SyntheticScenes(**kwargs)
  translate = data_config.get("task", "caption") == "translate"
  grid = bool(data_config.get("grid", False))
  out = {}
  for split in scenes.splits:
    n = scenes.num_images(split)
    ids = [scenes.image_id(split, i) for i in range(n)]
    if translate:
      refs = [scenes.captions_de(split, i) for i in range(n)]
      src = [scenes.source_en(split, i) for i in range(n)]
      oracle = noisy = None
    else:
      refs = [scenes.captions(split, i) for i in range(n)]
      src = None
      mode = data_config.get("attributes", "oracle")
      if split == "test":
        mode = data_config.get("test_attributes", "") or mode
      oracle = [scenes.attributes(split, i) for i in range(n)] if mode == "oracle" else None
      noisy = ([scenes.attributes(split, i, noisy=True) for i in range(n)]
               if mode == "noisy" else None)
    out[split] = SplitData(image_ids=ids, refs=refs, features=_SyntheticFeatures(scenes, split, grid),
                           src=src, attributes=noisy, oracle_attributes=oracle)
  return out


def load_synthetic(data_config) -> CaptionDataset:
  return CaptionDataset(synthetic_splits(data_config), data_config, name="synthetic_scenes",
                        feature_dim=data_config.feature_dim or None)
