"""synthetic_scenes wrapped as a CaptionDataset: every batch field, captioning and translation."""

import numpy as np
import pytest

from jaxcap import data
from jaxcap.data import pipeline
from jaxcap.data.synthetic import SyntheticScenes
from jaxcap.data.vocab import EOS, PAD

from tests.data import fakes

BATCH_KEYS = {"image_index", "valid", "feats", "feats_mask", "boxes", "global_feat", "captions",
              "attributes", "attr_labels"}


def _scenes(c):
  return SyntheticScenes(num_train=c.num_train, num_val=c.num_val, num_test=c.num_test,
                         seed=c.seed, feature_dim=c.feature_dim)


def test_caption_batches_have_every_field():
  c = fakes.synthetic_config()
  ds = data.get_dataset(c)
  scenes = _scenes(c)
  b = next(pipeline.make_train_iterator(ds.split("train"), 6, shard_index=0, shard_count=1))
  assert set(b) == BATCH_KEYS
  i = ds.info
  shapes = {"image_index": (6,), "valid": (6,), "feats": (6, 10, 16), "feats_mask": (6, 10),
            "boxes": (6, 10, 4), "global_feat": (6, i["global_dim"]), "captions": (6, 5, 17),
            "attributes": (6, 20), "attr_labels": (6, i["num_attributes"])}
  dtypes = {"image_index": np.int32, "valid": bool, "feats_mask": bool, "captions": np.int32,
            "attributes": np.int32}
  for k, shape in shapes.items():
    assert b[k].shape == shape, k
    assert b[k].dtype == dtypes.get(k, np.float32), k
  for j, row in enumerate(b["image_index"]):
    f = scenes.features("train", int(row))
    n = len(f["feats"])
    np.testing.assert_allclose(b["feats"][j, :n], f["feats"], rtol=1e-6)
    np.testing.assert_allclose(b["boxes"][j, :n], f["boxes"], rtol=1e-6)
    assert b["feats_mask"][j].sum() == n
    refs = {" ".join(r) for r in scenes.captions("train", int(row))}
    for s in range(5):  # min_word_count=1 and short sentences: decode is exact.
      assert ds.vocab.decode(b["captions"][j, s]) in refs
    attrs = [ds.vocab.itos[a] for a in b["attributes"][j] if a != PAD]
    assert attrs == scenes.attributes("train", int(row))[:20]
    words = {w for r in scenes.captions("train", int(row)) for w in r}
    want = np.array([w in words for w in ds.attribute_words], np.float32)
    np.testing.assert_array_equal(b["attr_labels"][j], want)
  assert ds.references("test")[scenes.image_id("test", 2)] == [
      " ".join(r) for r in scenes.captions("test", 2)]


def test_translate_task_gives_source_and_german_target():
  c = fakes.synthetic_config(task="translate", grid=True, max_regions=49)
  ds = data.get_dataset(c)
  scenes = _scenes(c)
  assert ds.src_vocab is not None and ds.info["src_vocab_size"] == len(ds.src_vocab)
  ex = ds.split("val")[1]
  assert ex["feats"].shape == (49, 16)  # the 7x7 grid as regions
  np.testing.assert_allclose(ex["feats"], scenes.features("val", 1)["grid"].reshape(49, 16),
                             rtol=1e-6)
  src = scenes.source_en("val", 1)
  want = [ds.src_vocab.stoi.get(w, 3) for w in src][:16] + [EOS]
  np.testing.assert_array_equal(ex["src"][:len(want)], want)
  assert ds.references("val")[scenes.image_id("val", 1)] == [
      " ".join(r) for r in scenes.captions_de("val", 1)]
  b = next(pipeline.eval_batches(ds.split("val"), 4))
  assert b["src"].shape == (4, 17) and set(b) == BATCH_KEYS | {"src"}


def test_noisy_attributes_and_none():
  c = fakes.synthetic_config(attributes="noisy", attr_noise=0.5)
  ds = data.get_dataset(c)
  scenes = SyntheticScenes(num_train=40, num_val=8, num_test=8, feature_dim=16, attr_noise=0.5)
  got = [[ds.vocab.itos[a] for a in ds.split("train")[i]["attributes"]] for i in range(40)]
  assert got == [scenes.attributes("train", i, noisy=True)[:20] for i in range(40)]
  assert got != [scenes.attributes("train", i)[:20] for i in range(40)]
  ds = data.get_dataset(fakes.synthetic_config(attributes="none"))
  assert len(ds.split("train")[0]["attributes"]) == 0


def test_noisy_attributes_need_synthetic(tmp_path):
  fakes.write_karpathy(tmp_path)
  with pytest.raises(ValueError, match="field 'attributes' is 'noisy'"):
    data.get_dataset(fakes.karpathy_config(tmp_path, attributes="noisy"))


def test_detected_attributes_file(tmp_path):
  import json
  truth = fakes.write_karpathy(tmp_path)
  table = {str(k): ["dog", "zebra", "ball"] for k in truth}
  (tmp_path / "attrs.json").write_text(json.dumps(table))
  ds = data.get_dataset(fakes.karpathy_config(tmp_path, attributes="detected",
                                              attributes_file=str(tmp_path / "attrs.json")))
  got = [ds.vocab.itos[a] for a in ds.split("val")[0]["attributes"]]
  assert got == ["dog", "ball"]  # unknown words are dropped, not UNK'd
  del table[str(ds.image_ids("test")[0])]
  (tmp_path / "attrs.json").write_text(json.dumps(table))
  with pytest.raises(ValueError, match=r"attrs\.json: no attributes for image"):
    data.get_dataset(fakes.karpathy_config(tmp_path, attributes="detected",
                                           attributes_file=str(tmp_path / "attrs.json")))


def test_train_references_ids():
  ds = data.get_dataset(fakes.synthetic_config())
  ids = ds.train_references_ids()
  assert len(ids) == 40 and len(ids[0]) == 5
  refs = list(ds.references("train").values())
  for r, row in zip(refs[0], ids[0]):
    assert ds.vocab.decode(row) == " ".join(r.split()[:16])


def test_test_split_may_read_other_attributes():
  """ETA^oracle: train/val on noisy attributes, test on the ground truth (data.test_attributes)."""
  c = fakes.synthetic_config(attributes="noisy", test_attributes="oracle", attr_noise=0.5)
  ds = data.get_dataset(c)
  scenes = SyntheticScenes(num_train=c.num_train, num_val=c.num_val, num_test=c.num_test,
                           seed=c.seed, feature_dim=c.feature_dim, attr_noise=0.5)
  assert (ds.attribute_mode("train"), ds.attribute_mode("val"), ds.attribute_mode("test")) == (
      "noisy", "noisy", "oracle")

  def words(split, i):
    return [ds.vocab.itos[a] for a in ds.split(split)[i]["attributes"]]

  changed = 0
  for i in range(scenes.num_images("train")):
    assert words("train", i) == [w for w in scenes.attributes("train", i, noisy=True)
                                 if w in ds.vocab.stoi][:20]
    changed += words("train", i) != scenes.attributes("train", i)[:20]
  assert changed > 0
  for i in range(scenes.num_images("test")):
    assert words("test", i) == scenes.attributes("test", i)[:20]
  with pytest.raises(ValueError, match="test_attributes"):
    data.get_dataset(fakes.synthetic_config(test_attributes="perfect"))
