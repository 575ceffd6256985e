"""The run directory (jaxcap/run_dir.py): config.json names the run's data from any directory.

A run trained with a relative ``data.root`` (a command run from the repository) is loaded by a
notebook elsewhere: config.json holds the paths resolved against the training's working
directory, and resuming the same command from there is still accepted.
"""

import json
import os

import pytest

import jaxcap
from jaxcap import run_dir
from jaxcap.evaluation import coco_metrics
from tests.data.fakes import karpathy_config, write_karpathy


def _config(root):
  config = jaxcap.get_config("transformer.py:synthetic", num_train_steps=2, eval_every_steps=2,
                             checkpoint_every_steps=2, log_every_steps=1, test_after_training=False)
  config.model.update(dim=32, ff_dim=64, num_layers=1, num_dec_layers=1)
  config.update(batch_size=8, eval_batch_size=8, warmup_steps=1)
  config.decode.max_len = 5
  config.data = karpathy_config(root, max_regions=5)
  return config


def _write_run(workdir, config):
  """A run as train.py starts one (config.json, vocab.json, info.json) with its initial
  parameters as the best checkpoint: no training step is compiled."""
  import jax.numpy as jnp
  from jaxcap.training import checkpoint, train_lib
  trainer = train_lib.Trainer(config, workdir)
  run_dir.init_workdir(workdir, config, trainer.dataset.vocab, trainer.info)
  ckpts = checkpoint.Checkpoints(workdir)
  ckpts.save_best_if_improved(2, trainer.initial_state().replace(step=jnp.int32(2)), {"epoch": 0},
                              {"CIDEr": 0.5})
  ckpts.close()
  return trainer


@pytest.mark.slow
def test_a_run_on_a_relative_data_root_evaluates_from_another_directory(tmp_path, monkeypatch):
  here, elsewhere = tmp_path / "repo", tmp_path / "notebooks"
  elsewhere.mkdir()
  write_karpathy(here / "data", counts=(8, 2, 2))
  monkeypatch.chdir(here)
  trainer = _write_run("runs/rel", _config("data"))  # relative, as a command run from the repo
  saved = json.loads((here / "runs" / "rel" / "config.json").read_text())
  assert saved["data"]["root"] == str(here / "data")
  assert saved["data"]["att_dir"] == "att"  # relative to the now absolute root, as before
  # Resuming the same command from the same directory: the check train.py makes accepts it.
  run_dir.init_workdir("runs/rel", _config("data"), trainer.dataset.vocab, trainer.info)

  monkeypatch.chdir(elsewhere)
  run = jaxcap.load(str(here / "runs" / "rel"))
  scores = run.evaluate("test", metrics=("Bleu", "CIDEr"), log=lambda _: None)
  assert len(scores["predictions"]) == 2 and "CIDEr" in scores["overall"]
  test = run.dataset.split("test")
  captions = run.caption(test.collate([test[0], test[1]], None), method="greedy")
  assert len(captions) == 2 and all(isinstance(c, str) for c in captions)


@pytest.mark.slow
def test_train_on_a_relative_root_resumes_and_evaluates_from_another_directory(tmp_path, monkeypatch):
  """The same through jaxcap.train: trained, resumed from the same directory, evaluated elsewhere."""
  here, elsewhere = tmp_path / "repo", tmp_path / "notebooks"
  elsewhere.mkdir()
  write_karpathy(here / "data", counts=(8, 2, 2))
  monkeypatch.chdir(here)
  jaxcap.train(_config("data"), "runs/rel")
  jaxcap.train(_config("data"), "runs/rel", num_train_steps=3)
  assert (here / "runs" / "rel" / "checkpoints" / "3").is_dir()
  monkeypatch.chdir(elsewhere)
  scores = jaxcap.load(str(here / "runs" / "rel")).evaluate("test", metrics=("Bleu",), log=lambda _: None)
  assert len(scores["predictions"]) == 2


def test_absolute_data_paths_resolves_what_the_dataset_resolves_against_the_working_directory(
    tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  cwd = str(tmp_path)
  # With a root: the root (and the files read relative to the working directory) only.
  out = run_dir.absolute_data_paths({"name": "karpathy", "root": "data/coco", "att_dir": "att",
                                     "fc_dir": "/feats/fc", "box_dir": "", "vocab_file": "v.json",
                                     "max_len": 16})
  assert out == {"name": "karpathy", "root": os.path.join(cwd, "data/coco"), "att_dir": "att",
                 "fc_dir": "/feats/fc", "box_dir": "", "vocab_file": os.path.join(cwd, "v.json"),
                 "max_len": 16}
  # Without one the root-relative fields are relative to the working directory.
  out = run_dir.absolute_data_paths({"root": "", "dataset_json": "d.json", "att_dir": "att"})
  assert out == {"root": "", "dataset_json": os.path.join(cwd, "d.json"),
                 "att_dir": os.path.join(cwd, "att")}
  # The synthetic data names no file: nothing changes.
  synthetic = jaxcap.get_config("transformer.py:synthetic").data.to_dict()
  assert run_dir.absolute_data_paths(synthetic) == synthetic


def _table(lines, first):
  """``(header, {printed name: printed value})`` of the metric table whose first line starts so."""
  i = next(i for i, ln in enumerate(lines) if ln.startswith(first))
  names, values = ([c.strip() for c in ln.split("|")] for ln in lines[i + 1:i + 3])
  return lines[i], dict(zip(names, values))


def test_the_printed_table_names_its_scale_and_is_the_files_scores_x100(tmp_path, capsys, monkeypatch):
  # One scale per number: the table says x100, the file keeps pycocoevalcap's own (CIDEr-D above
  # 1 here: it is not a 0-1 score), and printed / 100 is the file's value.
  refs = {1: ["a red square above a blue circle", "a red square over a blue circle"],
          2: ["two green triangles left of a cross", "green triangles beside a yellow cross"],
          3: ["a large orange star inside a box", "an orange star in a large box"]}
  preds = {1: "a red square above a blue circle", 2: "two green triangles left of a cross",
           3: "an orange star"}
  # Without Java's METEOR and PTB tokenizer (25 s here): the table scales every key alike.
  real = coco_metrics.score
  monkeypatch.setattr(coco_metrics, "score", lambda *a, **k: real(
      *a, **dict(k, metrics=("Bleu", "ROUGE_L", "CIDEr"), tokenize=False)))
  run_dir.write_scores(str(tmp_path), "test", preds, refs)
  header, printed = _table(capsys.readouterr().out.splitlines(), "test (3 images)")
  assert header == "test (3 images), scores x100"
  stored = json.loads((tmp_path / "scores_test.json").read_text())["overall"]
  assert stored["CIDEr"] > 1, stored
  names = {v: k for k, v in coco_metrics.DISPLAY_NAMES.items()}
  assert {"CIDEr-D", "BLEU-4", "ROUGE-L"} <= set(printed)
  for name, value in printed.items():
    assert float(value) / 100 == pytest.approx(stored[names[name]], abs=0.005 / 100), name
  # sacreBLEU is printed as computed (0-100), and the header says so; without a title the
  # scale is still the table's first line.
  header, printed = _table(run_dir.format_table({"sacreBLEU": 31.5, "CIDEr": 0.8}, "val").splitlines(), "val")
  assert header == "val, scores x100 (sacreBLEU as computed, 0-100)"
  assert printed == {"CIDEr-D": "80.00", "sacreBLEU": "31.50"}
  assert [ln.strip() for ln in run_dir.format_table({"Bleu_4": 0.25}).splitlines()] == ["scores x100", "BLEU-4", "25.00"]


def test_config_sections_are_the_base_config_s_objects():
  import ml_collections
  from jaxcap import config_common
  cfg = config_common.base_config()
  assert run_dir.CONFIG_SECTIONS == tuple(sorted(k for k, v in cfg.items()
                                                 if isinstance(v, ml_collections.ConfigDict)))


@pytest.mark.parametrize("section", ["backbone", "decode", "scst", "mesh"])
def test_a_saved_config_section_that_is_no_object_is_one_line(tmp_path, section):
  """It raised AttributeError ('str' object has no attribute 'get') in the program that read it."""
  cfg = {"model": {"name": "transformer"}, "data": {"name": "synthetic"}, section: "resnet50"}
  (tmp_path / run_dir.CONFIG_FILE).write_text(json.dumps(cfg))
  with pytest.raises(run_dir.BadInput) as e:
    run_dir.read_saved_config(str(tmp_path))
  assert str(e.value) == (f"{tmp_path / 'config.json'}: field {section!r} is 'resnet50', expected an "
                          "object (the config of the run in this workdir)")
  cfg[section] = {}
  (tmp_path / run_dir.CONFIG_FILE).write_text(json.dumps(cfg))
  assert run_dir.read_saved_config(str(tmp_path))[section] == {}
