"""The paper pages' commands (jaxcap/papers/<paper>/README.md) run as written (see
tests/readme_runner.py): part ``"papers"``, in a fresh copy of its own."""

import pytest

from tests.readme_runner import module_tests

pytestmark = pytest.mark.slow

checkout, test_documented_command_runs = module_tests("papers")
