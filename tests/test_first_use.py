"""What a user meets first (issue 55): the check that checks, help that helps, a did-you-mean
for flags, nothing printed before a refusal, a config file that does not run, and values that
were accepted in silence (an SCST start after the last step, a beam wider than the vocabulary).

Every case runs the program as a user does (tests/programs.py: a forked process per run) and
asserts the project's contract: a refusal is one ``error:`` line naming the flag, field or file
and what was expected, exit code 2, nothing else on stdout or stderr and nothing written.

Each test here failed on the code before the change: ``--only_check_args`` exited 0 on values
the run refuses and printed nothing on success; ``--help`` exited 1 listing no flag; an unknown
flag had no suggestion; a refused value printed ``workdir:`` first; a config file with a syntax
error or a raising ``get_config`` ended in a traceback (exit 1); ``scst.start_step`` beyond the
last step and ``--beam-size 100000`` were accepted.
"""

import json

import pytest

from jaxcap import run_dir
from jaxcap.training import validation
from tests.programs import Programs

TINY = "--config=configs/transformer.py:synthetic,tiny"


@pytest.fixture(scope="module")
def programs():
  with Programs() as p:
    yield p


def _refused(result, *needles):
  """The contract of a refusal: exit 2, one ``error:`` line holding every needle, nothing else."""
  code, out, err = result
  assert code == 2, (code, out, err[-2000:])
  assert out == "" and len(err.strip().splitlines()) == 1, (out, err)
  assert err.startswith("error: ") and "expected" in err, err
  for needle in needles:
    assert needle in err, (needle, err)
  return err.strip()


def _eval_workdir(tmp_path, **decode):
  """A workdir as evaluate.py reads it first: the run's config.json and vocab.json."""
  from jaxcap import config_files
  from jaxcap import data as data_lib
  config = config_files.load("configs/transformer.py:synthetic,tiny")
  config.decode.update(decode)
  wd = tmp_path / "wd"
  wd.mkdir()
  (wd / "config.json").write_text(json.dumps(run_dir.config_to_dict(config)))
  data_lib.get_dataset(config.data).vocab.save(str(wd / "vocab.json"))
  return wd


def _files(root):
  return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---------------------------------------------------------------------------- 1. the check checks
@pytest.mark.parametrize("override,needle", [
    ("--config.num_train_steps=-5", "config field num_train_steps"),
    ("--config.decode.method=beem", "config field decode.method"),
    ("--config.scst.start_step=0", "config field scst.reward"),  # a relation: bleu on device
])
def test_only_check_args_runs_the_runs_value_checks(programs, tmp_path, override, needle):
  extra = ["--config.scst.bleu_weight=0.5"] if "start_step" in override else []
  _refused(programs.run(["train.py", TINY, override, *extra, "--only_check_args"], tmp_path), needle)
  assert _files(tmp_path) == []


def test_only_check_args_says_it_passed_and_runs_nothing(programs, tmp_path):
  code, out, err = programs.run(["train.py", TINY, "--workdir", "wd", "--only_check_args"], tmp_path)
  assert code == 0 and err == "", err
  assert len(out.strip().splitlines()) == 1 and out.startswith("ok: ") and "--only_check_args" in out
  assert _files(tmp_path) == []
  # A workdir that cannot be written is the run's check too.
  (tmp_path / "file").write_text("x")
  _refused(programs.run(["train.py", TINY, "--workdir", "file/wd", "--only_check_args"], tmp_path),
           "--workdir=file/wd")


def test_evaluate_only_check_args(programs, tmp_path):
  _refused(programs.run(["evaluate.py", "--only_check_args"], tmp_path), "no --workdir")
  wd = _eval_workdir(tmp_path)
  before = _files(tmp_path)
  code, out, err = programs.run(["evaluate.py", f"--workdir={wd}", "--beam-size=3",
                                 "--only_check_args"], tmp_path)
  assert code == 0 and out.startswith("ok: ") and err == "", (out, err)
  # A decoding flag's value is refused by the flag as typed, not by the config field it sets.
  for argv, needle in [(["--temperature=-1"], "--temperature: "), (["--beam-size", "0"], "--beam-size: "),
                       (["--beam_size=0"], "--beam_size: "), (["--max-len=0"], "--max-len: "),
                       (["--top_p=2"], "--top_p: ")]:
    code, out, err = programs.run(["evaluate.py", f"--workdir={wd}", *argv, "--only_check_args"], tmp_path)
    _refused((code, out, err), needle)
    assert "config field" not in err, err
  # The other values the run checks before it reads anything.
  for argv, needle in [([f"--ensemble={wd},{wd}", "--ensemble-weights=1,nan"], "--ensemble-weights=1,nan"),
                       ([f"--workdir={wd}", "--batch_size=0"], "--batch_size=0"),
                       ([f"--workdir={wd}", "--server=test2014", "--att_dir=a", "--fc_dir=f", "--alg=a_b"],
                        "--alg=a_b")]:
    _refused(programs.run(["evaluate.py", *argv, "--only_check_args"], tmp_path), needle)
  assert _files(tmp_path) == before


# ---------------------------------------------------------------------------- 2. help that helps
@pytest.mark.parametrize("program,flags", [
    (["train.py"], ["--workdir", "--dry_run", "--print_config", "--config"]),
    (["evaluate.py"], ["--workdir", "--beam_size", "--predictions", "--ensemble"]),
    (["{console}"], ["--workdir", "--dry_run", "--print_config", "--config"]),  # jaxcap-train
])
def test_help_lists_the_programs_own_flags_and_exits_0(programs, tmp_path, program, flags):
  console = tmp_path / "jaxcap-train"  # what pip's console script runs
  console.write_text("import sys\nfrom jaxcap.entry import train\nsys.exit(train())\n")  # pyproject's target
  argv = [str(console) if a == "{console}" else a for a in program]
  for help_flag in ("--help", "-h"):
    code, out, err = programs.run([*argv, help_flag], tmp_path)
    assert code == 0 and err == "", (code, err[-2000:])
    for flag in flags:
      assert flag in out, (flag, out)
    assert "Run directory" in out  # the flags' help text, not only their names
    assert len(out.splitlines()) < 100  # not absl's 169 lines
  if "--config" in flags:
    assert "config fields: see --print_config" in out and "docs/USAGE.md" in out
  code, out, _ = programs.run([*argv, "--helpfull"], tmp_path)
  assert code == 0 and "--only_check_args" in out


def test_print_config_prints_the_resolved_config_and_runs_nothing(programs, tmp_path):
  code, out, err = programs.run(["train.py", TINY, "--config.batch_size=3", "--config.model.dim=48",
                                 "--print_config"], tmp_path)
  assert code == 0 and err == "", err
  lines = out.splitlines()
  assert "config.batch_size = 3" in lines and "config.model.dim = 48" in lines
  assert "config.num_train_steps = 4" in lines  # the file's argument (tiny)
  assert "config.data.name = 'synthetic_scenes'" in lines
  assert _files(tmp_path) == []
  # Still the command line's checks: a misspelt field is refused.
  _refused(programs.run(["train.py", "--config.batch_sze=3", "--print_config"], tmp_path),
           "did you mean batch_size?")


# ---------------------------------------------------------------------------- 3. did you mean
@pytest.mark.parametrize("argv,line", [
    (["train.py", "--workdr=x"], "error: unknown flag --workdr; did you mean --workdir?"),
    (["train.py", "--dryrun"], "error: unknown flag --dryrun; did you mean --dry_run?"),
    (["train.py", "--nodry_rn"], "error: unknown flag --nodry_rn; did you mean --nodry_run?"),
    (["evaluate.py", "--beam_sise=3"], "error: unknown flag --beam_sise; did you mean --beam_size?"),
])
def test_a_misspelt_flag_gets_a_suggestion(programs, tmp_path, argv, line):
  code, out, err = programs.run(argv, tmp_path)
  assert (code, out, err.strip()) == (2, "", f"{line} (expected one of the flags --help lists)")


def test_an_unknown_flag_without_a_close_one(programs, tmp_path):
  _refused(programs.run(["train.py", "--qqqqqqqq=1"], tmp_path), "unknown flag --qqqqqqqq",
           "the flags --help lists")


# ---------------------------------------------------------------------------- 4. nothing before
@pytest.mark.parametrize("override", ["--config.num_train_steps=-5", "--config.decode.method=beem"])
def test_a_refused_value_is_the_only_output(programs, tmp_path, override):
  _refused(programs.run(["train.py", TINY, override], tmp_path), override.split("=")[0][9:])
  assert _files(tmp_path) == []


# ---------------------------------------------------------------------------- 5. a config that does not run
@pytest.mark.parametrize("text,needles", [
    ("def get_config(arg=None):\n  return {\n", ["bad.py, line 2: '{' was never closed"]),
    ("def get_config(arg=None):\n  x = {}\n  return x['missing']\n",
     ["bad.py, line 3: get_config(None) raised KeyError: 'missing'"]),
    ("import jaxcap_no_such_module\n", ["bad.py, line 1: importing it raised ModuleNotFoundError"]),
    ("x = 1\n", ["bad.py: no get_config"]),
])
@pytest.mark.parametrize("check", [[], ["--only_check_args"]])
def test_a_config_file_that_does_not_run_is_one_line(programs, tmp_path, text, needles, check):
  (tmp_path / "bad.py").write_text(text)
  _refused(programs.run(["train.py", "--config=bad.py", *check], tmp_path), *needles)
  assert _files(tmp_path) == ["bad.py"]


# ---------------------------------------------------------------------------- 6. silent accepts
def test_scst_start_after_the_last_step_is_refused(programs, tmp_path):
  from jaxcap import config_files
  config = config_files.load("configs/transformer.py:synthetic,tiny")
  config.scst.start_step = 4  # num_train_steps 4: no step would be self-critical
  with pytest.raises(ValueError, match="scst.start_step: 4 .*num_train_steps \\(4\\)"):
    validation.check_config(config)
  config.scst.start_step = 3
  validation.check_config(config)
  config.scst.start_step, config.scst.start_epoch = 9, 0  # the epoch decides
  validation.check_config(config)
  _refused(programs.run(["train.py", TINY, "--config.scst.start_step=50", "--config.num_train_steps=5",
                         "--only_check_args"], tmp_path),
           "config field scst.start_step", "config field num_train_steps (5)")


def test_evaluate_refuses_a_beam_wider_than_the_vocabulary(programs, tmp_path):
  wd = _eval_workdir(tmp_path)
  words = len(run_dir.read_vocab(str(wd)))
  before = _files(tmp_path)
  for check in ([], ["--only_check_args"]):
    _refused(programs.run(["evaluate.py", f"--workdir={wd}", "--beam-size", "100000", *check],
                          tmp_path), "--beam-size=100000", f"({words} words)", f"at most {words}")
  assert _files(tmp_path) == before


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_evaluate_refuses_the_runs_own_beam_wider_than_the_vocabulary(programs, tmp_path):
  wd = _eval_workdir(tmp_path, method="beam", beam_size=5000)
  _refused(programs.run(["evaluate.py", f"--workdir={wd}"], tmp_path),
           "config field decode.beam_size (5000")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_train_refuses_a_beam_wider_than_the_vocabulary(tmp_path):
  from jaxcap import config_files
  from jaxcap import data as data_lib
  config = config_files.load("configs/transformer.py:synthetic,tiny")
  dataset = data_lib.get_dataset(config.data)
  words = len(dataset.vocab)
  config.decode.update(method="beam", beam_size=words + 1)
  with pytest.raises(ValueError, match=f"config field decode.beam_size: {words + 1} .*"
                                       f"\\({words} words\\); expected at most {words}"):
    validation.check_data(dataset, config, log=lambda *a: None)
  config.decode.beam_size = words
  validation.check_data(dataset, config, log=lambda *a: None)
  config.decode.update(method="greedy", beam_size=words + 1)  # a beam it does not use
  validation.check_data(dataset, config, log=lambda *a: None)
