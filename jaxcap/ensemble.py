"""Ensembles: several captioners decoded together, one averaged distribution per step.

Dimension legend: M members, N decoder rows (images x beams / samples), V vocabulary.

:class:`Ensemble` speaks the decoder protocol of docs/DESIGN.md, section 3, the way
:mod:`jaxcap.decoding` calls it (``apply(variables, ..., method="encode" | "init_cache" |
"decode_step")``), so greedy decoding, sampling and beam search (both beam modes, diverse
groups) decode an ensemble with the same code as one model. Its variables are the members'
variables dicts as a tuple, its encoding and cache the members' as tuples: each member encodes
the batch itself and keeps its own cache (Transformer key/value caches beside LSTM states),
and the search reorders every member's cache with the beams.

At every step each member gives ``p_m = softmax(logits_m)`` (float32) and the ensemble's
log-probabilities are those of the weighted mean of the members' probabilities,

  ``log p(w) = log sum_m c_m p_m(w)``,  ``c_m = weight_m / sum(weights)`` (1 / M by default),

computed as a logsumexp of ``log c_m + log_softmax(logits_m)``. This is self-critical.pytorch's
``AttEnsemble.get_logprobs_state`` (``stack(softmax(logit_m)).mean().log()``, optionally
weighted); it is a mixture, a normalised distribution with no renormalisation, whereas the
mean of log-probabilities (a geometric mean) would need one. The members must share one
vocabulary (same ids); they may be different models, each with its own sizes.

Usage with trained runs (plain models and variables: what ``registry.build`` and a restored
checkpoint give)::

  out = ensemble.ensemble_decode([model_a, model_b], [vars_a, vars_b], batch, decode_config)

``evaluate.py --ensemble runs/a,runs/b`` loads each run's best checkpoint and decodes a split
with it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from jaxcap import decoding
from jaxcap.errors import BadInput

_METHODS = ("encode", "init_cache", "decode_step")


@dataclasses.dataclass(frozen=True)
class Ensemble:
  """M captioners as one decoder for :mod:`jaxcap.decoding` (hashable: a static jit argument).

  Attributes:
    models: the members (``CaptionModel`` instances sharing one vocabulary).
    weights: one non-negative weight per member (normalised to sum 1), or None for the mean.
  """

  models: tuple
  weights: tuple | None = None

  def __post_init__(self):
    object.__setattr__(self, "models", tuple(self.models))
    if not self.models:
      raise BadInput("ensemble: expected at least one model, got none")
    if self.weights is not None:
      object.__setattr__(self, "weights", check_weights(self.weights, len(self.models)))

  def log_coefficients(self):
    """``log c_m``: float32 ``[M]``."""
    m = len(self.models)
    w = self.weights or (1.0,) * m
    # log(0) = -inf: a member of weight 0 adds nothing to the logsumexp.
    return jnp.log(jnp.asarray(w, jnp.float32) / sum(w))

  def apply(self, variables: Sequence[Any], *args, method: str, **kwargs):
    """``model.apply`` of every member on its own variables, encoding and cache.

    Args:
      variables: the members' variables dicts (a tuple, one per member).
      *args: the protocol method's arguments; ``enc`` and ``cache`` are the ensemble's tuples.
      method: ``"encode"``, ``"init_cache"`` or ``"decode_step"``.

    Returns:
      ``encode``: a tuple of the members' encodings; ``init_cache``: a tuple of caches;
      ``decode_step``: ``(log p [N, V] float32, tuple of caches, aux)`` with
      ``aux = {"member<m>": member m's aux}``.
    """
    if method not in _METHODS:
      raise ValueError(f"ensemble: method {method!r} is not supported; an ensemble decodes "
                       f"through {_METHODS}")
    if len(variables) != len(self.models):
      raise BadInput(f"ensemble: expected {len(self.models)} variables dicts (one per model), "
                     f"got {len(variables)}")
    members = list(zip(self.models, variables))
    if method == "encode":
      return tuple(m.apply(v, *args, method="encode", **kwargs) for m, v in members)
    if method == "init_cache":
      enc, max_len = args
      return tuple(m.apply(v, e, max_len, method="init_cache", **kwargs)
                   for (m, v), e in zip(members, enc))
    enc, cache, tokens, t = args
    lps, caches, aux = [], [], {}
    for i, ((m, v), e, c) in enumerate(zip(members, enc, cache)):
      logits, c, a = m.apply(v, e, c, tokens, t, method="decode_step", **kwargs)
      lps.append(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
      caches.append(c)
      aux[f"member{i}"] = a
    sizes = sorted({lp.shape[-1] for lp in lps})
    if len(sizes) > 1:
      raise BadInput(f"ensemble: the members' vocabularies differ in size {sizes}; expected "
                     "one shared vocabulary")
    # log sum_m c_m p_m, in float32: the log of the mixture of the members' distributions.
    lp_MxNxV = jnp.stack(lps)
    logc_M = self.log_coefficients()
    mixed_NxV = jax.nn.logsumexp(lp_MxNxV + logc_M[:, None, None], axis=0)
    return mixed_NxV, tuple(caches), aux


def check_weights(weights, n: int, name: str = "ensemble weights") -> tuple:
  """``weights`` as a tuple of ``n`` floats, or a one-line BadInput naming ``name``: each a
  finite number >= 0, their sum > 0 (a NaN weight would make every step's mixture NaN and the
  captions empty). A string is split at commas (``--ensemble-weights 1,2``)."""
  if isinstance(weights, str):
    weights = [w.strip() for w in weights.split(",")] if weights.strip() else []
  try:
    items = list(weights)
  except TypeError:
    raise BadInput(f"{name}: expected {n} numbers (one per member), got {weights!r}") from None
  if len(items) != n:
    raise BadInput(f"{name}: expected {n} numbers (one per member), got {len(items)}")
  out = []
  for i, x in enumerate(items):
    try:
      if isinstance(x, bool):
        raise TypeError
      w = float(x)
    except (TypeError, ValueError):
      raise BadInput(f"{name}: weight {i + 1} is {x!r}, expected a number") from None
    if not math.isfinite(w) or w < 0:
      raise BadInput(f"{name}: weight {i + 1} is {w}, expected a finite number >= 0")
    out.append(w)
  if sum(out) <= 0:
    raise BadInput(f"{name}: every weight is 0, expected a positive sum")
  return tuple(out)


def make_ensemble(models: Sequence[Any], params_list: Sequence[Any],
                  weights: Sequence[float] | None = None):
  """``(Ensemble, variables tuple)``, ready for any function of :mod:`jaxcap.decoding`."""
  if len(models) != len(params_list):
    raise BadInput(f"ensemble: {len(models)} models but {len(params_list)} variables dicts")
  ens = Ensemble(tuple(models), None if weights is None else tuple(weights))
  return ens, tuple(params_list)


def ensemble_decode(models: Sequence[Any], params_list: Sequence[Any], batch: dict,
                    decode_config, rng=None, *, weights: Sequence[float] | None = None,
                    bad_endings: Sequence[int] | None = None,
                    return_aux: bool | Sequence[str] = False) -> decoding.DecodeOutput:
  """Decodes ``batch`` with the ensemble of ``models`` (``decoding.decode``'s options).

  Args:
    models: captioners sharing one vocabulary (static: their fields key the compile cache).
    params_list: their variables dicts, in the same order.
    batch: a batch dict holding what every member's ``encode`` reads.
    decode_config: as for :func:`jaxcap.decoding.decode` (method, beam size, beam mode, ...).
    rng: PRNG key for sampling.
    weights: member weights (default: equal).
    bad_endings, return_aux: as for :func:`jaxcap.decoding.decode`.

  Returns:
    ``decoding.DecodeOutput``; ``token_logprobs`` are under the ensemble's distribution.
  """
  ens, variables = make_ensemble(models, params_list, weights)
  return decoding.decode(ens, variables, batch, decode_config, rng=rng, bad_endings=bad_endings,
                         return_aux=return_aux)


def check_same_vocab(vocabs: Sequence[Any], names: Sequence[str]) -> None:
  """Raises a one-line BadInput unless every vocabulary equals the first."""
  for vocab, name in zip(vocabs[1:], names[1:]):
    if vocab != vocabs[0]:
      raise BadInput(f"--ensemble: {name} has another vocabulary ({len(vocab)} words) than "
                     f"{names[0]} ({len(vocabs[0])} words); members must share one vocabulary")

