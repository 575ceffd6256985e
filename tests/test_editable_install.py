"""The namespace-package trap of an editable install: a clone at ``~/jaxcap`` and a script run
from ``~``.

setuptools' default editable install puts the package behind an import hook that Python asks
only after every ``sys.path`` entry; the script's directory (``~``) is the first entry and holds
a folder ``jaxcap`` without ``__init__.py`` (the clone), which is then imported as an empty
namespace package: ``AttributeError: module 'jaxcap' has no attribute 'load'``. The Makefile's
install line (``editable_mode=compat``: the checkout as a ``sys.path`` entry, where the regular
package wins over a namespace portion) and the README's documented one must not fall into it.
Reproduced for real: a fresh virtual environment, the checkout copied to ``<tmp>/home/jaxcap``,
the Makefile's ``pip install`` line, then ``import jaxcap; jaxcap.load`` from ``<tmp>/home``.
"""

import re
import shlex
import subprocess

import pytest

from tests.test_package import REPO, _env, _fresh_clone, _venv

FLAG = "editable_mode=compat"


def _makefile_install_args() -> list[str]:
  """The arguments after ``pip install`` of the Makefile's line installing jaxcap itself."""
  lines = [ln for ln in (REPO / "Makefile").read_text().splitlines()
           if "pip install" in ln and re.search(r"\s-e\s+\.(\s|$)", ln)]
  assert len(lines) == 1, lines
  words = shlex.split(lines[0])
  return [w for w in words[words.index("install") + 1:] if w != "--quiet"]


def test_the_documented_install_lines_use_the_fix():
  assert FLAG in _makefile_install_args()
  readme = (REPO / "README.md").read_text()
  installs = [ln for ln in readme.splitlines() if re.match(r"pip install -e ", ln)]
  assert installs and all(FLAG in ln for ln in installs), installs


@pytest.mark.slow
def test_a_clone_named_jaxcap_imports_from_its_parent_directory(tmp_path):
  py = _venv(tmp_path / "venv")
  home = tmp_path / "home"
  clone = _fresh_clone(home / "jaxcap")  # the folder a plain `git clone` makes
  r = subprocess.run([str(py), "-m", "pip", "install", *_makefile_install_args()], cwd=clone,
                     env=_env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  # From the clone's parent, as `python myscript.py` in ~ would: the script's folder is first on
  # sys.path (python -c puts the cwd there the same way).
  r = subprocess.run([str(py), "-c", "import jaxcap; jaxcap.load; print(jaxcap.__file__)"], cwd=home,
                     env=_env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.split() == [str(clone / "jaxcap" / "__init__.py")]
