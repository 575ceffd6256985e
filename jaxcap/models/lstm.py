"""A Show, Attend and Tell style LSTM captioner (Xu et al., 2015) with soft attention.

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region feature width,
  T caption positions, H LSTM width, E word embedding width, A attention width, V vocabulary.

Encoder (once per image): ``v = Dropout(ReLU(Dense_H(feats)))``, the attention keys
``W_v v`` and the initial state ``h0 = tanh(W_h mean(v))``, ``c0 = tanh(W_c mean(v))`` (mean
over real regions).
Decoder step, from the previous token ``y`` and state ``(c, h)``:
  ``e_n = w^T tanh(W_v v_n + W_q h)`` (padding regions masked), ``alpha = softmax(e)``,
  ``z = sum_n alpha_n v_n``, ``(c, h) = LSTM((c, h), [Dropout(Embed(y)); z])``,
  ``logits = Dense_V(Dropout(h + z))``.
The cache is the LSTM state; ``aux["attention"]`` holds ``alpha`` ``[B, N]``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcap.models import fields, layers
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register


@register("lstm")
class LSTMCaptioner(CaptionModel):
  """Soft-attention LSTM decoder over region features.

  Attributes:
    vocab_size: V.
    hidden_dim: H, the LSTM width (region features are projected to it too).
    embed_dim: E.
    att_dim: A.
    dropout: rate on region features, word embeddings and the output layer input.
  """

  vocab_size: int
  hidden_dim: int = 512
  embed_dim: int = 512
  att_dim: int = 512
  dropout: float = 0.5

  field_checks = {"hidden_dim": fields.POSITIVE, "embed_dim": fields.POSITIVE,
                  "att_dim": fields.POSITIVE, "dropout": fields.RATE}

  def setup(self):
    self.feat_proj = nn.Dense(self.hidden_dim)
    self.key_proj = nn.Dense(self.att_dim)
    self.query_proj = nn.Dense(self.att_dim, use_bias=False)
    self.att_score = nn.Dense(1, use_bias=False)
    self.init_h = nn.Dense(self.hidden_dim)
    self.init_c = nn.Dense(self.hidden_dim)
    self.embed, self.cell, self.out_proj, self.drop = layers.lstm_word_layers(
        self.vocab_size, self.embed_dim, self.hidden_dim, self.dropout)

  def encode(self, batch, train: bool = False):
    mask_BxN = batch["feats_mask"].astype(bool)
    v_BxNxH = nn.relu(self.feat_proj(batch["feats"].astype(jnp.float32)))
    v_BxNxH = self.drop(v_BxNxH, deterministic=not train)
    pooled_BxH = layers.masked_mean(v_BxNxH, mask_BxN)
    return {
        "values": v_BxNxH,
        "keys": self.key_proj(v_BxNxH),
        "mask": mask_BxN,
        "h0": jnp.tanh(self.init_h(pooled_BxH)),
        "c0": jnp.tanh(self.init_c(pooled_BxH)),
    }

  def init_cache(self, enc, max_len: int):
    del max_len  # A recurrent state does not grow with time.
    return {"c": enc["c0"], "h": enc["h0"]}

  def _attend(self, enc, h_BxH):
    e_BxN = self.att_score(jnp.tanh(enc["keys"] + self.query_proj(h_BxH)[:, None, :]))[..., 0]
    # A large finite mask value keeps an image without regions finite (uniform weights).
    e_BxN = jnp.where(enc["mask"], e_BxN.astype(jnp.float32), -1e9)
    alpha_BxN = jax.nn.softmax(e_BxN, axis=-1)
    z_BxH = jnp.einsum("bn,bnh->bh", alpha_BxN, enc["values"])
    return z_BxH, alpha_BxN

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    """One word up to the output layer: ``(Dropout(h + z) [B, H], cache, {"attention": [B, N]})``;
    teacher forcing scans this step (``CaptionModel.decode_train``: aux ``[B, T, N]``)."""
    del t  # The state carries the position.
    x_BxE = self.drop(self.embed(tokens_B), deterministic=not train)
    z_BxH, alpha_BxN = self._attend(enc, cache["h"])
    (c_BxH, h_BxH), _ = self.cell((cache["c"], cache["h"]), jnp.concatenate([x_BxE, z_BxH], -1))
    out_BxH = self.drop(h_BxH + z_BxH, deterministic=not train)
    return out_BxH, {"c": c_BxH, "h": h_BxH}, {"attention": alpha_BxN}

  def output_layer(self, out_BxH, train: bool = False):
    """``Dense_V`` (its input's dropout is ``step_features``'): logits float32."""
    del train
    return self.out_proj(out_BxH).astype(jnp.float32)
