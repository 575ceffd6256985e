"""A run from pixels across processes and preemption, as ``train.py`` runs it: two processes
(each reading the image files of its own rows) give what one process with as many devices
gives, with the state sharded (FSDP); SIGTERM at a random step saves it and the next start
resumes bitwise (the backbone, its frozen phase and its own Adam included)."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests import fast_compile

from tests.training.test_multihost import finish, free_port
from tests.training.test_pixels_run import scenes  # noqa: F401  (the fixture: 48 / 8 / 8 scenes, 32 px)
from tests.training.test_preemption import _assert_same, _signal_after

REPO = Path(__file__).resolve().parents[2]
_FAST = fast_compile.FLAGS  # compile time, see tests/conftest.py


def _args(scenes: str, steps: int, **extra) -> list[str]:
  # configs/pixels.py:synthetic at tiny sizes: a 1-block-per-stage ResNet at 32 px, frozen for
  # the first 2 steps, then trained; dropout on, so a mask keyed by anything but the image shows.
  flags = {"num_train_steps": steps, "batch_size": 8, "eval_batch_size": 8, "log_every_steps": 1,
           "model.dropout": 0.3, "warmup_steps": 2, **extra}
  return [f"--config=configs/pixels.py:synthetic,root={scenes},tiny",
          *(f"--config.{k}={v}" for k, v in flags.items())]


def _env(devices: int, **extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {_FAST}")
  env.pop("JAX_COORDINATOR_ADDRESS", None)  # one process unless extra says otherwise
  return dict(env, **extra)


def _two(workdir: Path, args: list[str]):
  port, procs = free_port(), []
  for pid in range(2):
    env = _env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(pid))
    procs.append(subprocess.Popen([sys.executable, "train.py", f"--workdir={workdir}", *args], cwd=REPO,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return procs


def _rows(workdir: Path):
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


# Heavy (274 s of CPU in an earlier .ci/run): the same two-process and preemption checks run from
# features too (tests/training/test_multihost.py,
# test_preemption.py), FSDP from pixels one step at a time (test_sharding.py) and each process
# reading only its rows' image files below.
@pytest.mark.slow
@pytest.mark.heavy
def test_two_processes_equal_one_and_a_preempted_run_resumes_bitwise(scenes, tmp_path):  # noqa: F811
  """One straight run (one process x 4 devices, FSDP) against two processes x 2 devices, and
  against the same run stopped by SIGTERM at a random step and started again (one straight run
  serves both comparisons: each launch compiles its programs anew)."""
  steps, at = 10, random.Random().randint(2, 7)  # the frozen phase ends at step 2: both phases
  args = _args(scenes, steps, sharding="fsdp", eval_every_steps=steps, checkpoint_every_steps=1000)
  one, two, preempted = tmp_path / "one", tmp_path / "two", tmp_path / "preempted"
  done = subprocess.run([sys.executable, "train.py", f"--workdir={one}", *args], cwd=REPO,
                        env=_env(4), capture_output=True, text=True, timeout=600)
  assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
  codes, errs = finish(_two(two, args))
  assert codes == [0, 0] and not any("Traceback" in e for e in errs), [
      [l for l in e.splitlines() if l.startswith("error")] or e[-3000:] for e in errs]
  r1, r2 = _rows(one), _rows(two)
  loss = lambda rows: [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]
  assert [s for s, _ in loss(r1)] == [s for s, _ in loss(r2)] == list(range(1, steps + 1))
  np.testing.assert_allclose([v for _, v in loss(r2)], [v for _, v in loss(r1)], rtol=1e-5)
  val = lambda rows: [r["val/CIDEr"] for r in rows if "val/CIDEr" in r]
  assert len(val(r1)) == 1
  np.testing.assert_allclose(val(r2), val(r1), rtol=1e-5)
  s1 = json.loads((one / "scores_test.json").read_text())["overall"]
  s2 = json.loads((two / "scores_test.json").read_text())["overall"]
  for k in s1:
    np.testing.assert_allclose(s2[k], s1[k], rtol=1e-5, atol=1e-9, err_msg=k)
  # Preempted, then the same command again: bitwise the straight run.
  proc = subprocess.Popen([sys.executable, "train.py", f"--workdir={preempted}", *args], cwd=REPO,
                          env=_env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    _signal_after([proc], preempted, at, signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
  finally:
    proc.kill()
  assert proc.returncode == 4 and "Traceback" not in err, (at, err[-3000:])
  done = subprocess.run([sys.executable, "train.py", f"--workdir={preempted}", *args], cwd=REPO,
                        env=_env(4), capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  _assert_same(one, preempted, steps)


def test_each_process_reads_only_the_image_files_of_its_rows(scenes, monkeypatch):  # noqa: F811
  """The training iterator of process k reads (opens and decodes) the files of its own shard's
  rows, none of another process's."""
  from jaxcap import config_files
  from jaxcap.data import get_dataset, karpathy
  from jaxcap.data.pipeline import TrainIterator
  config = config_files.load(f"pixels.py:synthetic,root={scenes},tiny")
  source = get_dataset(config.data).split("train")
  read = []
  original = karpathy.ImageFiles.read
  monkeypatch.setattr(karpathy.ImageFiles, "read", lambda self, i: read.append(self.paths[i]) or original(self, i))
  seen = []
  for shard in range(2):
    read.clear()
    it = TrainIterator(source, 4, seed=0, shard_index=shard, shard_count=2, num_threads=0)
    batches = [next(it) for _ in range(3)]
    assert all(b["pixels"].shape == (4, 32, 32, 3) for b in batches)
    seen.append(set(read))
  assert len(seen[0]) == len(seen[1]) == 12 and not seen[0] & seen[1]
