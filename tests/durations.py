"""The suite's cost per test: merges what tests/conftest.py wrote per pytest worker.

  python -m tests.durations --merge .cache/durations --out tests/durations.json   # .ci/run's last step
  python -m tests.durations --record tests/durations.json --top 10                 # the slowest, per tier

The record (``tests/durations.json``, committed from the last clean ``.ci/run``) holds each
test's tier, wall seconds and CPU seconds (its process and the processes it started: on a
shared 2-core machine CPU time says what a test costs, wall time what it waited), the totals
per tier and where it was measured. docs/DESIGN.md section 6 lists the ten slowest and why
each must be that slow.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import subprocess
import sys

TIERS = ("default", "slow", "heavy")


def merge(folder: str) -> dict:
  """``{nodeid: {"tier", "wall_s", "cpu_s"}}`` of every worker file in ``folder`` (a test run
  twice, as by a rerun, keeps its last entry)."""
  tests: dict = {}
  for path in sorted(glob.glob(os.path.join(folder, "*.json")), key=os.path.getmtime):
    with open(path) as f:
      tests.update(json.load(f))
  return tests


def record(tests: dict, repo: str = ".") -> dict:
  """The record: the tests, the totals per tier and the machine, commit and date."""
  totals = {t: {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0} for t in TIERS}
  for v in tests.values():
    s = totals[v["tier"]]
    s["tests"] += 1
    s["wall_s"] = round(s["wall_s"] + v["wall_s"], 2)
    s["cpu_s"] = round(s["cpu_s"] + v["cpu_s"], 2)
  try:
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = "unknown"
  return {"measured": {"date": datetime.date.today().isoformat(), "commit": commit,
                       "cpus": os.cpu_count(), "machine": platform.machine(),
                       "python": platform.python_version()},
          "totals": {t: s for t, s in totals.items() if s["tests"]}, "tests": dict(sorted(tests.items()))}


def slowest(rec: dict, n: int = 10, tier: str | None = None) -> list[tuple[str, dict]]:
  """The ``n`` tests of most CPU seconds (of ``tier``, or of all)."""
  items = [(k, v) for k, v in rec["tests"].items() if tier is None or v["tier"] == tier]
  return sorted(items, key=lambda kv: -kv[1]["cpu_s"])[:n]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tests.durations", description=__doc__.split("\n")[0])
  p.add_argument("--merge", help="A folder of the workers' files (tests/conftest.py's DURATIONS_DIR).")
  p.add_argument("--out", help="The record to write (with --merge).")
  p.add_argument("--record", help="A record to read (instead of --merge).")
  p.add_argument("--top", type=int, default=10, help="How many of the slowest tests to list per tier.")
  a = p.parse_args(argv)
  if bool(a.merge) == bool(a.record):
    p.error("give --merge FOLDER (with --out) or --record FILE")
  if a.merge:
    tests = merge(a.merge)
    if not tests:
      p.error(f"--merge {a.merge}: no worker files; expected the folder tests/conftest.py writes")
    rec = record(tests)
    if a.out:
      with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
  else:
    with open(a.record) as f:
      rec = json.load(f)
  for tier, s in rec["totals"].items():
    print(f"{tier}: {s['tests']} tests, {s['cpu_s']:.0f} s CPU, {s['wall_s']:.0f} s wall (summed)")
    for name, v in slowest(rec, a.top, tier):
      print(f"  {v['cpu_s']:7.1f} s CPU {v['wall_s']:7.1f} s wall  {name}")
  if a.out:
    print(f"wrote {a.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
