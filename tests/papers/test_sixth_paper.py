"""docs/DESIGN.md's sixth-paper walk-through, executed: a paper is its folder, its tests and one
registry line.

The test reads the walk-through (section 9: each file's path, then its code block), writes
exactly those files into a copy of the whole checkout (its tracked and untracked files, as git
lists them) — the registry line inserted into ``PAPERS`` — and nothing else. In that copy, each
in a fresh process: ``train.py`` trains the toy through the shipped-config lookup (``--config
configs/toy.py:synthetic,tiny``), ``evaluate.py`` decodes it with beam search, pytest runs the
paper's own test and every test marked ``paper_gate`` (the shared tests that ask something of
every registered paper: its attention-aux or no-attention declaration, decode-length case,
bad-input cases, Flickr8k status, scripts, config fields, model-table rows). Then, with the
toy's declarations removed (its ``shared_cases.py``, its ``FLICKR8K_NOT_ROWS``), the gates run
again and must reject it: the test fails if a gate no longer sees a new paper.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests import fast_compile

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "DESIGN.md"


def walkthrough() -> dict[str, str]:
  """``{path: text}`` of the walk-through's files (section 9 of docs/DESIGN.md)."""
  section = DESIGN.read_text().split("## 9. A sixth paper, step by step", 1)[1]
  found = re.findall(r"^`([\w./]+)` —.*?:\n\n```\w*\n(.*?)```", section, re.S | re.M)
  return {path: text for path, text in found}


def _added(diff: str) -> str:
  """The lines a diff block adds (``+`` lines, without the ``+``)."""
  return "".join(l[1:] + "\n" for l in diff.splitlines() if l.startswith("+"))


def test_the_walkthrough_lists_the_paper_s_files():
  files = walkthrough()
  assert set(files) == {
      "jaxcap/papers/toy/model.py", "jaxcap/papers/toy/__init__.py",
      "jaxcap/papers/toy/configs/__init__.py", "jaxcap/papers/toy/configs/toy.py",
      "jaxcap/papers/toy/README.md", "tests/papers/toy/__init__.py",
      "tests/papers/toy/shared_cases.py", "tests/papers/toy/test_model.py",
      "jaxcap/papers/__init__.py"}
  assert _added(files["jaxcap/papers/__init__.py"]).strip().startswith('"toy",')


def _checkout_files() -> list[str]:
  """The checkout's files as git lists them: tracked, and untracked but not ignored."""
  out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                       capture_output=True, text=True, check=True).stdout
  return [f for f in out.split("\0") if f and ((REPO / f).is_file() or (REPO / f).is_symlink())]


# The gates that must reject the toy without its declarations (test name -> what it misses).
REJECTING_GATES = {
    "test_attention_aux.py::test_every_model_is_covered": "NO_ATTENTION",
    "test_decode_length.py::test_every_decoding_model_is_covered": "DECODE_LENGTH_CASES",
    "test_bad_inputs.py::test_corpus_size": "BAD_INPUT_CASES",
    "test_table_scripts.py::test_flickr8k_table_configs_and_stage_settings": "FLICKR8K_NOT_ROWS",
}


@pytest.mark.slow
def test_a_sixth_paper_is_its_folder_its_tests_and_one_registry_line(tmp_path):
  root = tmp_path / "checkout"
  for rel in _checkout_files():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    if (REPO / rel).is_symlink():  # the checkout's configs/ -> jaxcap/configs
      os.symlink(os.readlink(REPO / rel), root / rel)
    else:
      shutil.copy2(REPO / rel, root / rel)
  for path, text in walkthrough().items():
    target = root / path
    if path == "jaxcap/papers/__init__.py":  # the registry line goes into PAPERS
      source = target.read_text()
      target.write_text(source.replace("PAPERS = (\n", "PAPERS = (\n" + _added(text), 1))
    else:
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text(text)
  env = dict(os.environ, PYTHONPATH=str(root), XLA_FLAGS=fast_compile.FLAGS)
  env.pop("PYTEST_XDIST_WORKER", None)
  workdir = root / "runs" / "toy"

  def run(*args, ok=True):
    r = subprocess.run([sys.executable, *map(str, args)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=900)
    if ok:
      assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
      assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r

  run("train.py", "--config", "configs/toy.py:synthetic,tiny", f"--workdir={workdir}",
      "--config.test_after_training=False")
  r = run("evaluate.py", f"--workdir={workdir}", "--beam-size=3", "--split=test")
  assert "CIDEr" in r.stdout and (workdir / "predictions_test.json").exists()
  pytest_args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf"]
  run(*pytest_args, "tests/papers/toy/test_model.py")
  r = run(*pytest_args, "-m", "paper_gate", "tests")
  assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-3000:]
  # Without its declarations the gates reject the toy.
  (root / "tests" / "papers" / "toy" / "shared_cases.py").unlink()
  init = root / "jaxcap" / "papers" / "toy" / "__init__.py"
  init.write_text(init.read_text().replace("FLICKR8K_NOT_ROWS", "_UNDECLARED"))
  r = run(*pytest_args, "-m", "paper_gate", "tests", ok=False)
  failed = {l.split(" ")[1].split("/")[-1] for l in r.stdout.splitlines() if l.startswith("FAILED ")}
  assert r.returncode == 1 and set(REJECTING_GATES) <= failed, (failed, r.stdout[-3000:])
  # The copy ran, not the repository's package: the toy paper is nowhere else.
  assert not (REPO / "jaxcap" / "papers" / "toy").exists()
