"""Sharding rules for parameters and optimiser state over a ``("data", "model")`` mesh
(config field ``sharding``; the trainer lays its state out by them: ``Trainer.state_shardings``).

Dimension legend: D data-axis size (devices the batch is split over), M model-axis size.

- ``"replicated"``: every array whole on every device (data parallelism as today).
- ``"fsdp"`` (big_vision's ``fsdp`` strategy, ZeRO-3 style): each array of at least
  ``min_elements`` elements is split over the data axis along its largest dimension that D
  divides (the last such on a tie, as big_vision's rule picks); smaller arrays and arrays no
  dimension of which D divides stay whole. The optimiser state follows its parameter: optax's
  moments have the parameter's shape, so the same rule gives them the same spec; scalars (the
  step count) are replicated. Inside ``jit`` XLA gathers a split parameter before its use and
  reduce-scatters its gradient: the numbers are those of the replicated program.

:func:`per_device_bytes` counts what each device holds of a tree under given shardings (from the
shard shapes); the compiled program's own count is ``compiled.memory_analysis()``.
"""

from __future__ import annotations

import math

import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxcap.errors import BadInput

RULES = ("replicated", "fsdp")
MIN_ELEMENTS = 2 ** 14  # below this an array's all-gather costs more than keeping it whole


def make_mesh(data: int = -1, model: int = 1, devices=None) -> Mesh:
  """A ``("data", "model")`` mesh; ``data=-1``: every device not on the model axis."""
  devices = list(jax.devices() if devices is None else devices)
  if model < 1 or len(devices) % model:
    raise BadInput(f"config field mesh.model: expected a divisor of the {len(devices)} devices, got {model}")
  data = len(devices) // model if data == -1 else data
  if data < 1 or data * model != len(devices):
    raise BadInput(f"config field mesh.data: expected data x model = {len(devices)} devices "
                     f"(data={data}, model={model}); -1 takes the rest")
  return Mesh(np.asarray(devices).reshape(data, model), ("data", "model"))


def fsdp_spec(shape, data_size: int, min_elements: int = MIN_ELEMENTS) -> P:
  """The partition spec of one array of ``shape`` under the ``"fsdp"`` rule."""
  if data_size <= 1 or math.prod(shape) < min_elements:
    return P()
  candidates = [i for i, n in enumerate(shape) if n % data_size == 0 and n >= data_size]
  if not candidates:
    return P()
  axis = max(candidates, key=lambda i: (shape[i], i))  # the largest; the last on a tie
  return P(*(["data" if i == axis else None for i in range(len(shape))]))


def shardings(tree, mesh: Mesh, rule: str = "replicated", min_elements: int = MIN_ELEMENTS):
  """A tree of ``NamedSharding`` for ``tree``'s arrays (or shape structs) under ``rule``."""
  if rule not in RULES:
    raise BadInput(f"config field sharding: expected one of {', '.join(RULES)}, got {rule!r}")
  data_size = mesh.shape["data"]

  def one(x):
    shape = tuple(getattr(x, "shape", ()))
    spec = fsdp_spec(shape, data_size, min_elements) if rule == "fsdp" else P()
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map(one, tree)


def per_device_bytes(tree, tree_shardings) -> int:
  """Bytes one device holds of ``tree`` under ``tree_shardings`` (the largest over devices)."""
  total = 0
  for x, s in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(
      tree_shardings, is_leaf=lambda v: isinstance(v, NamedSharding))):
    shape = tuple(getattr(x, "shape", ()))
    shard = s.shard_shape(shape) if shape else ()
    total += math.prod(shard) * np.dtype(x.dtype).itemsize
  return total
