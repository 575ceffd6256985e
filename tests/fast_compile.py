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

:data:`MANY_STEPS_FLAGS` are for programs that run hundreds of steps (the notebooks, which
train): there the level-0 code's slower steps cost more than its compiling saves (the M²
notebook at d = 128 alone: 188 s with :data:`FLAGS`, 90 s with XLA's defaults), while LLVM's
first optimisation level instead of XLA's default third compiles in half the time and runs as
fast (the quickstart's train step compiled in 14 s instead of 32 s, its 300 steps 24.5 s against
26.5 s). Same functions at every level (no fast-math at any).
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

MANY_STEPS_FLAGS = "--xla_backend_optimization_level=1"
