"""grain pipeline: sharding, exact resume, epochs, evaluation order, batch assembly."""

import json

import numpy as np
import pytest

from jaxcap import data
from jaxcap.data import base, pipeline
from jaxcap.data.vocab import EOS

from tests.data import fakes


@pytest.fixture(scope="module")
def ds():
  return data.get_dataset(fakes.synthetic_config(num_train=48))


def _take(it, k):
  return [next(it) for _ in range(k)]


def test_two_processes_disjoint_and_cover(ds):
  src = ds.split("train")
  per_epoch = 48 // 2 // 4
  seen = []
  for p in range(2):
    it = pipeline.make_train_iterator(src, 4, seed=3, shard_index=p, shard_count=2)
    batches = _take(it, per_epoch)
    seen.append(np.concatenate([b["image_index"] for b in batches]))
    assert all(b["valid"].all() for b in batches)
  assert len(set(seen[0]) & set(seen[1])) == 0
  assert sorted(np.concatenate(seen).tolist()) == list(range(48))


def test_uneven_split_gives_equal_shards(ds):
  src = ds.split("train")  # 48 images over 5 processes: 9 each, 3 left out this epoch.
  its = [pipeline.make_train_iterator(src, 3, shard_index=p, shard_count=5) for p in range(5)]
  assert {it.steps_per_epoch for it in its} == {3}
  rows = [np.concatenate([b["image_index"] for b in _take(it, 3)]) for it in its]
  flat = np.concatenate(rows)
  assert len(flat) == len(set(flat.tolist())) == 45


def test_save_restore_continues_with_exact_next_batch(ds):
  src = ds.split("train")
  it = pipeline.make_train_iterator(src, 5, seed=7, shard_index=0, shard_count=1)
  _take(it, 11)  # Crosses the epoch boundary (9 steps per epoch).
  state = json.loads(json.dumps(it.get_state()))
  assert state["epoch"] == 1 and state["position"] == 2 and state["seed"] == 7
  want = _take(it, 4)
  fresh = pipeline.make_train_iterator(src, 5, seed=0, shard_index=0, shard_count=1)
  fresh.set_state(state)
  got = _take(fresh, 4)
  for a, b in zip(want, got):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert fresh.get_state() == it.get_state()


def test_restore_rejects_changed_settings(ds):
  it = pipeline.make_train_iterator(ds.split("train"), 5, shard_index=0, shard_count=1)
  state = it.get_state()
  other = pipeline.make_train_iterator(ds.split("train"), 4, shard_index=0, shard_count=1)
  with pytest.raises(ValueError, match="field 'batch_size' is 5, expected 4"):
    other.set_state(state)


def test_epochs_reshuffle_and_seed_determines_order(ds):
  src = ds.split("train")
  def order(seed, epochs=2):
    it = pipeline.make_train_iterator(src, 8, seed=seed, shard_index=0, shard_count=1)
    rows = np.concatenate([b["image_index"] for b in _take(it, 6 * epochs)])
    return rows.reshape(epochs, 48)
  a, b, c = order(1), order(1), order(2)
  np.testing.assert_array_equal(a, b)
  assert sorted(a[0].tolist()) == sorted(a[1].tolist()) == list(range(48))
  assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[0], c[0])
  # The permutation is numpy's, so anyone can reproduce the order from the seed.
  np.testing.assert_array_equal(a[1], np.random.default_rng([1, 1]).permutation(48))


def test_no_drop_remainder_pads_last_batch(ds):
  it = pipeline.make_train_iterator(ds.split("train"), 10, drop_remainder=False,
                                    shard_index=0, shard_count=1)
  batches = _take(it, 5)
  assert [int(b["valid"].sum()) for b in batches] == [10, 10, 10, 10, 8]


def test_eval_batches_in_order_with_padding(ds):
  src = ds.split("val")  # 8 images
  batches = list(pipeline.eval_batches(src, 3))
  assert len(batches) == 3
  np.testing.assert_array_equal(np.concatenate([b["image_index"] for b in batches])[:8],
                                np.arange(8))
  assert batches[-1]["valid"].tolist() == [True, True, False]
  assert not batches[-1]["feats_mask"][2].any() and (batches[-1]["captions"][2] == 0).all()
  shards = [list(pipeline.eval_batches(src, 3, shard_index=p, shard_count=3)) for p in range(3)]
  assert {len(s) for s in shards} == {1}
  rows = sorted(int(i) for s in shards for b in s for i, v in zip(b["image_index"], b["valid"]) if v)
  assert rows == list(range(8))


def test_collate_against_numpy_reference():
  rng = np.random.default_rng(0)
  info = {"max_regions": 4, "feature_dim": 3, "global_dim": 2, "max_len": 5,
          "num_attributes": 6, "max_attributes": 3}
  examples = []
  for i, (n, r) in enumerate([(2, 1), (6, 5), (4, 7)]):
    caps = np.zeros((r, 6), np.int32)
    caps[:, 0] = 10 + np.arange(r)
    caps[:, 1] = EOS
    examples.append({"image_index": np.int32(i), "feats": rng.standard_normal((n, 3)).astype(np.float32),
                     "boxes": rng.uniform(size=(n, 4)).astype(np.float32),
                     "global_feat": rng.standard_normal(2).astype(np.float32),
                     "captions": caps, "attributes": np.arange(5, 5 + i * 2, dtype=np.int32),
                     "attr_labels": (rng.uniform(size=6) > 0.5).astype(np.float32)})
  b = base.collate(examples, np.random.default_rng(1), info=info, seq_per_img=5, batch_size=4)
  assert b["feats"].shape == (4, 4, 3) and b["captions"].shape == (4, 5, 6)
  for j, ex in enumerate(examples):
    n = min(len(ex["feats"]), 4)
    want = np.zeros((4, 3), np.float32)
    want[:n] = ex["feats"][:n]
    np.testing.assert_array_equal(b["feats"][j], want)
    np.testing.assert_array_equal(b["feats_mask"][j], np.arange(4) < n)
    firsts = b["captions"][j, :, 0] - 10
    r = len(ex["captions"])
    assert set(firsts.tolist()) <= set(range(r))
    if r <= 5:  # every reference is used, the rest sampled with replacement
      assert set(firsts.tolist()) == set(range(r))
    else:  # a subset without repeats
      assert len(set(firsts.tolist())) == 5
    att = np.zeros(3, np.int32)
    att[:min(3, len(ex["attributes"]))] = ex["attributes"][:3]
    np.testing.assert_array_equal(b["attributes"][j], att)
    np.testing.assert_array_equal(b["attr_labels"][j], ex["attr_labels"])
  assert b["valid"].tolist() == [True, True, True, False]
  assert (b["feats"][3] == 0).all() and (b["global_feat"][3] == 0).all()


def test_collate_without_rng_takes_the_references_in_order(ds):
  """``rng`` None (the README's snippet: a split's images as one batch to caption): no draw,
  the same batch on every call; R > S gives the first S references, R < S repeats them."""
  src = ds.split("test")
  examples = [src[i] for i in range(3)]
  a, b = src.collate(examples), src.collate(examples)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  assert a["valid"].all() and len(a["feats"]) == 3
  for j, ex in enumerate(examples):
    np.testing.assert_array_equal(a["feats"][j, :len(ex["feats"])], ex["feats"][:a["feats"].shape[1]])
  caps = np.zeros((7, 6), np.int32)
  caps[:, 0] = 10 + np.arange(7)
  info = {"max_regions": 2, "feature_dim": 3, "global_dim": 2, "max_len": 5,
          "num_attributes": 1, "max_attributes": 1}
  ex = {"image_index": np.int32(0), "feats": np.ones((2, 3), np.float32),
        "boxes": np.zeros((2, 4), np.float32), "global_feat": np.ones(2, np.float32),
        "attributes": np.zeros((0,), np.int32), "attr_labels": np.zeros(1, np.float32)}
  many = base.collate([dict(ex, captions=caps)], info=info, seq_per_img=5)
  few = base.collate([dict(ex, captions=caps[:2])], info=info, seq_per_img=5)
  assert many["captions"][0, :, 0].tolist() == [10, 11, 12, 13, 14]
  assert few["captions"][0, :, 0].tolist() == [10, 11, 10, 11, 10]


def test_threaded_and_inline_iterators_agree(ds):
  src = ds.split("train")
  a = _take(pipeline.make_train_iterator(src, 4, shard_index=0, shard_count=1), 3)
  b = _take(pipeline.make_train_iterator(src, 4, shard_index=0, shard_count=1, num_threads=0,
                                         prefetch=0), 3)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_auto_workers_from_the_host_cores(ds, monkeypatch):
  assert [pipeline.auto_workers(c) for c in (1, 2, 7, 8, 16, 64)] == [0, 0, 0, 4, 8, 16]
  # -1 reads as the host's choice: on a 2-core host, in this process, the same batches as 0.
  monkeypatch.setattr(pipeline, "auto_workers", lambda cores=None: 0)
  src = ds.split("train")
  a = _take(pipeline.make_train_iterator(src, 4, shard_index=0, shard_count=1, num_workers=-1), 2)
  b = _take(pipeline.make_train_iterator(src, 4, shard_index=0, shard_count=1, num_workers=0), 2)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
