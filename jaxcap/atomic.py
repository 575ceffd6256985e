"""Files written whole or not at all: a temporary file in the same folder, then ``os.replace``.

A kill, a full disk or an exception mid-write leaves the old file (or none) and no temporary
file behind. The folder is created when missing.
"""

from __future__ import annotations

import json
import os
import tempfile


def write_text(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` atomically."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_json(path: str, obj) -> None:
  """Writes ``obj`` as indented JSON to ``path`` atomically."""
  write_text(path, json.dumps(obj, indent=1) + "\n")
