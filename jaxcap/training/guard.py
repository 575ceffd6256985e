"""The non-finite guard: a NaN / Inf loss or gradient norm never reaches the parameters.

``guarded(step_fn)`` wraps a pure step ``(state, batch, ...) -> (state, metrics)`` inside its
jit: when any metric of the step (loss sums, gradient norm, ...) is not finite, the new
parameters and optimiser state are discarded (``jnp.where`` on the whole state; only the step
counter advances, so the data order and the RNG stream stay those of a straight run), the
step's metric sums are zeroed, and the step is flagged. The host then acts on
``config.nonfinite``:

- ``"stop"`` (default): the run stops at the first flagged step, before any later validation
  or checkpoint, with one line giving the step, the loss, the gradient norm and the batch's
  image ids (:class:`NonFiniteError`; ``train.py`` exits with code 3, see :mod:`jaxcap.cli`).
  Nothing is saved: the previous checkpoint stays the latest and ``best/`` is untouched. The
  step's metrics go to ``metrics.jsonl`` as ``null`` with ``"nonfinite": [names]``.
- ``"skip"``: the update is skipped and the run goes on; each logged line carries
  ``train/skipped`` (skipped steps in the window) and ``train/skipped_total``.

Flags are read on the host lazily (at each log, validation and checkpoint step and at the
end), so the guard adds no per-step device synchronisation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.errors import BadInput

OK = "_guard_ok"
LOSS = "_guard_loss"
GRAD_NORM = "_guard_grad_norm"
MODES = ("stop", "skip")


class NonFiniteError(RuntimeError):
  """The run stopped on a non-finite loss or gradient norm (``config.nonfinite="stop"``)."""


def guarded(step_fn):
  """``step_fn`` whose update is not applied when a metric is non-finite (see module doc)."""

  def fn(state, *args, **kwargs):
    new, metrics = step_fn(state, *args, **kwargs)
    values = [jnp.asarray(v) for v in metrics.values()]
    ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in values]))
    kept = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, state).replace(step=new.step)
    if "loss_sum" in metrics:
      loss = metrics["loss_sum"] / jnp.maximum(metrics.get("token_count", 1.0), 1.0)
    else:
      loss = metrics.get("scst_loss", jnp.float32(jnp.nan))
    out = {k: jnp.where(ok, v, jnp.zeros_like(v)) for k, v in metrics.items()}
    out[OK] = ok
    out[LOSS] = jnp.float32(loss)
    out[GRAD_NORM] = jnp.float32(metrics.get("grad_norm", jnp.float32(jnp.nan)))
    return kept, out

  return fn


def split_metrics(metrics: dict) -> tuple[dict, dict]:
  """``(metrics without the guard's entries, the guard's entries)``."""
  guard = {k: metrics[k] for k in (OK, LOSS, GRAD_NORM) if k in metrics}
  return {k: v for k, v in metrics.items() if k not in guard}, guard


class Monitor:
  """Host side: collects the guard's per-step flags and acts on them at check points."""

  def __init__(self, mode: str, image_ids, writer=None):
    if mode not in MODES:
      raise BadInput(f"config field nonfinite: expected 'stop' or 'skip', got {mode!r}")
    self.mode, self.image_ids, self.writer = mode, image_ids, writer
    self.pending: list = []
    self.skipped_total = 0

  def add(self, done: int, guard: dict, host_batch: dict) -> None:
    if guard:
      index = np.asarray(host_batch["image_index"])[np.asarray(host_batch["valid"], bool)]
      self.pending.append((done, guard, index))

  def check(self, latest_step=None) -> int:
    """Reads the pending flags; returns the number of skipped steps among them, or raises
    :class:`NonFiniteError` in stop mode."""
    if not self.pending:
      return 0
    flags = jax.device_get([g[OK] for _, g, _ in self.pending])
    bad = [p for p, ok in zip(self.pending, flags) if not bool(ok)]
    self.pending = []
    if not bad:
      return 0
    if self.mode == "skip":
      self.skipped_total += len(bad)
      return len(bad)
    done, g, index = bad[0]
    loss, gnorm = (float(x) for x in jax.device_get((g[LOSS], g[GRAD_NORM])))
    if self.writer is not None:
      self.writer.write(done, {"loss": loss, "grad_norm": gnorm, "stopped_nonfinite": 1.0},
                        prefix="train/")
    ids = [self.image_ids[int(i)] for i in index]
    shown = ", ".join(map(str, ids[:64])) + (f", ... ({len(ids) - 64} more)" if len(ids) > 64 else "")
    kept = (f"the latest checkpoint is still step {latest_step}" if latest_step is not None
            else "no checkpoint was saved")
    raise NonFiniteError(
        f"step {done}: non-finite training loss {loss} / gradient norm {gnorm} on the batch of "
        f"image ids [{shown}] (this process's rows); stopped without saving this state, {kept} "
        "(config field nonfinite='skip' skips such updates instead)")
