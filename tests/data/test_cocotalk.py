"""self-critical's cocotalk.json + cocotalk_label.h5 (written here with h5py)."""

import json
import os

import numpy as np
import pytest

from jaxcap import data
from jaxcap.errors import BadInput

from tests.data import fakes

h5py = pytest.importorskip("h5py")


def _write(root):
  return fakes.write_cocotalk(root, counts=(6, 2, 2))


def test_cocotalk_matches_karpathy_reader(tmp_path):
  truth = _write(tmp_path)
  c = data.default_data_config("cocotalk")
  c.root, c.att_dir, c.fc_dir, c.box_dir, c.max_regions = str(tmp_path), "att", "fc", "box", 5
  ds = data.get_dataset(c)
  assert [len(ds.split(s)) for s in ("train", "val", "test")] == [6, 2, 2]
  refs = ds.references("train")
  assert refs[101] == [" ".join(r[:16]) for r in truth[101]["refs"]]
  assert refs[100][0].split()[0] == "<unk>"
  kar = data.get_dataset(fakes.karpathy_config(tmp_path, max_regions=5))
  a, b = ds.split("val")[1], kar.split("val")[1]
  for k in ("feats", "boxes", "global_feat"):
    np.testing.assert_array_equal(a[k], b[k])


def test_missing_label_dataset(tmp_path):
  _write(tmp_path)
  with h5py.File(tmp_path / "cocotalk_label.h5", "a") as f:
    del f["label_end_ix"]
  c = data.default_data_config("cocotalk")
  c.root, c.fc_dir = str(tmp_path), "fc"
  with pytest.raises(ValueError, match=r"cocotalk_label\.h5: no dataset 'label_end_ix'"):
    data.get_dataset(c)


def _config_layout(root):
  """The fake cocotalk files with the feature dirs named as jaxcap/config_common.py's COCO layout."""
  return fakes.write_coco_layout(root, counts=(6, 2, 2), cocotalk=True)


def test_readme_cocotalk_config_reads_cocotalk_with_its_vocabulary(tmp_path):
  """The README's ``--config configs/transformer.py:cocotalk --config.data.root=...`` path."""
  from configs import transformer
  _config_layout(tmp_path)
  for arg in ("cocotalk", "cocotalk,size=small"):
    c = transformer.get_config(arg)
    assert (c.data.name, c.data.dataset_json, c.data.min_word_count) == (
        "cocotalk", "cocotalk.json", 1)
    c.data.root = str(tmp_path)
    ds = data.get_dataset(c.data)
    assert [len(ds.split(s)) for s in ("train", "val", "test")] == [6, 2, 2]
    ix_to_word = json.loads((tmp_path / "cocotalk.json").read_text())["ix_to_word"]
    train_words = {w for refs in ds.references("train").values() for r in refs for w in r.split()}
    # Every word of the training labels is in the vocabulary (threshold 1, as cocotalk's own),
    # and nothing outside cocotalk's ix_to_word ("UNK" is jaxcap's <unk>).
    assert train_words <= set(ds.vocab.itos)
    assert set(ds.vocab.itos[4:]) <= set(ix_to_word.values()) - {"UNK"}
    assert ds.split("train")[0]["feats"].shape[-1] == 8


def test_cocotalk_name_over_the_coco_config_says_what_to_use(tmp_path):
  from configs import transformer
  _config_layout(tmp_path)
  c = transformer.get_config("coco")
  c.data.root, c.data.name = str(tmp_path), "cocotalk"  # --config.data.name=cocotalk
  with pytest.raises(ValueError, match=r"dataset_coco\.json: a Karpathy dataset JSON.*:cocotalk"):
    data.get_dataset(c.data)


def _json_damage(key, value=None, image=None):
  def damage(root):
    path = root / "cocotalk.json"
    info = json.loads(path.read_text())
    if image is not None:
      info["images"][0][image] = value
    else:
      info[key] = value
    path.write_text(json.dumps(info))
  return damage


def _h5_damage(name, fn):
  def damage(root):
    with h5py.File(root / "cocotalk_label.h5", "a") as f:
      new = fn(f[name][()])
      del f[name]
      f[name] = new
  return damage


@pytest.mark.parametrize("damage, expected", [
    (_json_damage("ix_to_word", ["a", "b"]), r"cocotalk\.json: 'ix_to_word' a list and 'images' a list; expected"),
    (_json_damage("ix_to_word", {"one": "a"}), r"cocotalk\.json: ix_to_word entry 'one': 'a'; expected a word id"),
    (_json_damage("ix_to_word", {"1": 5}), r"cocotalk\.json: ix_to_word entry '1': 5; expected"),
    (_json_damage("images", {"0": {}}), r"cocotalk\.json: 'ix_to_word' a dict and 'images' a dict; expected"),
    (_json_damage(None, "101", image="id"), r"cocotalk\.json: images\[0\] has id '101'; expected an integer"),
    (_json_damage(None, None, image="id"), r"cocotalk\.json: images\[0\] has id None; expected an integer"),
    (_h5_damage("label_end_ix", lambda a: a + 1000), r"cocotalk_label\.h5: image 0's label_start_ix / label_end_ix"),
    (_h5_damage("label_start_ix", lambda a: a[::-1].copy()), r"cocotalk_label\.h5: image \d+'s label_start_ix"),
    (_h5_damage("label_end_ix", lambda a: a[:-1]), r"cocotalk_label\.h5: 10 images in label_start_ix and 9 in label_end_ix"),
    (_h5_damage("labels", lambda a: a.reshape(-1)), r"cocotalk_label\.h5: labels \[\d+\], label_start_ix \[10\]"),
])
def test_a_damaged_cocotalk_is_one_line_naming_the_file(tmp_path, damage, expected):
  """Each raised AttributeError, ValueError, KeyError or TypeError, or (the ranges) gave an image
  fewer captions without a word."""
  _write(tmp_path)
  damage(tmp_path)
  c = data.default_data_config("cocotalk")
  c.root, c.fc_dir = str(tmp_path), "fc"
  with pytest.raises(BadInput, match=expected):
    data.get_dataset(c)
