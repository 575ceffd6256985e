"""FLOPs of a step, counted from its jaxpr.

XLA's cost analysis counts a ``scan`` body once and a GPU library matmul as 0 FLOPs, so the
matrix-multiply FLOPs of a step are counted here from the jaxpr (:func:`jaxpr_matmul_flops`);
:func:`step_flops` also gives the lowered HLO's all-op count where the backend has one.
``train.py --dry_run`` and the benchmarks report them.
"""

from __future__ import annotations

import jax
import numpy as np


def _dot_flops(eqn) -> float:
  (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
  lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
  contract = float(np.prod([lhs[i] for i in lc])) if lc else 1.0
  batch = float(np.prod([lhs[i] for i in lb])) if lb else 1.0
  free_l = float(np.prod(lhs)) / contract / batch
  free_r = float(np.prod(rhs)) / contract / batch
  return 2.0 * batch * free_l * free_r * contract


def _conv_flops(eqn) -> float:
  out = eqn.outvars[0].aval.shape
  rhs = eqn.invars[1].aval.shape  # kernel: its elements per output feature are the MACs per output
  # A grouped kernel's input-feature axis is already in / groups, so this holds for groups too.
  out_feat = rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
  return 2.0 * float(np.prod(out)) * float(np.prod(rhs)) / out_feat


def jaxpr_matmul_flops(jaxpr, while_trips: int = 1) -> float:
  """Matrix-multiply FLOPs of a (closed) jaxpr, with scan bodies counted ``length`` times.

  ``while`` bodies (a trip count known only when it runs) count ``while_trips`` times: the
  caller's bound, e.g. ``max_len`` for a decoder whose captions never end early (random
  weights); ``cond`` counts its most expensive branch.
  """
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name == "conv_general_dilated":
      total += _conv_flops(eqn)
    elif name == "scan":
      total += eqn.params["length"] * jaxpr_matmul_flops(eqn.params["jaxpr"], while_trips)
    elif name == "while":
      total += while_trips * jaxpr_matmul_flops(eqn.params["body_jaxpr"], while_trips)
      total += jaxpr_matmul_flops(eqn.params["cond_jaxpr"], while_trips)
    elif name == "cond":
      total += max(jaxpr_matmul_flops(b, while_trips) for b in eqn.params["branches"])
    else:
      for p in eqn.params.values():
        for sub in (p if isinstance(p, (tuple, list)) else (p,)):
          if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
            total += jaxpr_matmul_flops(sub, while_trips)
  return total


def step_flops(fn, *args, lowered=None, while_trips: int = 1) -> tuple[float, float]:
  """``(matmul FLOPs from the jaxpr, all-op FLOPs from the lowered HLO)`` of one call
  (``lowered``: ``jax.jit(fn).lower(*args)`` where the caller has it, not lowered twice;
  ``while_trips``: as :func:`jaxpr_matmul_flops`)."""
  matmul = jaxpr_matmul_flops(jax.make_jaxpr(fn)(*args), while_trips)
  try:
    cost = (lowered if lowered is not None else jax.jit(fn).lower(*args)).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    hlo = float(cost.get("flops", 0.0)) if cost else 0.0
  except Exception:  # noqa: BLE001 - cost analysis is optional on some backends
    hlo = float("nan")
  return matmul, hlo


