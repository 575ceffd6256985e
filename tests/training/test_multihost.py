"""Multi-host training equals one host: ``jax.distributed`` from the standard environment
variables (initialised by the program before anything touches a backend), per-example random
keys, no parameter with an identically-zero gradient, one writer of the run directory.

Mutants tried (each made a test here fail, then was restored): one dropout key for the whole
batch (the pre-issue-18 ``steps.py``: the two-process row order's losses differ from the
natural order's by up to 0.15, 3.7 %); ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` not passed to
``jax.distributed.initialize``; the attention key projections with a bias (before their
removal: after 3 steps the 1-device and 8-device key biases differ by up to 0.12).
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests import fast_compile
import jax

from jaxcap import data as data_lib
from jaxcap.training import parallel
from tests.training import multihost_worker as worker

REPO = Path(__file__).resolve().parents[2]
_FAST = fast_compile.FLAGS  # compile time, see tests/conftest.py


@pytest.fixture(scope="module")
def setup():
  config = worker.tiny_config()
  return config, data_lib.get_dataset(config.data)


# The rows in the order two processes produce them: process 0 feeds 0, 2, 4, ..., process 1
# feeds 1, 3, ..., and the global array is process 0's rows then process 1's.
_TWO_PROCESS_ORDER = np.concatenate([np.arange(0, worker.GLOBAL_BATCH, 2), np.arange(1, worker.GLOBAL_BATCH, 2)])


@pytest.fixture(scope="module")
def eight_devices(setup):
  """8 devices: ``[(losses, params) in row order, (losses, params) in two-process order]``."""
  config, dataset = setup
  return worker.run(config, dataset, parallel.make_mesh(), np.arange(worker.GLOBAL_BATCH), _TWO_PROCESS_ORDER)


def test_distributed_init_args_from_the_environment():
  f = parallel.distributed_init_args
  assert f({}) is None
  assert f({"JAX_COORDINATOR_ADDRESS": "h:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}) == {
      "coordinator_address": "h:1234", "num_processes": 2, "process_id": 1}
  for bad in ({"JAX_NUM_PROCESSES": "2"}, {"JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
              {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}):
    with pytest.raises(ValueError, match="environment variable JAX_(NUM_PROCESSES|PROCESS_ID)"):
      f({"JAX_COORDINATOR_ADDRESS": "h:1", **bad})
  slurm = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_STEP_NODELIST": "n[1-2]"}
  assert f(slurm) == {}  # JAX's SLURM detection
  assert f(dict(slurm, SLURM_NTASKS="1")) is None  # a one-task allocation: one process
  assert f({"TPU_WORKER_HOSTNAMES": "a,b"}) == {} and f({"TPU_WORKER_HOSTNAMES": "a"}) is None
  assert f({"JAXCAP_DISTRIBUTED": "1"}) == {} and f(dict(slurm, JAXCAP_DISTRIBUTED="0")) is None


@pytest.mark.slow
def test_loss_does_not_depend_on_devices_or_row_order(setup, eight_devices):
  """One device, 8 devices, and 8 devices fed the rows in the order two processes produce
  (0, 2, 4, ..., 1, 3, ...): same losses with dropout on (per-example dropout keys)."""
  config, dataset = setup
  assert jax.device_count() == 8, "tests/conftest.py sets 8 fake CPU devices"
  (l8, p8), (lp, pp) = eight_devices
  l1, p1 = worker.run(config, dataset, parallel.make_mesh(jax.devices()[:1]), np.arange(worker.GLOBAL_BATCH))
  assert np.all(np.isfinite(l8))
  np.testing.assert_allclose(l1, l8, rtol=2e-6)
  np.testing.assert_allclose(lp, l8, rtol=2e-6)
  for k in p8:
    np.testing.assert_allclose(p1[k], p8[k], rtol=1e-4, atol=2e-5, err_msg=k)
    np.testing.assert_allclose(pp[k], p8[k], rtol=1e-4, atol=2e-5, err_msg=k)


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def finish(procs, timeout=600):
  """``(exit codes, stderrs)`` of processes started with text pipes, each waited for in turn
  (and killed if it outlives ``timeout``)."""
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=timeout))
    finally:
      p.kill()
  return [p.returncode for p in procs], [err for _, err in outs]


# Tiny sizes for the train.py launches; dropout large enough that a layout-dependent mask would
# show in the loss.
_TRAIN_ARGS = ["--config=configs/transformer.py:synthetic,tiny", "--config.eval_every_steps=2",
               "--config.log_every_steps=1", "--config.data.num_train=64", "--config.model.dropout=0.3",
               "--config.batch_size=16", "--config.eval_batch_size=16", "--config.warmup_steps=2"]

# Process 1 runs train.py under an audit hook that records every file it opens for writing and
# every file-system change it makes under the workdir (Python-level: orbax's own metadata, the
# writers, json files), so the test can check that only process 0 writes the run directory.
_AUDITED = """
import json, os, runpy, sys
workdir, log = os.path.abspath(sys.argv[1]), sys.argv[2]
seen = []
def hook(event, args):
  if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
    path, mode = os.fsdecode(args[0]), args[1]
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
      seen.append(os.path.abspath(path))
    elif isinstance(mode, int) and mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
      seen.append(os.path.abspath(path))
  elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.replace"):
    if args and isinstance(args[0], (str, bytes, os.PathLike)):
      seen.append(os.path.abspath(os.fsdecode(args[0])))
sys.addaudithook(hook)
import atexit
atexit.register(lambda: json.dump(sorted({p for p in seen if p.startswith(workdir + os.sep) or p == workdir}),
                                  open(log, "w")))
sys.argv = ["train.py", "--workdir", sys.argv[1]] + sys.argv[3:]
runpy.run_path("train.py", run_name="__main__")
"""


def _train_losses(workdir):
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return rows, [r["train/loss"] for r in rows if "train/loss" in r]


@pytest.mark.slow
def test_train_py_two_processes_like_one(tmp_path):
  """``train.py`` itself, launched as the README does (two processes x 4 CPU devices, gloo,
  ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``) against one process
  with 8 devices: the same per-step losses and validation / test scores, each step logged once,
  the run directory written by process 0 only, no traceback."""
  base = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  base.pop("JAX_COORDINATOR_ADDRESS", None)
  one = subprocess.run([sys.executable, "train.py", "--workdir", str(tmp_path / "one"), *_TRAIN_ARGS],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env=dict(base, XLA_FLAGS="--xla_force_host_platform_device_count=8 " + _FAST))
  assert one.returncode == 0 and "Traceback" not in one.stderr, one.stderr[-3000:]
  port, two, log1 = free_port(), tmp_path / "two", tmp_path / "process1_writes.json"
  procs = []
  for pid in range(2):
    env = dict(base, XLA_FLAGS="--xla_force_host_platform_device_count=4 " + _FAST,
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(pid))
    cmd = ([sys.executable, "train.py", "--workdir", str(two)] if pid == 0 else
           [sys.executable, "-c", _AUDITED, str(two), str(log1)]) + _TRAIN_ARGS
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
  codes, errs = finish(procs)
  for code, err in zip(codes, errs):
    assert code == 0 and "Traceback" not in err, err[-3000:]
  rows1, losses1 = _train_losses(tmp_path / "one")
  rows2, losses2 = _train_losses(two)
  assert len(losses1) == 4 and np.all(np.isfinite(losses1))
  np.testing.assert_allclose(losses2, losses1, rtol=1e-5)
  val = lambda rows: [(r["step"], r["val/CIDEr"]) for r in rows if "val/CIDEr" in r]
  assert [s for s, _ in val(rows2)] == [2, 4]  # each step once: process 1 wrote no metrics
  np.testing.assert_allclose([v for _, v in val(rows2)], [v for _, v in val(rows1)], rtol=1e-5)
  s1 = json.loads((tmp_path / "one" / "scores_test.json").read_text())["overall"]
  s2 = json.loads((two / "scores_test.json").read_text())["overall"]
  for k in s1:
    np.testing.assert_allclose(s2[k], s1[k], rtol=1e-5, atol=1e-9, err_msg=k)
  assert len(list((two / "tensorboard").iterdir())) == 1
  # Orbax's multi-process protocol has every process record the metadata of the arrays it holds
  # (``array_metadatas/process_<i>``) in the checkpoint being written; nothing else may appear.
  writes = [p for p in json.loads(log1.read_text()) if not re.search(r"/array_metadatas/process_1$", p)]
  assert writes == [], "process 1 wrote into the run directory"
