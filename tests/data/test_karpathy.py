"""Karpathy JSON + self-critical feature dirs: real Flickr8k, written layouts, bad input."""

import json
import os

import numpy as np
import pytest

from jaxcap import data
from jaxcap.data import pipeline
from jaxcap.data.vocab import EOS, PAD, UNK

from tests.data import fakes


def _batch(ds, split, n=64):
  return next(pipeline.eval_batches(ds.split(split), n, num_threads=0))


def test_flickr8k_real(shared_data):
  root = shared_data / "flickr8k_xception"
  c = data.default_data_config("karpathy")
  c.root, c.dataset_json, c.fc_dir = str(root), "dataset_flickr8k.json", "fc"
  ds = data.get_dataset(c)
  assert [len(ds.split(s)) for s in ("train", "val", "test")] == [700, 100, 200]
  assert ds.info["feature_dim"] == ds.info["global_dim"] == 1000
  assert ds.info["max_regions"] == 1  # fc only: the global feature is the single region.
  with open(root / "dataset_flickr8k.json") as f:
    entries = {os.path.splitext(e["filename"])[0]: e for e in json.load(f)["images"]}
  refs = ds.references("test")
  assert len(refs) == 200
  for iid, caps in refs.items():
    assert len(caps) == 5
    assert caps == [" ".join(s["tokens"]) for s in entries[iid]["sentences"]]
  ex = ds.split("val")[3]
  iid = ds.image_ids("val")[3]
  fc = np.load(root / "fc" / f"{iid}.npy")
  assert ex["feats"].shape == (1, 1000) and ex["captions"].shape == (5, 17)
  np.testing.assert_array_equal(ex["global_feat"], fc)
  # Vocabulary threshold re-derived with a plain count.
  counts = {}
  for e in entries.values():
    if e["split"] == "train":
      for s in e["sentences"]:
        for t in s["tokens"]:
          counts[t] = counts.get(t, 0) + 1
  assert set(ds.vocab.itos[4:]) == {w for w, n in counts.items() if n >= 5}


def test_written_layout_matches_files(tmp_path):
  truth = fakes.write_karpathy(tmp_path, regions=(2, 6))
  ds = data.get_dataset(fakes.karpathy_config(tmp_path, max_regions=4))
  assert ds.info["feature_dim"] == 8 and ds.info["global_dim"] == 6
  b = _batch(ds, "train")
  ids = ds.image_ids("train")
  assert b["valid"].sum() == len(ids) == 12
  for j, key in enumerate(ids):
    t = truth[key]
    n = min(len(t["feat"]), 4)  # Regions beyond max_regions are dropped.
    np.testing.assert_array_equal(b["feats"][j, :n], t["feat"][:n])
    assert (b["feats"][j, n:] == 0).all()
    np.testing.assert_array_equal(b["feats_mask"][j], np.arange(4) < n)
    want = np.clip(t["box"] / np.array([t["w"], t["h"], t["w"], t["h"]]), 0, 1)
    np.testing.assert_allclose(b["boxes"][j, :n], want[:n], rtol=1e-6)
    np.testing.assert_array_equal(b["global_feat"][j], t["fc"])
    for s, ref in enumerate(t["refs"]):
      ids_ = [ds.vocab.stoi.get(w, UNK) for w in ref][:16] + [EOS]
      row = b["captions"][j, s]
      np.testing.assert_array_equal(row[:len(ids_)], ids_)
      assert (row[len(ids_):] == PAD).all()
  assert ds.references("val") == {k: [" ".join(r) for r in truth[k]["refs"]]
                                  for k in ds.image_ids("val")}


def test_boxes_without_image_size_use_box_extent(tmp_path):
  truth = fakes.write_karpathy(tmp_path, sizes=False, coco=False)
  ds = data.get_dataset(fakes.karpathy_config(tmp_path, max_regions=6))
  ex = ds.split("test")[1]
  box = truth[ds.image_ids("test")[1]]["box"]
  w, h = box[:, 2].max(), box[:, 3].max()
  np.testing.assert_allclose(ex["boxes"], box / np.array([w, h, w, h]), rtol=1e-6)
  assert ds.image_ids("test")[1].startswith("img_")  # Flickr ids: file-name stems.


@pytest.mark.parametrize("shape", [(14, 14, 3), (196, 3)])
def test_grid_features_become_regions(tmp_path, shape):
  fakes.write_karpathy(tmp_path, counts=(3, 1, 1))
  rng = np.random.default_rng(1)
  grids = {}
  for name in os.listdir(tmp_path / "att"):
    os.remove(tmp_path / "att" / name)
    g = rng.standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "att" / name.replace(".npz", ".npy"), g)
    grids[name.split(".")[0]] = g
  ds = data.get_dataset(fakes.karpathy_config(tmp_path, grid=True, box_dir="", max_regions=196))
  assert ds.info["grid"]
  key = ds.image_ids("train")[2]
  ex = ds.split("train")[2]
  np.testing.assert_array_equal(ex["feats"], grids[str(key)].reshape(196, 3))
  # Cell k = (row r, col c) of a 14x14 grid spans [c/14, (c+1)/14] x [r/14, (r+1)/14].
  for k in (0, 1, 14, 195):
    r, c = divmod(k, 14)
    np.testing.assert_allclose(ex["boxes"][k], [c / 14, r / 14, (c + 1) / 14, (r + 1) / 14],
                               rtol=1e-6)


def test_restval_joins_train(tmp_path):
  fakes.write_karpathy(tmp_path)
  path = tmp_path / "dataset_coco.json"
  d = json.loads(path.read_text())
  d["images"][-1]["split"] = "restval"
  path.write_text(json.dumps(d))
  assert len(data.get_dataset(fakes.karpathy_config(tmp_path)).split("train")) == 13
  assert len(data.get_dataset(fakes.karpathy_config(tmp_path, use_restval=False)).split("train")) == 12


# --- bad input ---------------------------------------------------------------------------

def _first_test_key(tmp_path):
  d = json.loads((tmp_path / "dataset_coco.json").read_text())
  return [e["cocoid"] for e in d["images"] if e["split"] == "test"][0]


def _bad(tmp_path, match, **overrides):
  ds = data.get_dataset(fakes.karpathy_config(tmp_path, **overrides))
  with pytest.raises(ValueError, match=match) as e:
    ds.split("test")[0]
  assert "\n" not in str(e.value)


def test_missing_feature_file(tmp_path):
  fakes.write_karpathy(tmp_path)
  os.remove(tmp_path / "att" / f"{_first_test_key(tmp_path)}.npz")
  _bad(tmp_path, r"att/\d+\.npz: feature file is missing")


def test_unreadable_feature_file(tmp_path):
  fakes.write_karpathy(tmp_path)
  (tmp_path / "att" / f"{_first_test_key(tmp_path)}.npz").write_bytes(b"not a zip file at all")
  _bad(tmp_path, r"att/\d+\.npz: unreadable feature file")


def test_npz_without_feat_key(tmp_path):
  fakes.write_karpathy(tmp_path)
  np.savez(tmp_path / "att" / f"{_first_test_key(tmp_path)}.npz", x=np.zeros((2, 8)))
  _bad(tmp_path, r"\.npz: no key 'feat'")


def test_wrong_feature_dimension(tmp_path):
  fakes.write_karpathy(tmp_path)
  np.savez(tmp_path / "att" / f"{_first_test_key(tmp_path)}.npz", feat=np.zeros((3, 7), np.float32))
  _bad(tmp_path, r"\.npz: field 'feat' has feature dimension 7, expected 8")


def test_configured_feature_dimension_checked(tmp_path):
  fakes.write_karpathy(tmp_path)
  with pytest.raises(ValueError, match="feature dimension 8, expected 9"):
    data.get_dataset(fakes.karpathy_config(tmp_path, feature_dim=9))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_features(tmp_path, value):
  fakes.write_karpathy(tmp_path)
  feat = np.ones((3, 8), np.float32)
  feat[1, 2] = value
  np.savez(tmp_path / "att" / f"{_first_test_key(tmp_path)}.npz", feat=feat)
  _bad(tmp_path, r"\.npz: field 'feat' contains NaN or Inf")


def test_zero_regions(tmp_path):
  fakes.write_karpathy(tmp_path)
  np.savez(tmp_path / "att" / f"{_first_test_key(tmp_path)}.npz", feat=np.zeros((0, 8), np.float32))
  _bad(tmp_path, r"\.npz: field 'feat' has zero regions")


def test_empty_caption(tmp_path):
  fakes.write_karpathy(tmp_path)
  path = tmp_path / "dataset_coco.json"
  d = json.loads(path.read_text())
  d["images"][2]["sentences"][1]["tokens"] = []
  path.write_text(json.dumps(d))
  with pytest.raises(ValueError, match=r"split 'train' \(image 102\): caption 1 is empty"):
    data.get_dataset(fakes.karpathy_config(tmp_path))


def test_unknown_split(tmp_path):
  fakes.write_karpathy(tmp_path)
  ds = data.get_dataset(fakes.karpathy_config(tmp_path))
  for call in (ds.split, ds.references, ds.image_ids):
    with pytest.raises(ValueError, match=r"split 'valid': unknown, expected one of train, val, test"):
      call("valid")


def test_bad_json(tmp_path):
  (tmp_path / "dataset_coco.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"dataset_coco\.json: not a Karpathy dataset JSON"):
    data.get_dataset(fakes.karpathy_config(tmp_path))
