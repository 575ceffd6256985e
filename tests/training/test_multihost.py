"""Multi-host training equals one host (issue 18): ``jax.distributed`` from the standard
environment variables, per-example random keys, no parameter with an identically-zero gradient.

Mutants tried (each made a test here fail, then was restored): one dropout key for the whole
batch (the pre-issue-18 ``steps.py``: the two-process row order's losses differ from the
natural order's by up to 0.15, 3.7 %); ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` not passed to
``jax.distributed.initialize``; the attention key projections with a bias (before their
removal: after 3 steps the 1-device and 8-device key biases differ by up to 0.12).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import jax

from jaxcap import data as data_lib
from jaxcap.training import parallel
from tests.training import multihost_worker as worker

REPO = Path(__file__).resolve().parents[2]


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


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path, eight_devices):
  """Two CPU processes with 4 devices each (``jax.distributed`` from JAX_COORDINATOR_ADDRESS /
  JAX_NUM_PROCESSES / JAX_PROCESS_ID, gloo collectives) give one process's losses and
  parameters on the same global batch."""
  port = _free_port()
  out = tmp_path / "out.json"
  procs = []
  for pid in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(pid),
               PYTHONPATH=str(REPO))
    procs.append(subprocess.Popen([sys.executable, "-m", "tests.training.multihost_worker", str(out)],
                                  cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  logs = []
  for p in procs:
    try:
      logs.append(p.communicate(timeout=600)[0].decode()[-3000:])
    finally:
      p.kill()
  assert all(p.returncode == 0 for p in procs), "\n".join(logs)
  got = json.loads(out.read_text())
  assert got["processes"] == 2 and got["devices"] == 8
  l8, p8 = eight_devices[0]
  np.testing.assert_allclose(got["losses"], l8, rtol=2e-6)
  assert set(got["params"]) == set(p8)
  for k, v in got["params"].items():
    np.testing.assert_allclose(np.asarray(v, np.float32), p8[k], rtol=1e-4, atol=2e-5, err_msg=k)
