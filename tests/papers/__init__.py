"""Each paper's tests (``tests/papers/<paper>/``), and what the shared tests need of it.

A paper declares what the shared gates ask of it in ``tests/papers/<paper>/shared_cases.py``
(its attention-aux cases, the aux keys it adds, its documented summaries, ...); the shared
tests collect those declarations from every paper in :data:`jaxcap.papers.PAPERS`, so that a
new paper is its folders and one registry line, with no edit to a shared test.
"""

from __future__ import annotations

import importlib

from jaxcap.papers import PAPERS


def shared_cases() -> list:
  """The ``shared_cases`` modules of the registered papers that have one, in PAPERS order."""
  out = []
  for paper in PAPERS:
    name = f"tests.papers.{paper}.shared_cases"
    try:
      out.append(importlib.import_module(name))
    except ModuleNotFoundError as e:
      if e.name != name:
        raise
  return out


def collected(name: str) -> dict:
  """The union of every paper's ``name`` dict (a key declared twice is an error)."""
  out: dict = {}
  for mod in shared_cases():
    for k, v in getattr(mod, name, {}).items():
      if k in out:
        raise ValueError(f"{mod.__name__}.{name}: {k!r} is declared by another paper too")
      out[k] = v
  return out


def hooks(name: str) -> list:
  """Every paper's function ``name``, for the papers that define it."""
  return [getattr(mod, name) for mod in shared_cases() if hasattr(mod, name)]


def listed(name: str) -> list:
  """Every paper's ``name`` sequence, concatenated in PAPERS order."""
  return [x for mod in shared_cases() for x in getattr(mod, name, ())]
