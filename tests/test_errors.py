"""Two kinds of error (jaxcap/errors.py): a user's mistake is one line and exit 2; jaxcap's own
bug keeps its traceback, ends with one line saying whose error it is, and exits 1.

Before, ``cli.run_main`` printed every ``ValueError`` / ``KeyError`` as one line: a NumPy truth-
value test on an array inside a model read ``error: The truth value of an array with more than
one element is ambiguous...``, exit 2, as if the user had typed something wrong. The bad-input
corpus (tests/test_bad_inputs.py, tests/scripts/test_script_errors.py, tests/test_cli.py,
tests/test_serve.py) checks that every user mistake still gives its one line.
"""

import argparse
import textwrap

import pytest

import jaxcap
from jaxcap import cli, errors
from tests.programs import Programs

# train.py with one fault put into jaxcap's own code first (a bug, not the input's fault).
FAULTY_TRAIN = textwrap.dedent("""
  import os, runpy, sys
  import numpy as np
  fault = sys.argv.pop(1)
  if fault == "model":  # the issue's case: a truth-value test on an array, while the state is built
    from jaxcap.models import transformer
    def encode(self, batch, train=False):
      if np.zeros(2) > 0:
        pass
    transformer.TransformerCaptioner.encode = encode
  elif fault == "reader":  # a data reader that looks up a key its own code never wrote
    from jaxcap.data import synthetic
    def features(self, split, i):
      return {}["decoder"]
    synthetic.SyntheticScenes.features = features
  elif fault == "index":
    from jaxcap.training import train_lib
    def initial_state(self, *a, **k):
      return [][3]
    train_lib.Trainer.initial_state = initial_state
  sys.argv = [os.path.join(REPO_DIR, "train.py")] + sys.argv[1:]
  runpy.run_path(sys.argv[0], run_name="__main__")
""")


@pytest.mark.parametrize("fault,raised", [("model", "ValueError: The truth value of an array"),
                                          ("reader", "KeyError: 'decoder'"),
                                          ("index", "IndexError: list index out of range")])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_a_bug_in_a_model_or_a_reader_keeps_its_traceback_and_exits_1(tmp_path, fault, raised):
  from tests.programs import REPO
  script = tmp_path / "faulty_train.py"
  script.write_text(FAULTY_TRAIN.replace("REPO_DIR", repr(str(REPO))))
  with Programs() as programs:
    code, out, err = programs.run([script, fault, "--config=configs/transformer.py:synthetic,tiny",
                                   "--workdir=wd"], tmp_path)
  lines = err.strip().splitlines()
  assert code == errors.EXIT_BUG, (code, err[-3000:])
  assert "Traceback (most recent call last)" in err and raised in err, err[-3000:]
  assert lines[-1] == errors.bug_line(), lines[-3:]
  assert not any(line.startswith("error: ") for line in lines[:-1]), err[-3000:]  # not bad input too


def test_run_main_tells_bad_input_from_a_bug(capsys):
  def call(exc):
    def body():
      raise exc
    with pytest.raises(SystemExit) as e:
      cli.run_main(body, setup=False)
    return e.value.code, capsys.readouterr().err

  code, err = call(errors.BadInput("--beam-size: expected an int >= 1, got 0\nmore detail"))
  assert code == 2 and err == "error: --beam-size: expected an int >= 1, got 0\n"
  code, err = call(errors.BadKey("features.npz: no array 'feat'; expected feat"))
  assert code == 2 and err == "error: features.npz: no array 'feat'; expected feat\n"  # no quotes
  for exc in (ValueError("operands could not be broadcast"), KeyError("decoder"), IndexError("3"),
              TypeError("unhashable type: 'list'")):
    code, err = call(exc)
    assert code == 1 and "Traceback (most recent call last)" in err, err
    assert f"{type(exc).__name__}: " in err and err.strip().splitlines()[-1] == errors.bug_line(), err
  code, err = call(FileNotFoundError(2, "No such file or directory", "runs/x/config.json"))
  assert code == 2 and err.startswith("error: runs/x/config.json: No such file"), err


def test_the_bad_input_types_are_the_builtin_types_too():
  # A notebook catches bad input alone (jaxcap.BadInput); code written against the built-in
  # types keeps catching them.
  assert jaxcap.BadInput is errors.BadInput and "BadInput" in dir(jaxcap)
  for cls, builtin in ((errors.BadKey, KeyError), (errors.BadIndex, IndexError), (errors.BadType, TypeError)):
    assert issubclass(cls, errors.BadInput) and issubclass(cls, builtin) and issubclass(cls, ValueError)
  assert str(errors.BadKey("x: expected y")) == "x: expected y"


def test_the_python_api_raises_bad_input_for_a_user_s_mistake(tmp_path):
  with pytest.raises(jaxcap.BadInput, match="no_such_dataset"):
    jaxcap.get_config("transformer.py:no_such_dataset")
  with pytest.raises(jaxcap.BadInput):
    jaxcap.load(str(tmp_path))  # not a run directory
  refs = {1: ["a cat on a mat"]}
  with pytest.raises(jaxcap.BadInput, match="NOPE"):
    jaxcap.score(refs, {1: "a cat"}, metrics=["NOPE"])
  with pytest.raises(jaxcap.BadInput):
    jaxcap.score(refs, {2: "a dog"}, metrics=["CIDEr"])  # an image without references


def test_argparse_programs_refuse_in_one_line_without_patching_argparse(capsys):
  p = cli.ArgumentParser(prog="tool")
  p.add_argument("--steps", type=cli.positive_int, required=True)
  with pytest.raises(errors.BadInput, match=r"^--steps: expected an integer >= 1, got '0'$"):
    p.parse_args(["--steps", "0"])
  with pytest.raises(errors.BadInput, match="required: --steps; expected the flags"):
    p.parse_args([])
  # argparse itself is untouched: a plain parser still prints its usage and exits 2.
  plain = argparse.ArgumentParser(prog="plain")
  plain.add_argument("--n", type=int)
  with pytest.raises(SystemExit) as e:
    plain.parse_args(["--n", "x"])
  assert e.value.code == 2 and "usage: plain" in capsys.readouterr().err
  assert argparse.ArgumentParser.error is not cli.ArgumentParser.error


# ---------------------------------------------------------------------------- every program
# Every program a user runs (a file with a __main__ block: train.py, evaluate.py, the commands,
# python -m modules, scripts, table scripts, benchmarks), found by looking, not listed by hand.
# Those that read no command line (nothing to plant a fault in) are named with why.
_REPO_DIR = __import__("pathlib").Path(__file__).resolve().parents[1]
NO_COMMAND_LINE = {
    "jaxcap/data/synthetic.py": "a developer's timing of the scene generator, no arguments",
    "jaxcap/papers/__main__.py": "prints the papers' table; reads no input",
}
# Fixture generators: a developer's tools, run with torch and the producers' code to write the
# test fixtures (not installed, not documented for users); a raw traceback is their interface.
DEVELOPER_TOOLS = {"scripts/detection/make_frcnn_fixture.py", "scripts/detection/make_caffe_resize_fixture.py",
                   "scripts/detection/make_bua_fixture.py",
                   "scripts/detection/make_frcnn_photos_fixture.py",
                   "scripts/self_critical/make_import_fixture.py",
                   "scripts/self_critical/make_prepro_feats_fixture.py"}
# The reference side of a benchmark, run by the benchmark under a Python with torch and the
# producer's code (its job file written by the benchmark, not by a user).
DEVELOPER_TOOLS |= {"benchmarks/side_by_side_torch.py"}
# A bug planted where every program reads its command line: argparse's parse (every argparse
# program, cli.ArgumentParser included) and absl's flag parse (cli.parse_flags).
PLANTED = textwrap.dedent("""
  import argparse
  from absl import flags
  def planted(*a, **k):
    raise KeyError("planted bug")
  argparse.ArgumentParser.parse_args = planted
  argparse.ArgumentParser.parse_known_args = planted
  flags.FlagValues.__call__ = planted
""")


def user_programs() -> list[list[str]]:
  """The argv prefix of every program: ``[file.py]`` or ``["-m", module]`` for a package file."""
  out = []
  for path in sorted(_REPO_DIR.rglob("*.py")):
    rel = path.relative_to(_REPO_DIR).as_posix()
    if rel.split("/")[0] in ("tests", ".venv", ".anchors", "build", ".cache") or "/." in "/" + rel:
      continue
    text = path.read_text(errors="replace")
    if 'if __name__ == "__main__"' not in text or rel in NO_COMMAND_LINE or rel in DEVELOPER_TOOLS:
      continue
    if rel.startswith("jaxcap/"):
      module = rel[:-3].replace("/", ".").removesuffix(".__main__")
      out.append(["-m", module])
    else:
      out.append([rel])
  return out


def test_the_programs_are_found():
  found = {" ".join(p) for p in user_programs()}
  assert {"train.py", "evaluate.py", "-m jaxcap.commands.serve", "-m jaxcap.detection.extract",
          "benchmarks/run.py", "scripts/extract_features.py"} <= found, found
  assert all((_REPO_DIR / p).exists() for p in [*NO_COMMAND_LINE, *DEVELOPER_TOOLS])


@pytest.mark.slow  # ~50 programs, each importing its modules in a forked process
def test_a_bug_in_any_program_keeps_its_traceback_and_exits_1(tmp_path):
  from tests.programs import Programs as Server  # noqa: PLC0415
  wrong = []
  with Server() as programs:
    for argv in user_programs():
      code, out, err = programs.run(argv, cwd=tmp_path, prelude=PLANTED)
      lines = [l for l in err.strip().splitlines() if l.strip()]
      if not (code == 1 and "Traceback" in err and "KeyError: 'planted bug'" in err
              and lines and lines[-1] == errors.bug_line()):
        wrong.append(f"{' '.join(argv)}: exit {code}, last line {lines[-1] if lines else ''!r}")
  assert not wrong, "\n".join(wrong)
