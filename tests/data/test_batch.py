"""jaxcap.data.batch: the one definition of a batch, and every batch maker following it."""

import jax
import numpy as np
import pytest

from jaxcap import config_common as common
from jaxcap import data as data_lib
from jaxcap.data import batch as batch_lib
from jaxcap.data import pipeline


def _dataset(task="caption"):
  d = common.data_config("synthetic")
  d.num_train, d.num_val, d.num_test = 16, 8, 8
  d.task = task
  return data_lib.get_dataset(d)


def _layout(batch):
  return {k: (tuple(np.shape(v)), np.dtype(v.dtype)) for k, v in batch.items()}


def test_collated_dummy_and_zero_batches_have_the_contract_s_keys_shapes_and_dtypes():
  for task in ("caption", "translate"):
    ds = _dataset(task)
    info, has_src = dict(ds.info), task == "translate"
    want = {k: (shape, np.dtype(dtype)) for k, (shape, dtype) in
            batch_lib.shapes(info, 4, ds.seq_per_img, has_src).items()}
    assert ("src" in want) == has_src and set(want) <= set(batch_lib.KEYS)
    got = next(iter(pipeline.eval_batches(ds.split("val"), 4, num_threads=0)))
    assert _layout(got) == want
    assert _layout(batch_lib.zeros(info, 4, ds.seq_per_img, has_src)) == want
    dummy = batch_lib.dummy(dict(info, seq_per_img=ds.seq_per_img), 4)
    assert _layout(dummy) == want and dummy["feats_mask"][:, 0].all() and dummy["valid"].all()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_random_batches_have_every_key_and_valid_boxes():
  batch = batch_lib.random(jax.random.PRNGKey(0), 2, 5, 9, 4, 50, 6, src_len=3)
  assert set(batch) == set(batch_lib.KEYS) - {"pixels"}  # a batch of features
  assert batch["feats"].shape == (2, 9, 4) and batch["captions"].shape == (2, 5, 6)
  assert batch["src"].shape == (2, 4) and int(batch["src"][0, -1]) == 2  # EOS
  boxes = batch["boxes"]
  assert (boxes[..., 2:] >= boxes[..., :2]).all()
  for j in (1, 5):  # every fourth box inside the one before it: all three spatial relations
    assert (boxes[:, j, :2] >= boxes[:, j - 1, :2]).all() and (boxes[:, j, 2:] <= boxes[:, j - 1, 2:]).all()
  batch_lib.check_boxes(np.asarray(boxes), "random")


def test_a_batch_of_pixels_has_pixels_instead_of_the_feature_keys():
  info = {"max_regions": 0, "feature_dim": 0, "global_dim": 0, "max_len": 5, "image_size": 16}
  batch = batch_lib.zeros(info, 3, 2)
  assert set(batch) == set(batch_lib.KEYS) - set(batch_lib.FEATURE_KEYS) - {"src"}
  assert batch["pixels"].shape == (3, 16, 16, 3) and batch["pixels"].dtype == np.uint8
  assert "feats" in batch_lib.zeros(dict(info, image_size=0, max_regions=2, feature_dim=4, global_dim=4), 3, 2)


def test_bucket_pads_at_most_an_eighth_and_compiles_eight_sizes_per_doubling():
  sizes = [batch_lib.bucket(n) for n in range(1, 4097)]
  assert sizes[:16] == list(range(1, 17))  # small counts exactly
  assert all(n <= s <= n * 1.125 for n, s in zip(range(1, 4097), sizes))
  assert all(a <= b for a, b in zip(sizes, sizes[1:]))  # monotone
  for k in range(4, 12):  # (2^k, 2^(k+1)]: eight sizes
    assert len({s for n, s in zip(range(1, 4097), sizes) if 2 ** k < n <= 2 ** (k + 1)}) == 8
  assert (batch_lib.bucket(36), batch_lib.bucket(50), batch_lib.bucket(100)) == (36, 52, 104)
  assert batch_lib.bucket(100, 100) == 100 and batch_lib.bucket(9, 8) == 8 and batch_lib.bucket(0) == 1
