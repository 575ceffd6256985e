"""AAT: Adaptive Attention Time on an Up-Down style two-LSTM decoder (Huang et al., 2019).

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region feature width,
  T caption positions, D model width (= LSTM width = word embedding width, paper d),
  H heads, Dh = D / H, M = M_max (adaptive) or M_r (recurrent) attention steps,
  S = M + 1 step slots (slot 0 is the non-visual step h1), V vocabulary.

Section 3 of the paper, equation by equation:

* Encoder: region features are projected to D by a linear layer (+ dropout); the mean
  ``a_bar`` runs over the real regions only; the image keys/values of the multi-head attention
  are projected once, in ``encode``.
* Input module (eq. 1): ``(h1_t, m1_t) = LSTM_1([W_e y_t, a_bar + c_{t-1}], (h1_{t-1}, m1_{t-1}))``.
* Output module (eq. 2): ``softmax(W_p Dropout(c_t) + b_p)``.
* Attention module, ``attention=``
  - ``"base"`` (eqs. 4-7): ``a_hat = MHA(h1_t, A, A)``, ``(h2, m2) = LSTM_2([a_hat, h1_t], state_{t-1})``.
  - ``"recurrent"`` (eqs. 8-9): ``M_r = steps`` attention steps with query
    ``q_{t,n} = W_q [h1_t, h2_{t,n-1}] + b_q``; LSTM_2 is chained through the steps starting
    from ``(h2_{t-1}, m2_{t-1})``; ``c_t = h2_{t,M_r}``.
  - ``"adaptive"`` (eqs. 10-15): the same steps, plus the confidence network
    ``p_{t,n} = sigmoid(W_2 relu(W_1 x_{t,n} + b_1) + b_2)`` on ``x_{t,0} = h1_t``,
    ``x_{t,n} = h2_{t,n}``; ``p_{t,n} = 0`` for ``n < M_min``; ``N(t) = min(M_max,
    min{n': prod_{n<=n'} (1 - p_{t,n}) < epsilon})``; ``beta_{t,n} = p_{t,n} prod_{n'<n}
    (1 - p_{t,n'})`` normalised over ``n <= N(t)``; ``h2_t = beta_0 h1_t + sum_n beta_n h2_{t,n}``,
    ``m2_t = beta_0 m2_{t-1} + sum_n beta_n m2_{t,n}``, ``c_t = h2_t``; and the time cost
    ``L^a_t = N(t) + sum_{n<=N(t)} n (1 - p_{t,n})`` (eq. 14), returned times ``lambda``
    (``time_cost_weight``) as ``aux["extra_loss"]`` so that both the cross-entropy and the
    self-critical loss add it (eqs. 16-17).
  ``h2_{t,n}`` and ``m2_{t,n}`` go through LayerNorm_h / LayerNorm_m after every LSTM_2 step,
  in all three modes, so that *base* is exactly *recurrent* with one step and the paper's
  special cases (section 3.2.4) hold with the same weights.

Deviations from the paper, choices where it is silent and the released code's differences:
jaxcap/papers/aat/README.md, "The model against the paper".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.errors import BadInput
from jaxcap.models import fields, layers
from jaxcap.models.layers import masked_mean
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register

ATTENTION_KINDS = ("base", "recurrent", "adaptive")

# Stands in for log(0) in the weight softmax: finite so that gradients through the masked
# slots are exactly zero rather than NaN.
_LOG_ZERO = -1e30


def num_slots(attention: str, steps: int, max_steps: int) -> int:
  """S = number of step slots in the per-word aux arrays (slot 0: the non-visual step)."""
  if attention == "base":
    return 2
  if attention == "recurrent":
    return steps + 1
  return max_steps + 1


class AttentionTimeFields(nn.Module):
  """The fields that the attention module and the captioner share: D, H and the attention time
  of section 3.2 (the captioner's config sets them; it hands them to its attention module)."""

  dim: int
  num_heads: int = 8
  attention: str = "adaptive"
  steps: int = 2
  min_steps: int = 0
  max_steps: int = 4
  epsilon: float = 1e-4


class AATAttention(AttentionTimeFields):
  """The attention module of section 3.2 (base / recurrent / adaptive).

  Attributes:
    dim: D.
    num_heads: H.
    attention: "base" | "recurrent" | "adaptive".
    steps: M_r (recurrent).
    min_steps, max_steps: M_min, M_max (adaptive).
    epsilon: the halting threshold of eq. 11.
    confidence_dim: hidden width of the confidence network (0: D, as the released code).
    norm_query: LayerNorm on the query before the head projections (the released code's
      ``norm_q``; not in the paper: deviation 2).
    out_proj: the output projection ``W^O`` of eq. 5 (False: heads concatenated, as the
      released code; deviation 1).
    dtype: compute dtype; weights, costs and confidences are float32.
  """

  confidence_dim: int = 0
  norm_query: bool = False
  out_proj: bool = True
  dtype: Any = jnp.float32

  def setup(self):
    if self.attention not in ATTENTION_KINDS:
      raise BadInput(f"config field model.attention: expected one of {ATTENTION_KINDS}, "
                       f"got {self.attention!r}")
    self.mha = layers.MultiHeadAttention(self.num_heads, self.dim, 0.0, self.dtype)
    self.lstm = nn.OptimizedLSTMCell(self.dim, dtype=self.dtype)
    self.norm_h = nn.LayerNorm(dtype=self.dtype)
    self.norm_m = nn.LayerNorm(dtype=self.dtype)
    if self.norm_query:
      self.norm_q = nn.LayerNorm(dtype=self.dtype)
    if self.attention != "base":
      self.query = nn.Dense(self.dim, dtype=self.dtype)
    if self.attention == "adaptive":
      self.conf_hidden = nn.Dense(self.confidence_dim or self.dim, dtype=self.dtype)
      self.conf_out = nn.Dense(1, dtype=self.dtype)

  def project_kv(self, a_BxNxD):
    """Image keys and values ``([B, N, H, Dh], [B, N, H, Dh])``, once per image."""
    return self.mha.project_kv(a_BxNxD)

  def confidence_logit(self, x_BxD):
    """``W_2 relu(W_1 x + b_1) + b_2`` float32 ``[B]``: eq. 10 before the sigmoid."""
    z_Bx1 = self.conf_out(nn.relu(self.conf_hidden(x_BxD)))
    return z_Bx1[:, 0].astype(jnp.float32)

  def mha_attend(self, q_BxD, k_BxNxHxDh, v_BxNxHxDh, mask_BxN):
    """``a_hat = f_mha(q, A, A)`` (eqs. 4-5) for one query per example: ``(a_hat [B, D],
    weights [B, H, N] float32)``."""
    if self.norm_query:
      q_BxD = self.norm_q(q_BxD)
    if self.out_proj:
      a_Bx1xD, w_BxHx1xN = self.mha.attend_kv(q_BxD[:, None], k_BxNxHxDh, v_BxNxHxDh,
                                              mask_BxN[:, None, :], return_weights=True)
      return a_Bx1xD[:, 0], w_BxHx1xN[:, :, 0]
    # Without W^O: eq. 5's Concat(head_1, ..., head_h) itself (the released code's variant).
    q_BxHxDh = self.mha.project_q(q_BxD[:, None])
    w_BxHx1xN = layers.attention_weights(q_BxHxDh, k_BxNxHxDh, mask_BxN[:, None, :])
    o_BxHxDh = jnp.einsum("bhn,bnhd->bhd", w_BxHx1xN[:, :, 0].astype(self.dtype),
                          v_BxNxHxDh.astype(self.dtype))
    return o_BxHxDh.reshape(q_BxD.shape[0], self.dim), w_BxHx1xN[:, :, 0]

  def attend_step(self, h1_BxD, h2_BxD, m2_BxD, k_BxNxHxDh, v_BxNxHxDh, mask_BxN):
    """One attention step: query, MHA over the regions, LSTM_2, LayerNorms (eqs. 6-9):
    ``(h2_{t,n}, m2_{t,n}, the MHA's weights [B, H, N] float32)``."""
    if self.attention == "base":
      q_BxD = h1_BxD
    else:
      q_BxD = self.query(jnp.concatenate([h1_BxD, h2_BxD], axis=-1))
    a_hat_BxD, w_BxHxN = self.mha_attend(q_BxD, k_BxNxHxDh, v_BxNxHxDh, mask_BxN)
    (m_BxD, h_BxD), _ = self.lstm((m2_BxD, h2_BxD), jnp.concatenate([a_hat_BxD, h1_BxD], axis=-1))
    return self.norm_h(h_BxD), self.norm_m(m_BxD), w_BxHxN

  def __call__(self, h1_BxD, h2_BxD, m2_BxD, k_BxNxHxDh, v_BxNxHxDh, mask_BxN):
    """One decoding step of the attention module.

    Args:
      h1_BxD: the input module's output h1_t.
      h2_BxD, m2_BxD: LSTM_2's state after the previous word (h2_{t-1}, m2_{t-1}).
      k_BxNxHxDh, v_BxNxHxDh: projected image keys/values.
      mask_BxN: True for real regions.

    Returns:
      ``(h2_t [B, D], m2_t [B, D], aux)`` with ``c_t = h2_t`` and aux float32/int32:
      ``attention_steps`` int32 ``[B]`` (N(t)), ``confidences`` ``[B, S]`` (p_{t,n}, 0 where
      not taken), ``beta`` ``[B, S]`` (normalised weights, sum 1), ``time_cost`` ``[B]``
      (eq. 14, unweighted; 0 for base / recurrent), ``step_attention`` ``[B, S, H, N]`` (each
      attention step's weights per head; slot 0, the non-visual step, and steps not taken are
      0) and ``attention`` ``[B, N]`` (:func:`step_attention_summary`). Base and recurrent
      report all their weight on the last slot.
    """
    b = h1_BxD.shape[0]
    kv = (k_BxNxHxDh, v_BxNxHxDh, mask_BxN)
    if self.attention != "adaptive":
      n_steps = 1 if self.attention == "base" else self.steps
      h, m = h2_BxD, m2_BxD
      ws = []
      for _ in range(n_steps):
        h, m, w_BxHxN = self.attend_step(h1_BxD, h, m, *kv)
        ws.append(w_BxHxN)
      aux = {
          "attention_steps": jnp.full((b,), n_steps, jnp.int32),
          "confidences": jnp.zeros((b, n_steps + 1), jnp.float32),
          "beta": jax.nn.one_hot(jnp.full((b,), n_steps), n_steps + 1, dtype=jnp.float32),
          "time_cost": jnp.zeros((b,), jnp.float32),
      }
      aux.update(step_attention_summary(ws, aux["beta"], jnp.ones((b, n_steps + 1), bool)))
      return h, m, aux
    return self._adaptive(h1_BxD, h2_BxD, m2_BxD, *kv)

  def _adaptive(self, h1_BxD, h2_BxD, m2_BxD, k_BxNxHxDh, v_BxNxHxDh, mask_BxN):
    # Inside jit all M_max steps are computed (a fixed-length loop); each example's halting
    # step N(t) is then found from the cumulative log(1 - p) and later steps are masked out of
    # the weights and the cost: examples that halt at different steps need no Python control
    # flow on values. The weights are a softmax over log beta_n = log p_n + sum_{n'<n} log(1 -
    # p_n'), algebraically the paper's beta_n / sum beta but finite, with finite gradients,
    # when p saturates at 0 or 1 in float32.
    big_m = self.max_steps
    hs, ms, zs, ws = [h1_BxD], [m2_BxD], [self.confidence_logit(h1_BxD)], []
    h, m = h2_BxD, m2_BxD
    for _ in range(big_m):
      h, m, w_BxHxN = self.attend_step(h1_BxD, h, m, k_BxNxHxDh, v_BxNxHxDh, mask_BxN)
      ws.append(w_BxHxN)
      hs.append(h)
      ms.append(m)
      zs.append(self.confidence_logit(h))
    z_BxS = jnp.stack(zs, axis=1)
    n_S = jnp.arange(big_m + 1)
    forced_S = n_S < self.min_steps  # eq. 15: p = 0 before M_min
    log_p_BxS = jnp.where(forced_S, _LOG_ZERO, jax.nn.log_sigmoid(z_BxS))
    log_q_BxS = jnp.where(forced_S, 0.0, jax.nn.log_sigmoid(-z_BxS))  # log(1 - p)
    cum_q_BxS = jnp.cumsum(log_q_BxS, axis=1)  # log prod_{n' <= n} (1 - p_n')
    # Eqs. 11 and 15: the first n whose remaining mass drops below epsilon, at most M_max.
    below_BxS = jax.lax.stop_gradient(cum_q_BxS) < np.log(self.epsilon)
    halt_B = jnp.where(below_BxS.any(axis=1), jnp.argmax(below_BxS, axis=1), big_m)
    halt_B = jnp.minimum(halt_B, big_m).astype(jnp.int32)
    taken_BxS = n_S[None, :] <= halt_B[:, None]
    excl_q_BxS = jnp.pad(cum_q_BxS[:, :-1], ((0, 0), (1, 0)))  # log prod_{n' < n} (1 - p_n')
    log_beta_BxS = jnp.where(taken_BxS, log_p_BxS + excl_q_BxS, _LOG_ZERO)
    beta_BxS = jax.nn.softmax(log_beta_BxS, axis=1)  # beta_n / sum_{n <= N} beta_n
    hs_SxBxD = jnp.stack(hs).astype(jnp.float32)
    ms_SxBxD = jnp.stack(ms).astype(jnp.float32)
    h2_BxD = jnp.einsum("bs,sbd->bd", beta_BxS, hs_SxBxD).astype(h1_BxD.dtype)
    m2_out_BxD = jnp.einsum("bs,sbd->bd", beta_BxS, ms_SxBxD).astype(m2_BxD.dtype)
    p_BxS = jnp.where(forced_S, 0.0, jax.nn.sigmoid(z_BxS))
    one_minus_p_BxS = jnp.where(forced_S, 1.0, jax.nn.sigmoid(-z_BxS))
    cost_B = halt_B.astype(jnp.float32) + jnp.sum(
        jnp.where(taken_BxS, n_S * one_minus_p_BxS, 0.0), axis=1)
    aux = {
        "attention_steps": halt_B,
        "confidences": jnp.where(taken_BxS, p_BxS, 0.0),
        "beta": beta_BxS,
        "time_cost": cost_B,
    }
    aux.update(step_attention_summary(ws, beta_BxS, taken_BxS))
    return h2_BxD, m2_out_BxD, aux


def step_attention_summary(weights, beta_BxS, taken_BxS) -> dict:
  """AAT's attention aux from the M attention steps' weights (one ``[B, H, N]`` each).

  ``step_attention`` ``[B, S, H, N]``: slot 0 (h1, no attention) and the steps after the
  halting step N(t) are 0 (they are computed in the fixed-length loop but do not enter h2_t).
  ``attention`` ``[B, N]``: the regions' share of the visual steps, ``sum_{n>=1} beta_n
  mean_h w_{t,n} / sum_{n>=1} beta_n``: h2_t mixes the steps' states by beta (eq. 13), and
  the non-visual slot's beta_0 is renormalised away, so the row sums to 1 over the real regions
  whenever a step was taken; a word that halted at N(t) = 0 attended nothing: all 0. Base and
  recurrent attention (beta one-hot on the last slot) report the last step's weights.
  """
  w_BxMxHxN = jnp.stack(weights, axis=1).astype(jnp.float32)
  w_BxSxHxN = jnp.pad(w_BxMxHxN, ((0, 0), (1, 0), (0, 0), (0, 0)))
  w_BxSxHxN = jnp.where(taken_BxS[:, :, None, None], w_BxSxHxN, 0.0)
  visual_BxS = beta_BxS.at[:, 0].set(0.0)
  mass_B = visual_BxS.sum(axis=1)
  summary_BxN = jnp.einsum("bs,bsn->bn", visual_BxS, w_BxSxHxN.mean(axis=2))
  summary_BxN = jnp.where(mass_B[:, None] > 0, summary_BxN / jnp.maximum(mass_B, 1e-30)[:, None], 0.0)
  return {"step_attention": w_BxSxHxN, "attention": summary_BxN}


@register("aat")
class AATCaptioner(CaptionModel, AttentionTimeFields, kw_only=True):
  """Up-Down decoder with base / recurrent / adaptive (AAT) attention; see the module docstring.

  Attributes:
    vocab_size: V.
    dim: D (paper 1024): feature projection, both LSTMs, word embedding.
    num_heads: H (default 8 as the released code; the paper's text says 4).
    attention: "base" | "recurrent" | "adaptive".
    steps: M_r for "recurrent".
    min_steps, max_steps: M_min, M_max for "adaptive" (paper 0 and 4).
    epsilon: halting threshold (paper 1e-4).
    time_cost_weight: lambda of eqs. 16-17 (paper 1e-4).
    confidence_dim: hidden width of the confidence network (0: D).
    dropout: rate on word embeddings, projected features and c_t.
    norm_h1: LayerNorm on h1_t after LSTM_1, as the released code does (not in the paper);
      then every slot that the adaptive weights mix (h1 and the normalised h2_{t,n}) has the
      same scale (deviation 8).
    norm_query: LayerNorm on the attention query, as the released code (deviation 2).
    attention_out_proj: the output projection W^O of eq. 5 (default True, the paper; False:
      the released code; deviation 1).
    embed_relu: ReLU on the word embedding, as the released code (not in eq. 1; deviation 4).
    dtype: compute dtype; parameters stay float32, logits are float32.
  """

  vocab_size: int
  dim: int = 1024
  time_cost_weight: float = 1e-4
  confidence_dim: int = 0
  dropout: float = 0.5
  norm_h1: bool = False
  norm_query: bool = False
  attention_out_proj: bool = True
  embed_relu: bool = False
  dtype: Any = jnp.float32

  # The paper's reading is every switch's default (module docstring, deviations 1, 2, 4, 8).
  field_checks = {"attention": fields.one_of(ATTENTION_KINDS), "dim": fields.POSITIVE,
                  "num_heads": fields.POSITIVE, "steps": fields.POSITIVE,
                  "min_steps": fields.at_least(0), "max_steps": fields.POSITIVE,
                  "confidence_dim": fields.at_least(0),
                  "epsilon": fields.in_interval(0.0, 1.0, what="a threshold"),
                  "time_cost_weight": fields.NON_NEGATIVE,
                  "dropout": fields.RATE}

  @staticmethod
  def word_figures(words, aux, out_prefix, title=""):
    """The steps per word, ``<out_prefix>_steps.png``
    (:func:`jaxcap.papers.aat.figures.plot_attention_steps`)."""
    if "attention_steps" not in aux:
      return []
    from jaxcap.papers.aat import figures  # matplotlib only when drawing
    out = f"{out_prefix}_steps.png"
    figures.plot_attention_steps(words, aux["attention_steps"], aux["confidences"], aux["beta"],
                                 title=title, out=out)
    return [out]

  @staticmethod
  def check_fields(values):
    fields.heads_divide_dim(values)
    if values["min_steps"] > values["max_steps"]:
      raise BadInput(f"config fields model.min_steps / max_steps: expected min_steps <= "
                       f"max_steps, got {values['min_steps']} > {values['max_steps']}")

  def setup(self):
    self.feat_proj = nn.Dense(self.dim, dtype=self.dtype)
    self.embed = layers.Embed(self.vocab_size, self.dim, dtype=self.dtype)
    self.lstm1 = nn.OptimizedLSTMCell(self.dim, dtype=self.dtype)
    if self.norm_h1:
      self.norm1 = nn.LayerNorm(dtype=self.dtype)
    self.core = AATAttention(self.dim, self.num_heads, self.attention, self.steps, self.min_steps,
                             self.max_steps, self.epsilon, self.confidence_dim,
                             norm_query=self.norm_query, out_proj=self.attention_out_proj,
                             dtype=self.dtype)
    self.logits_proj = nn.Dense(self.vocab_size, dtype=self.dtype)
    self.drop = nn.Dropout(self.dropout)

  @property
  def num_slots(self) -> int:
    return num_slots(self.attention, self.steps, self.max_steps)

  def encode(self, batch, train: bool = False):
    """``{"mean": a_bar [B, D], "k", "v": [B, N, H, Dh], "mask": [B, N]}``."""
    mask_BxN = batch["feats_mask"].astype(bool)
    a_BxNxD = self.drop(self.feat_proj(batch["feats"].astype(self.dtype)), deterministic=not train)
    k, v = self.core.project_kv(a_BxNxD)
    return {"mean": masked_mean(a_BxNxD, mask_BxN), "k": k, "v": v, "mask": mask_BxN}

  def init_cache(self, enc, max_len: int):
    """LSTM states ``{"h1", "m1", "h2", "m2"}``, zeros ``[B, D]`` (``c_0 = h2_0 = 0``)."""
    del max_len  # a recurrent state does not grow with the caption
    zeros = jnp.zeros((enc["mean"].shape[0], self.dim), self.dtype)
    return {"h1": zeros, "m1": zeros, "h2": zeros, "m2": zeros}

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    """Input module + attention module of one word: ``(Dropout(c_t) [B, D], cache, aux)``.

    aux: ``extra_loss`` ``[B]`` (lambda x eq. 14; 0 unless adaptive), ``attention_steps``
    int32 ``[B]``, ``confidences`` / ``beta`` float32 ``[B, S]``. Teacher forcing scans this
    step (``CaptionModel.decode_train``): aux ``[B, T]`` / ``[B, T, S]``.
    """
    del t  # the recurrent state carries the position
    e_BxD = self.embed(tokens_B)  # W_e Pi_t (eq. 1)
    if self.embed_relu:
      e_BxD = nn.relu(e_BxD)
    e_BxD = self.drop(e_BxD, deterministic=not train)
    x_BxD2 = jnp.concatenate([e_BxD, (enc["mean"] + cache["h2"]).astype(e_BxD.dtype)], axis=-1)
    (m1_BxD, h1_BxD), _ = self.lstm1((cache["m1"], cache["h1"]), x_BxD2)
    if self.norm_h1:
      h1_BxD = self.norm1(h1_BxD)
    h2_BxD, m2_BxD, aux = self.core(h1_BxD, cache["h2"], cache["m2"], enc["k"], enc["v"], enc["mask"])
    cost_B = aux.pop("time_cost")
    aux["extra_loss"] = (self.time_cost_weight * cost_B if self.attention == "adaptive"
                         else jnp.zeros_like(cost_B))
    new_cache = {"h1": h1_BxD.astype(self.dtype), "m1": m1_BxD.astype(self.dtype),
                 "h2": h2_BxD.astype(self.dtype), "m2": m2_BxD.astype(self.dtype)}
    return self.drop(h2_BxD, deterministic=not train), new_cache, aux

  def output_layer(self, c, train: bool = False):
    """Eq. 2 before the softmax, ``W_p c + b_p`` (c's dropout is ``step_features``'): float32."""
    del train
    return self.logits_proj(c).astype(jnp.float32)
