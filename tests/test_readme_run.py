"""The README's commands up to its paper sections run as written (see tests/readme_runner.py)."""

import pytest

from tests.readme_runner import make_checkout, readme_commands, readme_part, run_readme_command

pytestmark = pytest.mark.slow

_ALL = readme_commands()
_COMMANDS = readme_part("start")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
  return make_checkout(tmp_path_factory)


def test_the_readme_commands_are_found():
  cmds = [c for _, c in _ALL]
  assert cmds[:2] == ["make train", "make test"]
  assert any(c.startswith("for i in 0 1; do") and c.endswith("wait") for c in cmds)
  assert len(cmds) > 40 and len(_COMMANDS) > 15 and len(readme_part("papers")) > 15


@pytest.mark.parametrize("line,cmd", _COMMANDS, ids=[f"L{l}:{c[:60]}" for l, c in _COMMANDS])
def test_readme_command_runs(checkout, line, cmd):
  run_readme_command(checkout, line, cmd, _ALL)
