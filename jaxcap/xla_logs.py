"""Silences XLA's slow-operation alarms on CPU (the console noise of bfloat16 on CPU).

XLA's CPU compiler arms ``SlowCompilationAlarm`` around code generation and its constant
folding pass arms another alarm per folded instruction (``xla/service/slow_operation_alarm.cc``);
both log an ``E...`` record of several lines (``Very slow compile? If you want to file a bug,
run with envvar XLA_FLAGS=--xla_dump_to=...``, ``Constant folding an instruction is taking >
1s``, then ``The operation took ...``). On a CPU, where bfloat16 is emulated, compiling a
bfloat16 training step or beam search takes minutes, so every run prints these alarms; no XLA
flag turns them off, and lowering absl's log level would hide every other XLA error too.

:func:`install` therefore filters the process's C-level stderr (file descriptor 2, where XLA's
absl logging writes) through a pipe and a thread that drops exactly those alarm records and
forwards everything else; Python's ``sys.stderr`` is pointed at the original stream first, so
progress bars and Python logging are untouched. It acts only on the CPU backend and only when
``JAXCAP_XLA_ALARMS`` is not ``1`` (set it to see the alarms). ``train.py``, ``evaluate.py`` and
``scripts/build_tfds.py`` call it through :func:`jaxcap.cli.run_main`.
"""

from __future__ import annotations

import atexit
import io
import os
import re
import sys
import threading

ALARM_SOURCE = "slow_operation_alarm.cc"
_SEPARATOR = "********************************"
# An absl / glog log record: "E1123 18:00:00.123456  4242 file.cc:12] ...".
_LOG_RECORD = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")
_MAX_BLOCK_LINES = 200  # a runaway block (an alarm we do not recognise the end of) ends here

_installed = None


class AlarmFilter:
  """Line by line: ``keep(line)`` is False for the lines of a slow-operation alarm record.

  A record starts at a line naming ``slow_operation_alarm.cc`` and ends after its second
  ``****`` separator (the slow-compile alarm), after its "If you'd like to file a bug" line (the
  constant-folding alarm), or just before the next log record.
  """

  def __init__(self):
    self.skipping, self.separators, self.lines = False, 0, 0

  def keep(self, line: str) -> bool:
    if ALARM_SOURCE in line:
      self.skipping, self.separators, self.lines = True, 0, 0
      return False
    if not self.skipping:
      return True
    self.lines += 1
    if _LOG_RECORD.match(line) or self.lines > _MAX_BLOCK_LINES:
      self.skipping = False
      return True
    text = line.strip()
    if text == _SEPARATOR:
      self.separators += 1
      self.skipping = self.separators < 2
    elif text.startswith("If you'd like to file a bug"):
      self.skipping = False
    return False


def filter_text(text: str) -> str:
  """``text`` without its alarm records (for tests and log files)."""
  f = AlarmFilter()
  return "".join(line for line in text.splitlines(keepends=True) if f.keep(line))


def install(force: bool = False) -> bool:
  """Filters XLA's slow-operation alarms out of fd 2 when the default backend is the CPU.

  Args:
    force: install whatever the backend (tests).

  Returns:
    Whether the filter is (now) installed.
  """
  global _installed
  if _installed is not None:
    return True
  if os.environ.get("JAXCAP_XLA_ALARMS", "") == "1":
    return False
  if not force and sys.stderr is not sys.__stderr__:
    # Python's stderr is redirected (a notebook kernel, a test capturing it, an embedding
    # program): replacing it would send the caller's own messages around its redirection.
    return False
  if not force:
    import jax
    if jax.default_backend() != "cpu":
      return False
  try:
    sys.stderr.flush()
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
  except OSError:  # no usable fd 2 (an embedded interpreter): leave the alarms alone
    return False
  # Python's own stderr writes bypass the pipe: tqdm's carriage-return updates are not lines.
  encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
  sys.stderr = io.TextIOWrapper(io.FileIO(os.dup(original), "w"), encoding=encoding,
                                errors="backslashreplace", line_buffering=True,
                                write_through=True)
  os.dup2(write_fd, 2)
  os.close(write_fd)

  def pump():
    f = AlarmFilter()
    with os.fdopen(read_fd, "rb") as pipe:
      for raw in iter(pipe.readline, b""):
        if f.keep(raw.decode("utf-8", "replace")):
          try:
            os.write(original, raw)
          except OSError:
            pass

  thread = threading.Thread(target=pump, name="jaxcap-xla-alarm-filter", daemon=True)
  thread.start()
  _installed = (original, thread)
  atexit.register(_uninstall)
  return True


def _uninstall() -> None:
  """Puts the original stream back on fd 2 and lets the thread forward what is left."""
  global _installed
  if _installed is None:
    return
  original, thread = _installed
  _installed = None
  try:
    sys.stderr.flush()
  except (OSError, ValueError):
    pass
  os.dup2(original, 2)  # closes the pipe's last write end held by this process
  thread.join(timeout=2.0)
