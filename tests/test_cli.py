"""The command line: validation before absl parses, the programs' flags onto the library."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcap import cli, run_dir
from jaxcap.config_files import default_workdir
from jaxcap.evaluation import runs
from tests.programs import Programs

REPO = Path(__file__).resolve().parents[1]
DEFAULT = {"config": "configs/transformer.py:synthetic"}


def test_default_workdir_names():
  assert default_workdir("configs/transformer.py:synthetic") == "runs/transformer_synthetic"
  assert default_workdir("/abs/configs/eta.py:synthetic,variant=stacked_v,gbc=tanh") == \
      "runs/eta_synthetic_variant-stacked_v_gbc-tanh"
  assert default_workdir("configs/aat.py") == "runs/aat"


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_train_py_default_workdir(tmp_path):
  """The default workdir is runs/<config name>, named by the refusal of a place that cannot be
  one (``runs`` is a file here); a refused data root is the only output: the ``workdir:`` line
  comes once the run's checks have passed, and nothing is written."""
  (tmp_path / "runs").write_text("a file")
  spec = "--config=configs/eta.py:synthetic,variant=stacked_v"
  with Programs() as programs:
    code, out, err = programs.run(["train.py", spec], tmp_path)
    assert code == 2 and out == "" and "--workdir=runs/eta_synthetic_variant-stacked_v" in err, err
    code, out, err = programs.run(["train.py", spec, "--config.data.name=karpathy",
                                   "--config.data.root=/nonexistent/x", "--workdir=wd"], tmp_path)
  assert code == 2 and "/nonexistent/x" in err and len(err.strip().splitlines()) == 1, err
  assert out == "", out
  assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.parametrize("argv,needle", [
    (["--config.batch_sze=8"], "config field batch_sze: unknown key in --config.batch_sze (did you mean batch_size?)"),
    (["--config", "configs/eta.py:synthetic", "--config.modle.dim=8"], "config field modle: unknown"),
    (["--config.data.num_train=9", "--config.data=3"], "config.data would overwrite config.data.num_train"),
    (["--config.decode=3"], "config field decode: a section"),
    (["--config.num_train_steps=1.5"], "config field num_train_steps: expected an int, got '1.5'"),
    (["--noconfig.test_after_training", "--config.learning_rate=x"], "config field learning_rate: expected a number"),
    (["--config=configs/mnmt.py:synthetic", "--config.model.fusion_tanh=maybe"],
     "config field model.fusion_tanh: expected true or false"),  # a None placeholder's declared type
    (["--config=nowhere.py"], "config file 'nowhere.py': not found"),
    (["--config=configs/eta.py:synthetic", "--config.model.dim=8", "--config", "configs/eta.py:coco"],
     "--config given 2 times"),
    (["--config.seed=0", "--config", "configs/eta.py:synthetic"], "--config.seed=0 comes before --config"),
])
def test_the_command_line_is_checked_before_absl_parses_it(argv, needle):
  with pytest.raises(ValueError, match=None) as e:
    cli.check_command_line(["train.py", *argv], DEFAULT)
  assert needle in str(e.value) and "expected" in str(e.value)


def test_a_good_command_line_passes_the_check():
  cli.check_command_line(["train.py", "--config", "configs/eta.py:synthetic,variant=stacked_v",
                          "--config.model.dim=64", "--config.data.num_train=100",
                          "--noconfig.test_after_training", "--config.learning_rate=1e-3",
                          "--workdir=/x"], DEFAULT)
  cli.check_command_line(["train.py", "--config.model.dtype=bfloat16"], DEFAULT)


def test_evaluate_decode_options():
  """--beam-size etc. onto the run's decode config; one beam is greedy only in the
  self-critical mode; --beam-groups makes a beam search (jaxcap.evaluation.runs.decode_options)."""
  from jaxcap import config_common as common
  base = common.decode_config().to_dict()

  def opts(**kw):
    d = runs.decode_options(base, **kw)
    return {k: d[k] for k in ("method", "beam_size", "beam_mode", "beam_groups", "diversity_strength")}

  plain = {"beam_groups": 1, "diversity_strength": 0.5}
  assert opts(beam_size=3) == {"method": "beam", "beam_size": 3, "beam_mode": "live", **plain}
  assert opts(beam_size=3, beam_mode="self_critical") == {
      "method": "beam", "beam_size": 3, "beam_mode": "self_critical", **plain}
  assert opts(beam_size=1)["method"] == "beam" and opts(beam_size=1, beam_mode="self_critical")["method"] == "greedy"
  assert opts(beam_size=6, beam_groups=3, diversity_strength=0.2) == {
      "method": "beam", "beam_size": 6, "beam_mode": "live", "beam_groups": 3, "diversity_strength": 0.2}
  assert opts(sample=True, beam_size=4)["method"] == "sample"


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_evaluate_py_maps_its_flags(tmp_path):
  """The program's flags reach the library: the decode flags (with their dash spellings) and
  --attributes (the evaluated split's attribute mode), seen in the refusal of a workdir whose
  checkpoints are missing."""
  from jaxcap import data as data_lib
  from jaxcap.papers.eta.configs import eta
  config = eta.get_config("synthetic")
  config.data.num_train, config.data.num_val, config.data.num_test = 64, 16, 16
  (tmp_path / "wd").mkdir()
  (tmp_path / "wd" / "config.json").write_text(json.dumps(run_dir.config_to_dict(config)))
  data_lib.get_dataset(config.data).vocab.save(str(tmp_path / "wd" / "vocab.json"))
  with Programs() as programs:
    code, _, err = programs.run(["evaluate.py", f"--workdir={tmp_path}/wd", "--attributes=none",
                                 "--beam-size=3", "--block-trigrams"], tmp_path)
  assert code == 2 and "--attributes=none" in err and "attends to attribute words" in err, err


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_evaluate_ensemble_refuses_different_vocabularies(tmp_path):
  """One line on stderr, exit code 2, before any data or checkpoint is read."""
  from configs import transformer
  from jaxcap.data.vocab import Vocab
  for name, words in (("a", ["dog", "cat"]), ("b", ["dog", "cat", "bird"])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(
        json.dumps(run_dir.config_to_dict(transformer.get_config("synthetic"))))
    Vocab(words).save(str(tmp_path / name / "vocab.json"))
  r = subprocess.run([sys.executable, str(REPO / "evaluate.py"),
                      f"--ensemble={tmp_path / 'a'},{tmp_path / 'b'}"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stderr[-2000:]
  assert len(r.stderr.strip().splitlines()) == 1 and "another vocabulary" in r.stderr, r.stderr


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_only_check_args_parses_a_command_without_running_it(tmp_path):
  """absl's --only_check_args: the command line is validated and parsed, nothing runs."""
  with Programs() as programs:
    ok = programs.run(["train.py", "--config=configs/aat.py:synthetic", "--config.model.dim=64",
                       "--only_check_args"], tmp_path)
    bad = programs.run(["train.py", "--config.model.dimm=64", "--only_check_args"], tmp_path)
  assert ok[0] == 0 and not list(tmp_path.iterdir()), ok
  assert bad[0] == 2 and "model.dimm" in bad[2]
