"""docs/DESIGN.md's sixth-paper walk-through, executed: a paper is its folder, its tests and one
registry line.

The test reads the walk-through (section 9: each file's path, then its code block), writes
exactly those files into a copy of the package — the registry line inserted into ``PAPERS`` —
and nothing else, then trains the toy with ``train.py`` and the shipped-config lookup
(``--config configs/toy.py:synthetic,tiny``), decodes it with beam search through
``evaluate.py`` and runs the paper's own test with pytest, each in a fresh process.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
      "jaxcap/papers/toy/README.md", "tests/papers/toy/test_model.py", "jaxcap/papers/__init__.py"}
  assert _added(files["jaxcap/papers/__init__.py"]).strip().startswith('"toy",')


@pytest.mark.slow
def test_a_sixth_paper_is_its_folder_its_tests_and_one_registry_line(tmp_path):
  ignore = shutil.ignore_patterns("__pycache__")
  for name in ("jaxcap", "configs"):
    shutil.copytree(REPO / name, tmp_path / name, ignore=ignore)
  for name in ("train.py", "evaluate.py", "pytest.ini", "tests/__init__.py", "tests/conftest.py"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / name, tmp_path / name)
  for path, text in walkthrough().items():
    target = tmp_path / path
    if path == "jaxcap/papers/__init__.py":  # the registry line goes into PAPERS
      source = target.read_text()
      target.write_text(source.replace("PAPERS = (\n", "PAPERS = (\n" + _added(text), 1))
    else:
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text(text)
  env = dict(os.environ, PYTHONPATH=str(tmp_path), XLA_FLAGS="--xla_backend_optimization_level=0")
  workdir = tmp_path / "runs" / "toy"

  def run(*args):
    r = subprocess.run([sys.executable, *map(str, args)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r

  run("train.py", "--config", "configs/toy.py:synthetic,tiny", f"--workdir={workdir}",
      "--config.test_after_training=False")
  r = run("evaluate.py", f"--workdir={workdir}", "--beam-size=3", "--split=test")
  assert "CIDEr" in r.stdout and (workdir / "predictions_test.json").exists()
  run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/papers/toy/test_model.py")
  # The copy ran, not the repository's package: the toy paper is nowhere else.
  assert not (REPO / "jaxcap" / "papers" / "toy").exists()
