"""self-critical.pytorch's FC model ("newfc", its ``NewFCModel``), for checkpoints imported from it.

Dimension legend:
  B batch (images, or images x captions / beams), F global image feature width,
  E word / image embedding width, H LSTM width, V vocabulary.

As self-critical.pytorch computes it (captioning/models/AttModel.py ``NewFCModel`` and
FCModel.py ``LSTMCore`` at commit 4c48a33):
  ``x_img = W_f v + b_f`` (no nonlinearity), fed once to the LSTM from a zero state (its output
  is not scored); then for each word ``x_t = E[y_t]`` (no dropout on the embedding);
  the cell: ``a = W_i x + b_i + W_h h + b_h`` ``[5H]``; ``i, f, o = sigmoid(a[:3H])``;
  ``g = max(a[3H:4H], a[4H:])`` (a maxout candidate, no tanh); ``c' = f * c + i * g``;
  ``h' = o * tanh(c')``; logits ``W_o Dropout(h') + b_o``.
The maxout candidate is why this is not Show and Tell (``show_tell``, flax's LSTM cell with a
tanh candidate): the equations differ, so an imported FC checkpoint needs this model.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxcap.models import fields
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register


@register("newfc")
class NewFC(CaptionModel):
  """The FC captioner of self-critical.pytorch (module docstring).

  Attributes:
    vocab_size: V.
    hidden_dim: H (``rnn_size``).
    embed_dim: E (``input_encoding_size``).
    dropout: the rate on the LSTM output (``drop_prob_lm``).
  """

  reads_regions = False  # only the global feature
  reads_global_feat = True

  vocab_size: int
  hidden_dim: int = 512
  embed_dim: int = 512
  dropout: float = 0.5

  field_checks = {"hidden_dim": fields.POSITIVE, "embed_dim": fields.POSITIVE,
                  "dropout": fields.RATE}

  def setup(self):
    self.img_embed = nn.Dense(self.embed_dim)
    self.embed = nn.Embed(self.vocab_size, self.embed_dim)
    self.i2h = nn.Dense(5 * self.hidden_dim)
    self.h2h = nn.Dense(5 * self.hidden_dim)
    self.out_proj = nn.Dense(self.vocab_size)
    self.drop = nn.Dropout(self.dropout)

  def _cell(self, x_BxE, c_BxH, h_BxH):
    a_Bx5H = self.i2h(x_BxE) + self.h2h(h_BxH)
    hd = self.hidden_dim
    gates = nn.sigmoid(a_Bx5H[:, :3 * hd])
    i, f, o = gates[:, :hd], gates[:, hd:2 * hd], gates[:, 2 * hd:]
    g = jnp.maximum(a_Bx5H[:, 3 * hd:4 * hd], a_Bx5H[:, 4 * hd:])
    c = f * c_BxH + i * g
    return c, o * jnp.tanh(c)

  def encode(self, batch, train: bool = False):
    x_BxE = self.img_embed(batch["global_feat"].astype(jnp.float32))
    zeros = jnp.zeros((x_BxE.shape[0], self.hidden_dim), jnp.float32)
    c, h = self._cell(x_BxE, zeros, zeros)
    return {"c0": c, "h0": h}

  def init_cache(self, enc, max_len: int):
    del max_len  # A recurrent state does not grow with time.
    return {"c": enc["c0"], "h": enc["h0"]}

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    del enc, t  # The state carries the image and the position.
    c, h = self._cell(self.embed(tokens_B), cache["c"], cache["h"])
    return self.drop(h, deterministic=not train), {"c": c, "h": h}, {}

  def output_layer(self, h_BxH, train: bool = False):
    del train
    return self.out_proj(h_BxH).astype(jnp.float32)
