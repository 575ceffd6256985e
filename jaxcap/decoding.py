"""Greedy decoding, sampling and beam search for every jaxcap model.

Dimension legend:
  B images, K beams, n samples per image, T = ``max_len`` decoding steps, V vocabulary.

Every search talks to the model only through the protocol of docs/DESIGN.md, section 3:
``model.apply(params, batch, method="encode")`` once per image,
``model.apply(params, enc, max_len, method="init_cache")`` and
``model.apply(params, enc, cache, tokens, t, method="decode_step")`` once per step, so the
same code decodes Transformer key/value caches and recurrent states. ``params`` is the
variables dict given to ``model.apply`` (``{"params": ...}``). Beam search and sampling repeat
``enc`` from ``[B, ...]`` to ``[B*K, ...]`` (image-major, row ``b*K + k``) once, after encoding,
and reorder the cache by gathering rows along axis 0. Every function is jitted with the model,
the sizes and the options that change the program (``block_trigrams``, ``return_aux``, whether
top-k/top-p filtering is on) static; option values (``alpha``, ``min_len``, ``temperature``, ...)
are traced, so they never recompile. The loop over time is a ``lax.while_loop`` of at most
``max_len`` steps that stops once every caption has ended (one compiled program; the output is
the full loop's, the skipped steps would change nothing).

Output conventions (:class:`DecodeOutput`):
  * ``tokens`` int32 never contain BOS: the first position is the first word. A sequence is its
    words, then EOS if the model emitted it within ``max_len`` steps, then PAD. A sequence
    that reaches ``max_len`` steps without EOS ends there (no EOS). PAD and BOS are never
    emitted; UNK only when ``suppress_unk`` is False.
  * ``lengths`` int32: words + EOS (the number of non-PAD tokens).
  * ``token_logprobs`` float32: ``log p(token_t | image, tokens_<t)`` under the model's own
    distribution, ``log_softmax(logits)`` in float32, at temperature 1 and before any top-k /
    top-p filtering; tokens banned by ``suppress_unk`` / ``min_len`` / trigram blocking are set
    to -inf without renormalising the rest. 0 after EOS. ``logprobs`` is their sum over time.
  * ``scores``: for greedy and sampling, equal to ``logprobs``. For beam search, the ranking
    score of each finished hypothesis with L = ``lengths``:
      - ``"none"``: ``logprobs``;
      - ``"gnmt"``: ``logprobs / ((5 + L) / 6) ** alpha`` (Wu et al., 2016);
      - ``"average"``: ``logprobs / L``.
  * Shapes: greedy ``[B, T]``; sampling ``[B, n, T]``; beam search ``[B, K, T]`` with the K beams
    of an image sorted best first (``scores`` descending, ties broken towards the hypothesis
    that finished first). Scalars per sequence drop the trailing T.
  * ``aux`` (only with ``return_aux``): the dict returned by ``decode_step`` with each
    array stacked along time, ``[B, (n | K,) T, ...]``, following the beam's own history; zeros
    after EOS. ``return_aux`` may name the entries to keep (e.g. ``("attention",)``, what the
    server and the exported captioner return): the others are dropped at every step, not
    carried through the loop. Otherwise None.

Beam search keeps two sets per image (the alive/finished formulation): up to K alive
hypotheses that have not ended, and the K best finished ones. A hypothesis ends with EOS, or
with any word at the last step (sequences are cut at ``max_len``); an ending hypothesis
competes with the finished set for its K places by score, the others stay alive. The search
space is every sequence that ends with EOS within ``max_len`` steps or has exactly
``max_len`` words; with K at least the number of candidates at every step the search is
exhaustive. ``beam_mode`` chooses how the alive set is refilled at step t, when every alive
beam proposes every word (K*V candidates ranked by log-probability):

  * ``"live"`` (default; flax's WMT example and t5x's ``beam_search``): the 2K best
    candidates are taken. Those that end go to the finished set; the K best of the others
    stay alive, so K hypotheses stay alive whatever finishes (at most K of the 2K end with
    EOS, one per parent). Unlike t5x, a caption cut at ``max_len`` counts as finished (t5x
    returns unfinished beams only when nothing finished), so every candidate t5x's search
    finds is found here too, and the top-1 is at least as probable as t5x's.
  * ``"self_critical"`` (self-critical.pytorch's ``beam_search``, jaxcap's earlier
    search): the K best candidates, EOS included, are taken; a hypothesis that ends takes a
    place of the K and leaves its slot dead (-inf) until the next step, so a finished caption
    costs a live hypothesis. With K = 1 this is exactly greedy decoding.
  * ``"in_slots"`` (the Meshed-Memory Transformer authors' ``BeamSearch``,
    aimagelab/meshed-memory-transformer, models/beam_search/beam_search.py ``iter`` / ``apply``):
    there is no finished set during the search; the K slots hold live and ended hypotheses
    alike. At every step the K best of all candidates are taken, where a live slot proposes
    every word (its score plus the word's log-probability) and an ended slot (its last word EOS)
    proposes itself once, score frozen (their ``seq_mask`` adds 0), with PAD (their word 0,
    written after EOS) and every other word at -999 (their ``old_seq_logprob[:, :, 1:] =
    -999``). A finished caption so keeps its slot while it is among the K best and is lost
    once K better candidates exist; nothing ends a slot but EOS. After the ``max_len`` steps
    the K slots, sorted by score, are the output (their ``torch.sort`` of ``seq_logprob``; they
    return the first ``out_size``). Their first step has one beam (``cur_beam_size = 1``), as
    here (beams 1.. start at -inf). No length penalty and no groups (both refused); PAD and
    BOS are banned as in every jaxcap search (their search bans nothing: identical wherever
    neither would be among the K best). K = 1 is greedy decoding.

On random tiny models (tests/test_decoding.py) ``"live"`` is never worse than
``"self_critical"`` on the top-1 log-probability; it is often better, since an early EOS no
longer removes a live beam. Once no alive beam can beat the worst finished one
(log-probabilities only decrease and the length penalty grows with length, so a bound is
known), an image is done: the loop keeps running while another image is not, and its
sequences, scores and finished set stay frozen (its cache keeps being computed but is never read
again); the loop stops once every image is done. ``"in_slots"`` fills its
finished set at the last step only, as its authors' search does; once every slot of every
image has ended (each with a score above their -999), the steps left would only write PAD after
the slots' EOS and keep their order, so the search goes straight to the last step (their
search runs every step: the same output). If fewer than K hypotheses exist at all, the missing
places have score -inf and length 0.

Diverse beam search (Vijayakumar et al., "Diverse Beam Search", 2016/2018; ``beam_groups`` G
> 1, ``diversity_strength`` lambda) splits the K beams into G groups of K' = K / G, each its
own alive/finished search in the chosen ``beam_mode``. All groups' beams share one
``decode_step`` call per step (rows ``b*K + g*K' + k``); then the groups choose in order, and
group g ranks its candidates by the running sum of ``log p(w) - lambda * count(w)``, where
count(w) is the number of hypotheses of groups < g that took word w at this step (Hamming
diversity, the paper's doubly greedy approximation). What a group "took": in
``"self_critical"`` mode its K' picks, finished ones included (self-critical.pytorch's
``beam_search`` with ``group_size`` / ``diversity_lambda``, which staggers group g by g steps;
that gives the same choices, as group g's step t reads only the earlier groups' step t); in
``"live"`` mode its K' alive hypotheses and the candidates that ended among its 2K'.
Finished hypotheses are ranked (``scores``) by that penalised sum with the length penalty, as
self-critical.pytorch ranks its ``done_beams``; ``logprobs`` and ``token_logprobs`` stay the
model's own. The output holds the groups one after the other, each best first (so
``tokens[:, 0]`` is group 0's best, the ordinary search of size K'). With G > 1 an image is
never frozen (later groups' penalties read every step's choices, as in self-critical.pytorch,
which has no early stop); freezing changes no output of a search on its own.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxcap import xla_options
from jaxcap.data.vocab import BOS, EOS, PAD, UNK
from jaxcap.errors import BadInput
from jaxcap.models.base import repeat_batch

LENGTH_PENALTIES = ("none", "gnmt", "average")
BEAM_MODES = ("live", "self_critical", "in_slots")
METHODS = ("greedy", "beam", "sample")


class DecodeOutput(struct.PyTreeNode):
  """Decoded sequences; see the module docstring for the conventions.

  Attributes:
    tokens: int32 ``[B, (K | n,) T]``.
    token_logprobs: float32 ``[B, (K | n,) T]``.
    logprobs: float32 ``[B, (K | n)]``.
    lengths: int32 ``[B, (K | n)]``.
    scores: float32 ``[B, (K | n)]``.
    aux: dict of ``[B, (K | n,) T, ...]`` arrays, or None.
  """

  tokens: jax.Array
  token_logprobs: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  scores: jax.Array
  aux: Any = None


# The decoding options and their defaults: the one definition (config files' ``decode``
# section is :func:`default_decode_config`).
_DEFAULTS = {
    "method": "greedy",  # "greedy" | "beam" | "sample"
    "beam_size": 3,
    # "live": K live hypotheses from the 2K best candidates (flax / t5x); "self_critical": the
    # K best candidates, finished ones included (self-critical.pytorch); "in_slots": finished
    # captions stay in the K slots until pushed out (the M² authors' BeamSearch). See
    # beam_search.
    "beam_mode": "live",
    "max_len": 16,
    "length_penalty": "none",  # "none" | "gnmt" | "average"
    "alpha": 0.6,
    "min_len": 0,
    "block_trigrams": False,
    "suppress_unk": False,
    # UNK suppressed in beam search only (greedy and sampling may emit it): self-critical.pytorch's
    # eval option suppress_UNK (default 1), which only its beam_search reads, not its _sample.
    "beam_suppress_unk": False,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "num_samples": 1,
    # self-critical.pytorch's remove_bad_endings: no caption ends with "a", "the", "of", ...
    "remove_bad_endings": False,
    # Diverse beam search (Vijayakumar et al.; self-critical.pytorch's group_size /
    # diversity_lambda): beam_size / beam_groups beams in each of beam_groups groups, each group
    # penalised by diversity_strength per earlier-group choice of a word at the same step.
    "beam_groups": 1,
    "diversity_strength": 0.5,
}

# self-critical.pytorch's ``bad_endings`` (misc/utils.py): words a caption should not end with.
BAD_ENDINGS = ("a", "an", "the", "in", "for", "at", "of", "with", "before", "after", "on", "upon",
               "near", "to", "is", "are", "am")


def bad_ending_ids(vocab, words: Sequence[str] = BAD_ENDINGS) -> tuple:
  """The ids of ``words`` in ``vocab`` (a ``Vocab`` with ``stoi``), skipping absent ones."""
  return tuple(sorted(vocab.stoi[w] for w in words if w in vocab.stoi))


def beam_suppresses_unk(cfg) -> bool:
  """Whether beam search suppresses UNK under the options ``cfg`` (a mapping): ``suppress_unk``
  (every method) or ``beam_suppress_unk`` (beam search only). The one rule, for
  :func:`decode` and the exported captioner."""
  return bool(cfg.get("suppress_unk", False) or cfg.get("beam_suppress_unk", False))


def default_decode_config():
  """The decoding options read by :func:`decode` (greedy by default).

  An ``ml_collections.ConfigDict`` (imported here only, so that decoding itself needs nothing
  beyond jax and flax).
  """
  import ml_collections
  return ml_collections.ConfigDict(dict(_DEFAULTS))


# ---------------------------------------------------------------------------------------------
# Shared pieces.


def _batch_size(tree) -> int:
  leaves = jax.tree.leaves(tree)
  if not leaves:
    raise ValueError("model.encode returned an empty pytree; expected arrays with leading axis B")
  return leaves[0].shape[0]


def _step_logprobs(model, params, enc, cache, tokens, t, aux_keys=True):
  logits, cache, aux = model.apply(params, enc, cache, tokens, t, method="decode_step")
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), cache, _select_aux(aux, aux_keys)


def _aux_spec(return_aux):
  """The static form of a ``return_aux`` argument: False, True (all of decode_step's aux) or a
  sorted tuple of the aux entries to keep (an empty selection is False)."""
  if isinstance(return_aux, (bool, np.bool_)):
    return bool(return_aux)
  if isinstance(return_aux, str):
    return (return_aux,)
  return tuple(sorted({str(k) for k in return_aux})) or False


def _select_aux(aux, aux_keys):
  """decode_step's aux, or only its entries named in ``aux_keys`` (those the model returns):
  what a search does not keep it does not carry through its steps (the beam search gathers and
  merges every carried entry at every step)."""
  if not isinstance(aux_keys, tuple):
    return aux
  return {k: aux[k] for k in aux_keys if k in aux} if isinstance(aux, dict) else {}


def _banned_tokens(lp_NxV, t, opts, prev_N):
  """Sets tokens that may not be emitted at step ``t`` after ``prev_N`` to -inf (no
  renormalisation).

  ``opts["min_len"]``, ``opts["suppress_unk"]`` and ``opts["bad_endings"]`` are traced, so
  they do not recompile (the bad-ending ids only when their number changes).
  """
  v = lp_NxV.shape[-1]
  if v <= UNK + 1:
    raise BadInput(f"decode_step logits: vocabulary of {v} has no words; expected V > {UNK + 1}")
  ids_V = jnp.arange(v)
  banned_V = ((ids_V == PAD) | (ids_V == BOS) | ((ids_V == UNK) & opts["suppress_unk"])
              | ((ids_V == EOS) & (t < opts["min_len"])))
  # EOS right after a bad ending ("a", "the", "of", ...: self-critical.pytorch's
  # remove_bad_endings) is banned; -1 pads the id list and matches no token.
  bad_prev_N = (prev_N[:, None] == opts["bad_endings"][None, :]).any(-1)
  banned_NxV = banned_V[None, :] | (bad_prev_N[:, None] & (ids_V == EOS)[None, :])
  return jnp.where(banned_NxV, -jnp.inf, lp_NxV)


def _common_opts(min_len, suppress_unk, bad_endings=()):
  # NumPy values, not jnp: the jitted decoders trace them alike (int32 / bool / float32
  # arrays), and a host value costs no device dispatch per option per call (~0.1 ms each,
  # a few % of a one-image caption on a CPU).
  bad = [int(i) for i in bad_endings] or [-1]
  return {"min_len": np.int32(min_len), "suppress_unk": np.bool_(suppress_unk),
          "bad_endings": np.asarray(bad, np.int32)}


def _trigram_blocked(seq_NxT, t, vocab_size: int):
  """True at ``[n, w]`` when emitting ``w`` at step ``t`` repeats a trigram of ``seq[n, :t]``.

  Trigram ``j`` is ``seq[j:j+3]``; it is complete before step t when ``j + 2 < t``, and ``w``
  repeats it when ``(seq[t-2], seq[t-1]) == (seq[j], seq[j+1])`` and ``w == seq[j+2]``.
  """
  n, length = seq_NxT.shape
  if length < 4:
    return jnp.zeros((n, vocab_size), bool)
  prev2_N = jnp.take(seq_NxT, jnp.maximum(t - 2, 0), axis=1)
  prev1_N = jnp.take(seq_NxT, jnp.maximum(t - 1, 0), axis=1)
  j = jnp.arange(length - 2)
  match_NxJ = ((seq_NxT[:, :-2] == prev2_N[:, None]) & (seq_NxT[:, 1:-1] == prev1_N[:, None])
               & (j[None, :] + 2 < t))
  # Scatter-add (not set): several trigrams may point at the same word.
  hits_NxV = jnp.zeros((n, vocab_size), jnp.int32).at[
      jnp.arange(n)[:, None], seq_NxT[:, 2:]].add(match_NxJ.astype(jnp.int32))
  return hits_NxV > 0


def _set_at(x_NxTx, t, value_Nx):
  """``x[:, t] = value`` for a traced t (a select, which XLA fuses; no scatter)."""
  at_t = (jnp.arange(x_NxTx.shape[1]) == t).reshape((1, -1) + (1,) * (x_NxTx.ndim - 2))
  return jnp.where(at_t, jnp.expand_dims(value_Nx, 1).astype(x_NxTx.dtype), x_NxTx)


def _aux_template(model, params, enc, cache, n: int, aux_keys=True):
  """Shapes/dtypes of ``decode_step``'s aux (the kept entries) for ``n`` rows, without running it."""
  tokens = jnp.full((n,), BOS, jnp.int32)
  return jax.eval_shape(lambda: _select_aux(
      model.apply(params, enc, cache, tokens, jnp.int32(0), method="decode_step")[2], aux_keys))


def _penalty_coefficients(kind: str, alpha: float):
  """(a, b, e) with penalty(L) = ((a + L) / b) ** e: one traced formula for every kind."""
  return np.asarray({"none": (0.0, 1.0, 0.0), "gnmt": (5.0, 6.0, alpha),
                     "average": (0.0, 1.0, 1.0)}[kind], np.float32)


def _length_penalty(length, coef):
  return ((coef[0] + jnp.asarray(length, jnp.float32)) / coef[1]) ** coef[2]


# ---------------------------------------------------------------------------------------------
# Greedy decoding and sampling: one hypothesis per row.


def _filter_logits(logits_NxV, top_k, top_p):
  """Top-k, then nucleus (top-p) filtering: excluded tokens get -inf. Ties with a cut stay.

  ``top_k`` (0: off) and ``top_p`` (1: off) are traced; one descending sort serves both.
  """
  v = logits_NxV.shape[-1]
  sorted_NxV = -jnp.sort(-logits_NxV, axis=-1)
  pos_V = jnp.arange(v)
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
  sorted_NxV = jnp.where(pos_V < k, sorted_NxV, -jnp.inf)
  probs_NxV = jax.nn.softmax(sorted_NxV, axis=-1)
  # Nucleus: a token is kept while the mass strictly before it is below p, the smallest set
  # whose mass reaches p (at least one token). top_p = 1 must keep every token even when the
  # float32 cumulative sum reaches 1 early.
  keep_NxV = ((jnp.cumsum(probs_NxV, axis=-1) - probs_NxV) < top_p) | (top_p >= 1.0)
  num_keep_N = jnp.clip((keep_NxV & (pos_V < k)).sum(-1), 1, k)
  cutoff_Nx1 = jnp.take_along_axis(sorted_NxV, num_keep_N[:, None] - 1, axis=-1)
  return jnp.where(logits_NxV < cutoff_Nx1, -jnp.inf, logits_NxV)


def _sequential(model, params, enc, keys_T, *, max_len, pick, opts, return_aux):
  """Runs one hypothesis per row of ``enc``; ``pick(lp_NxV, keys_T[t]) -> tokens_N``.

  ``keys_T``: the keys of the steps (leading axis ``max_len``; e.g. ``[T, B]`` keys, one per
  image and step), or None when ``pick`` draws nothing.

  A ``lax.while_loop`` that stops once every row has emitted EOS (or after ``max_len`` steps):
  the steps it skips would write PAD, 0 and zero aux, which the buffers already hold, so the
  output is the full loop's; with a trained model the captions end at about half of
  ``max_len`` on COCO, and so does the work (self-critical.pytorch's loop breaks the same way).
  """
  n = _batch_size(enc)
  cache = model.apply(params, enc, max_len, method="init_cache")
  keys = keys_T if keys_T is not None else jnp.zeros((max_len, 2), jnp.uint32)
  aux0 = None
  if return_aux:
    aux0 = jax.tree.map(lambda s: jnp.zeros((max_len,) + s.shape, s.dtype),
                        _aux_template(model, params, enc, cache, n, return_aux))

  def body(state):
    t, cache, prev_N, done_N, tok_TxN, tok_lp_TxN, aux_T = state
    lp_NxV, cache, aux = _step_logprobs(model, params, enc, cache, prev_N, t, return_aux)
    lp_NxV = _banned_tokens(lp_NxV, t, opts, prev_N)
    tok_N = pick(lp_NxV, jax.tree.map(lambda k: k[t], keys)).astype(jnp.int32)
    tok_lp_N = jnp.take_along_axis(lp_NxV, tok_N[:, None], axis=-1)[:, 0]
    tok_N = jnp.where(done_N, PAD, tok_N)
    tok_lp_N = jnp.where(done_N, 0.0, tok_lp_N)
    if return_aux:
      aux_T = jax.tree.map(
          lambda buf, a: buf.at[t].set(
              jnp.where(done_N.reshape((-1,) + (1,) * (a.ndim - 1)), jnp.zeros_like(a), a)),
          aux_T, aux)
    return (t + 1, cache, tok_N, done_N | (tok_N == EOS), tok_TxN.at[t].set(tok_N),
            tok_lp_TxN.at[t].set(tok_lp_N), aux_T)

  def running(state):
    return (state[0] < max_len) & ~state[3].all()

  init = (jnp.int32(0), cache, jnp.full((n,), BOS, jnp.int32), jnp.zeros((n,), bool),
          jnp.full((max_len, n), PAD, jnp.int32), jnp.zeros((max_len, n), jnp.float32), aux0)
  state = jax.lax.while_loop(running, body, init)
  tokens_NxT = state[4].T
  tok_lp_NxT = state[5].T
  aux = jax.tree.map(lambda a: jnp.moveaxis(a, 0, 1), state[6]) if return_aux else None
  logprobs_N = tok_lp_NxT.sum(-1)
  return DecodeOutput(tokens=tokens_NxT, token_logprobs=tok_lp_NxT, logprobs=logprobs_N,
                      lengths=(tokens_NxT != PAD).sum(-1).astype(jnp.int32), scores=logprobs_N,
                      aux=aux)


def _greedy_pick(lp_NxV, key):
  del key
  return jnp.argmax(lp_NxV, axis=-1)


def _sample_pick(opts, filtered: bool):
  """``pick(lp_NxV, key) -> tokens_N`` of :func:`sample`: one draw per row from
  ``softmax(lp / temperature)`` (top-k / top-p filtered when ``filtered``), arg-max at 0."""
  temperature = opts["temperature"]

  def pick(lp_NxV, key):
    logits_NxV = lp_NxV / jnp.where(temperature > 0, temperature, 1.0)
    if filtered:  # Static: the common unfiltered case pays for no sort.
      logits_NxV = _filter_logits(logits_NxV, opts["top_k"], opts["top_p"])
    sampled_N = jax.random.categorical(key, logits_NxV, axis=-1)
    return jnp.where(temperature > 0, sampled_N, jnp.argmax(lp_NxV, axis=-1))

  return pick


def _sample_opts(temperature, top_k, top_p, **common):
  return dict(_common_opts(**common), temperature=np.float32(temperature),
              top_k=np.int32(top_k), top_p=np.float32(top_p))


# Sizes and the options that change the program are static; option values are traced, so
# changing min_len, suppress_unk, temperature, top_k, top_p or alpha never recompiles.
@xla_options.decode_jit(static_argnums=0, static_argnames=("max_len", "return_aux"))
def _greedy_jit(model, params, batch, opts, *, max_len, return_aux):
  enc = model.apply(params, batch, method="encode")
  return _sequential(model, params, enc, None, max_len=max_len, pick=_greedy_pick, opts=opts,
                     return_aux=return_aux)


@xla_options.decode_jit(static_argnums=0,
                        static_argnames=("max_len", "num_samples", "filtered", "return_aux"))
def _sample_jit(model, params, batch, rng, opts, *, max_len, num_samples, filtered, return_aux):
  enc = model.apply(params, batch, method="encode")
  b = _batch_size(enc)
  enc = repeat_batch(enc, num_samples)
  out = _sequential(model, params, enc, jax.random.split(rng, max_len), max_len=max_len,
                    pick=_sample_pick(opts, filtered), opts=opts, return_aux=return_aux)
  return jax.tree.map(lambda x: x.reshape((b, num_samples) + x.shape[1:]), out)


@xla_options.decode_jit(static_argnums=0, static_argnames=("max_len", "num_samples", "with_greedy"))
def _sample_and_greedy_jit(model, params, batch, keys_B, opts, *, max_len, num_samples, with_greedy):
  # Rows b*m .. b*m + m-1 are image b's: its n samples, then its greedy row (m = n + 1).
  enc = model.apply(params, batch, method="encode")
  b = _batch_size(enc)
  m = num_samples + int(with_greedy)
  enc = repeat_batch(enc, m)
  # Image b's key of step t is split(keys_B[b], max_len)[t], as sample() splits its rng.
  keys_TxB = jax.vmap(lambda key: jax.random.split(key, max_len), out_axes=1)(keys_B)
  sample_pick = jax.vmap(_sample_pick(opts, filtered=False))

  def pick(lp_NxV, keys_B):
    lp_BxmxV = lp_NxV.reshape(b, m, -1)
    tok_Bxm = sample_pick(lp_BxmxV[:, :num_samples], keys_B)
    if with_greedy:
      tok_Bxm = jnp.concatenate([tok_Bxm, _greedy_pick(lp_BxmxV[:, num_samples:], None)], axis=1)
    return tok_Bxm.reshape(b * m)

  out = _sequential(model, params, enc, keys_TxB, max_len=max_len, pick=pick, opts=opts,
                    return_aux=False)
  out = jax.tree.map(lambda x: x.reshape((b, m) + x.shape[1:]), out)
  samples = jax.tree.map(lambda x: x[:, :num_samples], out)
  return samples, (jax.tree.map(lambda x: x[:, num_samples], out) if with_greedy else None)


def greedy(model, params, batch, *, max_len: int, suppress_unk: bool = False, min_len: int = 0,
           bad_endings: Sequence[int] = (), return_aux: bool | Sequence[str] = False) -> DecodeOutput:
  """Arg-max decoding.

  Args:
    model: a CaptionModel (static: its fields key the compilation cache).
    params: the variables dict for ``model.apply``.
    batch: a batch dict (docs/DESIGN.md, section 2); only what ``encode`` reads matters.
    max_len: T, the number of decoding steps (words + EOS at most).
    suppress_unk: never emit UNK.
    min_len: EOS is banned before step ``min_len`` (at least that many words).
    bad_endings: token ids after which EOS is banned (self-critical.pytorch's
      ``remove_bad_endings``: no caption ends with "a", "the", "of", ...; see
      :func:`bad_ending_ids`). A caption cut at ``max_len`` may still end with one.
    return_aux: also return the per-step aux outputs (True), or only the named entries.

  Returns:
    DecodeOutput with ``tokens [B, T]``.
  """
  _check_common(max_len, min_len)
  return _greedy_jit(model, params, batch, _common_opts(min_len, suppress_unk, bad_endings),
                     max_len=int(max_len), return_aux=_aux_spec(return_aux))


def sample(model, params, batch, rng, *, max_len: int, num_samples: int = 1,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           suppress_unk: bool = False, min_len: int = 0, bad_endings: Sequence[int] = (),
           return_aux: bool | Sequence[str] = False) -> DecodeOutput:
  """Ancestral sampling from ``softmax(logits / temperature)``, optionally top-k / top-p filtered.

  Args:
    rng: a PRNG key; the same key gives the same samples.
    num_samples: n sequences per image (rows ``b*n .. b*n + n-1`` share one encoding).
    temperature: > 0, or 0 for arg-max.
    top_k: keep the k most probable tokens (0: all).
    top_p: keep the smallest set of most probable tokens with mass >= p (1: all).
    Other arguments as in :func:`greedy`.

  Returns:
    DecodeOutput with ``tokens [B, n, T]``; ``token_logprobs`` are under the unfiltered model
    distribution at temperature 1 (what self-critical training needs).
  """
  _check_common(max_len, min_len)
  if num_samples < 1:
    raise BadInput(f"decode option num_samples: expected >= 1, got {num_samples}")
  if not temperature >= 0.0:
    raise BadInput(f"decode option temperature: expected >= 0, got {temperature}")
  if top_k < 0:
    raise BadInput(f"decode option top_k: expected >= 0 (0 disables), got {top_k}")
  if not 0.0 < top_p <= 1.0:
    raise BadInput(f"decode option top_p: expected in (0, 1], got {top_p}")
  opts = _sample_opts(temperature, top_k, top_p, min_len=min_len, suppress_unk=suppress_unk,
                      bad_endings=bad_endings)
  return _sample_jit(model, params, batch, rng, opts, max_len=int(max_len),
                     num_samples=int(num_samples), filtered=bool(top_k > 0 or top_p < 1.0),
                     return_aux=_aux_spec(return_aux))


def sample_and_greedy(model, params, batch, keys_B, *, max_len: int, num_samples: int,
                      with_greedy: bool = True, suppress_unk: bool = False, min_len: int = 0,
                      bad_endings: Sequence[int] = ()):
  """n samples per image at temperature 1 and its greedy caption, from one encoding and one loop.

  Image b's samples are those of ``sample(model, params, <image b alone>, keys_B[b], ...)``
  and its greedy row that of ``greedy(model, params, batch, ...)`` (equal tokens wherever the
  model's arithmetic does not depend on how many rows a call has), but the image is encoded
  once, its encoding repeated to n + 1 rows (n without the greedy row), and every row decoded
  in the same loop: self-critical training's decode (:mod:`jaxcap.training.scst`) with
  one encoder pass and one loop instead of two of each.

  Args:
    keys_B: one PRNG key per image (e.g. ``fold_in(rng, image_index)``).
    with_greedy: also decode the greedy row (False: ``None`` in its place).
    Other arguments as in :func:`sample` and :func:`greedy`.

  Returns:
    ``(DecodeOutput tokens [B, n, T], DecodeOutput tokens [B, T] or None)``.
  """
  _check_common(max_len, min_len)
  if num_samples < 1:
    raise BadInput(f"decode option num_samples: expected >= 1, got {num_samples}")
  opts = _sample_opts(1.0, 0, 1.0, min_len=min_len, suppress_unk=suppress_unk,
                      bad_endings=bad_endings)
  return _sample_and_greedy_jit(model, params, batch, keys_B, opts, max_len=int(max_len),
                                num_samples=int(num_samples), with_greedy=bool(with_greedy))


# ---------------------------------------------------------------------------------------------
# Beam search.


def _gather_beams(x_BxKx, idx_BxM):
  """``x[b, idx[b, m]]`` for every b, m."""
  idx = idx_BxM.reshape(idx_BxM.shape + (1,) * (x_BxKx.ndim - 2))
  return jnp.take_along_axis(x_BxKx, idx, axis=1)


# "in_slots": the score an ended slot gives its words other than PAD, their BeamSearch.iter's
# ``old_seq_logprob[:, :, 1:] = -999`` (reached only when fewer than K candidates beat it).
_IN_SLOTS_OTHER_WORDS = -999.0

_GROUP_FIELDS = ("last", "alive_seq", "alive_tok_lp", "alive_logp", "alive_aug", "alive_aux",
                 "fin_seq", "fin_tok_lp", "fin_aux", "fin_logp", "fin_score", "fin_len", "done")


def _beam_group_step(s, lp_BxKxV, aug_BxKxV, aux_BxK, t, *, beam_mode, max_len, penalty, freeze):
  """One step of one group of K beams (the whole search when there is one group).

  Args:
    s: the group's state (``_GROUP_FIELDS``, arrays ``[B, K, ...]``).
    lp_BxKxV: the model's log-probabilities (banned tokens -inf): what ``logprobs`` sum.
    aug_BxKxV: the log-probabilities that rank candidates (diverse beam search subtracts its
      penalty here; otherwise ``lp_BxKxV`` itself). ``alive_aug`` / ``fin_score`` sum these.
    aux_BxK: decode_step's aux of the group's rows, or None.
    freeze: whether a done image's state stops changing (only without groups: with groups the
      later groups' penalties read every step's choices, as self-critical.pytorch's search,
      which has no early stop; freezing never changes the finished set, see below).

  Returns:
    ``(new state, parent_BxK, words_BxM, chosen_BxM)``: the alive beams' parents (to reorder
    the cache), and the words the group's hypotheses took at this step with a mask (what
    later groups' diversity penalty counts).
  """
  b, k, v = lp_BxKxV.shape
  big_t = max_len
  in_slots = beam_mode == "in_slots"
  # C candidates per image and step: K for "self_critical" and "in_slots", 2K for "live" (at
  # most K of them end with EOS, one per parent, so K non-EOS ones always remain to stay alive).
  c = 2 * k if beam_mode == "live" else k
  cand_BxKxV = s["alive_aug"][..., None] + aug_BxKxV
  if in_slots:
    # A slot whose last word was EOS (or the PAD written after it) has ended: it proposes
    # itself once, with PAD and its score unchanged, and every other word at -999, as their
    # seq_mask / old_seq_logprob do, so it keeps its slot while it is among the K best.
    held_BxK = (s["last"] == EOS) | (s["last"] == PAD)
    frozen_BxKxV = jnp.where(jnp.arange(v) == PAD, s["alive_aug"][..., None],
                             _IN_SLOTS_OTHER_WORDS)
    cand_BxKxV = jnp.where(held_BxK[..., None], frozen_BxKxV, cand_BxKxV)

  # The C best candidates of all K*V by ranking score, EOS included. Those that end here
  # (EOS, or any word at the last step) go to the finished set, the others may stay alive.
  top_aug_BxC, top_idx_BxC = jax.lax.top_k(cand_BxKxV.reshape(b, k * v), c)
  parent_BxC, word_BxC = top_idx_BxC // v, top_idx_BxC % v
  word_lp_BxC = jnp.take_along_axis(lp_BxKxV.reshape(b, k * v), top_idx_BxC, axis=1)
  if in_slots:
    # An ended hypothesis carried on writes PAD and adds nothing (their masked word_logprob),
    # also when one of its -999 words was taken (their word there; PAD after EOS here).
    from_held_BxC = _gather_beams(held_BxK, parent_BxC)
    word_BxC = jnp.where(from_held_BxC, PAD, word_BxC)
    word_lp_BxC = jnp.where(from_held_BxC, 0.0, word_lp_BxC)
  top_logp_BxC = jnp.take_along_axis(s["alive_logp"], parent_BxC, axis=1) + word_lp_BxC
  if in_slots:
    # Nothing leaves the slots before the last step; then all K are the finished set.
    ends_BxC = jnp.broadcast_to(t == big_t - 1, (b, c))
  else:
    ends_BxC = (word_BxC == EOS) | (t == big_t - 1)

  def extend(hist_BxKxT, x_BxC):
    # The parents' histories, with the candidate's own value of this step written at t.
    hist_NxT = _gather_beams(hist_BxKxT, parent_BxC).reshape((b * c,) + hist_BxKxT.shape[2:])
    x_N = x_BxC.reshape((b * c,) + x_BxC.shape[2:])
    return _set_at(hist_NxT, t, x_N).reshape((b, c) + hist_BxKxT.shape[2:])

  seq_BxCxT = extend(s["alive_seq"], word_BxC)
  tok_lp_BxCxT = extend(s["alive_tok_lp"], word_lp_BxC)
  # decode_step's aux belongs to the parent (it was computed before the word was chosen).
  def parent_aux(a_BxKx):
    a_BxCx = _gather_beams(a_BxKx, parent_BxC)
    if in_slots:  # zeros after EOS
      a_BxCx = jnp.where(from_held_BxC.reshape((b, c) + (1,) * (a_BxCx.ndim - 2)), 0, a_BxCx)
    return a_BxCx

  aux_hist = (jax.tree.map(lambda h, a: extend(h, parent_aux(a)), s["alive_aux"], aux_BxK)
              if aux_BxK is not None else None)
  if in_slots:
    # The slots keep ended hypotheses (the finished set is only their copy at the last step).
    cont_aug_BxC, cont_logp_BxC = top_aug_BxC, top_logp_BxC
  else:
    cont_aug_BxC = jnp.where(ends_BxC, -jnp.inf, top_aug_BxC)
    cont_logp_BxC = jnp.where(ends_BxC, -jnp.inf, top_logp_BxC)

  if beam_mode in ("self_critical", "in_slots"):
    # The K candidates keep their slots. "self_critical": a slot that ended is dead (-inf)
    # and is refilled at the next step from the live beams' candidates.
    def alive(x_BxC):
      return x_BxC
  else:
    # The K best candidates that did not end stay alive (-inf ones only when fewer exist).
    _, alive_pick_BxK = jax.lax.top_k(cont_aug_BxC, k)

    def alive(x_BxC):
      return _gather_beams(x_BxC, alive_pick_BxK)

  alive_aug_BxK = alive(cont_aug_BxC)

  # The finishers compete with the finished set for its K places by score (ties: the
  # finished set first, so the hypothesis that finished first wins).
  if in_slots:
    # Words + EOS: an ended slot's sequence has PAD after its EOS. No length penalty (refused).
    len_BxC = (seq_BxCxT != PAD).sum(-1).astype(jnp.int32)
    new_score_BxC = jnp.where(ends_BxC, top_aug_BxC, -jnp.inf)
  else:
    length = t + 1
    len_BxC = jnp.full((b, c), length, jnp.int32)
    new_score_BxC = jnp.where(ends_BxC, top_aug_BxC / penalty(length), -jnp.inf)
  fin_score_BxK, pick_BxK = jax.lax.top_k(
      jnp.concatenate([s["fin_score"], new_score_BxC], axis=1), k)

  def merge(old, new):
    return _gather_beams(jnp.concatenate([old, new], axis=1), pick_BxK)

  new_fin = {
      "fin_seq": merge(s["fin_seq"], seq_BxCxT),
      "fin_tok_lp": merge(s["fin_tok_lp"], tok_lp_BxCxT),
      "fin_logp": merge(s["fin_logp"], top_logp_BxC),
      "fin_len": merge(s["fin_len"], len_BxC),
      "fin_score": fin_score_BxK,
      "fin_aux": jax.tree.map(merge, s["fin_aux"], aux_hist) if aux_hist is not None else None,
  }

  # An image is done when its finished set is full and no alive beam can still beat its
  # worst member: ranking scores only decrease (log-probabilities and the diversity penalty
  # are <= 0) and the length penalty is largest at max_len, so nothing enters the finished
  # set afterwards and freezing the image changes no output.
  best_bound_B = alive_aug_BxK.max(-1) / penalty(jnp.int32(big_t))
  if in_slots:
    # "in_slots" fills its finished set at the last step, so nothing is frozen. Its image is
    # done once every slot has ended with a score above -999: from then on each slot's one
    # candidate beats every other word, the K slots are already in top_k's order (score, then
    # slot), and every further step writes PAD, 0 and zero aux where the initial state already
    # holds them; the search skips to the last step (_beam_search_jit).
    ended_BxK = (word_BxC == EOS) | (word_BxC == PAD)
    done_B = (ended_BxK & (top_aug_BxC > _IN_SLOTS_OTHER_WORDS)).all(-1)
    frozen_B = jnp.zeros_like(s["done"])
  else:
    done_B = s["done"] | (fin_score_BxK[:, -1] >= best_bound_B)
    frozen_B = s["done"] if freeze else jnp.zeros_like(s["done"])

  def keep(old, new):
    return jnp.where(frozen_B.reshape((-1,) + (1,) * (old.ndim - 1)), old, new)

  out = {
      "last": keep(s["last"], alive(word_BxC)),
      "alive_seq": keep(s["alive_seq"], alive(seq_BxCxT)),
      "alive_tok_lp": keep(s["alive_tok_lp"], alive(tok_lp_BxCxT)),
      "alive_logp": keep(s["alive_logp"], alive(cont_logp_BxC)),
      "alive_aug": keep(s["alive_aug"], alive_aug_BxK),
      "alive_aux": (jax.tree.map(lambda o, n: keep(o, alive(n)), s["alive_aux"], aux_hist)
                    if aux_hist is not None else None),
      "done": done_B,
  }
  for name, value in new_fin.items():
    out[name] = jax.tree.map(keep, s[name], value) if value is not None else None

  # The words the group's hypotheses took at this step (self-critical.pytorch counts the K
  # picks, finished ones included; the live search's picks are its K alive beams and the
  # candidates that ended among the 2K). -inf candidates (fewer hypotheses than places) are
  # no choice.
  if beam_mode in ("self_critical", "in_slots"):  # "in_slots" has no groups (refused)
    words_BxM, chosen_BxM = word_BxC, jnp.isfinite(top_aug_BxC)
  else:
    words_BxM = jnp.concatenate([word_BxC, alive(word_BxC)], axis=1)
    chosen_BxM = jnp.concatenate([ends_BxC & jnp.isfinite(top_aug_BxC),
                                  jnp.isfinite(alive_aug_BxK)], axis=1)
  return out, alive(parent_BxC), words_BxM, chosen_BxM


def diversity_penalty(words_BxM, chosen_BxM, vocab_size: int, strength):
  """Hamming diversity (Vijayakumar et al., 2018, section 5): ``strength * count[b, w]``, the
  number of times word w was taken at this step by the earlier groups' hypotheses.

  Args:
    words_BxM: int32 words taken by earlier groups at this step.
    chosen_BxM: bool, which of them count.
    vocab_size: V.
    strength: lambda (>= 0).

  Returns:
    float32 ``[B, V]``, subtracted from every beam's log-probabilities of the next group.
  """
  counts_BxV = (jax.nn.one_hot(words_BxM, vocab_size, dtype=jnp.float32)
                * chosen_BxM[..., None].astype(jnp.float32)).sum(1)
  return strength * counts_BxV


@xla_options.decode_jit(static_argnums=0,
                        static_argnames=("beam_size", "max_len", "beam_mode", "groups",
                                         "block_trigrams", "return_aux"))
def _beam_search_jit(model, params, batch, opts, *, beam_size, max_len, beam_mode, groups,
                     block_trigrams, return_aux):
  # G groups of K' = K / G beams (G = 1: the ordinary search). The search's arrays are
  # [B, G, K', ...]; the model's rows are image-major, then group, then beam: b*K + g*K' + k.
  g_n, k, big_t = groups, beam_size // groups, max_len
  in_slots = beam_mode == "in_slots"
  enc = model.apply(params, batch, method="encode")
  b = _batch_size(enc)
  n = b * g_n * k
  # The image side is expanded once; every step reuses it.
  enc = repeat_batch(enc, g_n * k)
  cache = model.apply(params, enc, big_t, method="init_cache")
  penalty = functools.partial(_length_penalty, coef=opts["penalty"])
  # Only beam 0 of each group is alive at t = 0, so a group's first continuations differ.
  alive_logp_BxGxK = jnp.broadcast_to(jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf), (b, g_n, k))
  seq0 = jnp.full((b, g_n, k, big_t), PAD, jnp.int32)
  lp0 = jnp.zeros((b, g_n, k, big_t), jnp.float32)
  if return_aux:
    aux0 = jax.tree.map(
        lambda s: jnp.zeros((b, g_n, k, big_t) + s.shape[1:], s.dtype),
        _aux_template(model, params, enc, cache, n, return_aux))
  else:
    aux0 = None
  state = {
      "cache": cache,
      "last": jnp.full((b, g_n, k), BOS, jnp.int32),
      "alive_seq": seq0, "alive_tok_lp": lp0, "alive_aux": aux0,
      "alive_logp": alive_logp_BxGxK, "alive_aug": alive_logp_BxGxK,
      "fin_seq": seq0, "fin_tok_lp": lp0, "fin_aux": aux0,
      "fin_logp": jnp.full((b, g_n, k), -jnp.inf), "fin_score": jnp.full((b, g_n, k), -jnp.inf),
      "fin_len": jnp.zeros((b, g_n, k), jnp.int32),
      "done": jnp.zeros((b, g_n), bool),
  }

  def body(s, t):
    last_N = s["last"].reshape(n)
    # One decode_step for every group's beams: groups differ only in which words they pick.
    lp_NxV, new_cache, aux = _step_logprobs(model, params, enc, s["cache"], last_N, t, return_aux)
    v = lp_NxV.shape[-1]
    lp_NxV = _banned_tokens(lp_NxV, t, opts, last_N)
    if block_trigrams:
      blocked = _trigram_blocked(s["alive_seq"].reshape(n, big_t), t, v)
      lp_NxV = jnp.where(blocked, -jnp.inf, lp_NxV)
    lp_BxGxKxV = lp_NxV.reshape(b, g_n, k, v)
    aux_BxGxK = (jax.tree.map(lambda a: a.reshape((b, g_n, k) + a.shape[1:]), aux)
                 if return_aux else None)
    # The groups choose in order at every step (Vijayakumar et al.'s doubly greedy
    # approximation); group g's ranking subtracts the penalty of the words groups < g took
    # at this same step. self-critical.pytorch staggers group g by g steps, which gives the
    # same choices: group g's step t reads only the earlier groups' step t.
    taken_words, taken_mask = [], []
    outs, parents = [], []
    for g in range(g_n):
      s_g = {name: (jax.tree.map(lambda x: x[:, g], s[name]) if s[name] is not None else None)
             for name in _GROUP_FIELDS}
      lp_BxKxV = lp_BxGxKxV[:, g]
      aug_BxKxV = lp_BxKxV
      if g > 0:
        pen_BxV = diversity_penalty(jnp.concatenate(taken_words, 1),
                                    jnp.concatenate(taken_mask, 1), v, opts["diversity"])
        aug_BxKxV = lp_BxKxV - pen_BxV[:, None, :]
      out_g, parent_BxK, words_BxM, chosen_BxM = _beam_group_step(
          s_g, lp_BxKxV, aug_BxKxV,
          jax.tree.map(lambda a: a[:, g], aux_BxGxK) if return_aux else None, t,
          beam_mode=beam_mode, max_len=big_t, penalty=penalty, freeze=g_n == 1)
      outs.append(out_g)
      parents.append(parent_BxK)
      taken_words.append(words_BxM)
      taken_mask.append(chosen_BxM)

    def stack(*xs):
      return jnp.stack(xs, axis=1)

    out = {name: (jax.tree.map(stack, *[o[name] for o in outs]) if s[name] is not None else None)
           for name in _GROUP_FIELDS}
    parent_BxGxK = jnp.stack(parents, axis=1)
    rows_N = ((jnp.arange(b)[:, None, None] * g_n + jnp.arange(g_n)[None, :, None]) * k
              + parent_BxGxK).reshape(-1)
    out["cache"] = jax.tree.map(lambda x: x[rows_N], new_cache)
    return out, None

  # Stops once every image is done (no alive beam can beat its worst finished one: the
  # remaining steps would change nothing returned). "in_slots" fills its finished set at the
  # last step: once every image's slots have all ended, it goes straight to that step.
  def running(ts):
    t, s = ts
    return (t < big_t) & (jnp.bool_(in_slots) | ~s["done"].all())

  def advance(ts):
    t, s = ts
    s = body(s, t)[0]
    if in_slots:
      return jnp.where(s["done"].all(), jnp.maximum(t + 1, big_t - 1), t + 1), s
    return t + 1, s

  _, s = jax.lax.while_loop(running, advance, (jnp.int32(0), state))

  # Groups one after the other, each best first (self-critical.pytorch's done_beams order).
  def flat(x):
    return x.reshape((b, g_n * k) + x.shape[3:])

  return DecodeOutput(tokens=flat(s["fin_seq"]), token_logprobs=flat(s["fin_tok_lp"]),
                      logprobs=flat(s["fin_logp"]), lengths=flat(s["fin_len"]),
                      scores=flat(s["fin_score"]),
                      aux=jax.tree.map(flat, s["fin_aux"]) if return_aux else None)


def beam_search(model, params, batch, *, beam_size: int, max_len: int,
                beam_mode: str = "live", length_penalty: str = "none", alpha: float = 0.6,
                min_len: int = 0, block_trigrams: bool = False, suppress_unk: bool = False,
                bad_endings: Sequence[int] = (), beam_groups: int = 1,
                diversity_strength: float = 0.5, return_aux: bool | Sequence[str] = False) -> DecodeOutput:
  """Beam search (alive/finished formulation, see the module docstring), optionally diverse.

  Args:
    model: a CaptionModel (static).
    params: the variables dict for ``model.apply``.
    batch: a batch dict; only what ``encode`` reads matters.
    beam_size: K (in all groups together).
    max_len: T, the number of decoding steps.
    beam_mode: ``"live"`` (K live hypotheses from the 2K best candidates, as flax/t5x),
      ``"self_critical"`` (the K best candidates, finished ones included, as
      self-critical.pytorch; K = 1 is greedy) or ``"in_slots"`` (finished captions stay in
      the K slots until K better candidates push them out, as the M² authors' BeamSearch;
      only with ``length_penalty="none"`` and ``beam_groups=1``).
    length_penalty: ``"none"``, ``"gnmt"`` or ``"average"`` (how finished hypotheses are
      ranked; alive ones are always ranked by log-probability).
    alpha: the GNMT exponent (>= 0).
    min_len: EOS is banned before step ``min_len``.
    block_trigrams: a word that would repeat a trigram already in its beam gets -inf.
    suppress_unk: never emit UNK.
    bad_endings: token ids after which EOS is banned (as in :func:`greedy`).
    beam_groups: G, diverse beam search (Vijayakumar et al.) with G groups of K / G beams
      when > 1 (K must be a multiple of G); see the module docstring.
    diversity_strength: lambda, the diversity penalty per earlier-group choice of a word
      (>= 0; read only when G > 1).
    return_aux: also return the per-step aux outputs along each returned beam (True), or only
      the named entries.

  Returns:
    DecodeOutput with ``tokens [B, K, T]``: best first, or with G > 1 group after group
    (group g's K / G beams at places ``g*K/G ...``), each group best first by its own score.
  """
  _check_common(max_len, min_len)
  if beam_size < 1:
    raise BadInput(f"decode option beam_size: expected >= 1, got {beam_size}")
  if beam_mode not in BEAM_MODES:
    raise BadInput(f"decode option beam_mode: expected one of {BEAM_MODES}, got {beam_mode!r}")
  if length_penalty not in LENGTH_PENALTIES:
    raise BadInput(f"decode option length_penalty: expected one of {LENGTH_PENALTIES}, "
                   f"got {length_penalty!r}")
  if length_penalty == "gnmt" and not alpha >= 0.0:
    raise BadInput(f"decode option alpha: expected >= 0 for the GNMT penalty, got {alpha}")
  if beam_groups < 1 or beam_size % beam_groups:
    raise BadInput(f"decode option beam_groups: expected >= 1 and dividing beam_size="
                   f"{beam_size}, got {beam_groups}")
  if not diversity_strength >= 0.0:
    raise BadInput(f"decode option diversity_strength: expected >= 0, got {diversity_strength}")
  # The M² authors' search ranks by the log-probability sum and has no groups.
  if beam_mode == "in_slots" and beam_groups > 1:
    raise BadInput(f"decode options beam_mode='in_slots' and beam_groups={beam_groups}: "
                   f"the in_slots search has no diverse groups; expected beam_groups=1")
  if beam_mode == "in_slots" and length_penalty != "none":
    raise BadInput(f"decode options beam_mode='in_slots' and length_penalty="
                   f"{length_penalty!r}: the in_slots search has no length penalty; "
                   f"expected length_penalty='none'")
  opts = dict(_common_opts(min_len, suppress_unk, bad_endings),
              penalty=_penalty_coefficients(length_penalty, float(alpha)),
              diversity=np.float32(diversity_strength))
  return _beam_search_jit(model, params, batch, opts, beam_size=int(beam_size),
                          max_len=int(max_len), beam_mode=str(beam_mode),
                          groups=int(beam_groups), block_trigrams=bool(block_trigrams),
                          return_aux=_aux_spec(return_aux))


def _check_common(max_len, min_len):
  if max_len < 1:
    raise BadInput(f"decode option max_len: expected >= 1, got {max_len}")
  if not 0 <= min_len < max_len:
    raise BadInput(f"decode option min_len: expected in [0, max_len={max_len}), got {min_len}")


def decode(model, params, batch, decode_config, rng=None, *, bad_endings: Sequence[int] | None = None,
           return_aux: bool | Sequence[str] = False) -> DecodeOutput:
  """Dispatches on ``decode_config.method`` (fields as in :func:`default_decode_config`).

  ``decode_config`` is any mapping with ``items()`` (a ConfigDict or a dict).

  Missing fields take their defaults. ``"sample"`` needs ``rng``. With
  ``remove_bad_endings`` the ids ``bad_endings`` (:func:`bad_ending_ids` of the vocabulary)
  may not end a caption.
  """
  given = dict(decode_config.items())
  unknown = sorted(set(given) - set(_DEFAULTS))
  if unknown:
    raise BadInput(f"decode config: unknown fields {unknown}; expected a subset of "
                   f"{sorted(_DEFAULTS)}")
  cfg = types.SimpleNamespace(**{**_DEFAULTS, **given})
  if cfg.remove_bad_endings and bad_endings is None:
    raise BadInput("decode option remove_bad_endings needs the bad-ending token ids "
                   "(decoding.bad_ending_ids(vocab))")
  bad = tuple(bad_endings) if cfg.remove_bad_endings else ()
  if cfg.method == "greedy":
    return greedy(model, params, batch, max_len=cfg.max_len, suppress_unk=cfg.suppress_unk,
                  min_len=cfg.min_len, bad_endings=bad, return_aux=return_aux)
  if cfg.method == "beam":
    return beam_search(model, params, batch, beam_size=cfg.beam_size, max_len=cfg.max_len,
                       beam_mode=cfg.beam_mode, length_penalty=cfg.length_penalty,
                       alpha=cfg.alpha, min_len=cfg.min_len,
                       block_trigrams=cfg.block_trigrams,
                       suppress_unk=beam_suppresses_unk(given),
                       bad_endings=bad, beam_groups=cfg.beam_groups,
                       diversity_strength=cfg.diversity_strength, return_aux=return_aux)
  if cfg.method == "sample":
    if rng is None:
      raise BadInput("decode option method='sample' needs an rng key")
    return sample(model, params, batch, rng, max_len=cfg.max_len, num_samples=cfg.num_samples,
                  temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                  suppress_unk=cfg.suppress_unk, min_len=cfg.min_len, bad_endings=bad,
                  return_aux=return_aux)
  raise BadInput(f"decode option method: expected one of {METHODS}, got {cfg.method!r}")
