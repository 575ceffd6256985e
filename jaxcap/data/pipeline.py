"""grain input pipeline: a checkpointable training iterator and ordered evaluation batches.

Both are ``grain.MapDataset.range(...).map(make_batch)`` over *batch numbers*: the batch
function derives its image rows from (seed, epoch, position) alone, so the pipeline is a
pure function of the step number and grain's ordered thread prefetch cannot reorder or
lose anything. Save/restore is exact by construction: the state is the step number.

Training order: epoch ``e`` permutes the split with ``np.random.default_rng([seed, e])``;
process ``p`` of ``P`` takes every P-th image of the first ``P * (n // P)`` (disjoint shards,
equal lengths so every process runs the same number of steps), in batches of ``B`` images
(``drop_remainder`` drops the short last batch, otherwise it is padded with ``valid=False``).
Caption sampling for images with R != S references is seeded by (seed, epoch, position, p).

Dimension legend: B images per process batch, n images in the split, P processes.
"""

from __future__ import annotations

import os
import threading
from typing import Iterator

import numpy as np
import grain

from jaxcap.errors import BadInput

_HUGE = 2 ** 62  # "forever": grain needs a length; no run reaches this many steps.


def _process_defaults(shard_index, shard_count):
  if shard_index is None or shard_count is None:
    import jax  # Only here: the data package itself does not need jax.
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index}: expected 0 <= shard_index < shard_count "
                     f"({shard_count})")
  return int(shard_index), int(shard_count)


def _read_options(num_threads: int, prefetch: int):
  # grain reads with at most prefetch_buffer_size threads at once: a smaller buffer idles threads.
  return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=max(prefetch, num_threads))


def auto_workers(cores: int | None = None) -> int:
  """``data.num_workers = -1``: grain worker processes from this process's CPU cores — none
  below 8 cores (threads suit small hosts better: measured on 2), else half the cores, at most
  16, leaving the other half to the training process (its grain threads, the batches' device
  copies of ``parallel.DevicePrefetch``, XLA's host threads). A rule, not a measurement."""
  if cores is None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  return 0 if cores < 8 else min(cores // 2, 16)


def _maybe_multiprocess(ds, num_workers: int):
  if num_workers < 0:
    num_workers = auto_workers()
  if num_workers <= 0:
    return ds
  # grain 0.2.x workers read absl flags; an unparsed FLAGS object makes them fail to start.
  from absl import flags
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))


class _TrainBatches:
  """Step number -> batch: a pure function of the settings (picklable for grain workers)."""

  def __init__(self, source, batch_size, seed, shard_index, shard_count, per_shard,
               steps_per_epoch):
    self.source, self.batch_size, self.seed = source, batch_size, seed
    self.shard_index, self.shard_count = shard_index, shard_count
    self.per_shard, self.steps_per_epoch = per_shard, steps_per_epoch
    self.__setstate__(self.__dict__)

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_perm_cache")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()
    self._perm_cache = {}

  def shard_indices(self, epoch: int) -> np.ndarray:
    with self._lock:
      perm = self._perm_cache.get(epoch)
      if perm is None:
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.source))
        if len(self._perm_cache) > 4:  # Prefetch threads straddle at most two epochs.
          self._perm_cache.pop(min(self._perm_cache))
        self._perm_cache[epoch] = perm
    stop = self.per_shard * self.shard_count
    return perm[self.shard_index:stop:self.shard_count]

  def __call__(self, step: int) -> dict:
    epoch, pos = divmod(int(step), self.steps_per_epoch)
    rows = self.shard_indices(epoch)[pos * self.batch_size:(pos + 1) * self.batch_size]
    rng = np.random.default_rng([self.seed, epoch, pos, self.shard_index])
    return self.source.collate([self.source[i] for i in rows], rng, batch_size=self.batch_size)


class TrainIterator:
  """Yields training batches forever; ``get_state()`` / ``set_state()`` are JSON dicts.

  Args:
    source: a :class:`jaxcap.data.base.SplitSource` (anything with ``len``, ``[i]`` and
      ``collate(examples, rng, batch_size)``).
    batch_size: images per batch in this process.
    seed: shuffling and caption-sampling seed.
    shard_index, shard_count: this process and the number of processes (default
      ``jax.process_index()`` / ``jax.process_count()``).
    drop_remainder: drop the short last batch of each epoch (else pad with ``valid=False``).
    num_threads: grain prefetch threads (0: batches are built on the calling thread).
    prefetch: batches buffered ahead.
    num_workers: grain worker processes (0: none; threads suit 2-core hosts better; -1:
      :func:`auto_workers`).
  """

  def __init__(self, source, batch_size: int, *, seed: int = 0, shard_index: int | None = None,
               shard_count: int | None = None, drop_remainder: bool = True,
               num_threads: int = 2, prefetch: int = 4, num_workers: int = 0):
    self.source, self.batch_size = source, int(batch_size)
    self.shard_index, self.shard_count = _process_defaults(shard_index, shard_count)
    self.drop_remainder = drop_remainder
    n = len(source)
    self.per_shard = n // self.shard_count
    if drop_remainder:
      self.steps_per_epoch = self.per_shard // self.batch_size
    else:
      self.steps_per_epoch = -(-self.per_shard // self.batch_size)
    if self.steps_per_epoch == 0:
      raise BadInput(f"{source!r}: {n} images over {self.shard_count} processes is fewer than "
                       f"batch_size {self.batch_size}, expected at least one full batch")
    self._opts = (num_threads, prefetch, num_workers)
    self._build(int(seed), 0)

  def _build(self, seed: int, start: int) -> None:
    # Resuming rebuilds the range from the saved step: exact in every mode, including grain
    # worker processes whose own state is not a step number.
    self.seed, self._next = seed, start
    self.batch_at = _TrainBatches(self.source, self.batch_size, seed, self.shard_index,
                                  self.shard_count, self.per_shard, self.steps_per_epoch)
    num_threads, prefetch, num_workers = self._opts
    ds = grain.MapDataset.range(start, _HUGE).map(self.batch_at).to_iter_dataset(
        _read_options(num_threads, prefetch))
    self._it = iter(_maybe_multiprocess(ds, num_workers))

  def shard_indices(self, epoch: int) -> np.ndarray:
    """Rows of the split this process visits in ``epoch``, in order."""
    return self.batch_at.shard_indices(epoch)

  def __iter__(self) -> Iterator[dict]:
    return self

  def __next__(self) -> dict:
    batch = next(self._it)
    self._next += 1
    return batch

  def get_state(self) -> dict:
    epoch, position = divmod(self._next, self.steps_per_epoch)
    return {"epoch": epoch, "position": position, "seed": self.seed,
            "batch_size": self.batch_size, "shard_index": self.shard_index,
            "shard_count": self.shard_count, "num_images": len(self.source)}

  def set_state(self, state: dict) -> None:
    """Continues from a saved state: the next batch is the one after the saved one."""
    for key in ("batch_size", "shard_count", "num_images"):
      mine = self.get_state()[key]
      if key in state and int(state[key]) != mine:
        raise BadInput(f"iterator state: field {key!r} is {state[key]}, expected {mine} "
                         "(the data or batch settings changed since the checkpoint)")
    step = int(state["epoch"]) * self.steps_per_epoch + int(state["position"])
    self._build(int(state.get("seed", self.seed)), step)


def make_train_iterator(source, batch_size: int, **kwargs) -> TrainIterator:
  """See :class:`TrainIterator`."""
  return TrainIterator(source, batch_size, **kwargs)


def eval_batches(source, batch_size: int, *, shard_index: int = 0, shard_count: int = 1,
                 seed: int = 0, num_threads: int = 2, prefetch: int = 4) -> Iterator[dict]:
  """Yields the split once, in order, in batches of ``batch_size`` images.

  The last batch is padded with ``valid=False`` rows. With ``shard_count > 1`` process
  ``shard_index`` takes rows ``shard_index, shard_index + P, ...`` and every process yields
  the same number of batches (padding rows where the split runs out).
  """
  n = len(source)
  rows = np.arange(shard_index, n, shard_count)
  num_batches = -(-(-(-n // shard_count)) // batch_size)

  def make(k):
    chunk = rows[k * batch_size:(k + 1) * batch_size]
    rng = np.random.default_rng([seed, k, shard_index])
    return source.collate([source[i] for i in chunk], rng, batch_size=batch_size)

  if num_threads <= 0:
    for k in range(num_batches):
      yield make(k)
    return
  ds = grain.MapDataset.range(num_batches).map(make).to_iter_dataset(
      _read_options(num_threads, prefetch))
  yield from ds
