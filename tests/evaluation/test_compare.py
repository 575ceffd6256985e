"""Paired comparison of two scorings (jaxcap/evaluation/compare.py, jaxcap-compare)."""

import json

import numpy as np
import pytest

from jaxcap.evaluation import compare, files


def test_the_bootstrap_interval_covers_a_known_difference_about_95_percent_of_the_time():
  # Image difficulty shared by both systems (the pairing), a true mean difference of 0.05 and
  # skewed per-image noise, as CIDEr-D's per-image scores are: the 95 % interval must hold the
  # true difference in about 95 % of independent trials. Mutant checks: an unpaired resample
  # (a and b resampled independently) gives wider intervals (coverage ~1.0), a 68 % interval
  # (one std) ~0.68; both fall outside [0.92, 0.98].
  rng = np.random.default_rng(1)
  trials, n, hits = 300, 150, 0
  for t in range(trials):
    difficulty = rng.gamma(2.0, 0.4, n)
    a = difficulty + rng.normal(0, 0.15, n)
    b = difficulty + 0.05 + rng.exponential(0.15, n) - 0.15
    lo, hi = compare.paired_bootstrap(a, b, resamples=1000, seed=t)
    hits += lo <= 0.05 <= hi
  assert 0.92 <= hits / trials <= 0.98, hits / trials


def test_the_permutation_p_value_is_uniform_under_no_difference_and_small_under_one():
  rng = np.random.default_rng(2)
  ps = []
  for t in range(200):
    a = rng.gamma(2.0, 0.4, 80)
    b = a + rng.normal(0, 0.1, 80)  # no true difference
    ps.append(compare.paired_permutation_p(a, b, permutations=500, seed=t))
  ps = np.array(ps)
  assert 0.02 <= np.mean(ps < 0.05) <= 0.10  # about 5 % false positives
  a = rng.gamma(2.0, 0.4, 80)
  assert compare.paired_permutation_p(a, a + 0.05 + rng.normal(0, 0.1, 80), permutations=2000) < 0.01
  assert compare.paired_permutation_p(a, a) == 1.0  # identical scores: no evidence at all


def _scores(per_image, signature=None):
  out = {"overall": {}, "per_image": per_image}
  if signature is not None:
    out["signature"] = signature
  return out


def test_compare_pairs_by_image_and_refuses_different_image_sets():
  a = _scores({1: {"CIDEr": 1.0, "Bleu_4": 0.3}, 2: {"CIDEr": 0.5, "Bleu_4": 0.2}, 3: {"CIDEr": 0.2, "Bleu_4": 0.1}})
  # The same images in another order, B 0.1 better on every one: the interval is [0.1, 0.1].
  b = _scores({3: {"CIDEr": 0.3, "Bleu_4": 0.1}, 1: {"CIDEr": 1.1, "Bleu_4": 0.3}, 2: {"CIDEr": 0.6, "Bleu_4": 0.2}})
  r = compare.compare(a, b, resamples=500)
  assert r["images"] == 3 and list(r["metrics"]) == ["Bleu_4", "CIDEr"]
  c = r["metrics"]["CIDEr"]
  assert c["delta"] == pytest.approx(0.1) and c["ci"] == pytest.approx((0.1, 0.1))
  assert r["metrics"]["Bleu_4"]["p"] == 1.0
  fewer = _scores({1: {"CIDEr": 1.0}, 2: {"CIDEr": 0.5}})
  with pytest.raises(ValueError, match=r"A scores 3 images, B 2, 2 in both; expected the same images"):
    compare.compare(a, fewer)
  assert compare.compare(a, fewer, intersection=True)["images"] == 2
  with pytest.raises(ValueError, match="no image in common"):
    compare.compare(a, _scores({9: {"CIDEr": 1.0}}), intersection=True)


def test_settings_that_differ_are_named_from_the_signatures():
  sig = {"decode": {"method": "beam", "beam_size": 3}, "vocab": {"size": 9, "min_count": 5}}
  other = json.loads(json.dumps(sig))
  other["decode"]["beam_size"], other["vocab"]["min_count"] = 5, 3
  per = {1: {"CIDEr": 1.0}, 2: {"CIDEr": 0.5}}
  r = compare.compare(_scores(per, sig), _scores(per, other), resamples=100)
  assert r["settings"] == [("decode.beam_size", 3, 5), ("vocab.min_count", 5, 3)]
  text = compare.format_comparison(r)
  assert "decode.beam_size: 3 -> 5" in text and "CIDEr-D" in text


def test_seed_paired_averages_each_rows_seeds_per_image():
  base = [_scores({1: {"CIDEr": 1.0}, 2: {"CIDEr": 0.0}}), _scores({1: {"CIDEr": 0.0}, 2: {"CIDEr": 1.0}})]
  row = [_scores({1: {"CIDEr": 1.0}, 2: {"CIDEr": 1.0}}), _scores({1: {"CIDEr": 1.0}, 2: {"CIDEr": 1.0}})]
  r = compare.seed_paired({"base": base, "row": row}, "base", resamples=200)["row"]
  assert r["metrics"]["CIDEr"]["delta"] == pytest.approx(0.5)
  assert compare.interval_text(r) == "+50.00 [+50.00, +50.00]"


def test_load_reads_a_run_directory_or_a_file_and_names_what_is_missing(tmp_path):
  path = tmp_path / "scores_test.json"
  path.write_text(json.dumps({"overall": {"CIDEr": 0.5}, "per_image": [{"image_id": 1, "CIDEr": 0.5}],
                              "signature": {"decode": {"method": "greedy"}}}))
  scores, where = compare.load(str(tmp_path))
  assert where == str(path) and scores["signature"] == {"decode": {"method": "greedy"}}
  assert compare.load(str(path))[1] == str(path)
  with pytest.raises(ValueError, match=r"no scores_val_beam3.json; .*found scores_test.json"):
    compare.load(str(tmp_path), "val", "_beam3")
