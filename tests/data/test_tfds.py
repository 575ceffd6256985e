"""TFDS array_record builders: build -> grain read round trip, atomic failed builds."""

import os

import numpy as np
import pytest

from jaxcap import data
from jaxcap.data import pipeline, tfds_builders

from tests.data import fakes


def _same_batches(a, b, split, batch_size=4):
  xs = list(pipeline.eval_batches(a.split(split), batch_size))
  ys = list(pipeline.eval_batches(b.split(split), batch_size))
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def _tfds_config(c, path):
  t = c.copy_and_resolve_references()
  t.format, t.tfds_dir = "tfds", str(path)
  return t


def test_synthetic_round_trip(tmp_path):
  c = fakes.synthetic_config(task="translate")
  raw = data.get_dataset(c)
  out = tfds_builders.build(c, str(tmp_path))
  assert out == str(tmp_path / "jaxcap_synthetic_scenes" / "1.0.0")
  assert any(f.endswith("array_record-00000-of-00001") for f in os.listdir(out))
  built = data.get_dataset(_tfds_config(c, tmp_path))
  assert built.info == raw.info and built.vocab == raw.vocab and built.src_vocab == raw.src_vocab
  for split in ("train", "val", "test"):
    assert built.references(split) == raw.references(split)
    assert built.image_ids(split) == raw.image_ids(split)
    _same_batches(raw, built, split)
  # Training iterators agree too (same rows, same caption sampling).
  a = pipeline.make_train_iterator(raw.split("train"), 8, shard_index=0, shard_count=1)
  b = pipeline.make_train_iterator(built.split("train"), 8, shard_index=0, shard_count=1)
  for _ in range(6):
    x, y = next(a), next(b)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  # Plain TFDS readers see the same examples, in split order.
  import tensorflow_datasets as tfds
  src = tfds.builder_from_directory(out).as_data_source()["val"]
  assert len(src) == 8
  np.testing.assert_array_equal(src[5]["feats"], raw.split("val")[5]["feats"])


def test_karpathy_round_trip(tmp_path):
  fakes.write_karpathy(tmp_path / "raw")
  c = fakes.karpathy_config(tmp_path / "raw", max_regions=6)
  raw = data.get_dataset(c)
  tfds_builders.build(c, str(tmp_path / "tfds"))
  built = data.get_dataset(_tfds_config(c, tmp_path / "tfds"))
  assert built.image_ids("train") == raw.image_ids("train")  # int COCO ids survive
  for split in ("train", "test"):
    _same_batches(raw, built, split)


def test_failed_build_leaves_nothing(tmp_path):
  fakes.write_karpathy(tmp_path / "raw")
  c = fakes.karpathy_config(tmp_path / "raw")
  key = sorted(os.listdir(tmp_path / "raw" / "att"))[-1]
  feat = np.ones((3, 8), np.float32)
  feat[0, 0] = np.nan
  np.savez(tmp_path / "raw" / "att" / key, feat=feat)
  with pytest.raises(ValueError, match="contains NaN or Inf"):
    tfds_builders.build(c, str(tmp_path / "tfds"))
  assert os.listdir(tmp_path / "tfds") == []


def test_missing_build_dir(tmp_path):
  c = _tfds_config(fakes.synthetic_config(), tmp_path)
  with pytest.raises(ValueError, match="field 'tfds_dir' holds no built jaxcap TFDS dataset"):
    data.get_dataset(c)
