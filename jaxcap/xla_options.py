"""The XLA compiler options jaxcap's decoding programs are compiled with.

On CPU, XLA (jaxlib 0.10) hands every dot to a YNNPACK fusion. A decoding step's products have
a few rows (one per image, beam or sample), and there those fusions are slower than XLA's own
dots: measured on a 2-core AVX2 host (2026-12-07), one decoding step of the Meshed-Memory
Transformer at 5 beams took 20.5 ms with them and 13.6-14.9 ms without (in the step's profile its
FFN's first product took 1.05 ms, against 0.19 ms for the same product jitted alone), and
benchmarks/cpu_side_by_side.py's M² beam-5 caption of one image 0.38 s with them and 0.19 s
without (run with the option set for the whole process; every row's captions the same).

The option is given per compiled program (``jax.jit``'s ``compiler_options``), so a user's own
programs keep XLA's defaults, and only on the CPU backend. JAX accepts it on an outermost jit
only. :mod:`jaxcap.decoding`'s jitted searches (:func:`decode_jit`: ``Run.caption`` /
``Run.decode`` / ``jaxcap-serve`` call them directly), :func:`jaxcap.inference.decode_fn`
(``predict`` / ``evaluate.py``) and the exported captioner's :func:`jaxcap.serving.load` compile
with :func:`decode_compiler_options`; a search called inside a user's own jit is compiled with
that program, under its options. Training keeps XLA's defaults (its products have many rows).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax._src import core as _jax_core

# An empty list of YNN fusion types: XLA's own dot emitter for every dot.
_CPU_DECODE = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def decode_compiler_options() -> dict | None:
  """``compiler_options`` for a decoding program on the default backend: without YNNPACK
  fusions on CPU (see the module docstring), None elsewhere or where this jaxlib has no such
  option (a jaxlib before or after it: XLA's defaults, nothing else changes).

  Called at the first decode, not at import: asking for the backend initialises it, which must
  come after ``jax.distributed.initialize``."""
  if jax.default_backend() != "cpu":
    return None
  try:
    jax.jit(lambda x: x + 1, compiler_options=_CPU_DECODE).lower(np.float32(0)).compile()
  except jax.errors.JaxRuntimeError as e:
    if "No such compile option" not in str(e):
      raise
    return None
  return dict(_CPU_DECODE)


# Whether JAX is tracing has no public name; a release without this one gets None: the plain
# jit everywhere (always accepted).
_TRACE_STATE_CLEAN = getattr(_jax_core, "trace_state_clean", None)


def _top_level() -> bool:
  """Whether JAX is not tracing (a jit called here is an outermost one)."""
  return bool(_TRACE_STATE_CLEAN is not None and _TRACE_STATE_CLEAN())


def decode_jit(fun=None, **jit_kwargs):
  """A decorator: ``jax.jit(fun, **jit_kwargs)``, compiled with :func:`decode_compiler_options`
  when called outside any trace (JAX refuses compiler options on a nested jit, so inside a
  user's jit it is the plain one, compiled with the user's program). ``.lower`` / ``.trace`` /
  ... are the top-level one's."""
  if fun is None:
    return functools.partial(decode_jit, **jit_kwargs)
  return _DecodeJit(fun, jit_kwargs)


class _DecodeJit:

  def __init__(self, fun, jit_kwargs):
    functools.update_wrapper(self, fun)
    self._plain = jax.jit(fun, **jit_kwargs)
    self._fun, self._jit_kwargs, self._top = fun, jit_kwargs, None

  def _top_jit(self):
    if self._top is None:  # built at the first call: the backend is known by then
      options = decode_compiler_options()
      self._top = (jax.jit(self._fun, compiler_options=options, **self._jit_kwargs)
                   if options else self._plain)
    return self._top

  def __call__(self, *args, **kwargs):
    top = self._top_jit()
    return (top if top is not self._plain and _top_level() else self._plain)(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._top_jit(), name)
