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


# What jaxcap-compare says about its numbers (issue 55): the runs' own scores beside the paired
# statistics, what each interval is over, and only the settings that change the captions.

_GREEDY = {"method": "greedy", "beam_size": 3, "beam_mode": "live", "max_len": 16,
           "length_penalty": "none", "alpha": 0.6, "min_len": 0, "block_trigrams": False,
           "suppress_unk": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_samples": 1,
           "remove_bad_endings": False, "beam_groups": 1, "diversity_strength": 0.5}


def _run(tmp_path, name, *, overall, per_image, decode=None, config=None, config_hash="c0ffee00"):
  """A run directory with its scores_test.json (and config.json when ``config``)."""
  wd = tmp_path / name
  wd.mkdir()
  sig = {"decode": dict(decode or _GREEDY), "model": "transformer", "config": config_hash,
         "checkpoint": {"step": 100}}
  (wd / "scores_test.json").write_text(json.dumps(
      {"overall": overall, "per_image": [{"image_id": i, **m} for i, m in per_image.items()],
       "signature": sig}))
  if config is not None:
    (wd / "config.json").write_text(json.dumps(config))
  return wd


def _cli(capsys, monkeypatch, *argv):
  from jaxcap.commands import compare as command
  monkeypatch.setattr("sys.argv", ["jaxcap-compare", *map(str, argv), "--resamples=200"])
  assert command.main() == 0
  return capsys.readouterr().out


def test_compare_prints_each_runs_own_scores_and_labels_what_the_intervals_are_over(
    tmp_path, capsys, monkeypatch):
  # BLEU-4 and METEOR overall are corpus scores (the table's 31.52 and 29.36), not the mean of
  # their per-image scores (21.79-ish and 30.27-ish): both numbers must be printed, each named,
  # and the interval labelled as the per-image mean's. CIDEr-D's overall is its per-image mean.
  per_a = {i: {"Bleu_4": 0.2179 + 0.001 * (i - 2), "METEOR": 0.3027, "CIDEr": 0.9 + 0.01 * i}
           for i in range(5)}
  per_b = {i: {"Bleu_4": m["Bleu_4"] + 0.01, "METEOR": 0.3027, "CIDEr": m["CIDEr"] + 0.02}
           for i, m in per_a.items()}
  a = _run(tmp_path, "a", overall={"Bleu_4": 0.3152, "METEOR": 0.2936, "CIDEr": 0.92}, per_image=per_a)
  b = _run(tmp_path, "b", overall={"Bleu_4": 0.3301, "METEOR": 0.2951, "CIDEr": 0.94}, per_image=per_b)
  out = _cli(capsys, monkeypatch, a, b)
  rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in out.splitlines()
          if line.count("|") >= 8}
  assert rows["metric"][1:3] == ["A overall", "B overall"]
  assert "5 images scored by both, scores x100. 'overall'" in out  # the numbers below: the files' x100
  assert rows["BLEU-4"][1:6] == ["31.52", "33.01", "21.79", "22.79", "+1.00"]
  assert rows["BLEU-4"][-1] == "mean of per-image scores, not the corpus score"
  assert rows["METEOR"][1:5] == ["29.36", "29.51", "30.27", "30.27"]
  assert rows["METEOR"][-1] == "mean of per-image scores, not the corpus score"
  assert rows["CIDEr-D"][1:5] == ["92.00", "94.00", "92.00", "94.00"]
  assert rows["CIDEr-D"][-1] == "mean of per-image scores"
  assert "BLEU-4, METEOR: corpus-level scores" in out
  r = compare.compare(*(compare.load(str(p))[0] for p in (a, b)), resamples=100)
  assert r["metrics"]["Bleu_4"]["overall_a"] == 0.3152 and r["metrics"]["CIDEr"]["overall_b"] == 0.94


def _settings(a_decode, b_decode, **kw):
  per = {1: {"CIDEr": 1.0}, 2: {"CIDEr": 0.5}}
  sig = lambda d: {"decode": d, "config": "c0ffee00"}
  return compare.compare(_scores(per, sig(a_decode)), _scores(per, sig(b_decode)), resamples=50, **kw)


def test_settings_list_only_the_decoding_options_each_method_reads():
  # Greedy vs beam 2: greedy reads no beam option, so beam_size 3 -> 2 is no difference of theirs;
  # the method's line shows both decodings in short.
  r = _settings(_GREEDY, dict(_GREEDY, method="beam", beam_size=2))
  assert r["settings"] == [("decode.method", "greedy", "beam")]
  text = compare.format_comparison(r)
  assert "decode.method: 'greedy' -> 'beam' (greedy,max=16 -> beam2 live,lp=none,max=16)" in text
  assert "beam_size" not in text
  # The nearest neighbour decodes nothing: none of the Transformer's 16 options is listed.
  r = _settings({"method": "nearest_neighbour"}, _GREEDY)
  assert r["settings"] == [("decode.method", "nearest_neighbour", "greedy")]
  # Greedy reads max_len; beam reads alpha only with the GNMT penalty, diversity_strength only
  # with groups; sampling reads top_k, not beam_mode.
  assert _settings(_GREEDY, dict(_GREEDY, max_len=20, temperature=0.5, top_k=3))["settings"] == [
      ("decode.max_len", 16, 20)]
  beam = dict(_GREEDY, method="beam")
  assert _settings(beam, dict(beam, alpha=0.9, diversity_strength=0.1))["settings"] == []
  assert _settings(dict(beam, length_penalty="gnmt"), dict(beam, length_penalty="gnmt", alpha=0.9))[
      "settings"] == [("decode.alpha", 0.6, 0.9)]
  sample = dict(_GREEDY, method="sample")
  assert _settings(sample, dict(sample, top_k=5, beam_mode="self_critical"))["settings"] == [
      ("decode.top_k", 0, 5)]


def test_a_config_hash_that_differs_names_the_config_fields_from_config_json(
    tmp_path, capsys, monkeypatch):
  # Cross-entropy vs SCST: the signatures differ in the config hash and the step only; the runs'
  # config.json name the fields. The loader's workers change no score (the hash leaves them
  # out), and the config's beam_size is not read by its greedy decoding.
  base = {"model": {"name": "transformer", "d_model": 512}, "data": {"num_workers": 2},
          "scst": {"start_step": -1, "learning_rate": 2e-5}, "num_train_steps": 1000,
          "decode": _GREEDY}
  scst = json.loads(json.dumps(base))
  scst["scst"]["start_step"], scst["num_train_steps"] = 1000, 2000
  scst["data"]["num_workers"], scst["decode"]["beam_size"] = 8, 5
  per = {1: {"CIDEr": 1.0}, 2: {"CIDEr": 0.5}}
  a = _run(tmp_path, "xe", overall={"CIDEr": 0.75}, per_image=per, config=base, config_hash="aaaa1111")
  b = _run(tmp_path, "scst", overall={"CIDEr": 0.75}, per_image=per, config=scst, config_hash="bbbb2222")
  out = _cli(capsys, monkeypatch, a, b)
  assert ("settings that differ (3):\n  config differs (hash aaaa1111 -> bbbb2222)\n"
          "  config.num_train_steps: 1000 -> 2000\n  config.scst.start_step: -1 -> 1000\n") in out
  assert "num_workers" not in out and "beam_size" not in out
  # The same scores files outside their run directories: the hash, and why no field is named.
  lone = tmp_path / "lone"
  lone.mkdir()
  (lone / "scores_test.json").write_text((b / "scores_test.json").read_text())
  out = _cli(capsys, monkeypatch, a / "scores_test.json", lone / "scores_test.json")
  assert ("config differs (hash aaaa1111 -> bbbb2222); config.json not found (beside B's scores "
          "file)") in out
  assert "config.scst" not in out
