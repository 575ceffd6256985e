"""Test setup: 8 fake CPU devices (so data parallelism is exercised on one CPU) and paths."""

import os
import sys
from pathlib import Path

from tests.fast_compile import FLAGS as FAST_COMPILE

# Must be set before JAX initialises its backends: 8 fake CPU devices, and XLA flags under which
# the tests' tiny programs compile several times sooner (tests/fast_compile.py says which, and
# what each saves).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 " + FAST_COMPILE)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO = Path(__file__).resolve().parents[1]

# One persistent compilation cache for the whole test run: both pytest workers, the default and
# the slow step of .ci/run, and every program a test starts (they inherit this environment). The
# suite compiles the same tiny programs again and again (each test file drops its compiled
# programs, each train.py a test runs compiles its steps afresh); a cached train step loads in
# well under a second instead of compiling for several. A cache hit gives the same executable,
# so no result depends on it. A size limit turns on the cache's file lock, which keeps the two
# workers from reading an entry the other is half-way through writing; but then every write
# lists and stats the whole cache under that lock: with every program cached (thousands of
# entries) the workers spent much of the run waiting for it (py-spy: filelock polling in
# LRUCache.put), so only programs that took a second or more to compile are kept. Kept in the
# checkout (ignored by git): a clean clone starts empty.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".cache" / "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
# METEOR's Java start (~13 s wall, 16 s CPU; jaxcap.evaluation.coco_metrics.SKIP_ENV) left out of
# every scoring that does not name its metrics, in this process and the programs tests start:
# half of a tiny train.py's time. Tests of METEOR itself name it or clear this (with_meteor).
os.environ.setdefault("JAXCAP_SKIP_METRICS", "METEOR")
# The pytest workers' own programs (most of the suite's compiling) go to a cache of their own
# where every program is kept, however quickly it compiled: a tiny model's steps compile in under
# a second under FAST_COMPILE, so the one-second rule above kept almost none of them, and each
# test file compiled again what the files before it had (jax.clear_caches below). Without a size
# limit JAX takes no lock, but then its put writes the entry in place, where the other worker can
# read it half-written: here it is written to a temporary file and renamed (os.replace is atomic
# on one filesystem), so a reader finds a whole entry or none. The programs tests start keep the
# locked cache above (they do not load this patch). JAXCAP_TEST_WORKER_CACHE=0 turns it off.
WORKER_CACHE = REPO / ".cache" / "jax-tests-workers"


def _cache_every_worker_program() -> None:
  import threading  # noqa: PLC0415

  import jax  # noqa: PLC0415
  from jax._src import lru_cache  # noqa: PLC0415

  def put(self, key: str, value: bytes) -> None:
    if not key:
      raise ValueError("key cannot be empty")
    path = self.path / f"{key}{lru_cache._CACHE_SUFFIX}"  # noqa: SLF001  (JAX's own file name)
    if path.exists():
      return
    tmp = self.path / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_bytes(value)
    os.replace(tmp, path)

  if not hasattr(lru_cache, "_CACHE_SUFFIX") or not hasattr(lru_cache.LRUCache, "put"):
    return  # another JAX's cache: keep the locked one above
  lru_cache.LRUCache.put = put
  jax.config.update("jax_compilation_cache_dir", str(WORKER_CACHE))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_compilation_cache_max_size", -1)


if os.environ.get("JAXCAP_TEST_WORKER_CACHE", "1") != "0":
  _cache_every_worker_program()
SHARED_DATA = REPO.parent / "shared" / "data"
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
  """A heavy test is a slow one too (pytest.ini): ``make test`` (``-m "not slow"``) never runs
  it, whichever of the two markers its author wrote. Then the files in order of cost, costliest
  first (:func:`costliest_files_first`)."""
  del config
  for item in items:
    if item.get_closest_marker("heavy") and not item.get_closest_marker("slow"):
      item.add_marker(pytest.mark.slow)
  costliest_files_first(items)


# The heavy tier's cost for a test the record does not know yet (a new one): its tests take minutes.
UNRECORDED_HEAVY_CPU_S = 120.0


def _recorded() -> dict:
  """The committed record's tests (tests/durations.json), {} without one."""
  import json  # noqa: PLC0415
  try:
    return json.loads((REPO / "tests" / "durations.json").read_text())["tests"]
  except (OSError, ValueError, KeyError):
    return {}


# CI's time limit (90 minutes for the whole .ci/run, on machines up to about twice as slow as the
# one of the record): .ci/run sets JAXCAP_CI_DEADLINE (seconds since the epoch, 85 minutes after
# it starts), and a test that would still be running past it, by twice its recorded wall time
# (30 s unrecorded, 120 s a heavy one), is skipped by name instead of the run being killed with
# nothing reported; .ci/run then prints how many were, listed in .cache/ci-budget-skips/
# (tests/test_durations.py). On the machine
# of the record the whole run takes less than half that time: nothing is skipped.
DEADLINE_ENV = "JAXCAP_CI_DEADLINE"
DEADLINE_SKIP = "CI time budget"


def budget_skip_reason(item, now: float, deadline: float, recorded: dict) -> str | None:
  """Why ``item`` is skipped at ``now`` before ``deadline``, or None (it fits)."""
  rec = recorded.get(item.nodeid)
  need = 2 * rec["wall_s"] if rec and "wall_s" in rec else (
      UNRECORDED_HEAVY_CPU_S if item.get_closest_marker("heavy") else 30.0)
  left = deadline - now
  if need <= left:
    return None
  return (f"{DEADLINE_SKIP}: {max(left, 0):.0f} s left before .ci/run's deadline ({DEADLINE_ENV}), "
          f"this test may take {need:.0f} s")


def pytest_runtest_setup(item):
  deadline = os.environ.get(DEADLINE_ENV)
  if deadline:
    import time  # noqa: PLC0415
    global _RECORD
    if _RECORD is None:
      _RECORD = _recorded()
    why = budget_skip_reason(item, time.time(), float(deadline), _RECORD)
    if why:
      folder = REPO / ".cache" / "ci-budget-skips"  # .ci/run counts them
      folder.mkdir(parents=True, exist_ok=True)
      with open(folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as f:
        f.write(f"{item.nodeid}\t{why}\n")
      pytest.skip(why)


_RECORD = None


def costliest_files_first(items, recorded: dict | None = None) -> None:
  """Sorts ``items`` by their file's CPU seconds in the committed record (tests/durations.json),
  costliest first; a file keeps its own order. The Makefile runs pytest-xdist with
  ``--dist loadfile --no-loadscope-reorder``: each file goes whole to a worker, in this order, so
  the files of minutes start first and the run ends on short ones instead of one worker finishing a
  notebook file alone while the other waits (xdist's own order, most tests first, put the GPU
  script's two smoke runs near the end). The order changes no result: each file's fixtures are its
  own. A test the record (``recorded``: its ``tests``) does not know counts 0 s, or
  :data:`UNRECORDED_HEAVY_CPU_S` if heavy."""
  if recorded is None:
    recorded = _recorded()
    if not recorded:
      return  # no record: collection order
  cost: dict = {}
  for item in items:
    c = recorded.get(item.nodeid, {}).get("cpu_s")
    if c is None:
      c = UNRECORDED_HEAVY_CPU_S if item.get_closest_marker("heavy") else 0.0
    file = item.nodeid.split("::")[0]
    cost[file] = cost.get(file, 0.0) + c
  items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])  # stable: a file's own order kept


@pytest.fixture
def with_meteor(monkeypatch):
  """METEOR computed again (the suite leaves it out: JAXCAP_SKIP_METRICS above), for tests that
  read it; programs the test starts inherit it."""
  monkeypatch.delenv("JAXCAP_SKIP_METRICS", raising=False)


@pytest.fixture
def shared_data():
  if not SHARED_DATA.exists():
    pytest.skip(f"{SHARED_DATA} is absent")
  return SHARED_DATA


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test file.

  XLA's CPU backend maps a few memory regions per compiled kernel and frees them only with the
  executable; JAX's caches keep every executable for the life of the process. One pytest worker
  running half the suite reached Linux's limit of 65,530 regions per process
  (vm.max_map_count), where thread creation fails ("can't start new thread") and XLA's next
  compile segfaults. A program used by several files is compiled again in each (seconds).
  """
  yield
  import jax  # noqa: PLC0415
  jax.clear_caches()


# ---------------------------------------------------------------------------- the suite's cost
# Each test's wall time and CPU time (setup + call + teardown): the CPU of this process and of the
# processes it started and waited for (os.times' children: a train.py a test launches), so a
# test's cost does not depend on what the other worker runs beside it. Written per worker to
# .cache/durations/ at the end of the session; tests/durations.py merges them into the record
# (tests/durations.json: the ten slowest are listed in docs/DESIGN.md section 6).
DURATIONS_DIR = REPO / ".cache" / "durations"
_COST: dict = {}


def _cpu_seconds() -> float:
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  import time  # noqa: PLC0415
  wall, cpu = time.perf_counter(), _cpu_seconds()
  yield
  tier = "heavy" if item.get_closest_marker("heavy") else "slow" if item.get_closest_marker("slow") else "default"
  _COST[item.nodeid] = {"tier": tier, "wall_s": round(time.perf_counter() - wall, 2),
                        "cpu_s": round(_cpu_seconds() - cpu, 2),
                        "call_cpu_s": round(_CALL_CPU.pop(item.nodeid, 0.0), 2)}


# The test's own CPU (its call phase), apart from its setup and teardown: those include the
# fixtures a file or the session shares (a trained run, a program server reaped at the file's
# end), paid by whichever test comes first or last. tests/durations.py checks the quick loop's
# limit on the call.
_CALL_CPU: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  cpu = _cpu_seconds()
  yield
  _CALL_CPU[item.nodeid] = _cpu_seconds() - cpu


def pytest_sessionfinish(session, exitstatus):
  del exitstatus
  if not _COST:
    return
  import json  # noqa: PLC0415
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  DURATIONS_DIR.mkdir(parents=True, exist_ok=True)
  path = DURATIONS_DIR / f"{worker}-{os.getpid()}.json"
  path.write_text(json.dumps(_COST, indent=0, sort_keys=True))
  del session
