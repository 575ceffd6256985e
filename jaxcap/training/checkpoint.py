"""Orbax checkpoints: the latest ``keep`` plus the best by validation CIDEr-D.

A checkpoint holds the train state (parameters, optimiser state, step, RNG) and the data
iterator's position, so a run killed at any moment (SIGKILL included) resumes exactly.
Orbax writes each step into a temporary directory and renames it when complete, so a kill
during a save leaves the previous checkpoints intact (the temporary directory is removed when
the run starts again).

Saves are asynchronous (orbax's async checkpointing): ``save`` returns once the arrays are
copied off the devices and a thread writes them while training goes on; the next save, a
restore, :meth:`Checkpoints.wait` and :meth:`Checkpoints.close` wait for it and raise its error
(a full disk is one ``OSError`` naming the folder, the step and the last committed step; the
committed steps are untouched). ``config.async_checkpoints=False`` writes in the foreground.

What a crash or a damaged disk can still leave behind, and how a resumed run handles it
(:meth:`Checkpoints.resume`):

* a damaged step directory (emptied, files missing or corrupt — not an orbax temporary
  directory): the newest intact step is restored instead, with one line naming the damaged and
  the restored directory; the damaged one is moved to ``<workdir>/damaged_checkpoints/`` (kept
  for inspection, out of the way of the step that will be written again);
* a checkpoint of a different parameter tree (written before a change to the model's code, or
  edited by hand): not a damaged step — nothing is moved; one line names the step directory and
  the first missing / unexpected parameters (:class:`TreeMismatchError`);
* a kill after a save but before orbax deleted the oldest step (``keep + 1`` steps): orbax
  applies its retention (``max_to_keep``; ``best/``: the best step by its metric) only after a
  save, so :meth:`Checkpoints.resume` deletes the extra steps at start and ``keep_checkpoints``
  always holds (and ``best/`` keeps only its best step).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import glob
import logging
import os
import shutil
import time
import warnings
import weakref

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from jax.experimental import multihost_utils

from jaxcap.errors import BadInput


def _not_orbax_thread_error(record: logging.LogRecord) -> bool:
  """Orbax logs the traceback of a failed background save, which the waiting save raises again
  (reported there in one line), and a warning at the preemption step on each thread."""
  if "orbax" in record.pathname and "Reached preemption sync point" in record.getMessage():
    return False  # the stop is reported in one line (jaxcap.training.preemption)
  return not (record.levelno >= logging.ERROR and "orbax" in record.pathname
              and (record.exc_info or "futures" in record.pathname))


def quiet_logs() -> None:
  """Orbax and absl log every checkpoint step at INFO; keep the console for progress and results."""
  absl_logging.set_verbosity(absl_logging.WARNING)
  for name in ("orbax", "absl", "jax._src.xla_bridge"):
    logging.getLogger(name).setLevel(logging.WARNING)
  absl_logger = logging.getLogger("absl")
  if _not_orbax_thread_error not in absl_logger.filters:
    absl_logger.addFilter(_not_orbax_thread_error)


class _SettlingLoop(asyncio.SelectorEventLoop):
  """An event loop that lets its pending tasks finish before it closes.

  Orbax runs each restore on a fresh event loop and closes it as soon as the restore returns
  or raises. When one array of a damaged step fails to read, the reads still in flight finish
  a moment later on tensorstore's threads and post their results to the closed loop: a
  ``RuntimeError: Event loop is closed`` traceback on stderr, although the damage was handled.
  """

  def close(self):
    if not self.is_running() and not self.is_closed():
      pending = asyncio.all_tasks(self)
      if pending:  # gather retrieves their exceptions (no "never retrieved" log either)
        self.run_until_complete(asyncio.wait_for(
            asyncio.gather(*pending, return_exceptions=True), timeout=120))
    super().close()

  def call_soon_threadsafe(self, callback, *args, context=None):
    # A read that outlives its restore (a tensorstore thread finishing after the loop closed)
    # has nobody waiting for it any more: its callback is dropped, not raised into the thread.
    try:
      return super().call_soon_threadsafe(callback, *args, context=context)
    except RuntimeError:
      if self.is_closed():
        return None
      raise

  def call_exception_handler(self, context):
    # A damaged step fails several reads at once: the restore raises the first (the caller
    # reports it in one line) and the others end as this loop's "never retrieved" task errors,
    # the same damage again; they go to the debug log, not to stderr.
    if context.get("message") == "Task exception was never retrieved":
      logging.getLogger(__name__).debug("another read of the same restore failed: %s",
                                        context.get("exception"))
      return
    super().call_exception_handler(context)


class _SettlingPolicy(asyncio.DefaultEventLoopPolicy):
  _loop_factory = _SettlingLoop


_SAVERS = []  # the event loop policy before the first open asynchronous saver, then their tokens


def _settle_background_saves(saver) -> None:
  """Event loops are :class:`_SettlingLoop` while an asynchronous ``saver`` is open.

  Orbax writes an asynchronous save on its own thread, in event loops it creates there. When a
  write fails (a full disk), the loop closes while tensorstore's other writes of the step are
  still in flight; each then posts its result to the closed loop and prints a ``RuntimeError:
  Event loop is closed`` traceback, although the failure is reported (in one line) by the next
  save. A settling loop drops those late results; otherwise it behaves as the default loop. The
  previous policy is put back when the last saver closes (:func:`_release_background_saves`).
  """
  with warnings.catch_warnings():  # event loop policies are deprecated from Python 3.14
    warnings.simplefilter("ignore", DeprecationWarning)
    if not _SAVERS:
      _SAVERS.append(asyncio.get_event_loop_policy())
      asyncio.set_event_loop_policy(_SettlingPolicy())
  _SAVERS.append(saver)


def _release_background_saves(saver) -> None:
  if saver not in _SAVERS[1:]:
    return
  _SAVERS.remove(saver)
  if len(_SAVERS) == 1:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)
      asyncio.set_event_loop_policy(_SAVERS.pop())


@contextlib.contextmanager
def _settled_reads():
  """Event loops created inside (orbax's, for one restore) finish their reads before closing.

  Orbax's warnings about the step's files are held back too: a damaged step is reported by
  the caller in one line (a fallback warning, or the error naming the step directory).
  """
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(max(level, logging.ERROR))
  with warnings.catch_warnings():  # event loop policies are deprecated from Python 3.14
    warnings.simplefilter("ignore", DeprecationWarning)
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_SettlingPolicy())
  try:
    yield
  finally:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)
      asyncio.set_event_loop_policy(previous)
    absl_logger.setLevel(level)


class TreeMismatchError(BadInput):
  """A readable checkpoint whose parameter tree is not the one the model builds."""


def _leaf_names(tree) -> set:
  """``params/decoder/bias``-style names of a tree's leaves."""
  return {jax.tree_util.keystr(p, simple=True, separator="/")
          for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tree_mismatch(step_dir: str, abstract_state) -> str | None:
  """How the tree saved in ``step_dir/state`` differs from ``abstract_state`` (None: no
  difference found, or the saved tree's metadata is unreadable, i.e. a damaged step)."""
  try:
    with _settled_reads(), ocp.StandardCheckpointer() as ckptr:
      meta = ckptr.metadata(os.path.join(step_dir, "state"))
    disk = _leaf_names(getattr(meta, "item_metadata", meta))
  except Exception:  # pylint: disable=broad-except  # unreadable metadata: damaged, not mismatched
    return None
  want = _leaf_names(abstract_state)
  missing, unexpected = sorted(want - disk), sorted(disk - want)
  if not disk or not (missing or unexpected):
    return None
  parts = []
  if missing:
    parts.append(f"{len(missing)} parameter(s) of this model missing there, e.g. {missing[0]}")
  if unexpected:
    parts.append(f"{len(unexpected)} not in this model, e.g. {unexpected[0]}")
  return "; ".join(parts)


_UNREAD = object()


class Checkpoints:
  """``<workdir>/checkpoints`` (latest k) and ``<workdir>/best`` (the best by a metric)."""

  def __init__(self, workdir: str, keep: int = 3, best_metric: str = "CIDEr",
               asynchronous: bool = True):
    self.workdir = os.path.abspath(workdir)
    self.best_metric = best_metric
    self.keep = int(keep)
    self.asynchronous = bool(asynchronous)
    self._settling = None  # the finalizer that releases the settling policy (see _save)
    self._best_value = _UNREAD  # best_value()
    self._writing = {}  # id(manager) -> (step, bytes) of the write in the background
    # Temporary folders are removed by resume() (the run that writes here), not when any
    # reader opens the folder: an evaluation of a run in progress must not delete its save.
    options = dict(create=True, enable_async_checkpointing=self.asynchronous,
                   cleanup_tmp_directories=False)
    # Each manager its own barrier names: with several processes, latest/ and best/ write the
    # same step at once, and orbax names its barriers after the step.
    barriers = lambda name: ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=name)
    self.latest = ocp.CheckpointManager(
        os.path.join(self.workdir, "checkpoints"),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, **options,
                                             multiprocessing_options=barriers("latest")),
        item_names=("state", "data"))
    # orbax ranks the saved steps when it opens the folder: a step chosen by another metric
    # ranks lowest here, and best_value() refuses it before this run compares anything with it.
    self.best = ocp.CheckpointManager(
        os.path.join(self.workdir, "best"),
        options=ocp.CheckpointManagerOptions(max_to_keep=1,
                                             best_fn=lambda m: m.get(best_metric, float("-inf")),
                                             best_mode="max", keep_checkpoints_without_metrics=False,
                                             **options, multiprocessing_options=barriers("best")),
        item_names=("state", "data"))

  @contextlib.contextmanager
  def _reported(self, mngr, step: int, nbytes: int):
    """A failed save (this one, or the background write of the previous one, which orbax
    raises here) leaves the committed steps as they were: orbax's temporary folder is removed
    and a full disk is one ``OSError`` naming the folder, the step and the last committed step."""
    try:
      yield
    except Exception as e:
      folder = str(mngr.directory)
      failed, need = self._writing.pop(id(mngr), (int(step), int(nbytes)))
      full = _no_space(e) or (os.path.isdir(folder) and shutil.disk_usage(folder).free < need)
      for tmp in glob.glob(os.path.join(folder, "*.orbax-checkpoint-tmp*")):
        shutil.rmtree(tmp, ignore_errors=True)
      if full:
        latest = str(self.latest.directory)
        committed = sorted(int(n) for n in os.listdir(latest) if n.isdigit()) \
            if os.path.isdir(latest) else []
        last = os.path.join(latest, str(committed[-1])) if committed else "none"
        raise OSError(errno.ENOSPC, f"No space left on device to save step {failed} "
                      f"({need / 2**20:.1f} MiB); the latest intact checkpoint is {last}",
                      folder) from None
      raise

  def _save(self, mngr, step, state, data_state, metrics=None):
    """Saves ``step``. Asynchronously, ``save`` returns once the arrays are copied off the
    devices (the next training step may reuse their buffers) and a thread writes the files;
    orbax still renames the step's folder only when it is complete, so a kill at any moment
    loses at most the steps since the last committed one."""
    nbytes = sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(state))
    if self.asynchronous and self._settling is None:
      # From the first background save to close(); a reader that never saves leaves the
      # process's event loop policy alone, and one never closed (a Trainer dropped in a
      # notebook) gives it back when it is collected.
      token = object()
      _settle_background_saves(token)
      self._settling = weakref.finalize(self, _release_background_saves, token)
    with self._reported(mngr, step, nbytes):
      mngr.save(int(step), args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    data=ocp.args.JsonSave(data_state)),
                metrics=metrics, force=True)
      self._writing[id(mngr)] = (int(step), nbytes)
      if not self.asynchronous:
        mngr.wait_until_finished()
        self._writing.pop(id(mngr), None)

  def wait(self) -> None:
    """Waits for the background writes (raising their errors: a full disk in one line)."""
    for mngr in (self.latest, self.best):
      with self._reported(mngr, *self._writing.get(id(mngr), (-1, 0))):
        mngr.wait_until_finished()
      self._writing.pop(id(mngr), None)

  def save_latest(self, step: int, state, data_state: dict) -> None:
    """Saves ``step`` (once); orbax then deletes the steps beyond ``keep``."""
    if int(step) in self.latest.all_steps():
      return
    self._save(self.latest, step, state, data_state)

  def save_best_if_improved(self, step: int, state, data_state: dict, metrics: dict) -> bool:
    """Saves ``step`` to ``best/`` when its metric beats the best so far (orbax then deletes
    the previous best); returns whether it did."""
    best = self.best_value()
    value = float(metrics[self.best_metric])
    if best is not None and value <= best:
      return False
    self._save(self.best, step, state, data_state, {self.best_metric: value})
    self._best_value = value
    return True

  def best_value(self):
    """The metric of the best step, or None. Read from disk once, then kept here: while an
    asynchronous save of ``best/`` is in flight orbax knows its step but not yet its metrics, and
    a next validation compared with "no best" would always count as an improvement (early
    stopping would never stop)."""
    if self._best_value is _UNREAD:
      step = self.best.best_step()
      metrics = self.best.metrics(step) if step is not None else None
      if metrics is not None and self.best_metric not in metrics:
        # A resumed run whose config.best_metric is not the one that chose best/ (each
        # comparison would otherwise pit one metric against the other).
        raise BadInput(f"{os.path.join(self.workdir, 'best')}: step {step} was chosen by "
                       f"{', '.join(sorted(metrics)) or 'no metric'}, this run's best_metric is "
                       f"{self.best_metric!r}; expected the best_metric of the run that wrote it "
                       "(or a new --workdir)")
      self._best_value = None if metrics is None else float(metrics[self.best_metric])
    return self._best_value

  def latest_step(self):
    return self.latest.latest_step()

  def best_step(self):
    return self.best.best_step()

  def restore(self, abstract_state, step: int | None = None, which: str = "latest"):
    """Returns ``(state, data_state)`` from the given or newest step of ``which``."""
    mngr = self.latest if which == "latest" else self.best
    self.wait()
    if step is None:
      step = mngr.latest_step() if which == "latest" else mngr.best_step()
    if step is None:
      return None, None
    try:
      with _settled_reads():
        restored = mngr.restore(int(step), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except Exception:
      # A different tree is reported as such (it is not damage: older steps hold the same tree,
      # and moving them aside would lose a run that the code which wrote it can still read).
      why = tree_mismatch(self.step_dir(step, which), abstract_state)
      if why is None:
        raise
      raise TreeMismatchError(
          f"{self.step_dir(step, which)}: checkpoint of a different parameter tree ({why}); "
          "expected one written by this version of the model's code with this config (a run "
          "from before a model change: evaluate it with the jaxcap commit that wrote it, or "
          "train again in a new --workdir)") from None
    return restored.state, restored.data

  def step_dir(self, step: int, which: str = "latest") -> str:
    return os.path.join(self.workdir, "checkpoints" if which == "latest" else "best", str(int(step)))

  def resume(self, abstract_state, log=print):
    """The newest intact latest step: ``(state, data_state, step)``, or ``(None, None, None)``.

    Steps that fail to restore (an emptied directory, a missing item, a corrupt array file)
    are moved to ``<workdir>/damaged_checkpoints/`` and the next older step is tried; a fallback
    is reported in one line naming the damaged and the restored directory. Afterwards at most
    ``keep`` steps remain (a kill between a save and orbax's deletion of the oldest step
    leaves one more).

    Raises:
      BadInput: every step is damaged (one line naming the newest and the reason).
    """
    self._remove_unfinished()
    damaged = []
    for step in sorted(self.latest.all_steps(), reverse=True):
      try:
        state, data_state = self.restore(abstract_state, step)
        if not isinstance(data_state, dict):
          raise BadInput(f"data item is {type(data_state).__name__}, expected a JSON object")
      except TreeMismatchError:
        raise  # Not damage: nothing is moved (see the module docstring).
      except Exception as e:  # pylint: disable=broad-except  # any failure to read = damaged
        damaged.append((step, _first_line(e)))
        continue
      if damaged:
        moved = self._set_aside([s for s, _ in damaged])
        bad = ", ".join(self.step_dir(s) for s, _ in damaged)
        log(f"warning: damaged checkpoint {bad} ({damaged[0][1]}); resuming from the intact "
            f"{self.step_dir(step)} instead (damaged step moved to {moved})", flush=True)
      self.trim()
      return state, data_state, step
    if damaged:
      step, why = damaged[0]
      raise BadInput(f"{self.step_dir(step)}: damaged checkpoint ({why}) and no intact step "
                       f"before it in {self.workdir}/checkpoints; expected an intact step (move "
                       "the directory away to start afresh)")
    self.trim()
    return None, None, None

  def trim(self) -> None:
    """Deletes the oldest latest steps beyond ``keep``, and every best step but the best one.

    Orbax applies the same retention (``max_to_keep``, ``best_fn``) only after a save: a kill
    between its save and its deletion leaves one step more, which a resumed run removes here
    (before its next save could write past ``keep + 1``).
    """
    steps = sorted(self.latest.all_steps())
    for step in steps[:-self.keep]:
      self.latest.delete(step)
    best = self.best.best_step()
    for step in self.best.all_steps() if best is not None else []:
      if step != best:
        self.best.delete(step)

  def _remove_unfinished(self) -> None:
    """Deletes the temporary folders of saves a killed run did not finish."""
    if jax.process_index() == 0:
      for mngr in (self.latest, self.best):
        for tmp in glob.glob(os.path.join(str(mngr.directory), "*.orbax-checkpoint-tmp*")):
          shutil.rmtree(tmp, ignore_errors=True)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("jaxcap:unfinished_checkpoints_removed")

  def _set_aside(self, steps) -> str:
    """Moves damaged step directories to ``<workdir>/damaged_checkpoints/<step>[-<time>]``."""
    aside = os.path.join(self.workdir, "damaged_checkpoints")
    if jax.process_index() == 0:
      os.makedirs(aside, exist_ok=True)
      for step in steps:
        dst = os.path.join(aside, str(step))
        if os.path.exists(dst):
          dst = f"{dst}-{int(time.time())}"
        os.replace(self.step_dir(step), dst)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("jaxcap:damaged_checkpoints_moved")
    self.latest.reload()
    return aside

  def find_step(self, step: int):
    """Which manager holds ``step``: "latest", "best" or None."""
    if step in self.latest.all_steps():
      return "latest"
    if step in self.best.all_steps():
      return "best"
    return None

  def close(self, quiet: bool = False):
    """Waits for the background writes and closes both managers (each closed even when the
    other's write failed); raises the first failure (a full disk in one line) unless ``quiet``:
    the caller is already reporting an error."""
    first = None
    for mngr in (self.latest, self.best):
      try:
        with self._reported(mngr, *self._writing.get(id(mngr), (-1, 0))):
          mngr.close()  # waits for its write first
      except Exception as e:  # pylint: disable=broad-except
        first = first or e
    self._writing.clear()
    if self._settling is not None:
      self._settling()  # once; later calls do nothing
    if first is not None and not quiet:
      raise first


def _no_space(e: BaseException) -> bool:
  """Whether ``e`` or an exception it was raised from is a full disk (an ``OSError`` of errno
  ``ENOSPC``, or tensorstore's ``RESOURCE_EXHAUSTED ... No space left on device``)."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e):
      return True
    e = e.__cause__ or e.__context__
  return False


def _first_line(e: BaseException, limit: int = 160) -> str:
  text = (str(e).strip().splitlines() or [""])[0] or type(e).__name__
  return text if len(text) <= limit else text[:limit] + "..."


def abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
