"""XLA flags that make the tests' tiny programs compile sooner on CPU (tests/conftest.py sets them
for the suite; tests that start programs with an environment of their own pass :data:`FLAGS`).

Measured on the 2-core CI machine (test files run alone, an empty compilation cache):

* ``--xla_backend_optimization_level=0`` skips XLA's LLVM optimisation passes: a tiny model's
  train step compiles in 7 s instead of 31 s; it runs slower, which a test's few steps never feel.
* ``--xla_cpu_use_fusion_emitters=false``: XLA's CPU backend emits its fusions with the elemental
  IR emitter instead of the newer MLIR fusion emitters, whose pipeline costs more per fusion than
  a tiny program's run: tests/test_decoding.py 86 s -> 55 s, tests/models/test_transformer.py
  46 s -> 36 s. Both emitters compute the same functions (the suite's tolerances hold with
  either); the flag exists in the jaxlib releases this package supports (jaxlib >= 0.6), and an
  older one would abort on an unknown flag, so it is only added there.
"""

from __future__ import annotations

import importlib.metadata


def _jaxlib_version() -> tuple[int, ...]:
  try:
    return tuple(int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2])
  except (importlib.metadata.PackageNotFoundError, ValueError):
    return (0, 0)


FLAGS = "--xla_backend_optimization_level=0" + (
    " --xla_cpu_use_fusion_emitters=false" if _jaxlib_version() >= (0, 6) else "")
