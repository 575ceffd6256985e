"""jaxcap/papers/m2/table.py: its rows' configs, and the table it writes from finished runs."""

import json

import numpy as np
import pytest

from jaxcap.evaluation import compare, files
from jaxcap.papers.m2 import table


@pytest.mark.parametrize("dataset", table.DATASETS)
def test_rows_differ_only_in_what_they_name(dataset):
  """Same sizes, schedule and data for every row; cross-entropy only; the M² rows differ from
  each other in memory_slots / meshed alone."""
  c = {row: table.row_config(row, dataset) for row in table.ROWS}
  for row, config in c.items():
    assert (config.scst.start_step, config.scst.start_epoch) == (-1, -1), row
    for key in ("num_train_steps", "batch_size", "learning_rate", "schedule"):
      assert config[key] == c["transformer"][key], (row, key)
    assert config.data.to_dict() == c["transformer"].data.to_dict(), row
    assert config.decode.method == "greedy", row
    for key in ("dim", "num_heads", "ff_dim", "num_layers", "num_dec_layers"):
      assert config.model[key] == c["transformer"].model[key], (row, key)
  m2 = {row: c[row].model.to_dict() for row in ("m2", "m2_m0", "m2_last")}
  assert (m2["m2"]["memory_slots"], m2["m2_m0"]["memory_slots"], m2["m2_last"]["memory_slots"]) == (40, 0, 40)
  assert (m2["m2"]["meshed"], m2["m2_m0"]["meshed"], m2["m2_last"]["meshed"]) == ("meshed", "meshed", "last")
  assert {k for k in m2["m2"] if m2["m2"][k] != m2["m2_m0"][k]} == {"memory_slots"}
  assert {k for k in m2["m2"] if m2["m2"][k] != m2["m2_last"][k]} == {"meshed"}


def _scores(path, cider):
  per = [{"image_id": i, "CIDEr": float(c), "Bleu_4": 0.1, "METEOR": 0.2, "ROUGE_L": 0.3}
         for i, c in enumerate(cider)]
  overall = {"CIDEr": float(np.mean(cider)), "Bleu_4": 0.1, "METEOR": 0.2, "ROUGE_L": 0.3}
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps({"overall": overall, "per_image": per}))


def test_table_reads_finished_runs_and_pairs_with_the_transformer(tmp_path, monkeypatch):
  """Finished runs (scores_test.json) are read back, never retrained; the mean ± std columns
  and the paired column are the seeds' scores'."""
  monkeypatch.setattr(table.train_lib, "train_and_evaluate", lambda *a: pytest.fail("retrained"))
  rng = np.random.default_rng(0)
  base = rng.uniform(0, 1, 30)
  cider = {"transformer": [base, base + 0.01], "m2": [base + 0.1, base + 0.12]}
  for row, seeds in cider.items():
    for s, c in enumerate(seeds):
      _scores(tmp_path / row / f"seed{s}" / "scores_test.json", c)
  results = table.main(["--workdir", str(tmp_path), "--rows", "transformer,m2", "--seeds", "0,1"])
  by_row = {r["row"]: r for r in results}
  mean, std = by_row["m2"]["mean_std"]["CIDEr"]
  np.testing.assert_allclose([mean, std], [np.mean([c.mean() for c in cider["m2"]]),
                                           np.std([c.mean() for c in cider["m2"]], ddof=1)])
  want = compare.interval_text(compare.seed_paired(
      {r: [files.load_scores(str(tmp_path / r / f"seed{s}" / "scores_test.json")) for s in (0, 1)]
       for r in cider}, "transformer")["m2"], "CIDEr")
  assert by_row["m2"]["cider_minus_transformer"] == want and want.startswith("+10.5")
  assert by_row["transformer"]["cider_minus_transformer"] is None
  md = (tmp_path / "table.md").read_text()
  assert "M² (m = 40, meshed)" in md and want in md
  assert json.loads((tmp_path / "table.json").read_text())[1]["runs"][0]["seed"] == 0
