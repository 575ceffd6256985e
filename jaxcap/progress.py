"""Saying what a long phase is doing, without a line for the short ones.

A run's phases that take seconds on a GPU can take minutes on a 2-core CPU (compiling a
backbone's step, checking 120,000 files, starting METEOR's Java process, decoding a split). A
program silent for minutes looks hung; one that prints a line for every phase buries what
matters. :func:`phase` prints ``<what> ...`` only once the phase has run for ``delay`` seconds,
and then ``<what>: done in N s`` when it ends, so a fast phase stays silent and a slow one
says what it is and how long it took. :func:`bar` is tqdm's bar with the same delay, for
phases whose length is known (files to check, images to decode).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

DELAY_S = 3.0  # a phase silent for longer than this says what it is doing


@contextlib.contextmanager
def phase(what: str, delay: float = DELAY_S, file=None):
  """Runs the ``with`` body; if it is still running after ``delay`` seconds, prints
  ``<what> ...`` (stdout, flushed), and ``<what>: done in N s`` when it ends. Nothing is
  printed for a phase shorter than ``delay``, nor after an exception (the error is the line to
  read)."""
  out = file or sys.stdout
  said = threading.Event()
  lock = threading.Lock()
  finished = [False]

  def announce():
    with lock:
      if not finished[0]:
        print(f"{what} ...", file=out, flush=True)
        said.set()

  timer = threading.Timer(delay, announce)
  timer.daemon = True
  start = time.perf_counter()
  timer.start()
  ok = False
  try:
    yield
    ok = True
  finally:
    with lock:
      finished[0] = True
    timer.cancel()
    if ok and said.is_set():
      print(f"{what}: done in {time.perf_counter() - start:.0f} s", file=out, flush=True)


def bar(iterable, desc: str, total: int | None = None, delay: float = DELAY_S, unit: str = "it"):
  """tqdm's progress bar over ``iterable`` (stderr), shown only once it has run ``delay``
  seconds."""
  from tqdm import tqdm
  if getattr(tqdm, "_instances", None):  # inside another bar (training's validation): no second
    return iterable
  return tqdm(iterable, desc=desc, total=total, delay=delay, unit=unit, leave=False,
              dynamic_ncols=True)
