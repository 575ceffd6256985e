"""Metric writers: JSON lines and TensorBoard event files (no TensorFlow needed).

Only process 0 writes. ``metrics.jsonl`` gets one ``{"step", "time", <prefix><name>: value}``
line per call; ``tensorboard/`` gets the same scalars through tensorboardX's ``SummaryWriter``
(a maintained event-file writer that needs only protobuf), read by ``tensorboard --logdir``,
the caption scores named and scaled as every printed table shows them
(:func:`jaxcap.evaluation.coco_metrics.display`: ``val/CIDEr`` 0.75 is ``val/CIDEr-D`` 75.0);
``metrics.jsonl`` keeps pycocoevalcap's keys and scale (``val/CIDEr`` 0.75: CIDEr-D in 0-10,
BLEU in 0-1), as every JSON file does.
"""

from __future__ import annotations

import json
import math
import os
import time

import jax

from jaxcap import atomic
from jaxcap.evaluation import coco_metrics


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
  with open(path, "rb") as f:  # bytes: a line of damaged (non-UTF-8) bytes is dropped, not fatal
    lines = f.read().splitlines()
  kept = []
  for line in lines:
    try:
      rec = json.loads(line.decode("utf-8"))
      if isinstance(rec, dict) and int(rec["step"]) <= step:
        kept.append(line.decode("utf-8"))
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
      pass
  if len(kept) == len(lines):
    return 0
  atomic.write_text(path, "".join(line + "\n" for line in kept))
  return len(lines) - len(kept)


class MetricWriter:
  """Writes scalar metrics to ``<workdir>/metrics.jsonl`` and ``<workdir>/tensorboard/``."""

  def __init__(self, workdir: str, enabled: bool | None = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._tb = None
    self._jsonl = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self._path = os.path.join(workdir, "metrics.jsonl")
    self._tb_dir = os.path.join(workdir, "tensorboard")
    self._jsonl = open(self._path, "a")
    from tensorboardX import SummaryWriter
    # tensorboardX writes from a background thread and flushes every flush_secs; close()
    # (the end of fit) writes everything. metrics.jsonl is flushed on every write.
    self._tb = SummaryWriter(self._tb_dir, flush_secs=10)

  def write(self, step: int, metrics: dict, prefix: str = "") -> None:
    """Writes ``{prefix + name: float(value)}`` at ``step``; a NaN / inf value is written as
    null in JSON (JSON has no NaN) and as itself in TensorBoard."""
    if not self.enabled:
      return
    metrics = {f"{prefix}{k}": float(v) for k, v in metrics.items()}
    now = time.time()
    # JSON has no NaN / Infinity: such values are written as null and named in "nonfinite".
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    line = {"step": int(step), "time": now,
            **{k: (None if k in bad else v) for k, v in metrics.items()}}
    if bad:
      line["nonfinite"] = bad
    with atomic.naming(self._path):  # a full disk: the line names the file
      self._jsonl.write(json.dumps(line, allow_nan=False) + "\n")
      self._jsonl.flush()
    for k, v in metrics.items():
      prefix_, _, key = k.rpartition("/")
      name, scale = coco_metrics.display(key)
      tag = f"{prefix_}/{name}" if prefix_ else name
      self._tb.add_scalar(tag, v * scale, global_step=int(step), walltime=now)

  def close(self) -> None:
    if self._jsonl:
      jsonl, self._jsonl = self._jsonl, None
      with atomic.naming(self._path):
        jsonl.close()
    if self._tb is not None:
      tb, self._tb = self._tb, None
      with atomic.naming(self._tb_dir):
        tb.close()
