"""Will it fit? The device memory a compiled step needs, against what a device has.

XLA's compiled program says how much memory it needs on each device
(``compiled.memory_analysis()``: its arguments, outputs and temporaries, less the donated
arguments its outputs reuse). :func:`check_fits` compares that with the device's limit before a
run writes anything (``Trainer.fit`` checks its training and SCST steps at start;
``train.py --dry_run`` prints the figures and stops), as MaxText's ``train_compile.py`` does
ahead of time, so that an out-of-memory batch is one line naming the config field at start,
not an allocation failure after the workdir is written.

A GPU or TPU reports its limit (``memory_stats()["bytes_limit"]``); a CPU device does not: its
limit is the host's physical memory shared by the process's CPU devices.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import jax

from jaxcap.errors import BadInput


class StepMemory(NamedTuple):
  """Bytes one device needs for one compiled step."""
  arguments: int
  outputs: int
  temporaries: int
  aliased: int  # donated arguments whose buffers the outputs reuse
  code: int

  @property
  def total(self) -> int:
    return self.arguments + self.outputs + self.temporaries - self.aliased + self.code


def step_memory(compiled) -> StepMemory | None:
  """The per-device memory of a compiled step (None where the backend gives no analysis)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - a backend without memory analysis
    return None
  if m is None:
    return None
  get = lambda name: int(getattr(m, name, 0) or 0)
  return StepMemory(get("argument_size_in_bytes"), get("output_size_in_bytes"),
                    get("temp_size_in_bytes"), get("alias_size_in_bytes"),
                    get("generated_code_size_in_bytes"))


def device_limit(device=None) -> tuple[int | None, str]:
  """``(bytes one device may use, what that is)``; ``(None, ...)`` where it is unknown."""
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # noqa: BLE001 - CPU backends may not implement it
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{device.device_kind} ({device.platform})"
  try:
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None, f"{device.device_kind} (limit unknown)"
  n = max(1, sum(d.platform == device.platform for d in jax.local_devices()))
  if n == 1:
    return host, "the host's memory"
  return host // n, f"the host's {host / 2**30:.1f} GiB shared by {n} {device.platform} devices"


def gib(n: int | float) -> str:
  """Bytes as MiB below a GiB, else GiB."""
  return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def check_fits(name: str, memory: StepMemory | None, fields: str, values: str) -> None:
  """Raises one ``BadInput`` naming the config ``fields`` when the step ``name`` needs more
  than a device has (nothing is raised where either figure is unknown)."""
  limit, what = device_limit()
  if memory is None or limit is None or memory.total <= limit:
    return
  raise BadInput(
      f"config field {fields}: the {name} step needs {gib(memory.total)} per device "
      f"(arguments {gib(memory.arguments)}, temporaries {gib(memory.temporaries)}) but a device "
      f"has {gib(limit)} ({what}); expected a smaller {fields} (now {values}) or more devices")
