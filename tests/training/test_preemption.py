"""Preemption: SIGTERM / SIGINT during training saves the current step, exits with code 4, and
the next start resumes bitwise as if the run had not stopped (one process and two).

The signal comes from outside the program at a random step of the loop (the test waits for a
random number of ``metrics.jsonl`` lines, one per step, then signals), as a scheduler's would.
Mutants tried (each made the one-process test fail, then was restored): the loop not asking
``Watch.reached`` (the run finishes: exit 0, not 4); ``cli.run_main`` without its ``Preempted``
branch (a traceback, exit 1). Before the per-manager barrier names (``checkpoint.Checkpoints``),
the two-process test's resumed run aborted: ``latest/`` and ``best/`` saved step 40 at once and
orbax's barrier of that name was "already ongoing".
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tests import fast_compile

from jaxcap.training import preemption
from tests.training.test_multihost import finish, free_port

REPO = Path(__file__).resolve().parents[2]
_FAST = fast_compile.FLAGS  # compile time, see tests/conftest.py
_ARGS = ["--config=configs/transformer.py:synthetic,tiny", "--config.eval_every_steps=1000",
         "--config.test_after_training=False", "--config.log_every_steps=1",
         "--config.checkpoint_every_steps=1000"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_watch_turns_a_signal_into_a_stop_at_the_next_step(sig):
  before = signal.getsignal(sig)
  with preemption.Watch() as watch:
    assert not watch.reached(1)
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs between bytecodes of the main thread
    assert watch.reached(2) and watch.signame == signal.Signals(sig).name
  assert signal.getsignal(sig) is before  # the handlers are restored


def test_a_second_sigint_stops_at_once():
  with preemption.Watch():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)


def _lines(workdir: Path) -> int:
  path = workdir / "metrics.jsonl"
  return len(path.read_text().splitlines()) if path.exists() else 0


def _signal_after(procs, workdir: Path, lines: int, sig, target=0, timeout=600):
  """Sends ``sig`` to ``procs[target]`` once ``workdir``'s metrics.jsonl has ``lines`` lines."""
  deadline = time.time() + timeout
  while _lines(workdir) < lines:
    assert time.time() < deadline and all(p.poll() is None for p in procs), [
        p.communicate()[1][-3000:] for p in procs if p.poll() is not None]
    time.sleep(0.01)
  procs[target].send_signal(sig)


def _final_state(workdir: Path):
  """``(step, data position, parameter leaves)`` of the newest checkpoint, read as NumPy arrays
  (also one written by two processes)."""
  import jax
  import orbax.checkpoint as ocp
  step = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  folder = workdir / "checkpoints" / str(step)
  with ocp.PyTreeCheckpointer() as ckptr:
    meta = ckptr.metadata(folder / "state")
    meta = getattr(meta, "item_metadata", meta)
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    state = ckptr.restore(folder / "state", restore_args=args)
  data = json.loads((folder / "data" / "metadata").read_text())  # orbax JsonSave
  flat = jax.tree_util.tree_flatten_with_path(state["params"])[0]
  return step, data, {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def _assert_same(a: Path, b: Path, steps: int):
  sa, da, pa = _final_state(a)
  sb, db, pb = _final_state(b)
  assert sa == sb == steps and da == db
  assert pa.keys() == pb.keys() and len(pa) > 0
  for k in pa:
    np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)  # bitwise
  train = lambda w: [(r["step"], r["train/loss"]) for r in map(json.loads, (w / "metrics.jsonl").read_text().splitlines())
                     if "train/loss" in r]
  assert train(a) == train(b) and [s for s, _ in train(b)] == list(range(1, steps + 1))


@pytest.mark.slow
def test_sigterm_at_a_random_step_saves_it_and_the_next_start_resumes_bitwise(tmp_path):
  steps, at = 60, random.Random().randint(2, 30)
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  preempted, straight = tmp_path / "preempted", tmp_path / "straight"
  cmd = [sys.executable, "train.py", *_ARGS, f"--config.num_train_steps={steps}"]
  proc = subprocess.Popen([*cmd, f"--workdir={preempted}"], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    _signal_after([proc], preempted, at, signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
  finally:
    proc.kill()
  assert proc.returncode == 4, (at, err[-3000:])
  assert "Traceback" not in err
  line = [l for l in err.splitlines() if l.strip()][-1]
  saved = int(line.split("at step ")[1].split(":")[0])
  assert line.startswith("preempted: SIGTERM at step ") and "run the same command again" in line
  assert at <= saved < steps, (at, line)
  assert sorted(int(p.name) for p in (preempted / "checkpoints").iterdir()) == [saved]
  resumed = subprocess.run([*cmd, f"--workdir={preempted}"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0 and f"Resumed from {preempted}/checkpoints at step {saved}." in resumed.stdout, \
      resumed.stderr[-3000:]
  full = subprocess.run([*cmd, f"--workdir={straight}"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)
  assert full.returncode == 0, full.stderr[-3000:]
  _assert_same(straight, preempted, steps)


def _two_processes(workdir: Path, steps: int):
  port, procs = free_port(), []
  base = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
  for pid in range(2):
    env = dict(base, XLA_FLAGS="--xla_force_host_platform_device_count=2 " + _FAST,
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(pid))
    procs.append(subprocess.Popen(
        [sys.executable, "train.py", f"--workdir={workdir}", *_ARGS,
         f"--config.num_train_steps={steps}", "--config.batch_size=8"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
  return procs


@pytest.mark.slow
def test_two_processes_agree_on_the_step_and_resume_bitwise(tmp_path):
  """SIGTERM to process 1 only (its scheduler's notice): both processes stop after the same
  step (JAX's preemption sync point), save one checkpoint and exit 4; both restarted, they
  finish equal to an uninterrupted two-process run."""
  steps, at = 40, random.Random().randint(2, 20)
  preempted, straight = tmp_path / "preempted", tmp_path / "straight"
  procs = _two_processes(preempted, steps)
  try:
    _signal_after(procs, preempted, at, signal.SIGTERM, target=1)
  finally:
    codes, errs = finish(procs)
  assert codes == [4, 4], (at, codes, [e[-2000:] for e in errs])
  lines = [[l for l in e.splitlines() if l.strip()][-1] for e in errs]
  assert lines[0] == lines[1] and lines[0].startswith("preempted: SIGTERM at step "), lines
  saved = int(lines[0].split("at step ")[1].split(":")[0])
  assert at <= saved < steps
  assert sorted(int(p.name) for p in (preempted / "checkpoints").iterdir()) == [saved]
  codes, errs = finish(_two_processes(preempted, steps))
  assert codes == [0, 0], [e[:3000] for e in errs]
  codes, errs = finish(_two_processes(straight, steps))
  assert codes == [0, 0], [e[-2000:] for e in errs]
  _assert_same(straight, preempted, steps)
