"""Show and Tell (Vinyals et al., CVPR 2015): the CNN-LSTM baseline of TPGN's Table 1.

Dimension legend:
  B batch (images, or images x captions / beams), F global image feature width,
  T caption positions, H LSTM width (512), E word / image embedding width (512), V vocabulary.

The image is the LSTM's first input, once (eqs. 10-12 of Vinyals et al.):
  ``x_{-1} = W_I v + b_I``, ``(c_0, h_0) = LSTM(x_{-1}, (0, 0))`` (its output is not scored);
  then for each word ``x_t = W_e y_t``, ``(c, h) = LSTM(x_t, (c, h))``,
  ``logits = W_o Dropout(h) + b_o``.
``encode`` runs the image step, so the cache starts at ``(c_0, h_0)``; the LSTM is flax's
``OptimizedLSTMCell`` (the standard LSTM of the paper), one cell shared by the image and the
word steps. Dropout (rate ``dropout``) on the image embedding, the word embeddings and the LSTM
output, as NIC uses dropout; its rate is not given in the paper (0.5 as self-critical.pytorch's
``fc`` model). TPGN's authors re-implemented this model with ResNet-152 features (Table 1,
"CNN-LSTM"); here ``v`` is ``batch["global_feat"]``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxcap.models import fields, layers
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register


@register("show_tell")
class ShowTell(CaptionModel):
  """CNN-LSTM captioner: image feature as the first LSTM input.

  Attributes:
    vocab_size: V.
    hidden_dim: H (paper 512).
    embed_dim: E, the word and image embedding width (paper 512).
    dropout: rate on the embeddings and the LSTM output.
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
    self.embed, self.cell, self.out_proj, self.drop = layers.lstm_word_layers(
        self.vocab_size, self.embed_dim, self.hidden_dim, self.dropout)

  def encode(self, batch, train: bool = False):
    v_BxF = batch["global_feat"].astype(jnp.float32)
    x_BxE = self.drop(self.img_embed(v_BxF), deterministic=not train)
    b = x_BxE.shape[0]
    zeros = jnp.zeros((b, self.hidden_dim), jnp.float32)
    (c_BxH, h_BxH), _ = self.cell((zeros, zeros), x_BxE)
    return {"c0": c_BxH, "h0": h_BxH}

  def init_cache(self, enc, max_len: int):
    del max_len  # A recurrent state does not grow with time.
    return {"c": enc["c0"], "h": enc["h0"]}

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    """One word up to the output layer: ``(Dropout(h) [B, H], cache, {})``; teacher forcing
    scans this step (``CaptionModel.decode_train``)."""
    del enc, t  # The state carries the image and the position.
    x_BxE = self.drop(self.embed(tokens_B), deterministic=not train)
    (c_BxH, h_BxH), _ = self.cell((cache["c"], cache["h"]), x_BxE)
    return self.drop(h_BxH, deterministic=not train), {"c": c_BxH, "h": h_BxH}, {}

  def output_layer(self, h_BxH, train: bool = False):
    """``W_o Dropout(h) + b_o`` (the dropout is ``step_features``'): logits float32."""
    del train
    return self.out_proj(h_BxH).astype(jnp.float32)
