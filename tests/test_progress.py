"""jaxcap.progress: a phase says what it is doing only once it has run for its delay."""

import io
import time

import pytest

from jaxcap import progress


def test_a_short_phase_is_silent_and_a_long_one_says_what_and_how_long():
  out = io.StringIO()
  with progress.phase("compiling the train step", delay=0.5, file=out):
    pass
  assert out.getvalue() == ""
  with progress.phase("compiling the train step", delay=0.05, file=out):
    time.sleep(0.3)
  lines = out.getvalue().splitlines()
  assert lines[0] == "compiling the train step ..." and len(lines) == 2
  assert lines[1].startswith("compiling the train step: done in ") and lines[1].endswith(" s")


def test_a_failed_phase_says_no_done_line():
  out = io.StringIO()
  with pytest.raises(ValueError):
    with progress.phase("checking", delay=0.05, file=out):
      time.sleep(0.2)
      raise ValueError("bad input")
  assert out.getvalue() == "checking ...\n"


def test_a_bar_inside_another_bar_is_the_iterable_itself():
  from tqdm import tqdm
  items = [1, 2, 3]
  assert progress.bar(items, "x") is not items
  with tqdm(total=1, disable=False, file=io.StringIO()):
    assert progress.bar(items, "x") is items
