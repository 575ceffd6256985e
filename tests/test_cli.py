"""Command-line helpers shared by train.py and evaluate.py."""

import json
import subprocess
import sys
from pathlib import Path

from jaxcap import cli
from jaxcap.cli import default_workdir

REPO = Path(__file__).resolve().parents[1]


def test_default_workdir_names():
  assert default_workdir("configs/transformer.py:synthetic") == "runs/transformer_synthetic"
  assert default_workdir("/abs/configs/eta.py:synthetic,variant=stacked_v,gbc=tanh") == \
      "runs/eta_synthetic_variant-stacked_v_gbc-tanh"
  assert default_workdir("configs/aat.py") == "runs/aat"


def test_train_py_default_workdir(tmp_path):
  # A bad override stops the run after the workdir is chosen (and before anything is written).
  r = subprocess.run([sys.executable, str(REPO / "train.py"),
                      "--config=configs/eta.py:synthetic,variant=stacked_v",
                      "--config.data.name=karpathy", "--config.data.root=/nonexistent/x"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "/nonexistent/x" in r.stderr
  assert "workdir: runs/eta_synthetic_variant-stacked_v\n" in r.stdout
  assert not list(tmp_path.iterdir())


def test_evaluate_beam_mode_flag():
  """--beam-mode reaches the decode config; one beam is greedy only in the self-critical mode."""
  code = (
      "import json, sys, ml_collections\n"
      "from absl import flags\n"
      "import evaluate\n"
      "flags.FLAGS(['evaluate.py'] + sys.argv[1:])\n"
      "from configs import common\n"
      "d = evaluate.decode_overrides(ml_collections.ConfigDict({'decode': common.decode_config()}))\n"
      "print(json.dumps({'method': d.method, 'beam_size': d.beam_size, 'beam_mode': d.beam_mode,\n"
      "                  'beam_groups': d.beam_groups, 'diversity_strength': d.diversity_strength}))\n")

  def overrides(*args):
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

  plain = {"beam_groups": 1, "diversity_strength": 0.5}
  assert overrides("--beam-size=3") == {"method": "beam", "beam_size": 3, "beam_mode": "live", **plain}
  assert overrides("--beam-size", "3", "--beam-mode", "self_critical") == {
      "method": "beam", "beam_size": 3, "beam_mode": "self_critical", **plain}
  assert overrides("--beam-size=1") == {"method": "beam", "beam_size": 1, "beam_mode": "live", **plain}
  assert overrides("--beam-size=1", "--beam-mode=self_critical")["method"] == "greedy"
  # Diverse beam search: --beam-groups makes the method a beam search.
  assert overrides("--beam-size=6", "--beam-groups=3", "--diversity-strength=0.2") == {
      "method": "beam", "beam_size": 6, "beam_mode": "live", "beam_groups": 3,
      "diversity_strength": 0.2}


def test_evaluate_ensemble_refuses_different_vocabularies(tmp_path):
  """One line on stderr, exit code 2, before any data or checkpoint is read."""
  from configs import transformer
  from jaxcap.data.vocab import Vocab
  from jaxcap.run_dir import config_to_dict
  for name, words in (("a", ["dog", "cat"]), ("b", ["dog", "cat", "bird"])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(
        json.dumps(config_to_dict(transformer.get_config("synthetic"))))
    Vocab(words).save(str(tmp_path / name / "vocab.json"))
  r = subprocess.run([sys.executable, str(REPO / "evaluate.py"),
                      f"--ensemble={tmp_path / 'a'},{tmp_path / 'b'}"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stderr[-2000:]
  assert len(r.stderr.strip().splitlines()) == 1 and "another vocabulary" in r.stderr, r.stderr


def test_evaluate_attributes_flag():
  """--attributes sets the evaluated split's attribute mode (test: data.test_attributes)."""
  code = (
      "import json, sys, ml_collections\n"
      "from absl import flags\n"
      "import evaluate\n"
      "flags.FLAGS(['evaluate.py'] + sys.argv[1:])\n"
      "from jaxcap.papers.eta.configs import eta\n"
      "d = evaluate.data_overrides(eta.get_config('synthetic'))\n"
      "print(json.dumps({'attributes': d.attributes, 'test_attributes': d.test_attributes}))\n")

  def overrides(*args):
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

  assert overrides() == {"attributes": "noisy", "test_attributes": ""}
  assert overrides("--attributes=oracle") == {"attributes": "noisy", "test_attributes": "oracle"}
  assert overrides("--attributes=none", "--split=val") == {"attributes": "none",
                                                           "test_attributes": ""}


def test_config_flag_defined_in_an_own_empty_flag_values():
  # An empty FlagValues is falsy: it must still be the one used, not absl's global FLAGS.
  from absl import flags
  name = "config_of_an_own_flag_values"  # a name no program defines in the global FLAGS
  fv = flags.FlagValues()
  cli.define_config(name, "configs/transformer.py:synthetic", "cfg", flag_values=fv)
  assert name in fv and name not in flags.FLAGS
  cli.parse_flags(["train.py", f"--{name}.num_train_steps=7"], flag_values=fv)
  assert fv[name].value.num_train_steps == 7
