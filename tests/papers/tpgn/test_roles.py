"""The section 5.3 tools (jaxcap/papers/tpgn/roles.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import jax

from jaxcap.papers.tpgn import roles as roles
from jaxcap.data.synthetic import POS_NOMINAL


def test_kmeans_recovers_separated_blobs_and_assign_is_nearest_centroid():
  rng = np.random.default_rng(0)
  centres = np.array([[0, 0, 0], [10, 0, 0], [0, 10, 0]], np.float64)
  x = np.concatenate([c + rng.normal(scale=0.3, size=(40, 3)) for c in centres])
  truth = np.repeat(np.arange(3), 40)
  mu = roles.kmeans(x, 3, seed=1)
  labels = roles.assign(x, mu)
  # Same partition up to relabelling.
  for j in range(3):
    assert len(set(labels[truth == j])) == 1
  assert len(set(labels)) == 3
  brute = np.argmin(((x[:, None] - mu[None]) ** 2).sum(-1), 1)
  np.testing.assert_array_equal(labels, brute)
  for j in range(3):  # centroids are cluster means
    np.testing.assert_allclose(mu[j], x[labels == j].mean(0), atol=1e-5)
  with pytest.raises(ValueError):
    roles.kmeans(x[:2], 3)


def test_purity_and_nv_tables_by_hand():
  labels = np.array([0, 0, 0, 1, 1, 1, 1])
  tags = ["NOUN", "NOUN", "ADP", "ADP", "VERB", "ADP", "DET"]
  pos = np.array([1, 2, 3, 1, 2, 3, 4])
  table = roles.purity_table(labels, tags, pos)
  assert table[0]["n"] == 3 and table[0]["tags"][0] == ("NOUN", 2 / 3)
  assert table[1]["tags"][0] == ("ADP", 0.5)
  assert table[0]["pos1"] == pytest.approx(1 / 3) and table[1]["pos2"] == pytest.approx(1 / 4)
  assert roles.weighted_purity(table) == pytest.approx((2 + 2) / 7)
  nv = roles.nv_table(labels, tags, lambda t: t in POS_NOMINAL)
  assert nv["nominal_cluster"] == 0
  rows = {r["tag"]: r for r in nv["rows"]}
  assert (rows["NOUN"]["N_w"], rows["NOUN"]["N_r"]) == (2, 2)
  assert (rows["ADP"]["N_w"], rows["ADP"]["N_r"]) == (3, 2)  # one ADP sits in the nominal cluster
  assert (rows["DET"]["N_r"], rows["VERB"]["N_r"]) == (0, 1)
  assert nv["overall"] == pytest.approx(5 / 7)
  assert "P_c" in roles.format_nv(nv) and "purity" in roles.format_purity(table)


def test_projection_and_plot(tmp_path):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(50, 9)) * np.array([5, 3] + [0.1] * 7)
  xy = roles.project_2d(x)
  assert xy.shape == (50, 2)
  assert np.var(xy[:, 0]) >= np.var(xy[:, 1]) > 0.5  # the two high-variance directions
  out = roles.plot_projection(xy, ["NOUN"] * 25 + ["ADP"] * 25, str(tmp_path / "u.png"))
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    assert out is None
  else:
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_real_text_without_a_tagger_gives_none_or_tags():
  tags = roles.tag_words(["a", "dog", "runs"], [0, 0, 0], [1, 2, 3], "karpathy")
  assert tags is None or len(tags) == 3
  assert roles.tag_words(["a", "red", "is"], [0, 0, 0], [1, 2, 3], "synthetic_scenes") == ["DET", "ADJ", "VERB"]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_analysis_end_to_end_on_an_untrained_model(tmp_path):
  from jaxcap import config_common as common
  from jaxcap import data as data_lib
  from jaxcap.data import pipeline
  from jaxcap.models.base import shift_right
  from jaxcap.papers.tpgn.model import TPGN
  d = common.data_config("synthetic")
  d.num_train, d.num_val, d.num_test = 24, 8, 16
  ds = data_lib.get_dataset(d)
  model = TPGN(vocab_size=ds.info["vocab_size"], feature_dim=ds.info["global_dim"], d=3)
  batch = next(iter(pipeline.eval_batches(ds.split("train"), 8, num_threads=0)))
  variables = jax.jit(model.init)(jax.random.key(0), {"global_feat": batch["global_feat"]},
                                  shift_right(batch["captions"]))
  # Bias the lexical layer so that untrained captions have several words before EOS.
  variables["params"]["b_x"] = variables["params"]["b_x"].at[2].add(-5.0)
  got = roles.collect(model, variables, ds, "test", max_len=6, batch_size=8)
  n = len(got["words"])
  assert got["u"].shape == (n, 9) and n == len(got["position"]) > 0
  assert set(got["captions"]) == set(range(16))
  assert got["position"][0] == 1
  lines = []
  out, centroids = roles.analyse(model, variables, ds, clusters=(2,), fit_images=16, max_len=6,
                                     png=str(tmp_path / "u.png"), ablate=True, log=lines.append)
  assert centroids[2].shape == (2, 9)
  assert sum(out["tables"]["2"]["sizes"]) == out["words"] == n
  assert "nv" in out["tables"]["2"] and 0 <= out["tables"]["2"]["weighted_purity"] <= 1
  assert [r["zeroed_cluster"] for r in out["ablation"]["2"]] == [-1, 0, 1]
  with pytest.raises(ValueError, match=r"^--clusters: 1000000 clusters of the \d+ words generated "
                     "for train; expected between 1 and"):
    roles.analyse(model, variables, ds, clusters=(10**6,), fit_images=16, max_len=6, log=lines.append)
