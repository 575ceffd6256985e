"""The noisy-OR attribute detector: the equation, masking, metrics, files, and a short training
run on synthetic_scenes that must beat the frequency prior.

Dimension legend: B images, N regions, F feature width, K attribute words, I images.
"""

import json
import os

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from jaxcap.data import attributes
from jaxcap.papers.eta import attributes as ad


def np_noisy_or(region_logits_BxNxK, mask_BxN):
  """P(w | image) = 1 - prod_i (1 - p_i(w)) over the real regions, directly."""
  p = 1.0 / (1.0 + np.exp(-np.asarray(region_logits_BxNxK, np.float64)))
  out = np.zeros(p.shape[::2])
  for b in range(p.shape[0]):
    prod = np.ones(p.shape[2])
    for i in range(p.shape[1]):
      if mask_BxN[b, i]:
        prod *= 1.0 - p[b, i]
    out[b] = 1.0 - prod
  return out


def test_noisy_or_matches_numpy_with_padding_masked():
  rng = np.random.default_rng(0)
  z = rng.normal(scale=2.0, size=(3, 5, 7)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
  log_p, log_not = ad.noisy_or(jnp.asarray(z), jnp.asarray(mask))
  ref = np_noisy_or(z, mask)
  np.testing.assert_allclose(np.exp(log_p), ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.exp(log_not), 1 - ref, rtol=1e-5, atol=1e-6)
  # A single region is just its own probability.
  np.testing.assert_allclose(np.exp(log_p)[2], 1 / (1 + np.exp(-z[2, 0].astype(np.float64))),
                             rtol=1e-5)


def test_noisy_or_loss_is_the_binary_cross_entropy():
  rng = np.random.default_rng(1)
  z = rng.normal(size=(4, 3, 6)).astype(np.float32)
  mask = np.ones((4, 3), bool)
  mask[1, 2] = False
  y = (rng.random((4, 6)) < 0.4).astype(np.float32)
  valid = np.array([True, True, True, False])
  p = np_noisy_or(z, mask)
  bce = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(-1)
  got = ad.noisy_or_loss(jnp.asarray(z), jnp.asarray(mask), jnp.asarray(y), jnp.asarray(valid))
  np.testing.assert_allclose(float(got), bce[:3].mean(), rtol=1e-5)


def test_noisy_or_stays_finite_at_extreme_logits():
  z = jnp.array([[[-80.0, 80.0, 0.0]], [[-200.0, 30.0, -30.0]]])
  mask = jnp.ones((2, 1), bool)
  y = jnp.ones((2, 3))
  log_p, log_not = ad.noisy_or(z, mask)
  assert np.isfinite(np.asarray(log_p)).all() and np.isfinite(np.asarray(log_not)).all()
  grads = jax.grad(lambda z: ad.noisy_or_loss(z, mask, y))(z)
  assert np.isfinite(np.asarray(grads)).all()


def test_detector_module_ignores_padding_regions():
  rng = np.random.default_rng(2)
  feats = rng.normal(size=(2, 4, 5)).astype(np.float32)
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)
  model = ad.NoisyOrDetector(num_attributes=6, hidden=8)
  params = model.init(jax.random.PRNGKey(0), feats, mask)
  out = model.apply(params, feats, mask)
  np.testing.assert_allclose(out["prob"], np_noisy_or(out["region_logits"], mask), rtol=1e-5,
                             atol=1e-6)
  garbage = np.where(mask[..., None], feats, 1e3).astype(np.float32)
  np.testing.assert_allclose(model.apply(params, garbage, mask)["prob"], out["prob"], rtol=1e-6)


def np_ap_bruteforce(scores, labels):
  """AP from its definition: for each positive, precision among items ranked at or above it."""
  order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
  rank = {i: r for r, i in enumerate(order)}
  pos = [i for i in range(len(scores)) if labels[i]]
  precisions = []
  for i in pos:
    above = [j for j in range(len(scores)) if rank[j] <= rank[i]]
    precisions.append(sum(labels[j] for j in above) / len(above))
  return sum(precisions) / len(pos)


def test_metrics_match_their_definitions():
  rng = np.random.default_rng(3)
  scores = rng.random((30, 8))
  labels = rng.random((30, 8)) < 0.3
  labels[:, 5] = False  # a word with no positive is left out of the mean
  m = ad.detection_metrics(scores, labels, ks=(1, 3))
  aps = [np_ap_bruteforce(list(scores[:, j]), list(labels[:, j])) for j in range(8) if j != 5]
  assert m["mAP"] == pytest.approx(np.mean(aps), rel=1e-9)
  for k in (1, 3):
    hits = [sum(labels[i, j] for j in sorted(range(8), key=lambda j: -scores[i, j])[:k]) / k
            for i in range(30)]
    assert m[f"precision@{k}"] == pytest.approx(np.mean(hits), rel=1e-9)
  perfect = ad.detection_metrics(labels.astype(float), labels, ks=(1,))
  assert perfect["mAP"] == pytest.approx(1.0)


def test_top_attributes_and_atomic_file_round_trip(tmp_path):
  probs = np.array([[0.1, 0.9, 0.5], [0.8, 0.05, 0.2]])
  words = ["red", "ball", "dog"]
  top = ad.top_attributes(probs, words, top_k=2, min_prob=0.15)
  assert top == [["ball", "dog"], ["red", "dog"]]
  path = str(tmp_path / "sub" / "attributes.json")
  attributes.write_file(path, {7: top[0], "x": top[1]})
  assert attributes.read_file(path) == {"7": ["ball", "dog"], "x": ["red", "dog"]}
  assert os.listdir(tmp_path / "sub") == ["attributes.json"]
  bad = tmp_path / "bad.json"
  bad.write_text("[1, 2]")
  with pytest.raises(ValueError, match="bad.json"):
    attributes.read_file(str(bad))
  with pytest.raises(ValueError, match="attribute words"):
    ad.top_attributes(probs, words[:2], top_k=1)


def _synthetic_config(tmp_path, attributes="none", path=""):
  from jaxcap import config_common as common
  c = common.data_config("synthetic")
  c.num_train, c.num_val, c.num_test = 1500, 200, 20
  c.attributes = attributes
  c.attributes_file = path
  return c


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_detector_beats_the_frequency_prior_and_feeds_the_pipeline(tmp_path):
  """Trains on synthetic_scenes (a few seconds); precision@10 must clear the prior by 0.1."""
  from jaxcap import data as data_lib
  dataset = data_lib.get_dataset(_synthetic_config(tmp_path))
  cfg = {"hidden": 64, "num_steps": 300, "batch_size": 100, "learning_rate": 3e-3,
         "top_k": 8, "min_prob": 0.3, "ks": (5, 10)}
  result = ad.run(dataset, cfg, str(tmp_path / "out"), log=lambda s: None)
  det, prior = result["val"], result["val_prior"]
  print(f"detector {det}\nprior {prior}")  # shown with pytest -s
  assert det["precision@10"] > prior["precision@10"] + 0.1
  assert det["mAP"] > prior["mAP"] + 0.1
  table = attributes.read_file(result["path"])
  ids = [str(i) for s in ("train", "val", "test") for i in dataset.image_ids(s)]
  assert sorted(table) == sorted(ids)
  assert all(set(ws) <= set(dataset.attribute_words) and len(ws) <= 8 for ws in table.values())
  # The data pipeline reads the file back as the images' attributes.
  detected = data_lib.get_dataset(_synthetic_config(tmp_path, "detected", result["path"]))
  src = detected.split("val")
  iid = detected.image_ids("val")[3]
  words = [detected.vocab.itos[i] for i in src[3]["attributes"]]
  assert words == table[str(iid)][:detected.max_attributes]


def test_the_flickr8k_table_reads_its_own_detected_attributes(tmp_path):
  """experiments/flickr8k/table.py through this paper's flickr8k_config: ETA's row reads the
  attributes its detector writes under the table's workdir (not the test references)."""
  import importlib.util
  path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "experiments", "flickr8k",
                      "table.py")
  spec = importlib.util.spec_from_file_location("_flickr8k_table", path)
  table = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(table)
  assert "eta" in table.MODELS
  eta = table.base_config("eta", str(tmp_path))
  assert eta.data.attributes == "detected"
  assert eta.data.attributes_file == str(tmp_path / "attributes_flickr8k" / "attributes.json")
  assert table.base_config("eta", str(tmp_path), "synthetic").data.attributes_file != eta.data.attributes_file
