"""jaxcap as an installed package: a fresh virtual environment, ``pip install -e ".[train]"``
(and ``pip install --no-deps .``), then, from another directory, the README's Python API snippet
on a finished run, and the console scripts.

The new environments reuse this one's installed dependencies through a ``.pth`` file (pip then
finds every requirement satisfied and installs none of them again); pip fetches only the build
backend (setuptools) from the package index, as any ``pip install .`` does.
"""

import json
import os
import re
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.test_readme import README, SNIPPET_MARK, code_blocks

REPO = Path(__file__).resolve().parents[1]

TINY = ["--config", "configs/transformer.py:synthetic,tiny", "--config.num_train_steps=8",
        "--config.eval_every_steps=8", "--config.checkpoint_every_steps=8", "--config.log_every_steps=4",
        "--config.test_after_training=False"]


def _venv(path: Path) -> Path:
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
  py = path / "bin" / "python"
  purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
  # This environment's packages (jax, flax, pip, setuptools, ...) become visible to the new one.
  ours = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]] if os.path.isdir(p)]
  Path(purelib, "_reuse_parent_env.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
  return py


def _fresh_clone(dest: Path) -> Path:
  """The checkout's files (tracked and new, not ignored) copied to ``dest``: what a fresh clone
  of this working tree holds, and nothing built here (no build/, no .venv) leaks in."""
  import shutil
  names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split("\0")
  for name in filter(None, names):
    src = REPO / name
    if src.is_symlink():  # the checkout's configs/ -> jaxcap/configs
      (dest / name).parent.mkdir(parents=True, exist_ok=True)
      os.symlink(os.readlink(src), dest / name)
    elif src.is_file():
      (dest / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dest / name)
  return dest


def _env():
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  return dict(env, JAX_PLATFORMS="cpu", PYTHONDONTWRITEBYTECODE="1")


def _run(cmd, cwd, timeout=600):
  r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                     timeout=timeout)
  assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  return r.stdout


@pytest.mark.slow
def test_fresh_editable_install_runs_the_readme_snippet_from_another_directory(tmp_path):
  py = _venv(tmp_path / "venv")
  clone = _fresh_clone(tmp_path / "clone")
  # README's command: the `train` extra is requirements.txt (plain `.` is the exported captioner's
  # needs only, tests/test_export.py).
  r = subprocess.run([str(py), "-m", "pip", "install", "-e", ".[train]"], cwd=clone, env=_env(),
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  # setuptools deprecates a license given as a TOML table (it printed the warning four times).
  assert "project.license" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  where = _run([py, "-c", "import importlib.util, jaxcap, jaxcap.configs; print(jaxcap.__file__); "
                          "print(jaxcap.configs.__file__); print(importlib.util.find_spec('configs'))"],
               cwd=elsewhere).split()
  # The shared configs are jaxcap's own package; no top-level `configs` is installed.
  assert where == [str(clone / "jaxcap" / "__init__.py"),
                   str(clone / "jaxcap" / "configs" / "__init__.py"), "None"]
  # The console script trains a tiny run from another directory: --config configs/... is found
  # in the package.
  bin_dir = py.parent
  _run([bin_dir / "jaxcap-train", "--workdir", "runs/transformer_synthetic", *TINY], cwd=elsewhere)
  assert (elsewhere / "runs" / "transformer_synthetic" / "info.json").exists()
  # The snippet as written, with only what a fresh clone has after `make train` (the run; no
  # feature files of its own); the dataset it reads must not be read by jaxcap.load itself.
  snippet = [b for b in code_blocks(README.read_text()) if b[3] == SNIPPET_MARK][0][1]
  (elsewhere / "snippet.py").write_text(snippet)
  guard = ("import jaxcap, jaxcap.data\n"
           "read, get_dataset, load = [], jaxcap.data.get_dataset, jaxcap.load\n"
           "jaxcap.data.get_dataset = lambda *a, **k: read.append(1) or get_dataset(*a, **k)\n"
           "def _load(*a, **k):\n"
           "  run = load(*a, **k)\n"
           "  assert not read, 'jaxcap.load read the dataset'\n"
           "  return run\n"
           "jaxcap.load = _load\n"
           "import runpy; runpy.run_path('snippet.py', run_name='__main__')\n"
           "assert read, 'the snippet read no dataset'\n")
  out = _run([py, "-c", guard], cwd=elsewhere)
  captions_line = [ln for ln in out.splitlines() if ln.startswith("[")][-1]
  assert re.search(r"\] CIDEr-D x100: [0-9.]+$", captions_line), out  # the score labelled with its scale
  assert captions_line.count("'") >= 10  # five quoted captions
  # jaxcap-evaluate on the same run, greedy on the 16 test images.
  _run([bin_dir / "jaxcap-evaluate", "--workdir", "runs/transformer_synthetic", "--tag", "_installed"],
       cwd=elsewhere)
  scores = json.loads((elsewhere / "runs" / "transformer_synthetic" / "scores_test_installed.json").read_text())
  assert "CIDEr" in scores["overall"]


@pytest.mark.slow
def test_wheel_install_ships_the_package_and_its_configs(tmp_path):
  py = _venv(tmp_path / "venv")
  _run([py, "-m", "pip", "install", "--no-deps", "."], cwd=_fresh_clone(tmp_path / "clone"))
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  out = _run([py, "-c", (
      "import importlib.util, jaxcap, jaxcap.configs\n"
      "assert importlib.util.find_spec('configs') is None, 'a top-level configs is installed'\n"
      "from jaxcap import config_files\n"
      "c = jaxcap.get_config('configs/eta.py:synthetic,variant=stacked_v', num_train_steps=5)\n"
      "print(jaxcap.__file__, jaxcap.configs.__file__, config_files.configs_dir(), c.model.variant, c.num_train_steps)\n")],
      cwd=elsewhere).split()
  site_dir = str(tmp_path / "venv")
  assert all(p.startswith(site_dir) for p in out[:3]), out
  assert Path(out[2]) == Path(out[0]).parent / "configs" == Path(out[1]).parent, out
  assert out[3:] == ["stacked_v", "5"]
  assert all((py.parent / f"jaxcap-{p}").exists() for p in ("train", "evaluate", "extract", "compare", "import"))
  names = {p.name for p in Path(out[2]).iterdir()}
  assert {"common.py", "transformer.py", "base.py"} <= names
  papers = Path(out[0]).parent / "papers"  # a paper's configs are installed with its folder
  assert (papers / "eta" / "configs" / "eta.py").exists() and (papers / "aat" / "configs" / "aat.py").exists()
