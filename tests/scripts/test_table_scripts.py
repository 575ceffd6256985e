"""The multi-seed table scripts: jaxcap/papers/eta/ablations.py, jaxcap/papers/aat/table1.py,
experiments/flickr8k/table.py (and the shared runner, jaxcap/analysis/experiment.py).

Default tests never train: finished runs are faked by writing the files a finished run leaves
(``scores.json``, ``result.json``, ``scores_test.json``) so that the scripts' resume path, the
per-seed layout and the mean ± std (sample std, ddof = 1, checked against numbers worked out by
hand) are exercised in a few seconds. The ``slow`` tests train a few steps for real.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from tests import fast_compile

from jaxcap.errors import BadInput

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable


def _load(path):
  name = path.replace("/", "_")[:-3]
  spec = importlib.util.spec_from_file_location(f"_script_{name}", os.path.join(ROOT, path))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _run(script, *args, env=None, timeout=120):
  prog = ["-m", script[:-3].replace("/", ".")] if script.startswith("jaxcap/") else [os.path.join(ROOT, script)]
  out = subprocess.run([PY, *prog, *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  return out.stdout


def _write(path, obj):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(obj, f)


# Three seeds' CIDEr 1.0, 1.2, 1.7: mean 1.3, sample variance ((.3^2 + .1^2 + .4^2) / 2) = 0.13.
CIDER = {0: 1.0, 1: 1.2, 2: 1.7}
MEAN, STD = 1.3, 0.13 ** 0.5


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_eta_ablations_resumes_per_seed_runs_and_reports_mean_std(tmp_path):
  for row in ("eta", "stacked_v"):
    for seed, c in CIDER.items():
      bonus = 0.5 if row == "eta" else 0.0
      _write(str(tmp_path / row / f"seed{seed}" / "scores.json"),
             {"CIDEr": c + bonus, "Bleu_4": 0.3, "METEOR": 0.25, "ROUGE_L": 0.5, "train_seconds": 10.0 + seed})
  _run("jaxcap/papers/eta/ablations.py", "--workdir", tmp_path, "--variants", "eta,stacked_v", "--seeds", "0,1,2")
  table = json.loads((tmp_path / "table.json").read_text())
  assert list(table) == ["eta", "stacked_v"]
  assert table["eta"]["config"] == "configs/eta.py:synthetic,variant=eta"
  assert sorted(table["stacked_v"]["seeds"]) == ["0", "1", "2"]
  assert table["stacked_v"]["seeds"]["2"]["CIDEr"] == pytest.approx(1.7)
  assert table["stacked_v"]["mean"]["CIDEr"] == pytest.approx(MEAN)
  assert table["stacked_v"]["std"]["CIDEr"] == pytest.approx(STD)
  assert table["eta"]["mean"]["CIDEr"] == pytest.approx(MEAN + 0.5)
  assert table["eta"]["std"]["Bleu_4"] == pytest.approx(0.0)
  assert table["eta"]["n"] == 3
  md = (tmp_path / "table.md").read_text()
  assert f"| stacked_v | 3 | {100 * MEAN:.1f} ± {100 * STD:.1f} | 30.0 ± 0.0 |" in md
  assert "| eta | 3 | 180.0 ± 36.1 |" in md and "seeds 0,1,2" in md
  # A subset of seeds reads back only those runs.
  _run("jaxcap/papers/eta/ablations.py", "--workdir", tmp_path, "--variants", "stacked_v", "--seeds", "2")
  table = json.loads((tmp_path / "table.json").read_text())
  assert table["stacked_v"]["mean"]["CIDEr"] == pytest.approx(1.7) and table["stacked_v"]["std"]["CIDEr"] == 0.0


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_aat_table1_resumes_per_seed_runs_and_reports_mean_std(tmp_path):
  for seed, c in CIDER.items():
    _write(str(tmp_path / "adaptive" / f"seed{seed}" / "result.json"),
           {"seed": seed, "avg_steps": 2.0 + seed, "CIDEr": c, "METEOR": 0.2, "Bleu_4": 0.3, "train_seconds": 5.0})
  out = _run("jaxcap/papers/aat/table1.py", "--workdir", tmp_path, "--rows", "adaptive", "--seeds", "0,1,2")
  table = json.loads((tmp_path / "table.json").read_text())
  (row,) = table
  assert row["row"] == "adaptive" and row["seeds"] == [0, 1, 2] and len(row["runs"]) == 3
  assert row["CIDEr"] == pytest.approx([MEAN, STD])
  assert row["avg_steps"] == pytest.approx([3.0, 1.0])  # 2, 3, 4
  md = (tmp_path / "table.md").read_text()
  assert f"| Adaptive (`adaptive`) | 0 | 4 | 3 | 3.00 ± 1.00 | {100 * MEAN:.1f} ± {100 * STD:.1f} | 20.0 ± 0.0 |" in md
  assert "±" in out


def test_aat_table1_rejects_unknown_rows_and_bad_seeds(tmp_path):
  mod = _load("jaxcap/papers/aat/table1.py")
  with pytest.raises(SystemExit):
    mod.main(["--workdir", str(tmp_path), "--rows", "nope"])
  from jaxcap.analysis import experiment
  with pytest.raises(SystemExit):
    experiment.parse_seeds("0,x")
  assert experiment.parse_seeds("2, 0,2") == [2, 0]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_flickr8k_table_resumes_and_reports_against_nearest_neighbour(tmp_path):
  for seed, c in CIDER.items():
    for stage, bonus in (("xe", 0.0), ("scst", 0.1)):
      d = tmp_path / "transformer" / stage / f"seed{seed}"
      _write(str(d / "scores_test.json"), {"overall": {"CIDEr": c + bonus, "Bleu_4": 0.2, "METEOR": 0.18}})
      _write(str(d / "run_seconds.json"), {"seconds": 60.0, "steps": 1200 if stage == "xe" else 300})
  _write(str(tmp_path / "nearest_neighbour" / "scores_test.json"),
         {"overall": {"CIDEr": 0.166, "Bleu_4": 0.1, "METEOR": 0.15}})
  _run("experiments/flickr8k/table.py", "--workdir", tmp_path, "--models", "transformer", "--seeds", "0,1,2")
  table = json.loads((tmp_path / "table.json").read_text())
  rows = {r["stage"]: r for r in table["rows"]}
  assert set(rows) == {"xe", "scst", "gain"} and table["seeds"] == [0, 1, 2]
  # The paired gain: SCST minus XE seed by seed (+0.1 each), so its spread is 0, not the seeds'.
  assert rows["gain"]["mean"]["CIDEr"] == pytest.approx(0.1) and rows["gain"]["std"]["CIDEr"] == pytest.approx(0.0)
  assert rows["xe"]["mean"]["CIDEr"] == pytest.approx(MEAN) and rows["xe"]["std"]["CIDEr"] == pytest.approx(STD)
  assert rows["scst"]["mean"]["CIDEr"] == pytest.approx(MEAN + 0.1)
  assert rows["scst"]["seeds"]["1"]["run_steps"] == 300
  assert table["nearest_neighbour"]["CIDEr"] == 0.166
  md = (tmp_path / "table.md").read_text()
  assert f"| transformer | XE | 3 | {100 * MEAN:.1f} ± {100 * STD:.1f} | 20.0 ± 0.0 | 18.0 ± 0.0 | 1200 | 60 |" in md
  assert "| transformer | XE + SCST | 3 | 140.0 ± 36.1 |" in md
  assert "| transformer | SCST − XE (paired) | 3 | 10.0 ± 0.0 |" in md
  assert "| nearest neighbour | - | - | 16.6 | 10.0 | 15.0 | - | - |" in md
  # --scst-steps 0 drops the SCST rows.
  _run("experiments/flickr8k/table.py", "--workdir", tmp_path, "--models", "transformer", "--seeds", "0,1,2", "--scst-steps", "0")
  assert [r["stage"] for r in json.loads((tmp_path / "table.json").read_text())["rows"]] == ["xe"]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_flickr8k_table_xe_continued_control_and_its_paired_row(tmp_path):
  for seed, c in CIDER.items():
    for stage, bonus in (("xe", 0.0), ("scst", 0.1), ("xe_more", 0.04)):
      _write(str(tmp_path / "transformer" / stage / f"seed{seed}" / "scores_test.json"),
             {"overall": {"CIDEr": c + bonus, "Bleu_4": 0.2, "METEOR": 0.18}})
  _run("experiments/flickr8k/table.py", "--workdir", tmp_path, "--models", "transformer", "--seeds", "0,1,2",
       "--stages", "xe,scst,xe_more", "--no-nn")
  rows = json.loads((tmp_path / "table.json").read_text())["rows"]
  assert [r["stage"] for r in rows] == ["xe", "scst", "xe_more", "gain", "gain_more"]
  assert rows[-1]["mean"]["CIDEr"] == pytest.approx(0.06) and rows[-1]["std"]["CIDEr"] == pytest.approx(0.0)
  assert "| transformer | SCST − XE continued (paired) | 3 | 6.0 ± 0.0 |" in (tmp_path / "table.md").read_text()
  # The control's config: the xe run's schedule plus the SCST steps, validated as SCST is; its
  # folder starts as a copy of the xe run without the test results.
  mod = _load("experiments/flickr8k/table.py")
  args = argparse.Namespace(workdir=str(tmp_path), steps=0, batch_size=0, scst_steps=400, scst_lr=0.0,
                                scst_eval_every=100, dataset="synthetic")
  more = mod.stage_config("transformer", "xe_more", 1, args)
  assert more.num_train_steps == 1400 and more.eval_every_steps == more.checkpoint_every_steps == 100
  assert more.scst.start_step == -1 and not more.init_from
  src = tmp_path / "transformer" / "xe" / "seed1"
  (src / "checkpoints" / "1000").mkdir(parents=True)
  (src / "metrics.jsonl").write_text("{}\n")
  mod.copy_xe_run(str(src), str(tmp_path / "copy"))
  assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["checkpoints", "metrics.jsonl"]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_flickr8k_table_report_reads_finished_runs_and_trains_nothing(tmp_path):
  # transformer: seeds 0-2 finished (xe and scst); aoanet: seed 0 xe only; nothing else.
  for seed, c in CIDER.items():
    for stage in ("xe", "scst"):
      _write(str(tmp_path / "transformer" / stage / f"seed{seed}" / "scores_test.json"),
             {"overall": {"CIDEr": c, "Bleu_4": 0.2, "METEOR": 0.18}})
  _write(str(tmp_path / "aoanet" / "xe" / "seed0" / "scores_test.json"),
         {"overall": {"CIDEr": 0.3, "Bleu_4": 0.1, "METEOR": 0.15}})
  before = sorted(str(p) for p in tmp_path.rglob("*"))
  _run("experiments/flickr8k/table.py", "--workdir", tmp_path, "--seeds", "0,1,2,3,4", "--report")
  table = json.loads((tmp_path / "table.json").read_text())
  rows = {(r["model"], r["stage"]): r for r in table["rows"]}
  assert set(rows) == {("transformer", "xe"), ("transformer", "scst"), ("transformer", "gain"), ("aoanet", "xe")}
  assert rows[("transformer", "xe")]["n"] == 3 and rows[("aoanet", "xe")]["n"] == 1
  assert rows[("transformer", "scst")]["mean"]["CIDEr"] == pytest.approx(MEAN)
  assert table["nearest_neighbour"] is None  # not finished: not run either
  after = sorted(str(p) for p in tmp_path.rglob("*"))
  assert after == sorted(before + [str(tmp_path / "table.json"), str(tmp_path / "table.md")])


@pytest.mark.paper_gate
def test_flickr8k_table_configs_and_stage_settings(tmp_path):
  mod = _load("experiments/flickr8k/table.py")
  from jaxcap.models import registry
  args = argparse.Namespace(workdir=str(tmp_path), steps=0, batch_size=0, scst_steps=40, scst_lr=3e-5)
  for model in mod.MODELS:  # Every listed model has a flickr8k config for a registered model.
    c = mod.base_config(model, str(tmp_path))
    assert c.data.dataset_json == "dataset_flickr8k.json" and c.data.max_regions == 1
    assert c.model.name in registry.names()
  missing = {n for n in registry.names() if n not in mod.MODELS and n not in mod.UNSUPPORTED}
  assert not missing, f"registered models neither in the table nor explained: {missing}"
  xe = mod.stage_config("transformer", "xe", 3, args)
  assert xe.seed == 3 and xe.scst.start_step == -1 and not xe.init_from
  scst = mod.stage_config("transformer", "scst", 3, args)
  assert scst.seed == 3 and scst.scst.start_step == 0 and scst.num_train_steps == 40
  assert scst.init_from == str(tmp_path / "transformer" / "xe" / "seed3")
  assert scst.scst.learning_rate == pytest.approx(3e-5) and scst.eval_every_steps == 20
  with pytest.raises(SystemExit):
    mod.main(["--workdir", str(tmp_path), "--models", "mnmt"])
  with pytest.raises(SystemExit):
    mod.main(["--workdir", str(tmp_path), "--stages", "rl"])


def test_flickr8k_table_scst_settings_flags(tmp_path):
  # --scst-samples / --scst-baseline / --scst-eval-every set the SCST stage's config, and
  # --xe-workdir starts it from cross-entropy runs kept elsewhere (one sweep workdir a setting).
  mod = _load("experiments/flickr8k/table.py")
  args = argparse.Namespace(workdir=str(tmp_path / "sweep"), steps=0, batch_size=0, scst_steps=600,
                                scst_lr=1e-4, scst_samples=3, scst_baseline="mean", scst_eval_every=50,
                                xe_workdir=str(tmp_path / "xe_runs"))
  c = mod.stage_config("aoanet", "scst", 1, args)
  assert c.init_from == str(tmp_path / "xe_runs" / "aoanet" / "xe" / "seed1")
  assert (c.scst.num_samples, c.scst.baseline, c.num_train_steps) == (3, "mean", 600)
  assert c.eval_every_steps == c.checkpoint_every_steps == 50
  assert c.scst.learning_rate == pytest.approx(1e-4)
  xe = mod.stage_config("aoanet", "xe", 1, args)  # the flags touch only the SCST stage
  assert xe.scst.start_step == -1 and not xe.init_from and xe.eval_every_steps == 200
  # --dataset synthetic: the same stages on the configs' synthetic scenes (train.py's default).
  args.dataset = "synthetic"
  syn = mod.stage_config("transformer", "scst", 2, args)
  assert syn.data.name == "synthetic_scenes" and syn.num_train_steps == 600 and syn.scst.start_step == 0
  assert mod.stage_config("transformer", "xe", 2, args).num_train_steps == 1000  # cpu_sized's schedule
  with pytest.raises(BadInput, match="--dataset: invalid choice: 'coco'"):  # argparse's, one line
    mod.main(["--workdir", str(tmp_path), "--dataset", "coco"])


def test_aat_word_classes_mark_the_second_object_of_a_relation():
  mod = _load("jaxcap/papers/aat/table1.py")
  words = "two shapes : a red circle to the left of a small blue square and a metal star".split()
  assert mod.word_classes(words) == [
      "number", "shape", "function", "function", "colour", "shape", "function", "function", "relation",
      "function", "function", "second object", "second object", "second object", "function", "function",
      "material", "shape", "EOS"]
  assert set(mod.word_classes(["inside", "a", "big", "box"])) <= set(mod.WORD_CLASSES)


def test_flickr8k_config_sweep_settings_change_one_field_each(tmp_path):
  mod = _load("experiments/flickr8k/config_sweep.py")
  base = mod.run_config("transformer", "base", 0, str(tmp_path))
  assert base.test_after_training is False and base.seed == 0  # validation only
  half = mod.run_config("transformer", "learning_rate*0.5+model.dropout=0.5", 2, str(tmp_path))
  assert half.learning_rate == pytest.approx(base.learning_rate / 2) and half.model.dropout == 0.5
  assert half.seed == 2 and half.num_train_steps == base.num_train_steps
  longer = mod.run_config("transformer", "num_train_steps*1.5", 0, str(tmp_path))
  assert longer.num_train_steps == round(1.5 * base.num_train_steps) and isinstance(longer.num_train_steps, int)
  step = mod.run_config("tpgn", mod.EXTRA["tpgn"][0], 0, str(tmp_path))  # AoANet's schedule, read from its config
  assert (step.schedule, step.learning_rate, step.decay_every_epochs, step.warmup_steps) == ("step", 1e-3, 10, 0)
  assert step.num_train_steps == 1800 and mod.run_config("tpgn", "base", 0, str(tmp_path)).num_train_steps == 1000
  assert mod.run_config("tpgn", mod.EXTRA["tpgn"][1], 0, str(tmp_path)).num_train_steps == 500  # as it was
  # ETA and AAT took AoANet's schedule; their old configs stay one setting each.
  for model, old in (("eta", ("noam", 1.0, 300, 1200)), ("aat", ("step", 2e-3, 0, 1200))):
    now, was = (mod.run_config(model, s, 0, str(tmp_path)) for s in ("base", mod.EXTRA[model][0]))
    assert (now.schedule, now.learning_rate, now.warmup_steps, now.num_train_steps) == ("step", 1e-3, 0, 1800)
    assert (was.schedule, was.learning_rate, was.warmup_steps, was.num_train_steps) == old
    assert was.model.dropout == now.model.dropout == 0.3
  noam = mod.run_config("transformer", mod.EXTRA["transformer"][0], 0, str(tmp_path))
  assert (noam.schedule, noam.learning_rate, noam.warmup_steps, noam.num_train_steps, noam.model.dropout) == (
      "noam", 1.0, 300, 1200, 0.3)
  # The Image Transformer's chosen dropout / rate stay its own: AoANet's config is built by the
  # same function and keeps its 0.3 / 1e-3; the old Image Transformer config is its EXTRA row.
  it = {s: mod.run_config("image_transformer", s, 0, str(tmp_path)) for s in ("base", *mod.EXTRA["image_transformer"])}
  aoanet = mod.run_config("aoanet", "base", 0, str(tmp_path))
  assert [(c.model.dropout, c.learning_rate) for c in (*it.values(), aoanet)] == [
      (0.1, pytest.approx(5e-4)), (0.3, pytest.approx(1e-3)), (0.3, pytest.approx(1e-3))]
  assert mod.dirname("learning_rate*0.5+model.dropout=0.5") == "learning_rate_x0.5__model.dropout=0.5"
  for bad, needle in (("model.nope=1", "no field 'nope'"), ("nope.x=1", "no section 'nope'"),
                      ("schedule*2", "not a number"), ("learning_rate", "key=value"),
                      ("learning_rate*x", "not a number")):
    with pytest.raises(SystemExit, match=needle):
      mod.run_config("transformer", bad, 0, str(tmp_path))
  for model in mod.EXTRA:  # every default setting applies to its model's config
    for setting in (*mod.GENERIC, *mod.EXTRA[model]):
      mod.run_config(model, setting, 0, str(tmp_path))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_flickr8k_config_sweep_reads_back_runs_and_chooses_on_validation(tmp_path):
  # Faked finished runs (sweep.json): two settings x two seeds and a third on one seed, higher
  # but not a finalist; nothing trains.
  vals = {"base": (0.30, 0.34), "learning_rate*0.5": (0.36, 0.38), "learning_rate*2": (0.50,)}
  mod = _load("experiments/flickr8k/config_sweep.py")
  for setting, per_seed in vals.items():
    for seed, v in enumerate(per_seed):
      _write(str(tmp_path / "transformer" / mod.dirname(setting) / f"seed{seed}" / "sweep.json"),
             {"setting": setting, "seed": seed, "steps": 1200, "seconds": 60.0, "val_steps": [200, 400],
              "val_CIDEr": [v - 0.05, v], "best_step": 400, "best_val_CIDEr": v, "last_val_CIDEr": v})
  _run("experiments/flickr8k/config_sweep.py", "--model", "transformer", "--workdir", tmp_path,
       "--settings", "base;learning_rate*0.5", "--seeds", "0,1", "--out", tmp_path / "out")
  table = json.loads((tmp_path / "out" / "config_sweep_transformer.json").read_text())
  rows = {r["setting"]: r for r in table["rows"]}
  assert rows["base"]["best_val_CIDEr"] == pytest.approx([0.32, 0.02 ** 0.5 * 0.2])
  assert rows["learning_rate*0.5"]["chosen"] and not rows["base"]["chosen"]
  md = (tmp_path / "out" / "config_sweep_transformer.md").read_text()
  assert "| `learning_rate*0.5` | 2 | 37.0 ± 1.4 | 400 | 37.0 ± 1.4 | 1200 | 60 | chosen |" in md
  assert "test split is not decoded" in md
  # With the one-seed setting (its seed 1 unfinished: --report trains nothing).
  _run("experiments/flickr8k/config_sweep.py", "--model", "transformer", "--workdir", tmp_path, "--report",
       "--settings", "base;learning_rate*0.5;learning_rate*2", "--seeds", "0,1", "--out", tmp_path / "out")
  table = json.loads((tmp_path / "out" / "config_sweep_transformer.json").read_text())
  assert [(r["setting"], r["n"]) for r in table["rows"] if r["chosen"] or r["n"] == 1] == [
      ("learning_rate*0.5", 2), ("learning_rate*2", 1)]
  assert [r["chosen"] for r in table["rows"]] == [False, True, False]


@pytest.mark.slow
def test_flickr8k_config_sweep_trains_and_reads_validation(tmp_path, shared_data):
  del shared_data
  tiny = "num_train_steps=4+eval_every_steps=2+checkpoint_every_steps=2+batch_size=8"
  _run("experiments/flickr8k/config_sweep.py", "--model", "transformer", "--workdir", tmp_path,
       "--settings", f"{tiny};{tiny}+learning_rate*0.5", "--seeds", "0", env=_one_device_env(), timeout=600)
  table = json.loads((tmp_path / "config_sweep_transformer.json").read_text())
  assert [r["n"] for r in table["rows"]] == [1, 1]
  run = tmp_path / "transformer" / "num_train_steps=4__eval_every_steps=2__checkpoint_every_steps=2__batch_size=8" / "seed0"
  result = json.loads((run / "sweep.json").read_text())
  assert result["val_steps"] == [2, 4] and not (run / "scores_test.json").exists()  # never tested


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_flickr8k_scst_sweep_reads_validation_curves(tmp_path):
  # Faked metrics.jsonl: the cross-entropy run (best validation 0.30 at step 400) and two settings.
  def metrics(path, records):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
      f.write("\n".join(json.dumps(r) for r in records) + "\n")
  metrics(str(tmp_path / "xe" / "aoanet" / "xe" / "seed0"),
          [{"step": 200, "val/CIDEr": 0.2}, {"step": 400, "val/CIDEr": 0.3}, {"step": 600, "val/CIDEr": 0.25}])
  for name, vals in (("lr1e-4_greedy", (0.31, 0.33, 0.29)), ("lr2e-5_mean", (0.30, 0.305, 0.31))):
    metrics(str(tmp_path / "sweep" / name / "aoanet" / "scst" / "seed0"),
            [r for k, v in zip((150, 300, 600), vals)
             for r in ({"step": k, "train/reward": v + 0.2}, {"step": k, "val/CIDEr": v})])
  out = tmp_path / "results"
  _run("experiments/flickr8k/scst_sweep.py", "--sweep", tmp_path / "sweep", "--xe-workdir", tmp_path / "xe",
       "--out", out)
  md = (out / "scst_sweep.md").read_text()
  assert "best checkpoint (step 400)" in md and "| XE start (step 0) | - | 30.0 | - | - |" in md
  assert "| lr1e-4_greedy | 600 | 33.0 | 300 | 31.0, 33.0, 29.0 |" in md
  assert md.index("lr1e-4_greedy") < md.index("lr2e-5_mean")  # best validation first
  data = json.loads((out / "scst_sweep.json").read_text())
  assert data["settings"]["lr2e-5_mean"]["best_step"] == 600 and (out / "scst_sweep.png").stat().st_size > 0
  assert sorted(p.name for p in out.iterdir()) == ["scst_sweep.json", "scst_sweep.md", "scst_sweep.png"]


def _one_device_env():
  env = dict(os.environ)
  # One CPU device: the flickr8k configs' batch of 25 need not split by 8.
  env["XLA_FLAGS"] = fast_compile.FLAGS
  return env


@pytest.mark.slow
def test_flickr8k_table_trains_xe_then_scst(tmp_path, shared_data):
  del shared_data
  _run("experiments/flickr8k/table.py", "--workdir", tmp_path, "--models", "transformer", "--seeds", "0",
       "--steps", "4", "--scst-steps", "2", "--batch-size", "8", "--stages", "xe,scst,xe_more",
       env=_one_device_env(), timeout=900)
  table = json.loads((tmp_path / "table.json").read_text())
  assert [r["stage"] for r in table["rows"]] == ["xe", "scst", "xe_more", "gain", "gain_more"]
  # The control resumed the xe run's copy: its metrics go on from step 4 to 6.
  more = [json.loads(l) for l in (tmp_path / "transformer" / "xe_more" / "seed0" / "metrics.jsonl").read_text().splitlines()]
  assert max(r["step"] for r in more) == 6 and any(r["step"] == 4 for r in more)
  cfg = json.loads((tmp_path / "transformer" / "scst" / "seed0" / "config.json").read_text())
  assert cfg["init_from"].endswith(os.path.join("transformer", "xe", "seed0")) and cfg["scst"]["start_step"] == 0
  assert 0.0 < table["nearest_neighbour"]["CIDEr"] < 1.0


@pytest.mark.slow
@pytest.mark.heavy  # minutes of CPU (pytest.ini)
def test_eta_and_aat_tables_train_tiny_runs(tmp_path):
  env = _one_device_env()
  _run("jaxcap/papers/eta/ablations.py", "--workdir", tmp_path / "eta", "--variants", "eta", "--seeds", "0,1", "--steps", "4",
       "--batch_size", "8", "--eval_num_images", "16", "--test_images", "16", env=env, timeout=600)
  t = json.loads((tmp_path / "eta" / "table.json").read_text())
  assert sorted(t["eta"]["seeds"]) == ["0", "1"] and "CIDEr" in t["eta"]["std"]
  _run("jaxcap/papers/aat/table1.py", "--workdir", tmp_path / "aat", "--rows", "adaptive", "--seeds", "0,1", "--steps", "4",
       "--batch_size", "8", "--eval_images", "16", "--test_images", "16", env=env, timeout=600)
  (row,) = json.loads((tmp_path / "aat" / "table.json").read_text())
  assert [r["seed"] for r in row["runs"]] == [0, 1] and len(row["CIDEr"]) == 2
  # Each run's scores say how they were made (its seed's config, the checkpoint, the decoding).
  for table in ("eta", "aat"):
    files = sorted((tmp_path / table).rglob("scores_test.json"))
    assert len(files) == 2
    sigs = [json.loads(f.read_text())["signature"] for f in files]
    assert all(s["split"] == {"name": "test", "images": 16} and 1 <= s["checkpoint"]["step"] <= 4 for s in sigs)
    assert sigs[0]["config"] != sigs[1]["config"]  # the seeds


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_flickr8k_config_sweep_report_trains_nothing(tmp_path):
  mod = _load("experiments/flickr8k/config_sweep.py")
  for setting, seed, v in (("base", 0, 0.30), ("model.dropout=0.5", 0, 0.31), ("model.dropout=0.5", 1, 0.35)):
    _write(str(tmp_path / "transformer" / mod.dirname(setting) / f"seed{seed}" / "sweep.json"),
           {"setting": setting, "seed": seed, "steps": 1800, "seconds": 60.0, "val_steps": [200],
            "val_CIDEr": [v], "best_step": 200, "best_val_CIDEr": v, "last_val_CIDEr": v})
  _run("experiments/flickr8k/config_sweep.py", "--model", "transformer", "--workdir", tmp_path, "--report",
       "--settings", "base;model.dropout=0.5;learning_rate*2", "--seeds", "0,1", "--out", tmp_path / "out")
  rows = {r["setting"]: r for r in json.loads((tmp_path / "out" / "config_sweep_transformer.json").read_text())["rows"]}
  assert sorted(rows) == ["base", "model.dropout=0.5"] and rows["base"]["n"] == 1 and rows["model.dropout=0.5"]["n"] == 2
  assert not (tmp_path / "transformer" / "base" / "seed1").exists()  # the missing run was not trained
  assert not (tmp_path / "transformer" / "learning_rate_x2").exists()
  # A setting that leaves the config as it is (the Transformer's dropout is 0.1) is base: not run twice.
  _run("experiments/flickr8k/config_sweep.py", "--model", "transformer", "--workdir", tmp_path, "--report",
       "--settings", "base;model.dropout=0.1", "--seeds", "0", "--out", tmp_path / "out2")
  rows = json.loads((tmp_path / "out2" / "config_sweep_transformer.json").read_text())["rows"]
  assert [r["setting"] for r in rows] == ["base"] and rows[0]["best_val_CIDEr"][0] == pytest.approx(0.30)
  # only such settings: nothing to run, not an error, nothing written
  out = _run("experiments/flickr8k/config_sweep.py", "--model", "transformer", "--workdir", tmp_path,
             "--settings", "model.dropout=0.1", "--out", tmp_path / "out3")
  assert "nothing to run" in out and not (tmp_path / "out3").exists()
  out = subprocess.run([PY, os.path.join(ROOT, "experiments/flickr8k/config_sweep.py"), "--model", "lstm", "--workdir",
                        str(tmp_path), "--report", "--settings", "base"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
  assert out.returncode == 2 and "no finished run" in out.stderr, out.stderr[-2000:]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_mnmt_table2_keeps_one_decoder_per_workdir(tmp_path):
  _write(str(tmp_path / "table2.json"), {"nmt/seed0": {"decoder": "nmtpy", "loss": 1.0}})
  out = subprocess.run([PY, "-m", "jaxcap.papers.mnmt.table2", "--workdir", str(tmp_path),
                        "--decoder", "paper"], capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert out.returncode == 2 and "holds runs of decoder 'nmtpy'" in out.stderr, out.stderr[-2000:]
  out = subprocess.run([PY, "-m", "jaxcap.papers.mnmt.table2", "--workdir", str(tmp_path / "x"),
                        "--decoder", "dl4mt"], capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert out.returncode == 2 and "--decoder" in out.stderr and not (tmp_path / "x").exists(), out.stderr[-2000:]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_mnmt_table2_pairs_each_row_with_the_same_seeds_nmt(tmp_path):
  # Finished runs (faked) are read back; the "- NMT" columns are per-seed differences.
  def run(bleu, omit):
    scores = {"BLEU": bleu, "METEOR": 50.0, "CIDEr": 300.0, "omit_BLEU": omit, "omit_CIDEr": 200.0}
    return {"decoder": "paper", "loss": 1.0, "first": scores, "best": scores}
  _write(str(tmp_path / "table2.json"), {
      "nmt/seed0": run(80.0, 70.0), "nmt/seed1": run(90.0, 72.0),
      "mnmt7/seed0": run(81.0, 71.0), "mnmt7/seed1": run(88.0, 75.0)})
  _run("jaxcap/papers/mnmt/table2.py", "--workdir", tmp_path, "--rows", "nmt,mnmt7", "--seeds", "0,1",
       "--num_train", "16", "--num_test", "8", "--no_meteor", timeout=300)
  rows = {line.split(" | ")[0].strip("| "): line.split(" | ")
          for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ")}
  assert rows["Model"][6:8] == ["BLEU − NMT", "BLEU − NMT, colour omitted |"]
  # seed differences +1, -2 (mean -0.5, std 2.12) and +1, +3 (mean 2, std 1.41); unpaired stds would differ
  assert rows["MNMT7"][6:8] == ["-0.50 ± 2.12", "2.00 ± 1.41 |"] and rows["NMT"][6] == "-"


@pytest.mark.slow
def test_mnmt_table2_validates_and_tests_the_best_step(tmp_path):
  _run("jaxcap/papers/mnmt/table2.py", "--workdir", tmp_path, "--rows", "nmt", "--seeds", "0", "--steps", "6",
       "--batch", "8", "--num_train", "64", "--num_test", "16", "--hidden", "16", "--embed", "16",
       "--decoder", "nmtpy", "--val_every", "3", "--num_val", "8", "--no_meteor", timeout=600)
  res = json.loads((tmp_path / "table2.json").read_text())["nmt/seed0"]
  assert res["decoder"] == "nmtpy" and [s for s, _ in res["val_curve"]] == [3, 6]
  assert res["best_step"] in (3, 6) and res["best_val_BLEU"] == max(b for _, b in res["val_curve"])
  md = (tmp_path / "table.md").read_text()
  assert "decoder `nmtpy`" in md and "| val BLEU (best) | at step | last-quarter gain |" in md


def test_pixels_joint_rows_differ_only_in_the_frozen_phase(tmp_path):
  joint = _load("experiments/pixels/joint.py")
  frozen, trained = (joint.row_config(r, str(tmp_path), 900) for r in ("frozen", "joint"))
  assert frozen.backbone.freeze_steps == 900 and trained.backbone.freeze_steps == 270  # 300 of 1,000
  flat = lambda c: {k: v for k, v in c.to_dict().items() if k != "backbone"}
  assert flat(frozen) == flat(trained)
  assert {k: v for k, v in frozen.backbone.items() if k != "freeze_steps"} == \
      {k: v for k, v in trained.backbone.items() if k != "freeze_steps"}


# Heavy (135 s in an earlier .ci/run): both rows are train.py runs from pixels, which the slow step trains
# (tests/training/test_pixels_run.py, USAGE's from-pixels commands); this checks joint.py's table.
@pytest.mark.slow
@pytest.mark.heavy
def test_pixels_joint_table_trains_both_rows(tmp_path):
  args = ["--workdir", str(tmp_path / "w"), "--seeds", "0", "--steps", "8", "--tiny",
          "--num_train", "16", "--num_val", "8", "--num_test", "8", "--size", "32"]
  _run("experiments/pixels/joint.py", *args, timeout=600)
  rows = json.loads((tmp_path / "w" / "table.json").read_text())
  assert [r["row"] for r in rows] == ["frozen", "joint"]
  assert [r["runs"][0]["freeze_steps"] for r in rows] == [8, 4]  # the tiny config's 2 of 4 steps
  # The same run until the joint row's backbone starts training, then not.
  ends = [r["runs"][0]["loss_end_frozen"] for r in rows]
  assert ends[0] is not None and ends[0] == ends[1]
  assert rows[0]["runs"][0]["loss_last"] != rows[1]["runs"][0]["loss_last"]
  assert rows[1]["joint_minus_frozen"] and "|" in (tmp_path / "w" / "table.md").read_text()
  again = _run("experiments/pixels/joint.py", *args, timeout=600)  # read back: trains nothing
  assert "===" not in again, again[-2000:]
