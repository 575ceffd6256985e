"""Files written whole or not at all: a temporary file in the same folder, then ``os.replace``.

A kill, a full disk or an exception mid-write leaves the old file (or none) and no temporary
file behind. The folder is created when missing. This module imports nothing of jaxcap, so every
layer (the image features at the bottom included) writes through it.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Callable


def write_with(path: str, write: Callable, mode: str = "wb") -> None:
  """Calls ``write(f)`` on a temporary file beside ``path`` (opened with ``mode``), then
  renames it over ``path``."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, mode) as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` atomically."""
  write_with(path, lambda f: f.write(text), "w")


def write_json(path: str, obj) -> None:
  """Writes ``obj`` as indented JSON to ``path`` atomically."""
  write_text(path, json.dumps(obj, indent=1) + "\n")
