"""Orbax checkpoints: the latest ``keep`` plus the best by validation CIDEr-D.

A checkpoint holds the train state (parameters, optimiser state, step, RNG) and the data
iterator's position, so a run killed at any moment (SIGKILL included) resumes exactly.
Orbax writes each step into a temporary directory and renames it when complete, so a kill
during a save leaves the previous checkpoints intact.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpoints:
  """``<workdir>/checkpoints`` (latest k) and ``<workdir>/best`` (the best by a metric)."""

  def __init__(self, workdir: str, keep: int = 3, best_metric: str = "CIDEr"):
    self.workdir = os.path.abspath(workdir)
    self.best_metric = best_metric
    self.latest = ocp.CheckpointManager(
        os.path.join(self.workdir, "checkpoints"),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False),
        item_names=("state", "data"))
    self.best = ocp.CheckpointManager(
        os.path.join(self.workdir, "best"),
        options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True, best_fn=lambda m: m[best_metric],
                                             best_mode="max", enable_async_checkpointing=False),
        item_names=("state", "data"))

  @staticmethod
  def _save(mngr, step, state, data_state, metrics=None):
    mngr.save(int(step), args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                  data=ocp.args.JsonSave(data_state)),
              metrics=metrics, force=True)
    mngr.wait_until_finished()

  def save_latest(self, step: int, state, data_state: dict) -> None:
    if int(step) in self.latest.all_steps():
      return
    self._save(self.latest, step, state, data_state)

  def save_best_if_improved(self, step: int, state, data_state: dict, metrics: dict) -> bool:
    best = self.best_value()
    value = float(metrics[self.best_metric])
    if best is not None and value <= best:
      return False
    self._save(self.best, step, state, data_state, {self.best_metric: value})
    return True

  def best_value(self):
    step = self.best.best_step()
    if step is None:
      return None
    meta = self.best.metrics(step) if hasattr(self.best, "metrics") else None
    if meta is None:
      try:
        meta = self.best._checkpoints[-1].metrics  # older orbax
      except Exception:  # pylint: disable=broad-except
        return None
    return float(meta[self.best_metric])

  def latest_step(self):
    return self.latest.latest_step()

  def best_step(self):
    return self.best.best_step()

  def restore(self, abstract_state, step: int | None = None, which: str = "latest"):
    """Returns ``(state, data_state)`` from the given or newest step of ``which``."""
    mngr = self.latest if which == "latest" else self.best
    if step is None:
      step = mngr.latest_step() if which == "latest" else mngr.best_step()
    if step is None:
      return None, None
    restored = mngr.restore(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    return restored.state, restored.data

  def find_step(self, step: int):
    """Which manager holds ``step``: "latest", "best" or None."""
    if step in self.latest.all_steps():
      return "latest"
    if step in self.best.all_steps():
      return "best"
    return None

  def close(self):
    self.latest.close()
    self.best.close()


def abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
