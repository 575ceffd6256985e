"""Up-Down as self-critical.pytorch computes it (its ``updown`` / ``topdown``: ``UpDownModel`` with
``UpDownCore``), for checkpoints imported from it.

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region / global feature widths,
  E word embedding width (``input_encoding_size``), R LSTM width (``rnn_size``), A attention
  width (``att_hid_size``), V vocabulary.

As captioning/models/AttModel.py computes it at commit 4c48a33 (Anderson et al.'s top-down
attention LSTM and language LSTM, in that code's reading):

* once per image: ``f = Dropout(ReLU(W_f fc + b_f))`` (``fc_embed``),
  ``a_n = Dropout(ReLU(W_a v_n + b_a))`` (``att_embed``), ``p_n = W_c a_n + b_c`` (``ctx2att``);
* each word ``y``: ``x = Dropout(ReLU(E[y]))``;
  ``(h1, c1) = LSTMCell_1([h2_prev; f; x], (h1, c1))`` (torch's cell: gates i, f, g, o);
  ``e_n = w_alpha^T tanh(p_n + W_h h1 + b_h) + b_alpha`` (``h2att``, ``alpha_net``);
  ``alpha = softmax(e)`` over the real regions (the code's softmax over the batch's clipped
  regions, multiplied by the mask and renormalised: the same distribution);
  ``z = sum_n alpha_n a_n``; ``(h2, c2) = LSTMCell_2([z; h1], (h2, c2))``;
  logits ``W_o Dropout(h2) + b_o``; the state starts at zeros.

Every dropout is ``drop_prob_lm`` and active only in training. ``aux["attention"]`` is ``alpha``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcap.models import fields
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register


class _TorchLSTMCell(nn.Module):
  """torch.nn.LSTMCell's equations and parameter layout (``ih`` and ``hh``, each with a bias;
  gates i, f, g, o), so that a checkpoint's two weight matrices map one to one."""

  hidden: int

  @nn.compact
  def __call__(self, x_BxI, h_BxR, c_BxR):
    gates = nn.Dense(4 * self.hidden, name="ih")(x_BxI) + nn.Dense(4 * self.hidden, name="hh")(h_BxR)
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = nn.sigmoid(f) * c_BxR + nn.sigmoid(i) * jnp.tanh(g)
    return nn.sigmoid(o) * jnp.tanh(c), c


@register("updown")
class UpDown(CaptionModel):
  """self-critical.pytorch's Up-Down captioner (module docstring).

  Attributes:
    vocab_size: V.
    hidden_dim: R (``rnn_size``); embed_dim: E (``input_encoding_size``); att_dim: A
      (``att_hid_size``).
    dropout: ``drop_prob_lm`` (the word, global and region embeddings and the output).
  """

  reads_global_feat = True  # fc_embed

  vocab_size: int
  hidden_dim: int = 1000
  embed_dim: int = 1000
  att_dim: int = 512
  dropout: float = 0.5

  field_checks = {"hidden_dim": fields.POSITIVE, "embed_dim": fields.POSITIVE,
                  "att_dim": fields.POSITIVE, "dropout": fields.RATE}

  def setup(self):
    self.fc_embed = nn.Dense(self.hidden_dim)
    self.att_embed = nn.Dense(self.hidden_dim)
    self.ctx2att = nn.Dense(self.att_dim)
    self.embed = nn.Embed(self.vocab_size, self.embed_dim)
    self.att_lstm = _TorchLSTMCell(self.hidden_dim)
    self.lang_lstm = _TorchLSTMCell(self.hidden_dim)
    self.h2att = nn.Dense(self.att_dim)
    self.alpha_net = nn.Dense(1)
    self.out_proj = nn.Dense(self.vocab_size)
    self.drop = nn.Dropout(self.dropout)

  def encode(self, batch, train: bool = False):
    det = not train
    f_BxR = self.drop(nn.relu(self.fc_embed(batch["global_feat"].astype(jnp.float32))), deterministic=det)
    a_BxNxR = self.drop(nn.relu(self.att_embed(batch["feats"].astype(jnp.float32))), deterministic=det)
    return {"fc": f_BxR, "att": a_BxNxR, "p_att": self.ctx2att(a_BxNxR), "mask": batch["feats_mask"].astype(bool)}

  def init_cache(self, enc, max_len: int):
    del max_len  # A recurrent state does not grow with time.
    zeros = jnp.zeros((enc["fc"].shape[0], self.hidden_dim), jnp.float32)
    return {"h1": zeros, "c1": zeros, "h2": zeros, "c2": zeros}

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    del t  # The state carries the position.
    det = not train
    x_BxE = self.drop(nn.relu(self.embed(tokens_B)), deterministic=det)
    h1, c1 = self.att_lstm(jnp.concatenate([cache["h2"], enc["fc"], x_BxE], -1), cache["h1"], cache["c1"])
    e_BxN = self.alpha_net(jnp.tanh(enc["p_att"] + self.h2att(h1)[:, None, :]))[..., 0]
    # A large finite mask value keeps an image without regions finite (uniform weights).
    e_BxN = jnp.where(enc["mask"], e_BxN.astype(jnp.float32), -1e9)
    alpha_BxN = jax.nn.softmax(e_BxN, axis=-1)
    z_BxR = jnp.einsum("bn,bnr->br", alpha_BxN, enc["att"])
    h2, c2 = self.lang_lstm(jnp.concatenate([z_BxR, h1], -1), cache["h2"], cache["c2"])
    return (self.drop(h2, deterministic=det), {"h1": h1, "c1": c1, "h2": h2, "c2": c2},
            {"attention": alpha_BxN})

  def output_layer(self, out_BxR, train: bool = False):
    del train
    return self.out_proj(out_BxR).astype(jnp.float32)
