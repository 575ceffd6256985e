"""The README's paper sections' commands run as written (see tests/readme_runner.py): a module
of its own, with its own fresh copy, so that the slow step's two workers share the README."""

import pytest

from tests.readme_runner import make_checkout, readme_commands, readme_part, run_readme_command

pytestmark = pytest.mark.slow

_ALL = readme_commands()
_COMMANDS = readme_part("papers")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
  return make_checkout(tmp_path_factory)


@pytest.mark.parametrize("line,cmd", _COMMANDS, ids=[f"L{l}:{c[:60]}" for l, c in _COMMANDS])
def test_readme_command_runs(checkout, line, cmd):
  run_readme_command(checkout, line, cmd, _ALL)
