"""The suite's cost per test: merges what tests/conftest.py wrote per pytest worker.

  python -m tests.durations --merge .cache/durations --out tests/durations.json   # .ci/run's last step
  python -m tests.durations --record tests/durations.json --top 10                 # the slowest, per tier
  python -m tests.durations --record tests/durations.json --check                  # the quick loop's limit

The tiers (pytest.ini) are chosen by cost: a test of the quick loop (``make test``, the default
tier) takes at most :data:`DEFAULT_LIMIT_CPU_S` seconds of CPU on the 2-core CI machine, fixtures
and the programs it starts included; a costlier one is marked ``slow`` (CI runs it in its second
step). ``--check`` fails, naming them, when a default-tier test of the record took more than
:data:`CHECK_CPU_S` (the limit with margin: a test's CPU time barely depends on what runs beside
it, but whichever test of a file compiles a shared program first pays for it).

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
# The quick loop's limit per test (CPU seconds, 2-core machine), and where --check fails.
DEFAULT_LIMIT_CPU_S = 2.0
CHECK_CPU_S = 3 * DEFAULT_LIMIT_CPU_S


def over_limit(rec: dict, limit: float = CHECK_CPU_S) -> list[tuple[str, dict]]:
  """The default-tier tests of ``rec`` whose call took more than ``limit`` CPU seconds (their
  own work; the setup and teardown of fixtures a file shares are paid by whichever test comes
  first or last: :func:`shared_setup` lists them), costliest first."""
  items = [(k, v) for k, v in rec["tests"].items() if v["tier"] == "default"
           and v.get("call_cpu_s", v["cpu_s"]) > limit]
  return sorted(items, key=lambda kv: -kv[1].get("call_cpu_s", kv[1]["cpu_s"]))


def shared_setup(rec: dict, tier: str = "default") -> dict[str, float]:
  """CPU seconds per test file of ``tier`` outside its tests' calls (fixtures' setup and
  teardown), most first."""
  out: dict[str, float] = {}
  for k, v in rec["tests"].items():
    if v["tier"] == tier and "call_cpu_s" in v:
      f = k.split("::")[0]
      out[f] = round(out.get(f, 0.0) + v["cpu_s"] - v["call_cpu_s"], 2)
  return dict(sorted(out.items(), key=lambda kv: -kv[1]))


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
  p.add_argument("--check", action="store_true",
                 help=f"Exit 1 when a default-tier test took more than {CHECK_CPU_S:g} s of CPU.")
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
  if a.check:
    over = over_limit(rec)
    for name, v in over:
      print(f"error: {name}: {v.get('call_cpu_s', v['cpu_s']):.1f} s of CPU in the quick loop (limit {DEFAULT_LIMIT_CPU_S:g} s, "
            f"checked at {CHECK_CPU_S:g} s); expected @pytest.mark.slow or a cheaper test", file=sys.stderr)
    shared = list(shared_setup(rec).items())[:a.top]
    if shared:
      print("default: CPU seconds of shared fixtures per file (setup and teardown):")
      for f, cpu in shared:
        print(f"  {cpu:7.1f} s CPU  {f}")
    if over:
      return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
