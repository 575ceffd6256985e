"""Data parallelism over every local device, multi-host ready.

jaxcap uses the pmap programming model (replicated parameters, the batch split along its
first axis, gradients averaged) written with ``jax.jit`` and ``NamedSharding`` over a 1-D
``("data",)`` mesh of all devices: XLA inserts the gradient all-reduce. Each process feeds
only its own shard of the global batch (``jax.make_array_from_process_local_data``).
"""

from __future__ import annotations

import os
import queue
import threading

import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils

from jaxcap.errors import BadInput

def distributed_init_args(environ=None) -> dict | None:
  """The ``jax.distributed.initialize`` keyword arguments for this launch; None: one process.

  * ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0), ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID``: passed explicitly (``jax.distributed.initialize()`` itself reads only
    the coordinator address from the environment, then fails with "Number of processes must be
    defined");
  * SLURM with more than one task (``srun``: ``SLURM_JOB_ID``, ``SLURM_NTASKS`` > 1,
    ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_STEP_NODELIST``): no arguments, JAX's SLURM
    cluster detection fills them in;
  * a multi-host TPU slice (``TPU_WORKER_HOSTNAMES`` / ``TPU_PROCESS_ADDRESSES`` naming more
    than one host), or ``JAXCAP_DISTRIBUTED=1`` anywhere JAX detects the cluster itself (TPU
    pods, Open MPI, Kubernetes): no arguments;
  * ``JAXCAP_DISTRIBUTED=0`` turns all of this off.

  Raises:
    BadInput: a coordinator address without a valid process count or id (one line).
  """
  env = os.environ if environ is None else environ
  flag = env.get("JAXCAP_DISTRIBUTED", "")
  if flag == "0":
    return None
  coordinator = env.get("JAX_COORDINATOR_ADDRESS", "")
  if coordinator:
    num = _env_int(env, "JAX_NUM_PROCESSES", coordinator, minimum=1)
    pid = _env_int(env, "JAX_PROCESS_ID", coordinator, minimum=0)
    if pid >= num:
      raise BadInput(f"environment variable JAX_PROCESS_ID: expected 0 <= id < JAX_NUM_PROCESSES "
                       f"({num}), got {pid}")
    return {"coordinator_address": coordinator, "num_processes": num, "process_id": pid}
  if flag == "1":
    return {}
  slurm = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NODELIST")
  if all(env.get(k) for k in slurm) and env["SLURM_NTASKS"].isdigit() and int(env["SLURM_NTASKS"]) > 1:
    return {}
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
  if len([h for h in hosts.split(",") if h.strip()]) > 1:
    return {}
  return None


def _env_int(env, name: str, coordinator: str, minimum: int) -> int:
  value = env.get(name, "")
  try:
    out = int(value)
  except ValueError:
    out = None
  if out is None or out < minimum:
    raise BadInput(f"environment variable {name}: expected an integer >= {minimum} with "
                     f"JAX_COORDINATOR_ADDRESS={coordinator}, got {value!r}")
  return out


def maybe_initialize_distributed() -> None:
  """Calls ``jax.distributed.initialize`` when launched as one process of a multi-host job
  (see :func:`distributed_init_args`); must run before anything touches a JAX backend."""
  kwargs = distributed_init_args()
  if kwargs is not None and not jax.distributed.is_initialized():
    jax.distributed.initialize(**kwargs)


def make_mesh(devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), ("data",))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def local_batch_size(global_batch: int, mesh: Mesh) -> int:
  """This process's share of a global batch; the global batch must split evenly over devices."""
  n = mesh.devices.size
  if global_batch % n:
    raise BadInput(f"config field batch_size: {global_batch} is not divisible by the {n} devices; expected a multiple of {n}")
  return global_batch // jax.process_count()


def shard_batch(batch: dict, mesh: Mesh) -> dict:
  """Process-local numpy batch -> global jax.Arrays sharded along axis 0."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}


class DevicePrefetch:
  """``(host batch, device batch)`` pairs of ``iterator``, fetched and copied to ``mesh`` ahead.

  A background thread takes the next ``size`` batches from the loader and copies them to the
  devices (:func:`shard_batch`) while the devices run the current step, so neither the loader's
  hand-over (grain workers' shared memory) nor the host-to-device copy sits on the loop's thread
  between two dispatches (flax's ``prefetch_to_device`` keeps transfers ahead but runs them on
  the caller's thread, and is written for ``pmap``). The batches and their order are the
  loader's. ``get_state()`` is the loader's state after the last batch handed out, not after the
  ones buffered ahead, so a checkpoint resumes at the first batch the loop has not seen; a
  loader's error is raised by the ``next()`` that would have returned its batch.
  """

  def __init__(self, iterator, mesh: Mesh, size: int = 2):
    self._it, self._mesh = iterator, mesh
    self._state = iterator.get_state()
    self._queue: queue.Queue = queue.Queue(maxsize=max(1, size))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._fill, name="DevicePrefetch", daemon=True)
    self._thread.start()

  def _fill(self):
    while not self._stop.is_set():
      try:
        host = next(self._it)
        item = (host, shard_batch(host, self._mesh), self._it.get_state())
      except BaseException as e:  # handed to the loop's thread, raised there
        item = e
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if isinstance(item, BaseException):
        return

  def __iter__(self):
    return self

  def __next__(self) -> tuple[dict, dict]:
    item = self._queue.get()
    if isinstance(item, BaseException):
      self.close()
      raise item
    host, device, self._state = item
    return host, device

  def get_state(self) -> dict:
    return self._state

  def close(self) -> None:
    self._stop.set()
    self._thread.join(timeout=10)


def to_host(x):
  """A (possibly multi-host) global array -> the full numpy array on every process."""
  if jax.process_count() == 1:
    return np.asarray(jax.device_get(x))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
