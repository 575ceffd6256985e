"""tests/durations.py: the workers' files merged into the record, the slowest listed by CPU time,
and the conftest hook that writes them measuring the test's child processes too."""

import json
import subprocess
import sys

from tests import durations


def test_merge_record_and_slowest(tmp_path):
  (tmp_path / "gw0-1.json").write_text(json.dumps({
      "a::x": {"tier": "default", "wall_s": 1.0, "cpu_s": 2.0},
      "a::y": {"tier": "slow", "wall_s": 9.0, "cpu_s": 8.0}}))
  (tmp_path / "gw1-2.json").write_text(json.dumps({"b::z": {"tier": "default", "wall_s": 5.0, "cpu_s": 0.5}}))
  rec = durations.record(durations.merge(str(tmp_path)))
  assert set(rec["tests"]) == {"a::x", "a::y", "b::z"}
  assert rec["totals"]["default"] == {"tests": 2, "wall_s": 6.0, "cpu_s": 2.5}
  assert rec["totals"]["slow"]["tests"] == 1 and "heavy" not in rec["totals"]
  assert [k for k, _ in durations.slowest(rec, 2)] == ["a::y", "a::x"]  # by CPU, not wall
  assert [k for k, _ in durations.slowest(rec, 5, "default")] == ["a::x", "b::z"]
  out = tmp_path / "rec.json"
  assert durations.main(["--merge", str(tmp_path), "--out", str(out)]) == 0
  assert json.loads(out.read_text())["tests"] == rec["tests"]


def test_a_child_process_cpu_is_the_tests(tmp_path):
  """The hook counts the CPU of a process the test waited for (os.times' children)."""
  from tests import conftest
  before = conftest._cpu_seconds()
  subprocess.run([sys.executable, "-c", "s = 0\nfor i in range(3_000_000): s += i"], check=True)
  assert conftest._cpu_seconds() - before > 0.05


def test_check_names_a_default_test_over_the_quick_loop_s_limit(tmp_path, capsys):
  limit = durations.CHECK_CPU_S
  rec = {"totals": {"default": {"tests": 2, "wall_s": 1.0, "cpu_s": 1.0}},
         "tests": {"a::cheap": {"tier": "default", "wall_s": 0.5, "cpu_s": limit},
                   "a::costly_slow": {"tier": "slow", "wall_s": 90.0, "cpu_s": 90.0}}}
  path = tmp_path / "rec.json"
  path.write_text(json.dumps(rec))
  assert durations.main(["--record", str(path), "--check"]) == 0  # at the limit, and a slow one
  # A file's shared fixture paid by its first test is the file's, not that test's call:
  rec["tests"]["a::first"] = {"tier": "default", "wall_s": 30.0, "cpu_s": 30.0, "call_cpu_s": 0.2}
  path.write_text(json.dumps(rec))
  capsys.readouterr()
  assert durations.main(["--record", str(path), "--check"]) == 0
  assert "29.8 s CPU  a\n" in capsys.readouterr().out
  rec["tests"]["a::costly"] = {"tier": "default", "wall_s": 9.0, "cpu_s": limit + 0.5,
                               "call_cpu_s": limit + 0.1}
  path.write_text(json.dumps(rec))
  assert durations.main(["--record", str(path), "--check"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: a::costly: {limit + 0.1:.1f} s of CPU")
  assert "@pytest.mark.slow" in err[0]



def test_files_run_costliest_first_each_in_its_own_order():
  """conftest's order for pytest-xdist: files by their recorded CPU (the sum of their tests),
  costliest first, a file's tests in their own order; an unrecorded heavy test counts minutes."""
  from tests import conftest

  class Item:
    def __init__(self, nodeid, heavy=False):
      self.nodeid, self.heavy = nodeid, heavy

    def get_closest_marker(self, name):
      return name == "heavy" and self.heavy or None

  items = [Item("a.py::1"), Item("a.py::2"), Item("b.py::1"), Item("c.py::2"), Item("c.py::1"),
           Item("d.py::new", heavy=True), Item("e.py::new")]
  recorded = {"a.py::1": {"cpu_s": 3.0}, "a.py::2": {"cpu_s": 4.0}, "b.py::1": {"cpu_s": 10.0},
              "c.py::1": {"cpu_s": 1.0}, "c.py::2": {"cpu_s": 1.0}}
  conftest.costliest_files_first(items, recorded)
  assert [i.nodeid for i in items] == ["d.py::new", "b.py::1", "a.py::1", "a.py::2", "c.py::2", "c.py::1",
                                       "e.py::new"]


def test_past_ci_s_deadline_a_test_is_skipped_by_its_recorded_time():
  """conftest's time guard (JAXCAP_CI_DEADLINE, set by .ci/run): a test runs when twice its
  recorded wall time fits before the deadline, else it is skipped naming the budget; unrecorded
  tests count 30 s, unrecorded heavy ones 120 s."""
  from tests import conftest

  class Item:
    def __init__(self, nodeid, heavy=False):
      self.nodeid, self.heavy = nodeid, heavy

    def get_closest_marker(self, name):
      return name == "heavy" and self.heavy or None

  recorded = {"a.py::t": {"wall_s": 40.0, "cpu_s": 1.0}}
  reason = conftest.budget_skip_reason
  assert reason(Item("a.py::t"), now=1000.0, deadline=1081.0, recorded=recorded) is None
  why = reason(Item("a.py::t"), now=1000.0, deadline=1079.0, recorded=recorded)
  assert why.startswith(conftest.DEADLINE_SKIP) and "79 s left" in why and "80 s" in why
  assert reason(Item("b.py::new"), now=0.0, deadline=31.0, recorded=recorded) is None
  assert reason(Item("b.py::new"), now=0.0, deadline=29.0, recorded=recorded)
  assert reason(Item("b.py::new", heavy=True), now=0.0, deadline=100.0, recorded=recorded)
  assert reason(Item("b.py::new", heavy=True), now=0.0, deadline=121.0, recorded=recorded) is None
