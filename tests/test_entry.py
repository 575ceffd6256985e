"""The console scripts' guard (:mod:`jaxcap.entry`): without the ``train`` extra every program is
one line naming the install it needs, exit 2; a missing module of jaxcap's own or of the base
install keeps its traceback. tests/test_export.py runs the installed scripts of a real
``pip install .`` (slow); here the extra's modules are blocked in a fresh interpreter."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from jaxcap import entry

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]  # {"jaxcap-train": "jaxcap.entry:train", ...}
BASE = {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
# Imported by jaxcap only inside a try that turns their absence into its own one-line error.
OPTIONAL = {"torch", "nltk"}


def _train_distributions() -> list[str]:
  """requirements.txt's distributions (the ``train`` extra) beyond pyproject's dependencies."""
  lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
  return [n for n in (Requirement(ln).name.lower() for ln in lines if ln) if n not in BASE]


@functools.cache
def _packages_distributions() -> dict:
  return md.packages_distributions()  # every installed distribution's files read: once


def _top_level_names(dists) -> set[str]:
  """The top-level import names the installed distributions ``dists`` provide."""
  wanted = {d.replace("_", "-") for d in dists}
  return {top for top, owners in _packages_distributions().items()
          if any(o.lower().replace("_", "-") in wanted for o in owners) and top.isidentifier()}


def _third_party_imports() -> set[str]:
  """Top-level names of every non-stdlib module jaxcap's code imports (anywhere in a file)."""
  names = set()
  for path in (REPO / "jaxcap").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        names |= {a.name.split(".")[0] for a in node.names}
      elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        names.add(node.module.split(".")[0])
  return {n for n in names if n not in sys.stdlib_module_names and n != "jaxcap"}


def test_every_console_script_goes_through_the_guard_to_its_program():
  calls = []
  for script, target in SCRIPTS.items():
    module, _, attr = target.partition(":")
    assert module == "jaxcap.entry", (script, target)
    saved = entry.run_program
    entry.run_program = lambda prog, mod: calls.append((prog, mod))
    try:
      getattr(entry, attr)()
    finally:
      entry.run_program = saved
    prog, mod = calls[-1]
    assert prog == script, (script, prog)
    # The program it runs exists and has its run() (read, not imported: absl flags are global).
    path = REPO / (mod.replace(".", "/") + ".py")
    assert mod.startswith("jaxcap.commands.") and path.is_file(), (script, mod)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in ast.parse(path.read_text()).body), mod
  assert len(calls) == len(SCRIPTS) and "jaxcap-serve" in SCRIPTS


def test_the_guards_list_is_the_train_extra_and_covers_every_import():
  train_tops = _top_level_names(_train_distributions())
  used = _third_party_imports()
  base_tops = _top_level_names(BASE) | {"PIL", "jaxlib"}
  # Every third-party module jaxcap imports is the base install's, the train extra's (listed in
  # the guard) or optional (handled where it is imported).
  assert used - base_tops - entry.TRAIN_MODULES - OPTIONAL == set()
  # What the guard lists is the train extra's (not a base module, whose absence is a broken
  # base install, not a missing extra), and each train module jaxcap imports is listed.
  assert entry.TRAIN_MODULES <= train_tops, entry.TRAIN_MODULES - train_tops
  assert not entry.TRAIN_MODULES & base_tops
  assert (used & train_tops) - base_tops <= entry.TRAIN_MODULES


# The base install in one fresh interpreter: the train extra's modules are not there. Each
# program runs in turn (--help: without the extra it cannot even list its flags, they are absl's)
# and leaves its exit code, stdout and stderr.
BLOCKED = textwrap.dedent("""
  import contextlib, io, json, sys
  for name in sys.argv[2].split(","):
    sys.modules[name] = None
  from jaxcap import entry
  out = {}
  for attr in sys.argv[1].split(","):
    sys.argv = [attr, "--help"]
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
      try:
        getattr(entry, attr)()
      except SystemExit as e:
        code = e.code
      except BaseException as e:  # a traceback would have ended the program: exit 1
        code = 1
        print(repr(e), file=sys.stderr)
    out[attr] = [code, stdout.getvalue(), stderr.getvalue()]
  print(json.dumps(out))
""")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_every_program_without_the_train_extra_is_one_line_naming_the_extra(tmp_path):
  blocked = sorted(_top_level_names(_train_distributions()))
  assert {"absl", "flax", "aiohttp", "pycocoevalcap"} <= set(blocked)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  attrs = {target.partition(":")[2]: script for script, target in SCRIPTS.items()}
  proc = subprocess.run([sys.executable, "-c", BLOCKED, ",".join(attrs), ",".join(blocked)],
                        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout)
  assert set(got) == set(attrs)
  for attr, (code, out, err) in got.items():
    script = attrs[attr]
    assert code == 2 and out == "", (script, code, out, err[-2000:])
    lines = err.splitlines()
    assert len(lines) == 1, (script, err[-2000:])
    assert re.fullmatch(rf"error: {script} needs the training install \(no module named '\w+'\); "
                        r"expected jaxcap installed with its train extra: pip install \"\.\[train\]\" .*",
                        lines[0]), lines[0]
  assert list(tmp_path.iterdir()) == []  # nothing written


def _module(tmp_path, monkeypatch, name: str, body: str) -> str:
  (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, name, raising=False)
  return name


@pytest.mark.parametrize("where", ["import", "run"])
def test_a_missing_train_module_is_one_line_exit_2(tmp_path, monkeypatch, capsys, where):
  monkeypatch.setitem(sys.modules, "aiohttp", None)  # as if not installed
  body = ("import aiohttp\ndef run():\n  print('ran')\n" if where == "import" else
          "def run():\n  from aiohttp import web\n  print('ran')\n")  # a program's lazy import
  mod = _module(tmp_path, monkeypatch, f"fake_program_{where}", body)
  with pytest.raises(SystemExit) as e:
    entry.run_program("jaxcap-fake", mod)
  assert e.value.code == 2
  out, err = capsys.readouterr()
  assert out == ""
  assert err.count("\n") == 1 and err.startswith("error: jaxcap-fake needs the training install "
                                                 "(no module named 'aiohttp'); expected"), err
  assert '".[train]"' in err


@pytest.mark.parametrize("missing", ["jaxcap.no_such_module", "PIL", "no_such_dependency"])
def test_a_missing_module_that_is_not_the_extras_keeps_its_traceback(tmp_path, monkeypatch, capsys, missing):
  # jaxcap's own: a bug; the base install's (PIL): a broken install; anything else: not the
  # extra's to name. Each stays the ModuleNotFoundError it is.
  monkeypatch.setitem(sys.modules, "PIL", None)
  mod = _module(tmp_path, monkeypatch, "fake_program_bug", f"import {missing}\ndef run():\n  pass\n")
  with pytest.raises(ModuleNotFoundError) as e:
    entry.run_program("jaxcap-fake", mod)
  assert e.value.name == missing
  assert capsys.readouterr().err == ""


def test_a_program_with_its_modules_runs_and_keeps_its_exit_code(tmp_path, monkeypatch, capsys):
  mod = _module(tmp_path, monkeypatch, "fake_program_ok",
                "import sys, aiohttp\ndef run():\n  print('ran', sys.argv[1:])\n  sys.exit(3)\n")
  monkeypatch.setattr(sys, "argv", ["jaxcap-fake", "--flag"])
  with pytest.raises(SystemExit) as e:
    entry.run_program("jaxcap-fake", mod)
  assert e.value.code == 3
  assert capsys.readouterr() == ("ran ['--flag']\n", "")


def test_a_missing_program_module_keeps_its_traceback():
  with pytest.raises(ModuleNotFoundError, match="jaxcap.commands.no_such_program"):
    entry.run_program("jaxcap-fake", "jaxcap.commands.no_such_program")


def test_the_guard_imports_the_standard_library_only():
  # It runs where only the base install is: anything it imported at module level would fail first.
  tree = ast.parse(Path(entry.__file__).read_text())
  tops = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
  tops |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
  assert tops - {"__future__"} <= sys.stdlib_module_names, tops
