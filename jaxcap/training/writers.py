"""Metric writers: JSON lines and TensorBoard event files (no TensorFlow needed).

Only process 0 writes. TensorBoard events are written with the ``tensorboard`` package's
own event-file writer and protos; when that package is missing, only JSON lines are written.
"""

from __future__ import annotations

import json
import math
import os
import time

import jax


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
    # JSON has no NaN / Infinity: such values are written as null and named in "nonfinite".
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    line = {"step": int(step), "time": time.time(),
            **{k: (None if k in bad else v) for k, v in metrics.items()}}
    if bad:
      line["nonfinite"] = bad
    self._jsonl.write(json.dumps(line, allow_nan=False) + "\n")
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
