"""README.md's and docs/*.md's commands run as written (see tests/readme_runner.py)."""

import pytest

from tests.readme_runner import module_tests, part_commands, readme_commands

pytestmark = pytest.mark.slow

checkout, test_documented_command_runs = module_tests("readme")


def test_the_commands_are_found():
  cmds = [c for _, c in part_commands("readme")]
  assert cmds[:2] == ["make train", "make test"]
  assert any(c.startswith("for i in 0 1; do") and c.endswith("wait") for c in cmds)
  assert len(readme_commands()) > 40 and len(cmds) > 15 and len(part_commands("experiments")) > 15
  assert any(w.startswith("docs/USAGE.md:") for w, _ in part_commands("readme"))
