"""Self-critical sequence training (Rennie et al., 2017) with a vectorised CIDEr-D reward.

Dimension legend: B images, n samples per image, T decoding steps, V vocabulary.

One SCST step (``scst.reward = "device"``, the default): one jitted function
(:func:`scst_device_step`) — sample n captions per image with the current parameters and, for
the greedy baseline, decode greedily; the reward = CIDEr-D in training mode
(:mod:`jaxcap.evaluation.cider_device`, jax.numpy: the document frequencies of the training
references and the padded references of every training image live on the device), with EOS
counted as a word as self-critical.pytorch does; then the loss
``-(r(w^s) - b) * log p(w^s)`` summed over the sampled tokens up to and including the first EOS
and divided by their number (self-critical.pytorch's normalisation), plus the model's own
``extra_loss`` (e.g. AAT's attention-time cost, eq. 17), and the optimiser update. No host
callback and no device-to-host transfer: the rewards equal the host scorer's to ~1e-6.
``scst.fused_decode = True`` decodes the samples and the greedy captions together: one
encoder pass over the batch (the cross-attention keys and values computed once) and one
``lax.scan`` over n + 1 rows per image, the same tokens from the same keys
(:func:`jaxcap.decoding.sample_and_greedy`); False (default) keeps the two decodes.

``scst.reward = "host"`` (the checking option, and the only one for ``bleu_weight > 0``): the
samples go to the host, the reward is :class:`Rewarder` (NumPy CIDEr-D of
:mod:`jaxcap.evaluation.cider`, cached on disk, + optional weighted BLEU-4), and a second jitted
function does the update.

Baselines: ``"greedy"`` — the reward of the greedy caption (Rennie et al.); ``"mean"`` — the
mean reward of the other n - 1 samples of the same image ("new self-critical", Luo 2020);
``"mean_all"`` — the mean reward of all n candidates of the image, its own included (the M²
authors' train.py: ``reward - mean(reward, -1)``; (n - 1) / n times the ``"mean"`` advantage).

Candidates (``scst.candidates``): ``"sample"`` (default) — n captions sampled from the model;
``"beam"`` — the n beams of a beam search of width n (``decode.beam_mode``, ``decode.max_len``;
the M² authors' ``model.beam_search(..., beam_size, out_size=beam_size)``). The search is not
differentiated: its tokens are fixed and their log-probabilities recomputed by teacher forcing,
which gives the same values as the search's own per-word log-probabilities (without dropout:
the search runs without it; the authors search in training mode, with dropout, and
differentiate that pass). ``scst.loss_norm``: ``"tokens"`` (default) — the sum over the
candidates' tokens divided by their number (self-critical.pytorch); ``"steps"`` — each
candidate's log-probability (words and EOS) divided by the T decoding steps, then the mean over
candidates (the authors' ``-mean(log_probs, -1) * (reward - baseline)``, whose ``log_probs``
are the search's per-step values, 0 after EOS, over ``seq_len`` = T steps).
On-policy gradient: the log-probabilities in the gradient must be those of the
policy that drew the samples. Sampling (``decoding.sample``) runs the model without dropout,
so by default (``scst.dropout = False``) the gradient pass, which recomputes the samples'
log-probabilities by teacher forcing (:func:`sample_logits`), runs without dropout too: the
recomputed log-probabilities equal the sampling-time ones (tests/training/test_scst.py), and
the estimator is the unbiased REINFORCE gradient of the policy that is evaluated and decoded.
This differs from self-critical.pytorch, which samples in training mode and differentiates
that same pass with its dropout masks; replaying the masks here would mean differentiating
the step-by-step sampling loop instead of the one-pass teacher-forced ``decode_train``, and a
model that never uses dropout at test time gains nothing from it. ``scst.dropout = True``
keeps jaxcap's pre-issue-17 behaviour (fresh dropout masks in the gradient pass: a
regulariser, slightly off-policy).
"""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap import decoding
from jaxcap.data.vocab import PAD
from jaxcap.errors import BadInput
from jaxcap.evaluation import cider
from jaxcap.evaluation import cider_device
from jaxcap.models.base import shift_right
from jaxcap.training import guard
from jaxcap.training import parallel, steps


LOSS_NORMS = ("tokens", "steps")
CANDIDATES = ("sample", "beam")
BASELINES = ("greedy", "mean", "mean_all")


def scst_loss(logits_NxTxV, tokens_NxT, advantage_N, extra_NxT=None, norm: str = "tokens"):
  """``sum_t -(r - b) log p(w_t)`` over the non-PAD candidate tokens, divided by their count
  (``norm="tokens"``) or by N * T (``"steps"``: per candidate the mean over the T steps, PAD
  counting 0, then the mean over the N candidates).

  Returns:
    ``(loss, denominator)``.
  """
  if norm not in LOSS_NORMS:
    raise BadInput(f"config field scst.loss_norm: expected one of {LOSS_NORMS}, got {norm!r}")
  logp_NxTxV = jax.nn.log_softmax(logits_NxTxV.astype(jnp.float32), axis=-1)
  logp_NxT = jnp.take_along_axis(logp_NxTxV, tokens_NxT[..., None], axis=-1)[..., 0]
  mask = (tokens_NxT != PAD).astype(jnp.float32)
  if norm == "steps":
    total = jnp.float32(tokens_NxT.shape[0] * tokens_NxT.shape[1])
  else:
    total = jnp.maximum(jnp.sum(mask), 1.0)
  loss = -jnp.sum(jax.lax.stop_gradient(advantage_N)[:, None] * logp_NxT * mask) / total
  if extra_NxT is not None:
    loss = loss + jnp.sum(extra_NxT.astype(jnp.float32) * mask) / total
  return loss, total


def sample_logits(model, params, batch, samples_BxnxT, rng, dropout: bool = False):
  """Teacher-forced logits of the samples: ``(logits [B*n, T, V], aux)`` (the gradient pass).

  Args:
    dropout: False (default): no dropout, the policy :func:`sample_with_baseline` sampled
      from; True: training mode with dropout masks drawn from ``rng`` (off-policy).
  """
  b, n, t = samples_BxnxT.shape

  def one(ex, samples_1xnxT, key):
    rngs = lambda i: {"dropout": jax.random.fold_in(key, i)} if dropout else {}
    enc = model.apply(params, ex, train=dropout, method="encode", rngs=rngs(0))
    return model.apply(params, enc, shift_right(samples_1xnxT), train=dropout,
                       method="decode_train_grouped", rngs=rngs(1))

  if dropout:  # masks keyed by the image (steps.map_examples), not by its row in the layout
    logits, aux = steps.map_examples(lambda ex, key: one(ex, ex.pop("_samples"), key),
                                     dict(batch, _samples=samples_BxnxT), rng)
    aux = jax.tree.map(lambda x: x.reshape((b * n,) + x.shape[2:]), aux)  # [B, n, ...] -> [B*n, ...]
  else:
    logits, aux = one(batch, samples_BxnxT, rng)
  return logits.reshape(b * n, t, -1), aux


def scst_grad_step(state, batch, samples_BxnxT, advantage_Bxn, *, model, tx=None, dropout=False,
                   loss_norm: str = "tokens"):
  """The update of step 3 (pure; jitted by :func:`make_scst_step`): the shared
  :func:`jaxcap.training.steps.apply_gradients` on :func:`scst_loss`."""
  b, n, t = samples_BxnxT.shape
  rng = jax.random.fold_in(state.rng, state.step)
  tokens = samples_BxnxT.reshape(b * n, t)

  def loss_fn(params):
    logits, aux = sample_logits(model, params, batch, samples_BxnxT, rng, dropout)
    loss, _ = scst_loss(logits, tokens, advantage_Bxn.reshape(-1), (aux or {}).get("extra_loss"),
                        loss_norm)
    return loss, {"scst_loss": loss}

  return steps.apply_gradients(state, loss_fn, tx)


def baseline_rewards(sample_r_Bxn, greedy_r_B, kind: str, xp=np):
  """The baseline b per sample: greedy reward, or the mean of the image's other samples
  (``xp``: numpy on the host, jax.numpy inside the jitted device step)."""
  if kind == "greedy":
    return xp.broadcast_to(greedy_r_B[:, None], sample_r_Bxn.shape)
  if kind in ("mean", "mean_all"):
    n = sample_r_Bxn.shape[1]
    if n < 2:
      raise BadInput(f"config field scst.num_samples: the {kind!r} baseline needs at least 2 samples")
    if kind == "mean_all":
      return xp.broadcast_to(sample_r_Bxn.mean(axis=1, keepdims=True), sample_r_Bxn.shape)
    return (sample_r_Bxn.sum(axis=1, keepdims=True) - sample_r_Bxn) / (n - 1)
  raise BadInput(f"config field scst.baseline: expected one of {BASELINES}, got {kind!r}")


def sample_with_baseline(model, params, batch, rng, *, max_len: int, num_samples: int, baseline: str,
                         fused_decode: bool = False, candidates: str = "sample",
                         beam_mode: str = "live"):
  """Step 1 (pure; jit it): ``(samples [B, n, T], greedy [B, T] or None)``.

  ``candidates="beam"``: the n beams of a beam search of width n in ``beam_mode`` instead of
  samples (deterministic: ``rng`` is not used), best first; no greedy caption.

  Each image samples with its own key ``fold_in(rng, image_index)``
  (:func:`jaxcap.training.steps.map_examples`), so its samples do not depend on its row in the
  process / device layout. The greedy captions are decoded only for the ``"greedy"`` baseline.

  Args:
    fused_decode: False: the samples (one encoding per image) and the greedy captions (a
      second encoding of the batch) are two decodes, two loops; True: one encoding and one
      loop over n + 1 rows per image (:func:`jaxcap.decoding.sample_and_greedy`), the same
      tokens with the same keys.
  """
  if candidates == "beam":
    check_candidates(candidates, baseline, fused_decode)
    beams = decoding.beam_search(model, params, batch, beam_size=num_samples, max_len=max_len,
                                 beam_mode=beam_mode)
    return jax.lax.stop_gradient(beams.tokens), None
  if candidates != "sample":
    raise BadInput(f"config field scst.candidates: expected one of {CANDIDATES}, got {candidates!r}")
  if fused_decode:
    samples, greedy = decoding.sample_and_greedy(
        model, params, batch, steps.per_example_keys(rng, batch), max_len=max_len,
        num_samples=num_samples, with_greedy=baseline == "greedy")
    return samples.tokens, greedy.tokens if greedy is not None else None
  sample_one = lambda ex, key: decoding.sample(model, params, ex, key, max_len=max_len,
                                               num_samples=num_samples).tokens[0]
  samples_BxnxT = steps.map_examples(sample_one, batch, rng)
  greedy = None
  if baseline == "greedy":
    greedy = decoding.greedy(model, params, batch, max_len=max_len).tokens
  return samples_BxnxT, greedy


def check_candidates(candidates: str, baseline: str, fused_decode: bool = False) -> None:
  """The combinations :func:`sample_with_baseline` refuses (also said by the config check)."""
  if candidates == "beam" and baseline == "greedy":
    raise BadInput("config field scst.baseline: scst.candidates='beam' compares each beam with "
                     "the image's other beams; expected 'mean' or 'mean_all', got 'greedy'")
  if candidates == "beam" and fused_decode:
    raise BadInput("config field scst.fused_decode: it fuses samples with the greedy caption; "
                     "scst.candidates='beam' decodes one beam search, expected False")


def advantages(reward_fn, samples_BxnxT: np.ndarray, image_index_B: np.ndarray,
               greedy_BxT: np.ndarray | None, baseline: str):
  """Step 2 (host): rewards and ``r(w^s) - b`` per sample.

  Args:
    reward_fn: ``(tokens [N, T], image_index [N]) -> rewards [N]`` (e.g. a :class:`Rewarder`).
    samples_BxnxT, image_index_B, greedy_BxT: host arrays from :func:`sample_with_baseline`.
    baseline: ``"greedy"`` or ``"mean"`` (:func:`baseline_rewards`).

  Returns:
    ``(advantage float32 [B, n], sample rewards [B, n], greedy rewards [B] or None)``.
  """
  b, n, t = samples_BxnxT.shape
  r_sample = np.asarray(reward_fn(samples_BxnxT.reshape(b * n, t), np.repeat(image_index_B, n))).reshape(b, n)
  r_greedy = reward_fn(greedy_BxT, image_index_B) if greedy_BxT is not None else None
  adv = (r_sample - baseline_rewards(r_sample, r_greedy, baseline)).astype(np.float32)
  return adv, r_sample, r_greedy


def training_scorer(dataset, cache_dir: str, cider_compat: str):
  """``(training references as ids, CiderD scorer)`` of the SCST reward in ``cider_compat`` mode
  (its document frequencies cached in ``cache_dir``): what the host and the device rewards
  share."""
  if cider_compat not in cider.COMPAT_MODES:
    raise BadInput(f"config field scst.cider_compat: expected one of {cider.COMPAT_MODES}, "
                     f"got {cider_compat!r}")
  # self-critical.pytorch: df on full captions, references cut to max_len by the scorer.
  refs = dataset.train_references_ids(full=cider_compat == "self_critical")
  return refs, cider.CiderD.for_training(refs, cache_dir, dataset.vocab, compat=cider_compat,
                                         max_len=dataset.max_len)


class Rewarder:
  """CIDEr-D (training mode) + optional weighted BLEU-4 + optional weighted CLIP-S (``clip``:
  ``(Scorer, unit image embeddings [I, E])``, :func:`clip_reward_parts`) for sampled token ids."""

  def __init__(self, dataset, cache_dir: str, cider_weight: float = 1.0, bleu_weight: float = 0.0,
               cider_compat: str = "jaxcap", clip_weight: float = 0.0, clip=None):
    self.vocab = dataset.vocab
    refs, self.scorer = training_scorer(dataset, cache_dir, cider_compat)
    self.refs = self.scorer.prepare_refs(refs)
    self.cider_weight, self.bleu_weight = cider_weight, bleu_weight
    self.clip_weight, self.clip = clip_weight, clip
    self._ref_strings = None
    if bleu_weight > 0:
      train_refs = dataset.references("train")
      self._ref_strings = [train_refs[i] for i in dataset.image_ids("train")]

  def __call__(self, tokens_NxT: np.ndarray, image_index_N: np.ndarray) -> np.ndarray:
    r = self.cider_weight * self.scorer.score(tokens_NxT, image_index_N, self.refs)
    if self.bleu_weight > 0:
      r = r + self.bleu_weight * self._bleu4(tokens_NxT, image_index_N)
    if self.clip is not None:
      from jaxcap.clip import reward as clip_reward
      scorer, images_IxE, grammar, grammar_weight = self.clip
      if self.clip_weight > 0:
        r = r + self.clip_weight * clip_reward.host_clip_s(scorer, self.vocab, tokens_NxT,
                                                           images_IxE[np.asarray(image_index_N)])
      if grammar is not None:
        r = r + grammar_weight * clip_reward.host_grammar(scorer, self.vocab, tokens_NxT, grammar)
    return r

  def _bleu4(self, tokens_NxT, image_index_N):
    from pycocoevalcap.bleu.bleu import Bleu
    res = {k: [self.vocab.decode(row) or "<empty>"] for k, row in enumerate(tokens_NxT)}
    gts = {k: self._ref_strings[int(i)] for k, i in enumerate(image_index_N)}
    _, per = Bleu(4).compute_score(gts, res, verbose=0)
    return np.asarray(per[3], np.float64)


def make_rewarder(trainer) -> Rewarder:
  """The reward of the Trainer's config (``config.scst``), its CIDEr-D document frequencies
  cached in ``config.data.cache_dir`` (default ``<workdir>/cache``)."""
  sc = trainer.config.scst
  cache_dir = _cache_dir(trainer)
  clip_weight, grammar_weight = _clip_weights(sc)
  parts = clip_reward_parts(trainer) if clip_weight > 0 or grammar_weight > 0 else None
  return Rewarder(trainer.dataset, cache_dir, sc.cider_weight, sc.bleu_weight,
                  sc.cider_compat, clip_weight, parts and (*parts, grammar_weight))


def _clip_weights(sc) -> tuple[float, float]:
  """``(scst.clip_weight, scst.grammar_weight)``; 0 for a config made before the fields."""
  return float(sc.get("clip_weight", 0.0)), float(sc.get("grammar_weight", 0.0))


def clip_reward_parts(trainer):
  """``(Scorer, unit embeddings [I, E] of the training images in image_index order, grammar
  head or None)`` of the config's CLIP reward (``scst.clip_model``, ``scst.clip_images`` when
  ``clip_weight > 0``, ``scst.grammar_head`` when ``grammar_weight > 0``), the embeddings
  computed once and cached with the CIDEr-D document frequencies."""
  from jaxcap.clip import metrics as clip_metrics, reward as clip_reward, score as clip_score
  sc, dataset = trainer.config.scst, trainer.dataset
  clip_weight, grammar_weight = _clip_weights(sc)
  try:
    scorer = clip_score.Scorer(sc.clip_model)
  except BadInput as e:
    raise BadInput(f"config field scst.clip_model: {e}") from None
  grammar = None
  if grammar_weight > 0:
    try:
      grammar = clip_reward.load_grammar_head(sc.grammar_head, scorer.sizes.transformer_width)
    except BadInput as e:
      raise BadInput(f"config field scst.grammar_head: {e}") from None
  if clip_weight <= 0:  # the grammar head alone reads no image
    return scorer, np.zeros((1, scorer.sizes.embed_dim), np.float32), grammar
  keys = list(dataset.image_ids("train"))
  try:
    files = clip_metrics.image_files(sc.clip_images, keys)
  except BadInput as e:
    raise BadInput(f"config field scst.clip_images: {e}") from None
  return scorer, clip_reward.image_embeddings(scorer, keys, files, _cache_dir(trainer)), grammar


def _cache_dir(trainer) -> str | None:
  """Where the training CIDEr-D document frequencies are cached: ``data.cache_dir`` if a config
  sets one (several runs on one dataset share it), else the run's own ``cache/``; None (counted,
  not cached) for a dry run and before a fresh run's workdir exists (the step is built for the
  memory check before anything is written; a resumed run caches the table)."""
  if not getattr(trainer, "write_caches", True):
    return None
  shared = trainer.config.data.get("cache_dir", "")
  if shared:
    return shared
  return os.path.join(trainer.workdir, "cache") if os.path.isdir(trainer.workdir or "") else None


class DeviceReward(NamedTuple):
  """The device reward's arrays (a pytree, an argument of the jitted step).

  Attributes:
    table: document frequencies of the training references (:class:`cider_device.DfTable`).
    refs_IxRxL: int32 references of every training image, PAD-filled to ``data.max_len``.
    nref_I: int32 references per training image.
  """

  table: Any  # cider_device.DfTable (imported when the device reward is built)
  refs_IxRxL: jax.Array
  nref_I: jax.Array
  clip: Any = None  # jaxcap.clip.reward.ClipReward when scst.clip_weight > 0


def make_device_reward(trainer):
  """``(arrays, static options)`` of the device CIDEr-D for the Trainer's config: the same
  document-frequency table as :class:`Rewarder` (cached in ``data.cache_dir``) and the
  training references as one padded array, both built once on the host."""
  sc, dataset = trainer.config.scst, trainer.dataset
  if sc.bleu_weight > 0:
    raise BadInput("config field scst.reward: 'device' computes CIDEr-D only; "
                     "scst.bleu_weight > 0 needs scst.reward='host'")
  cider_device.check_vocab_size(len(dataset.vocab))
  refs, scorer = training_scorer(dataset, _cache_dir(trainer), sc.cider_compat)
  table, options = cider_device.training_table(scorer)
  # Both compat modes cut references at max_len words, so that is the array's width.
  refs_IxRxL, nref_I = cider_device.pad_references(refs, dataset.max_len)
  repl = parallel.replicated(trainer.mesh)
  (clip_weight, grammar_weight), clip, clip_sizes = _clip_weights(sc), None, None
  if clip_weight > 0 or grammar_weight > 0:
    from jaxcap.clip import reward as clip_reward
    clip_scorer, images_IxE, grammar = clip_reward_parts(trainer)
    clip = clip_reward.build(clip_scorer, dataset.vocab, images_IxE, grammar)
    clip_sizes = clip_scorer.sizes
  arrays = jax.device_put(DeviceReward(table, refs_IxRxL, nref_I, clip), repl)
  return arrays, dict(vocab_size=scorer.vocab_size, options=options, clip_weight=clip_weight,
                      grammar_weight=grammar_weight, clip_sizes=clip_sizes)


def device_advantages(batch, samples_BxnxT, greedy_BxT, reward: DeviceReward, *, baseline: str,
                      cider_weight: float, vocab_size: int, options, clip_weight: float = 0.0,
                      grammar_weight: float = 0.0, clip_sizes=None):
  """Step 2 on the device (pure): the CIDEr-D rewards of the samples (and greedy captions)
  against their images' references (+ ``clip_weight`` x CLIP-S against the images,
  :func:`jaxcap.clip.reward.device_scores`), the baselines and ``r(w^s) - b``.

  Returns:
    ``(advantage float32 [B, n], sample rewards [B, n], baselines [B, n], greedy rewards [B]
    or None)``.
  """
  b, n, t = samples_BxnxT.shape
  image_B = batch["image_index"].astype(jnp.int32)
  # Only this batch's references: candidates index rows 0..B-1 of the gathered set.
  refs_BxRxL, nref_B = reward.refs_IxRxL[image_B], reward.nref_I[image_B]
  cider = functools.partial(cider_device.score, refs_IxRxL=refs_BxRxL, nref_I=nref_B,
                            table=reward.table, vocab_size=vocab_size, options=options)

  def score(tokens_NxT, row_N):  # row_N: the caption's image among the batch's
    r_N = cider_weight * cider(tokens_NxT, row_N) if cider_weight else jnp.zeros(row_N.shape, jnp.float32)
    if clip_weight or grammar_weight:  # one pass of CLIP's text tower for both
      from jaxcap.clip import reward as clip_reward
      clip_s_N, grammar_N = clip_reward.device_scores(reward.clip, clip_sizes, tokens_NxT, image_B[row_N])
      if clip_weight:
        r_N = r_N + clip_weight * clip_s_N
      if grammar_weight:
        r_N = r_N + grammar_weight * grammar_N
    return r_N

  r_sample_Bxn = score(samples_BxnxT.reshape(b * n, t),
                       jnp.repeat(jnp.arange(b, dtype=jnp.int32), n)).reshape(b, n)
  r_greedy_B = None
  if greedy_BxT is not None:
    r_greedy_B = score(greedy_BxT, jnp.arange(b, dtype=jnp.int32))
  base_Bxn = baseline_rewards(r_sample_Bxn, r_greedy_B, baseline, xp=jnp)
  adv_Bxn = jax.lax.stop_gradient(r_sample_Bxn - base_Bxn).astype(jnp.float32)
  return adv_Bxn, r_sample_Bxn, base_Bxn, r_greedy_B


def scst_device_step(state, batch, reward: DeviceReward, *, model, max_len: int, num_samples: int,
                     baseline: str, cider_weight: float, vocab_size: int, options,
                     clip_weight: float = 0.0, grammar_weight: float = 0.0, clip_sizes=None,
                     dropout: bool = False, fused_decode: bool = False, candidates: str = "sample",
                     beam_mode: str = "live", loss_norm: str = "tokens"):
  """One whole SCST step on the device (pure; jitted by :func:`make_scst_step`): sample (+
  greedy; one decode with ``fused_decode``), device CIDEr-D, advantages, guarded update.
  Returns ``(state, metrics)``."""
  rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), 7)
  samples_BxnxT, greedy_BxT = sample_with_baseline(model, state.params, batch, rng, max_len=max_len,
                                                   num_samples=num_samples, baseline=baseline,
                                                   fused_decode=fused_decode, candidates=candidates,
                                                   beam_mode=beam_mode)
  adv_Bxn, r_sample_Bxn, base_Bxn, r_greedy_B = device_advantages(
      batch, samples_BxnxT, greedy_BxT, reward, baseline=baseline, cider_weight=cider_weight,
      vocab_size=vocab_size, options=options, clip_weight=clip_weight, grammar_weight=grammar_weight,
      clip_sizes=clip_sizes)
  state, metrics = guard.guarded(scst_grad_step)(state, batch, samples_BxnxT, adv_Bxn, model=model,
                                                 dropout=dropout, loss_norm=loss_norm)
  metrics = dict(metrics, reward=r_sample_Bxn.mean(), baseline=base_Bxn.mean())
  if r_greedy_B is not None:
    metrics["greedy_reward"] = r_greedy_B.mean()
  return state, metrics


def make_scst_step(trainer, reward_fn=None):
  """Returns ``step(state, batch, step_index) -> (state, metrics)`` for the Trainer's run.

  ``scst.reward = "device"`` (default) and no ``reward_fn``: one jitted
  :func:`scst_device_step`. Otherwise sample (device) -> ``reward_fn`` (host; default
  :func:`make_rewarder`) -> update (device).

  Args:
    reward_fn: ``(tokens [N, T], image_index [N]) -> rewards [N]`` (see :func:`advantages`).
  """
  config, model, mesh = trainer.config, trainer.model, trainer.mesh
  sc = config.scst
  kind = sc.reward
  if kind not in ("device", "host"):
    raise BadInput(f"config field scst.reward: expected 'device' or 'host', got {kind!r}")
  if reward_fn is None and kind == "device":
    return _make_device_step(trainer)
  reward_fn = reward_fn if reward_fn is not None else make_rewarder(trainer)
  repl, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  max_len = config.decode.max_len

  sample_fn = functools.partial(sample_with_baseline, model, max_len=max_len,
                                num_samples=sc.num_samples, baseline=sc.baseline,
                                fused_decode=_fused_decode(sc), **_candidate_options(config))
  state_sh = trainer.state_shardings
  sample_jit = jax.jit(sample_fn, in_shardings=(state_sh.params, data, None), out_shardings=(data, data))
  dropout = bool(sc.dropout)
  grad_jit = jax.jit(functools.partial(guard.guarded(scst_grad_step), model=model, dropout=dropout,
                                       loss_norm=_loss_norm(sc)),
                     in_shardings=(state_sh, data, data, data), out_shardings=(state_sh, repl),
                     donate_argnums=0)
  pi = jax.process_index()

  def step(state, batch, step_index):
    rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), 7)
    samples, greedy = sample_jit(state.params, batch, rng)
    samples_h = parallel.to_host(samples)
    index_h = parallel.to_host(batch["image_index"])
    greedy_h = parallel.to_host(greedy) if greedy is not None else None
    adv, r_sample, r_greedy = advantages(reward_fn, samples_h, index_h, greedy_h, sc.baseline)
    lb = samples_h.shape[0] // jax.process_count()
    rows = slice(pi * lb, (pi + 1) * lb)
    local_in = {"samples": samples_h[rows].astype(np.int32), "adv": adv[rows]}
    g = parallel.shard_batch(local_in, mesh)
    state, metrics = grad_jit(state, batch, g["samples"], g["adv"])
    metrics = dict(metrics, reward=jnp.float32(r_sample.mean()),
                   baseline=jnp.float32((r_sample - adv).mean()))
    if r_greedy is not None:
      metrics["greedy_reward"] = jnp.float32(r_greedy.mean())
    return state, metrics

  def trace(state, batch):
    """The step's jitted parts traced at these shapes (``Trainer.compile_steps``)."""
    rng = jax.ShapeDtypeStruct(state.rng.shape, state.rng.dtype)
    sampled = sample_jit.trace(state.params, batch, rng)
    samples = jax.eval_shape(sample_jit, state.params, batch, rng)[0]
    samples = jax.ShapeDtypeStruct(samples.shape, jnp.int32, sharding=data)
    adv = jax.ShapeDtypeStruct(samples.shape[:2], jnp.float32, sharding=data)
    return [sampled, grad_jit.trace(state, batch, samples, adv)]

  step.trace = trace
  return step


def _fused_decode(scst_config) -> bool:
  """``scst.fused_decode``; False (two decodes) for a config made before the field existed."""
  return bool(scst_config.get("fused_decode", False))


def _loss_norm(scst_config) -> str:
  """``scst.loss_norm``; "tokens" for a config made before the field existed."""
  return str(scst_config.get("loss_norm", "tokens"))


def _candidate_options(config) -> dict:
  """``candidates`` (``scst.candidates``; "sample" for a config made before the field) and the
  beam search's ``beam_mode`` (the run's ``decode.beam_mode``)."""
  return dict(candidates=str(config.scst.get("candidates", "sample")),
              beam_mode=str(config.decode.get("beam_mode", "live")))


def _make_device_step(trainer):
  config, model, mesh = trainer.config, trainer.model, trainer.mesh
  sc = config.scst
  arrays, static = make_device_reward(trainer)
  repl, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  fn = functools.partial(scst_device_step, model=model, max_len=config.decode.max_len,
                         num_samples=sc.num_samples, baseline=sc.baseline,
                         cider_weight=float(sc.cider_weight), dropout=bool(sc.dropout),
                         fused_decode=_fused_decode(sc), loss_norm=_loss_norm(sc),
                         **_candidate_options(config), **static)
  state_sh = trainer.state_shardings
  step_jit = jax.jit(fn, in_shardings=(state_sh, data, repl), out_shardings=(state_sh, repl),
                     donate_argnums=0)

  def step(state, batch, step_index):
    del step_index  # the sampling key comes from state.step, as on the host path
    return step_jit(state, batch, arrays)

  step.jitted, step.reward_arrays = step_jit, arrays  # for tests and benchmarks
  step.trace = lambda state, batch: [step_jit.trace(state, batch, arrays)]
  return step
