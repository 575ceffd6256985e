"""Metric writers: JSON lines and TensorBoard event files (no TensorFlow needed).

Only process 0 writes. TensorBoard events are written with the ``tensorboard`` package's
own event-file writer and protos; when that package is missing, only JSON lines are written.
"""

from __future__ import annotations

import json
import os
import time

import jax


def drop_lines_after(workdir: str, step: int) -> int:
  """Keeps the lines of ``<workdir>/metrics.jsonl`` with ``step <= step`` (process 0 only).

  A resumed run writes again every step after the checkpoint it resumed from, so the lines a
  killed run wrote past that step would appear twice. Lines that are not JSON objects with a
  ``step`` (the half-written last line of a killed run) are dropped too. Written to a
  temporary file and renamed, so a kill leaves either the old or the new file. Call it before
  a :class:`MetricWriter` opens the file.

  Returns:
    the number of lines dropped.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if jax.process_index() != 0 or not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = f.read().splitlines()
  kept = []
  for line in lines:
    try:
      rec = json.loads(line)
      if isinstance(rec, dict) and int(rec["step"]) <= step:
        kept.append(line)
    except (ValueError, KeyError, TypeError):
      pass
  if len(kept) == len(lines):
    return 0
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write("".join(line + "\n" for line in kept))
  os.replace(tmp, path)
  return len(lines) - len(kept)


class MetricWriter:

  def __init__(self, workdir: str, enabled: bool | None = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._tb = None
    self._jsonl = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
    try:
      from tensorboard.summary.writer.event_file_writer import EventFileWriter
      self._tb = EventFileWriter(os.path.join(workdir, "tensorboard"))
    except ImportError:  # pragma: no cover - tensorboard is in requirements.txt
      self._tb = None

  def write(self, step: int, metrics: dict, prefix: str = "") -> None:
    if not self.enabled:
      return
    metrics = {f"{prefix}{k}": float(v) for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **metrics}) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      from tensorboard.compat.proto import event_pb2, summary_pb2
      summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v)
                                           for k, v in metrics.items()])
      self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))
      self._tb.flush()

  def close(self) -> None:
    if self._jsonl:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
