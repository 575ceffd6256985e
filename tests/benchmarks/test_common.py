"""Helpers of the benchmark scripts."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import common  # noqa: E402


def test_busy_time_is_the_union_of_overlapping_intervals():
  # Two streams: [0, 10) and [5, 12) overlap, [20, 25) is apart, [21, 22) lies inside it.
  assert common.busy_time([(20, 25), (0, 10), (5, 12), (21, 22)]) == 12 + 5
  assert common.busy_time([]) == 0.0
  assert common.busy_time([(3, 3)]) == 0.0


def test_summarize_trace_without_a_trace_says_so(tmp_path):
  assert "no *.xplane.pb" in common.summarize_trace(str(tmp_path))
