"""Preemption: SIGTERM (or SIGINT) during training saves a checkpoint at the current step.

A scheduler that takes the machine back sends SIGTERM; a person presses Ctrl-C (SIGINT). The
training loop asks :meth:`Watch.reached` after every step; once it says so, the loop saves the
latest checkpoint at that step (the loader's state after the last batch taken) and raises
:class:`Preempted`, which the command line reports in one line with exit code
``cli.EXIT_PREEMPTED``. Running the same command again resumes from that step, bitwise as if
the run had not stopped.

With several processes every process must stop at the same step (each saves its shards of one
checkpoint): JAX's preemption sync point (``multihost_utils.reached_preemption_sync_point``,
whose notifier ``jax.distributed.initialize`` installs for SIGTERM, the scheduler's signal)
agrees on it without a collective per step; SIGINT then keeps its default (a
``KeyboardInterrupt`` in the process that got it). A second SIGINT of a single process stops at
once.
"""

from __future__ import annotations

import signal
import threading

import jax
from jax.experimental import multihost_utils


class Preempted(Exception):
  """Training stopped on a signal after saving the latest checkpoint at ``step``."""

  def __init__(self, step: int, workdir: str, signame: str):
    self.step, self.workdir, self.signame = step, workdir, signame
    super().__init__(f"{signame} at step {step}: saved {workdir}/checkpoints/{step}; run the same "
                     "command again to resume from it")


class Watch:
  """Installs the SIGTERM / SIGINT handlers while training runs (a context manager)."""

  def __init__(self):
    self.signame = None
    self._saved = {}

  def _handle(self, signum, frame):
    del frame
    if self.signame is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C: stop now
    self.signame = signal.Signals(signum).name

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      # With several processes JAX's own notifier handles SIGTERM (it agrees on the step).
      for sig in () if jax.process_count() > 1 else (signal.SIGTERM, signal.SIGINT):
        self._saved[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._saved.items():
      signal.signal(sig, handler)
    self._saved.clear()

  def reached(self, step: int) -> bool:
    """Whether every process stops after ``step`` (the same answer on each)."""
    if jax.process_count() == 1:
      return self.signame is not None
    if multihost_utils.reached_preemption_sync_point(step):
      self.signame = "SIGTERM"
      return True
    return False
