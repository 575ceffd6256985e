"""The experiments' shared seeds x rows runner (jaxcap/analysis/experiment.py)."""

import json
import math

import numpy as np
import pytest

from jaxcap.analysis import experiment


def test_mean_std_is_the_sample_std_everywhere():
  vals = [1.0, 1.2, 1.7]
  mean, std = experiment.mean_std(vals)
  assert mean == pytest.approx(np.mean(vals)) and std == pytest.approx(np.std(vals, ddof=1))
  assert std == pytest.approx(0.13 ** 0.5)  # ((.3^2 + .1^2 + .4^2) / 2) worked out by hand
  assert experiment.mean_std([0.4]) == (0.4, 0.0)  # one seed: no spread
  assert experiment.mean_std([None, 2.0, "x", 4.0]) == pytest.approx((3.0, math.sqrt(2.0)))
  assert experiment.mean_std([None]) is None


def test_population_std_of_three_seeds_converts_exactly():
  """The conversion the MNMT / Image Transformer pages apply to their published ddof = 0 stds."""
  vals = [0.2, 0.5, 0.3]
  assert np.std(vals) * math.sqrt(3 / 2) == pytest.approx(experiment.mean_std(vals)[1])


def test_summarize_and_table():
  per_seed = {0: {"CIDEr": 1.0, "name": "a"}, 1: {"CIDEr": 1.2}, 2: {"CIDEr": 1.7}}
  s = experiment.summarize(per_seed)
  assert s["n"] == 3 and list(s["mean"]) == ["CIDEr"]
  assert experiment.pm((s["mean"]["CIDEr"], s["std"]["CIDEr"])) == "130.0 ± 36.1"
  assert experiment.pm(None) == "-"
  assert experiment.markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |"


def test_run_grid_orders_resumes_and_writes_results(tmp_path):
  calls, after = [], []
  path = lambda row, seed: str(tmp_path / row / f"seed{seed}" / "result.json")

  def run(row, seed):
    calls.append((row, seed))
    return {"CIDEr": float(seed)}

  experiment.write_json(path("b", 1), {"CIDEr": 9.0})  # a finished run: read back, not run
  grid = experiment.run_grid(["a", "b"], [0, 1], run, result_file=path, seed_major=True,
                             after=lambda g: after.append(sum(len(d) for d in g.values())))
  assert calls == [("a", 0), ("b", 0), ("a", 1)] and after == [1, 2, 3, 4]
  assert grid == {"a": {0: {"CIDEr": 0.0}, 1: {"CIDEr": 1.0}}, "b": {0: {"CIDEr": 0.0}, 1: {"CIDEr": 9.0}}}
  assert json.loads((tmp_path / "a" / "seed1" / "result.json").read_text()) == {"CIDEr": 1.0}
  calls.clear()
  experiment.run_grid(["a", "b"], [0, 1], run, result_file=path)
  assert calls == []  # every run finished


def test_bad_lists_are_one_line():
  assert experiment.parse_seeds("2, 0,2") == [2, 0]
  with pytest.raises(SystemExit, match="--seeds: expected comma-separated integers"):
    experiment.parse_seeds("0,x")
  with pytest.raises(SystemExit, match="at least one"):
    experiment.parse_seeds(",")
  with pytest.raises(SystemExit, match="--rows: unknown row 'c'"):
    experiment.parse_rows("a,c", ["a", "b"])


def test_write_table(tmp_path):
  experiment.write_table(str(tmp_path / "w"), {"x": 1}, "caption", "| a |", json_name="table2.json")
  assert json.loads((tmp_path / "w" / "table2.json").read_text()) == {"x": 1}
  assert (tmp_path / "w" / "table.md").read_text() == "caption\n\n| a |\n"
  assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["table.md", "table2.json"]  # no temporaries


def test_paired_against_averages_seeds_per_image_and_pairs_rows_with_the_baseline(tmp_path):
  import json
  from jaxcap.papers.eta import ablations

  def write(row, seed, cider):
    path = tmp_path / row / f"seed{seed}" / "scores_test.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"overall": {"CIDEr": sum(cider) / len(cider)},
                                "per_image": [{"image_id": i, "CIDEr": c} for i, c in enumerate(cider)]}))

  # The baseline's two seeds average to 0.5 on every image; "better" is 0.1 above on each image
  # whatever its seed: the paired interval is exactly [+10, +10] (x100).
  write("base", 0, [0.2, 0.8, 0.5]); write("base", 1, [0.8, 0.2, 0.5])
  write("better", 0, [0.6, 0.6, 0.6]); write("better", 1, [0.6, 0.6, 0.6])
  write("unfinished", 0, [0.1, 0.1, 0.1])  # seed 1 missing: left out
  where = lambda row, seed: str(tmp_path / row / f"seed{seed}" / "scores_test.json")
  cells = experiment.paired_against("base", ["better", "unfinished"], where, [0, 1])
  assert cells == {"better": "+10.00 [+10.00, +10.00]"}
  assert experiment.paired_against("missing", ["better"], where, [0, 1]) == {}
  summary = {"mean": {"CIDEr": 0.5}, "std": {"CIDEr": 0.0}, "n": 2}
  table = ablations.format_table({"base": summary, "better": summary}, cells)
  assert "CIDEr-D - base (paired 95 %)" in table.splitlines()[0]
  assert table.splitlines()[3].split(" | ")[-2] == "+10.00 [+10.00, +10.00]"
