"""jaxcap.training.validation: the checks before the first step (headers, sample mode, timing)."""

import numpy as np
import pytest

from jaxcap import config_common as common
from jaxcap import data as data_lib
from jaxcap.training import validation
from tests.data import fakes


def _config(root, **data):
  c = common.base_config("synthetic")
  c.data = fakes.karpathy_config(root, max_regions=5, **data)
  c.test_after_training = True
  return c


def _key(root, split, k):
  import json
  images = json.loads((root / "dataset_coco.json").read_text())["images"]
  return [e["cocoid"] for e in images if e["split"] == split][k]


def test_all_sample_and_off(tmp_path):
  fakes.write_karpathy(tmp_path, counts=(40, 4, 4), dim=8, regions=(2, 5))
  # A wrong-size feature file at a training index the 5-image sample does not read.
  bad = _key(tmp_path, "train", 3)
  np.savez(tmp_path / "att" / f"{bad}.npz", feat=np.zeros((3, 9), np.float32))
  logs = []
  config = _config(tmp_path, validate_sample=5)
  dataset = data_lib.get_dataset(config.data)
  with pytest.raises(ValueError, match=rf"att/{bad}\.npz: features have dimension 9, expected 8"):
    validation.check_data(dataset, config, log=logs.append)
  config.data.validate_features = "sample"
  out = validation.check_data(dataset, config, log=logs.append)
  assert out["images"] == 5 + 4 + 4
  assert len(logs) == 1 and logs[0].startswith("Checked the feature headers and boxes of 13 images")
  assert logs[0].endswith(" s.") and "validate_features=sample" in logs[0]
  config.data.validate_features = "off"
  assert validation.check_data(dataset, config, log=logs.append)["images"] == 0


def test_headers_are_read_without_loading_the_arrays(tmp_path, monkeypatch):
  fakes.write_karpathy(tmp_path, counts=(8, 2, 2), dim=8, regions=(2, 5))
  config = _config(tmp_path, box_dir="")  # boxes are small and are read; features must not be
  dataset = data_lib.get_dataset(config.data)  # (probes the first training image: a read)

  def no_load(*a, **k):
    raise AssertionError(f"an array was loaded: {a}")

  from jaxcap.data import karpathy
  monkeypatch.setattr(np, "load", no_load)
  monkeypatch.setattr(karpathy, "load_array", no_load)
  assert validation.check_data(dataset, config, log=lambda s: None)["images"] == 12


@pytest.mark.parametrize("box,allowed", [([5, 5, 5, 9], "allow"), ([5, 5, 9, 9], "error")])
def test_zero_area_rule(tmp_path, box, allowed):
  fakes.write_karpathy(tmp_path, counts=(8, 2, 2), dim=8, regions=(2, 5))
  key = _key(tmp_path, "val", 0)
  boxes = np.load(tmp_path / "box" / f"{key}.npy")
  boxes[0] = box
  np.save(tmp_path / "box" / f"{key}.npy", boxes)
  config = _config(tmp_path, degenerate_boxes=allowed)
  dataset = data_lib.get_dataset(config.data)
  validation.check_data(dataset, config, log=lambda s: None)
  dataset.split("val")[0]  # the read-time check agrees
  config.data.degenerate_boxes = "error"
  if box[0] == box[2]:
    with pytest.raises(ValueError, match="zero-area"):
      validation.check_data(dataset, config, log=lambda s: None)
