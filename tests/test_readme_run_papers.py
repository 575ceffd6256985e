"""The experiment pages' commands (experiments/README.md, experiments/<paper>/README.md) run as
written (see tests/readme_runner.py): a module of its own, with its own fresh copy, so that the
slow step's two workers share the documentation."""

import pytest

from tests.readme_runner import module_tests

pytestmark = pytest.mark.slow

checkout, test_documented_command_runs = module_tests("experiments")
