"""Data parallelism over every local device, multi-host ready.

jaxcap uses the pmap programming model (replicated parameters, the batch split along its
first axis, gradients averaged) written with ``jax.jit`` and ``NamedSharding`` over a 1-D
``("data",)`` mesh of all devices: XLA inserts the gradient all-reduce. Each process feeds
only its own shard of the global batch (``jax.make_array_from_process_local_data``).
"""

from __future__ import annotations

import os

import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils

_DIST_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def maybe_initialize_distributed() -> None:
  """Calls ``jax.distributed.initialize()`` when launched as one process of a multi-host job.

  Detected from the coordinator environment variables (or a TPU pod / SLURM environment,
  which ``jax.distributed.initialize`` understands itself when ``JAXCAP_DISTRIBUTED=1``).
  """
  if any(os.environ.get(k) for k in _DIST_ENV) or os.environ.get("JAXCAP_DISTRIBUTED") == "1":
    if not jax.distributed.is_initialized():
      jax.distributed.initialize()


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
    raise ValueError(f"config field batch_size: {global_batch} is not divisible by the {n} devices; expected a multiple of {n}")
  return global_batch // jax.process_count()


def shard_batch(batch: dict, mesh: Mesh) -> dict:
  """Process-local numpy batch -> global jax.Arrays sharded along axis 0."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}


def to_host(x):
  """A (possibly multi-host) global array -> the full numpy array on every process."""
  if jax.process_count() == 1:
    return np.asarray(jax.device_get(x))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
