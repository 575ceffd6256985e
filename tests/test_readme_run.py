"""README.md's commands run as written (see tests/readme_runner.py): part ``"readme"``, in a
fresh copy of its own; docs/*.md, the experiment pages and the paper pages are the other parts
(tests/test_readme_run_docs.py, tests/test_readme_run_experiments.py,
tests/test_readme_run_papers.py)."""

from pathlib import Path

import pytest

from tests.readme_runner import PARTS, module_tests, part_commands, readme_commands

pytestmark = pytest.mark.slow

checkout, test_documented_command_runs = module_tests("readme")


def test_the_commands_are_found():
  cmds = [c for _, c in part_commands("readme")]
  assert cmds[:2] == ["make train", "make test"]
  assert any(c.startswith("for i in 0 1; do") and c.endswith("wait") for c in cmds)
  assert len(readme_commands()) > 40 and len(cmds) > 15 and len(part_commands("experiments")) > 15
  assert any(w.startswith("docs/USAGE.md:") for w, _ in part_commands("docs"))
  assert any(w.startswith("jaxcap/papers/aat/") for w, _ in part_commands("papers"))
  # Every command belongs to exactly one part, and each part has its test module.
  assert sum(len(part_commands(p)) for p in PARTS) == len(readme_commands())
  here = Path(__file__).parent
  for p in PARTS:
    name = "test_readme_run.py" if p == "readme" else f"test_readme_run_{p}.py"
    assert f'module_tests("{p}")' in (here / name).read_text(), name
