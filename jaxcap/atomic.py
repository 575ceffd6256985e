"""Files written whole or not at all: a temporary file in the same folder, then ``os.replace``.

A kill, a full disk or an exception mid-write leaves the old file (or none) and no temporary
file behind. The folder is created when missing. This module imports nothing of jaxcap, so every
layer (the image features at the bottom included) writes through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from typing import Callable


def write_with(path: str, write: Callable, mode: str = "wb") -> None:
  """Calls ``write(f)`` on a temporary file beside ``path`` (opened with ``mode``), then
  renames it over ``path``."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
  try:
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from other users
    with os.fdopen(fd, mode) as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    with naming(path):
      raise


# What write_with's temporary files are named: <file name>.<mkstemp's 8 characters>.tmp.
_LEFTOVER = re.compile(r"^.+\.[a-z0-9_]{8}\.tmp$")


def remove_leftovers(folder: str, older_than_s: float = 0.0) -> list[str]:
  """Removes the temporary files of :func:`write_with` in ``folder`` (not below it) that a killed
  process left (a kill skips the ``except`` that removes them); returns their paths.
  ``older_than_s``: only those not modified for that long, where another process may be
  writing into the folder right now (an evaluation beside a resumed training run)."""
  if not os.path.isdir(folder):
    return []
  now, removed = time.time(), []
  with os.scandir(folder) as entries:
    for e in entries:
      if _LEFTOVER.match(e.name) and e.is_file(follow_symlinks=False):
        try:
          if now - e.stat(follow_symlinks=False).st_mtime >= older_than_s:
            os.remove(e.path)
            removed.append(e.path)
        except FileNotFoundError:  # its writer renamed or removed it meanwhile
          pass
  return sorted(removed)


@contextlib.contextmanager
def naming(path: str):
  """An ``OSError`` without a file name raised inside names ``path``: a full disk fails in
  ``write()`` or ``close()``, whose errors name no file, and the one-line report needs it."""
  try:
    yield
  except OSError as e:
    if e.errno is None or e.filename:
      raise
    raise OSError(e.errno, e.strerror or os.strerror(e.errno), path) from None


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def check_writable(path: str, flag: str, *, file: bool = False) -> None:
  """Raises one ``BadInput`` line naming ``flag`` unless this user can write ``path`` (a
  folder; ``file``: a file), or create it in its nearest existing folder. Nothing is written:
  programs check their outputs before reading, compiling or computing anything."""
  from jaxcap.errors import BadInput  # here: this module imports nothing of jaxcap at its top
  path = os.path.abspath(path)
  if file and os.path.isdir(path):
    raise BadInput(f"{flag}: is a directory; expected a file name")
  if file and os.path.exists(path) and not os.access(path, os.W_OK):
    raise BadInput(f"{flag}: the file is not writable; expected one this user can write")
  if not file and os.path.exists(path) and not os.path.isdir(path):
    raise BadInput(f"{flag}: is a file; expected a directory (or a path to create one at)")
  folder = os.path.dirname(path) if file else path
  while folder and not os.path.exists(folder):
    folder = os.path.dirname(folder)
  if not os.path.isdir(folder):
    raise BadInput(f"{flag}: {folder} is a file; expected a directory to write in")
  if not os.access(folder, os.W_OK | os.X_OK):
    raise BadInput(f"{flag}: {folder} is not writable (a read-only place); expected a folder "
                     "this user can write to")


def write_text(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` atomically."""
  write_with(path, lambda f: f.write(text), "w")


def write_json(path: str, obj) -> None:
  """Writes ``obj`` as indented JSON to ``path`` atomically."""
  write_text(path, json.dumps(obj, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# Outputs a user names: a path that holds something jaxcap did not write is never replaced
# without the program's --overwrite flag (docs/DESIGN.md section 6).

OVERWRITE_FLAG = "--overwrite"
# The key jaxcap's own JSON objects carry at their top: {"program": <program>, "version": ...}.
JSON_MARKER = "jaxcap"
# The PNG text chunk (tEXt keyword) jaxcap's figures carry (jaxcap.analysis.figures.save_png).
PNG_MARKER = "jaxcap"
# The file a folder jaxcap writes into holds from its first write on (mark_folder).
FOLDER_MARKER = ".jaxcap-output"


def check_output(path: str, flag: str, *, overwrite: bool = False, mine: Callable | None = None,
                 folder: bool = False, what: str = "one this program wrote",
                 overwrite_flag: str = OVERWRITE_FLAG) -> None:
  """Checks an output path a user named, before anything is computed or written: it is new, or
  (a file) ``mine(path)`` says jaxcap wrote it, or (a folder, ``folder``) it is empty, holds
  :data:`FOLDER_MARKER` or ``mine(path)`` says it is a jaxcap output folder; else one
  ``BadInput`` line naming ``flag`` and ``overwrite_flag`` (``overwrite``: no refusal).
  ``what``: what the refusal says was expected besides a new path. Also :func:`check_writable`."""
  from jaxcap.errors import BadInput  # here: this module imports nothing of jaxcap at its top
  check_writable(path, flag, file=not folder)
  if overwrite or not os.path.lexists(path):
    return
  if folder:
    if not os.listdir(path) or os.path.isfile(os.path.join(path, FOLDER_MARKER)) or says(mine, path):
      return
    raise BadInput(f"{flag}: a folder that holds files jaxcap did not write; expected a new or "
                   f"empty folder or {what} ({overwrite_flag} writes into it anyway)")
  if not says(mine, path):
    raise BadInput(f"{flag}: a file jaxcap did not write is there; expected a new path or {what} "
                   f"({overwrite_flag} replaces it)")


def says(mine: Callable | None, path: str) -> bool:
  """``mine(path)``, False when it cannot tell (an unreadable or damaged file is not jaxcap's)."""
  if mine is None:
    return False
  try:
    return bool(mine(path))
  except Exception:  # pylint: disable=broad-except  (any reader's error: not recognised)
    return False


def mark_folder(path: str, program: str) -> None:
  """Makes ``path`` and writes its :data:`FOLDER_MARKER` (before anything else goes in)."""
  marker = os.path.join(path, FOLDER_MARKER)
  if not os.path.isfile(marker):
    write_json(marker, marker_value(program))


def marker_value(program: str) -> dict:
  """What :data:`JSON_MARKER` holds: the program and jaxcap's version."""
  from jaxcap.version import __version__
  return {"program": program, "version": __version__}


def read_json(path: str, limit: int = 1 << 30):
  """The JSON value of ``path`` (raises on a damaged, too large or unreadable file)."""
  if os.path.getsize(path) > limit:
    raise ValueError(f"{path}: larger than {limit} bytes")
  with open(path, "rb") as f:
    return json.loads(f.read())


def json_marked(path: str) -> bool:
  """``path`` is a JSON object carrying :data:`JSON_MARKER` (jaxcap wrote it)."""
  obj = read_json(path)
  return isinstance(obj, dict) and isinstance(obj.get(JSON_MARKER), dict)


def png_marked(path: str) -> bool:
  """``path`` is a PNG holding a text chunk keyed :data:`PNG_MARKER` (jaxcap drew it)."""
  import struct
  with open(path, "rb") as f:
    if f.read(8) != b"\x89PNG\r\n\x1a\n":
      return False
    while True:
      head = f.read(8)
      if len(head) < 8:
        return False
      size, kind = struct.unpack(">I4s", head)
      if kind in (b"tEXt", b"zTXt", b"iTXt") and size < 1 << 20:
        keyword = f.read(size).split(b"\0", 1)[0]
        if keyword == PNG_MARKER.encode():
          return True
        f.seek(4, 1)
      elif kind == b"IEND":
        return False
      else:
        f.seek(size + 4, 1)
