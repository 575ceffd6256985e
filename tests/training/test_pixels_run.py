"""A run from pixels (config.backbone + data.images_dir): synthetic scenes rendered as PNGs, a tiny
ViT trained with a tiny Transformer; the backbone held still for backbone.freeze_steps, then
trained; the run loaded and evaluated as any run; bad settings refused in one line before
anything is written."""

import json
import os

import numpy as np
import pytest
import jax

from jaxcap import config_files
from jaxcap.errors import BadInput
from jaxcap.data import render
from jaxcap.data.synthetic import SyntheticScenes
from jaxcap.training import train_lib
from tests.training.test_train import set_fields

TINY_VIT = '{"image_size": 32, "patch": 8, "dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64}'


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("scenes"))
  render.write_dataset(out, SyntheticScenes(num_train=48, num_val=8, num_test=8, seed=0), 32,
                       log=lambda *_: None)
  return out


def pixels_config(scenes: str, **overrides):
  c = config_files.load("transformer.py:synthetic,tiny")
  c.data.name = "karpathy"
  c.data.dataset_json = os.path.join(scenes, render.KARPATHY_FILE)
  c.data.images_dir = os.path.join(scenes, render.IMAGES_DIR)
  c.data.image_size = 32
  c.backbone.name = "vit_b16"
  c.backbone.fields = TINY_VIT
  c.update(num_train_steps=6, batch_size=8, eval_every_steps=1000, checkpoint_every_steps=1,
           keep_checkpoints=10, async_checkpoints=False, test_after_training=False)
  return set_fields(c, overrides)


def _backbone_params(workdir, step):
  import orbax.checkpoint as ocp
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  tree = ocp.PyTreeCheckpointer().restore(path)
  return tree["params"]["params"]["backbone"]


@pytest.mark.slow
def test_the_backbone_is_held_still_then_trained_and_the_run_evaluates(scenes, tmp_path):
  workdir = str(tmp_path / "run")
  config = pixels_config(scenes, **{"backbone.freeze_steps": 3, "test_after_training": True})
  scores = train_lib.train_and_evaluate(config, workdir)
  assert 0.0 <= scores["overall"]["CIDEr"] and len(scores["per_image"]) == 8
  steps = {s: _backbone_params(workdir, s) for s in (1, 3, 4, 6)}
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert same(steps[1], steps[3])  # frozen through step 3
  assert not same(steps[3], steps[4]) and not same(steps[4], steps[6])  # trained from step 4
  info = json.load(open(os.path.join(workdir, "info.json")))
  assert info["image_size"] == 32 and info["feature_dim"] == 32 and info["max_regions"] == 16
  # Loaded as any run: its backbone is the trained one, its captions those of the test.
  import jaxcap
  run = jaxcap.load(workdir)
  preds = run.predict("test")
  written = json.load(open(os.path.join(workdir, "predictions_test.json")))
  got = {str(k): v for k, v in preds.items()}
  assert [got[str(p["image_id"])] for p in written] == [p["caption"] for p in written]
  # Its trained backbone captions the test image files as the run's own test did.
  test = run.dataset.split_data("test")
  assert run.caption_images(list(test.features.paths)) == [got[str(i)] for i in test.image_ids]


@pytest.mark.parametrize("overrides,needle", [
    ({"backbone.name": ""}, "config field backbone.name: the data is image files"),
    ({"data.image_size": 48}, "config field data.image_size: vit_b16 takes 32 x 32 images"),
    ({"data.image_size": 0}, "config field data.image_size: expected the side in pixels"),
    ({"backbone.fields": "{\"depth\": "}, "config field backbone: --fields="),
    ({"data.fc_dir": "fc"}, "fields 'images_dir' and 'fc_dir' are both set"),
    ({"backbone.weights": "/nonexistent/vit.safetensors"}, "/nonexistent/vit.safetensors: config field backbone.weights"),
    ({"mesh.model": 2}, "config field mesh.model: expected 1"),
    ({"sharding": "zero"}, "config field sharding: expected one of"),
])
def test_bad_settings_are_one_line_before_anything_is_written(scenes, tmp_path, overrides, needle):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("{", r"\{")):
    train_lib.train_and_evaluate(pixels_config(scenes, **overrides), str(workdir))
  assert not workdir.exists() or not any(workdir.iterdir())


def test_a_missing_image_file_is_named(scenes, tmp_path):
  data = json.load(open(os.path.join(scenes, render.KARPATHY_FILE)))
  first_train = next(i for i, e in enumerate(data["images"]) if e["split"] == "train")
  data["images"][first_train]["filename"] = "missing.png"
  path = tmp_path / "dataset.json"
  path.write_text(json.dumps(data))
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"images/missing.png: no such image file \(data.images_dir\)"):
    train_lib.train_and_evaluate(pixels_config(scenes, **{"data.dataset_json": str(path)}), str(workdir))
  assert not workdir.exists() or not any(workdir.iterdir())


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_truncated_image_is_refused_before_the_first_step(scenes, tmp_path, split):
  """A PNG whose header reads but whose pixels stop short (a copy interrupted): the check
  before training read headers only, so the run wrote its folder and stopped at the step that
  first drew the image. Now every image of the splits in use is decoded first (on threads)."""
  import shutil
  images = tmp_path / "images"
  shutil.copytree(os.path.join(scenes, render.IMAGES_DIR), images)
  data = json.load(open(os.path.join(scenes, render.KARPATHY_FILE)))
  entry = [e for e in data["images"] if e["split"] == split][-1]
  png = images / entry.get("filepath", "") / entry["filename"]
  png.write_bytes(png.read_bytes()[: png.stat().st_size * 2 // 3])
  from PIL import Image
  with Image.open(png) as img:
    assert img.size == (32, 32)  # the header still reads
  workdir = tmp_path / "run"
  with pytest.raises(BadInput, match=rf"{png}: .*; expected an image file"):
    train_lib.train_and_evaluate(pixels_config(scenes, **{"data.images_dir": str(images),
                                                          "test_after_training": split == "test"}),
                                 str(workdir))
  assert not workdir.exists() or not any(workdir.iterdir())


def test_features_data_with_a_backbone_is_refused(tmp_path):
  c = config_files.load("transformer.py:synthetic,tiny")
  c.backbone.name = "vit_b16"
  with pytest.raises(ValueError, match="config field data.images_dir: backbone.name='vit_b16' reads image files"):
    train_lib.train_and_evaluate(c, str(tmp_path / "run"))


def test_the_data_check_names_image_files_not_feature_headers(scenes):
  """A run from pixels checks image files; its line says so (not "feature headers and boxes")."""
  from jaxcap import data as data_lib
  from jaxcap.training import validation
  config = pixels_config(scenes)
  logs = []
  out = validation.check_data(data_lib.get_dataset(config.data), config, splits=["train", "val"],
                              log=logs.append)
  assert out["images"] == 48 + 8
  assert len(logs) == 1 and logs[0].startswith("Checked the image files of 56 images (train, val;"), logs
