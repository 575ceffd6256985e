"""The console scripts of ``pyproject.toml``: each imports its program only when run, so that an
install without the ``train`` extra says which install the program needs.

``pip install .`` installs what an exported captioner needs only (jax, numpy, flatbuffers,
Pillow: :mod:`jaxcap.serving`), yet setuptools installs every console script whatever the
extras. Every program (``jaxcap.commands.<name>``) needs the training stack (each imports
:mod:`jaxcap.cli`, which needs absl, then its own part of the stack: flax to rebuild a model,
aiohttp to serve, ...), so run without it a program stops with one line naming the install it
needs, exit 2, instead of a ``ModuleNotFoundError`` traceback.
This module imports the standard library only (``jaxcap/__init__.py`` imports
:mod:`jaxcap.version` alone). A missing module that is not the ``train`` extra's (one of
jaxcap's own: a bug; or one of the base install's) keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys

EXIT_BAD_INPUT = 2  # jaxcap.cli's, not imported from there: it imports absl

# The top-level import names of requirements.txt (the ``train`` extra) beyond pyproject's own
# dependencies; tests/test_entry.py checks them against requirements.txt and against every
# module jaxcap's code imports.
TRAIN_MODULES = frozenset({
    "absl", "aiohttp", "array_record", "flax", "ftfy", "grain", "h5py", "importlib_resources",
    "matplotlib", "ml_collections", "optax", "orbax", "pycocoevalcap", "regex", "sacrebleu",
    "safetensors", "tensorboard", "tensorboardX", "tensorflow_datasets", "tqdm",
})


def missing_train_module(e: ModuleNotFoundError) -> str | None:
  """The missing module's name when it belongs to the ``train`` extra, else None."""
  name = getattr(e, "name", None) or ""
  return name if name.split(".")[0] in TRAIN_MODULES else None


def run_program(prog: str, module: str) -> None:
  """Imports ``module`` and calls its ``run()``; a missing ``train``-extra module (at import or
  while running: some programs import part of the stack when they use it) is one line, exit 2."""
  try:
    importlib.import_module(module).run()
  except ModuleNotFoundError as e:
    missing = missing_train_module(e)
    if missing is None:
      raise
    print(f"error: {prog} needs the training install (no module named {missing!r}); expected jaxcap "
          "installed with its train extra: pip install \".[train]\" in a checkout (pip install . "
          "alone runs exported captioners from Python only: jaxcap.serving)", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


# One function per console script (pyproject.toml's [project.scripts] name them).
def train():
  run_program("jaxcap-train", "jaxcap.commands.train")


def evaluate():
  run_program("jaxcap-evaluate", "jaxcap.commands.evaluate")


def extract():
  run_program("jaxcap-extract", "jaxcap.commands.extract")


def compare():
  run_program("jaxcap-compare", "jaxcap.commands.compare")


def import_checkpoint():
  run_program("jaxcap-import", "jaxcap.commands.import_checkpoint")


def export():
  run_program("jaxcap-export", "jaxcap.commands.export")


def serve():
  run_program("jaxcap-serve", "jaxcap.commands.serve")
