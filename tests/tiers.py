"""The test tiers (pytest.ini; docs/DESIGN.md §6) for parametrised tests.

``make test`` is the quick loop (a test's call at most 2 s of CPU: tests/durations.py): a parametrised test whose
every case compiles its own programs keeps one case there and runs the others in the slow step
(``make test-slow``, .ci/run's second step), so that each equation is still checked on every
commit by the quick loop and in full by CI.
"""

import pytest


def one_in_default(values, keep=None):
  """``values`` for ``pytest.mark.parametrize``: ``keep`` (default: the first) as is, the
  others marked slow."""
  values = list(values)
  keep = values[0] if keep is None else keep
  if keep not in values:
    raise ValueError(f"one_in_default: {keep!r} is not among {values}")
  return [v if v == keep else pytest.param(v, marks=pytest.mark.slow) for v in values]
