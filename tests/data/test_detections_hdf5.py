"""``data.detections_hdf5``: the M² authors' ``coco_detections.hdf5`` layout (one dataset
``<image_id>_features`` [n, 2048] per image, beside ``_boxes`` / ``_cls_prob`` their loader does
not read) as the Karpathy reader's region source; with the imported run's data settings a batch
is what their ``ImageDetectionsField(max_detections=50)`` gives; bad files are one line naming
the file and the key."""

import h5py
import numpy as np
import pytest

from jaxcap import data
from jaxcap.data import pipeline
from jaxcap.papers.m2 import importer
from jaxcap.training import validation

from tests.data import fakes

DIM = 8
BIG_KEY = 100  # the first training image: given more regions than their loader keeps


def _write(tmp_path, edit=None):
  """Karpathy JSON + the detections file from the same arrays; returns ``(truth, config)``.
  ``edit(f, truth)`` may change the file before it is closed."""
  truth = fakes.write_karpathy(tmp_path, dim=DIM, regions=(2, 6))
  rng = np.random.default_rng(1)
  truth[BIG_KEY]["feat"] = rng.standard_normal((importer.MAX_DETECTIONS + 7, DIM)).astype(np.float32)
  path = tmp_path / "coco_detections.hdf5"
  with h5py.File(path, "w") as f:
    for key, t in truth.items():
      n = len(t["feat"])
      f.create_dataset(f"{key}_features", data=t["feat"])
      f.create_dataset(f"{key}_boxes", data=rng.uniform(0, 300, (n, 4)).astype(np.float32))
      f.create_dataset(f"{key}_cls_prob", data=rng.uniform(0, 1, (n, 5)).astype(np.float32))
    if edit is not None:
      edit(f, truth)
  config = fakes.karpathy_config(tmp_path, att_dir="", fc_dir="", box_dir="",
                                 detections_hdf5="coco_detections.hdf5", max_regions=80)
  return truth, config


def _their_field(feat, max_detections=importer.MAX_DETECTIONS):
  """Their ImageDetectionsField.preprocess (data/field.py) on one image's array."""
  delta = max_detections - feat.shape[0]
  if delta > 0:
    feat = np.concatenate([feat, np.zeros((delta, feat.shape[1]))], axis=0)
  elif delta < 0:
    feat = feat[:max_detections]
  return feat.astype(np.float32)


def _batch(ds, split):
  return next(pipeline.eval_batches(ds.split(split), 64, num_threads=0))


def test_the_real_regions_are_read_with_a_mask_and_no_boxes(tmp_path):
  truth, config = _write(tmp_path)
  ds = data.get_dataset(config)
  assert ds.info["feature_dim"] == DIM and ds.info["max_regions"] == 80
  assert ds.split_data("train").features.has_boxes is False
  b = _batch(ds, "train")
  for j, key in enumerate(ds.image_ids("train")):
    feat = truth[key]["feat"]
    n = len(feat)
    np.testing.assert_array_equal(b["feats"][j, :n], feat)
    assert b["feats_mask"][j].sum() == n and not b["feats"][j, n:].any()
    np.testing.assert_allclose(b["global_feat"][j], feat.mean(0), rtol=1e-6)
    # Their boxes are pixels without the image size: every region has the whole-image box.
    np.testing.assert_array_equal(b["boxes"][j, :n], np.tile([0, 0, 1, 1], (n, 1)))


def test_the_imported_runs_data_settings_give_their_loaders_batch(tmp_path):
  truth, config = _write(tmp_path)
  config.max_regions = 80
  importer.their_detections(config, config.detections_hdf5)
  ds = data.get_dataset(config)
  for split in ("train", "test"):
    b = _batch(ds, split)
    for j, key in enumerate(ds.image_ids(split)):
      np.testing.assert_array_equal(b["feats"][j], _their_field(truth[key]["feat"]))
  # The run-start check accepts the image with more regions than 50 (their [:50]).
  assert len(truth[BIG_KEY]["feat"]) > importer.MAX_DETECTIONS
  validation.check_data(ds, _run_config(config), splits=["train", "val", "test"], log=lambda *_: None)


def _run_config(data_config):
  import ml_collections
  return ml_collections.ConfigDict({"data": data_config, "test_split": "test"})


def _drop(key):
  def edit(f, truth):
    del f[f"{key}_features"]
  return edit


def _put(key, array):
  def edit(f, truth):
    del f[f"{key}_features"]
    f.create_dataset(f"{key}_features", data=array)
  return edit


@pytest.mark.parametrize("case", ["missing", "width", "nan", "one_dim"])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, case):
  key = 104  # a training image other than the first (the first is read to size the features)
  edit, match = {
      "missing": (_drop(key), rf"coco_detections.hdf5: no dataset '{key}_features' for image {key}"),
      "width": (_put(key, np.ones((3, DIM + 1), np.float32)),
                rf"coco_detections.hdf5:{key}_features: .*dimension {DIM + 1}, expected {DIM}"),
      "nan": (_put(key, np.full((3, DIM), np.nan, np.float32)),
              rf"coco_detections.hdf5:{key}_features: .*NaN"),
      "one_dim": (_put(key, np.ones((DIM,), np.float32)),
                  rf"coco_detections.hdf5:{key}_features: .*\[regions, "),
  }[case]
  _, config = _write(tmp_path, edit)
  ds = data.get_dataset(config)
  index = ds.image_ids("train").index(key)
  with pytest.raises(ValueError, match=match) as e:
    ds.split("train")[index]
  assert "\n" not in str(e.value)
  if case in ("missing", "width", "one_dim"):  # the headers say it before training
    with pytest.raises(ValueError, match=match.split(":")[0]):
      validation.check_data(ds, _run_config(config), splits=["train"], log=lambda *_: None)


def test_the_file_is_one_source_of_regions(tmp_path):
  _, config = _write(tmp_path)
  config.fc_dir = "fc"
  with pytest.raises(ValueError, match=r"^karpathy: fields 'detections_hdf5' and 'fc_dir' are both set"):
    data.get_dataset(config)
  config.fc_dir, config.detections_hdf5 = "", "nothing.hdf5"
  with pytest.raises(ValueError, match=r"nothing.hdf5: field 'detections_hdf5' is not a file"):
    data.get_dataset(config)
