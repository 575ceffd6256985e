"""AoANet as self-critical.pytorch's ``aoa`` model computes it (and the AoANet authors' code, from
which it was copied), for checkpoints imported from either.

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region feature width,
  D model width (``rnn_size``), E word embedding width (``input_encoding_size``), S the
  multi-head scale (``multi_head_scale``), H heads, Dk = S*D / H, V vocabulary.

jaxcap's ``aoanet`` (:mod:`jaxcap.papers.image_transformer.aoanet`) is the paper's equations as
the Image Transformer paper restates them; the released code differs from them, and a
checkpoint's parameters only mean something under the code's equations. Here they are, from
captioning/models/AoAModel.py and AttModel.py at self-critical.pytorch commit 4c48a33:

* regions ``A = Dropout(ReLU(W_a feats + b_a))``;
* refiner (``refine``): 6 pre-norm layers ``A = A + Dropout(AoA(LN(A)))`` with
  ``AoA(X) = GLU(W_g Dropout_aoa([MultiHead'(X, X, X); X]) + b_g)`` (multi-head attention with
  q / k / v projections to S*D and no output projection; ``refine_aoa=0``: with the output
  projection and no GLU), then (``use_ff``) ``A = A + Dropout(FFN(LN(A)))`` (inner width 2048),
  and a final ``LN`` over the stack; ``LN`` is the Annotated Transformer's layer norm
  (:class:`jaxcap.models.layers.AnnotatedLayerNorm`);
* ``Ā`` the mean of the refined regions over the real ones (``mean_feats``); values and keys
  ``[V; K] = W_c A + b_c`` (``ctx2att``, to 2*S*D; the values are the first half);
* each word: ``x = Dropout(ReLU(E[y]))``; ``(h, c) = LSTMCell([x; Ā + Dropout_ctx(ctx)], (h, c))``
  (torch's cell: gates i, f, g, o); ``a = MultiHead(W_q LN(h) + b_q, K, V)`` (no output
  projection); ``ctx = GLU(W_o [a; h] + b_o)`` (``decoder_type="AoA"``); logits
  ``W_p Dropout(ctx (+ h with out_res)) + b_p``. ``ctx`` is fed back at the next step.

Every dropout is active only in training. The options the importer refuses (``decoder_type``
other than ``"AoA"``, ``use_multi_head`` other than 2, ``mean_feats=0``) have no code here.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxcap.errors import BadInput
from jaxcap.models import fields, layers
from jaxcap.models.base import CaptionModel
from jaxcap.models.layers import masked_mean
from jaxcap.models.registry import register

REFINER_LAYERS = 6  # fixed in the code (clones(layer, 6))
REFINER_FF_DIM = 2048  # fixed in the code
REFINER_DROPOUT = 0.1  # the refiner's attention and residual dropout, fixed in the code


def _glu(x):
  a, b = jnp.split(x, 2, axis=-1)
  return a * nn.sigmoid(b)


def _heads(x, h):
  return x.reshape(x.shape[:-1] + (h, x.shape[-1] // h))


class _RefinerLayer(nn.Module):
  dim: int
  num_heads: int
  scale: int
  refine_aoa: bool
  use_ff: bool
  dropout_aoa: float

  @nn.compact
  def __call__(self, x_BxNxD, mask_BxN, train: bool):
    drop = lambda y, rate=REFINER_DROPOUT: nn.Dropout(rate)(y, deterministic=not train)
    q = layers.AnnotatedLayerNorm(name="norm0")(x_BxNxD)
    proj = lambda name: _heads(nn.Dense(self.scale * self.dim, name=name)(q), self.num_heads)
    w_BxHxNxN = layers.attention_weights(proj("query"), proj("key"), mask_BxN[:, None, :])
    v = proj("value")
    o = jnp.einsum("bhlm,bmhd->blhd", drop(w_BxHxNxN), v).reshape(x_BxNxD.shape[:2] + (-1,))
    if self.refine_aoa:
      o = _glu(nn.Dense(2 * self.dim, name="aoa")(drop(jnp.concatenate([o, q], -1), self.dropout_aoa)))
    else:
      o = nn.Dense(self.dim, name="out")(o)
    x = x_BxNxD + drop(o)
    if self.use_ff:
      y = layers.AnnotatedLayerNorm(name="norm1")(x)
      x = x + drop(layers.FeedForward(self.dim, REFINER_FF_DIM, REFINER_DROPOUT, name="ffn")(y, train))
    return x


@register("aoa")
class AoA(CaptionModel):
  """self-critical.pytorch's / the AoANet authors' AoA captioner (module docstring).

  Attributes:
    vocab_size: V.
    dim: D (``rnn_size``); embed_dim: E (``input_encoding_size``).
    num_heads: H; scale: S (``multi_head_scale``).
    dropout: ``drop_prob_lm`` (regions, words, the context fed back, the output);
    dropout_aoa: the dropout on the refiner's AoA input.
    refine, refine_aoa, use_ff, ctx_drop, out_res: the code's switches of the same names.
  """

  vocab_size: int
  dim: int = 1024
  embed_dim: int = 1024
  num_heads: int = 8
  scale: int = 1
  dropout: float = 0.5
  dropout_aoa: float = 0.3
  refine: bool = True
  refine_aoa: bool = True
  use_ff: bool = False
  ctx_drop: bool = True
  out_res: bool = False

  field_checks = {"dim": fields.POSITIVE, "embed_dim": fields.POSITIVE, "num_heads": fields.POSITIVE,
                  "scale": fields.POSITIVE, "dropout": fields.RATE, "dropout_aoa": fields.RATE}

  @staticmethod
  def check_fields(values):
    if values["dim"] * values["scale"] % values["num_heads"]:
      raise BadInput(f"config field model.num_heads: expected a divisor of dim x scale = "
                       f"{values['dim'] * values['scale']}, got {values['num_heads']}")

  def setup(self):
    self.att_embed = nn.Dense(self.dim)
    self.refiner = [_RefinerLayer(self.dim, self.num_heads, self.scale, self.refine_aoa, self.use_ff,
                                  self.dropout_aoa) for _ in range(REFINER_LAYERS if self.refine else 0)]
    if self.refine:
      self.refiner_norm = layers.AnnotatedLayerNorm()
    self.ctx2att = nn.Dense(2 * self.scale * self.dim)
    self.embed = nn.Embed(self.vocab_size, self.embed_dim)
    self.lstm_ih = nn.Dense(4 * self.dim)
    self.lstm_hh = nn.Dense(4 * self.dim)
    self.attn_norm = layers.AnnotatedLayerNorm()
    self.attn_query = nn.Dense(self.scale * self.dim)
    self.attn_dropout = nn.Dropout(REFINER_DROPOUT)
    self.att2ctx = nn.Dense(2 * self.dim)
    self.out_proj = nn.Dense(self.vocab_size)
    self.drop = nn.Dropout(self.dropout)

  def encode(self, batch, train: bool = False):
    mask_BxN = batch["feats_mask"]
    a = self.drop(nn.relu(self.att_embed(batch["feats"].astype(jnp.float32))), deterministic=not train)
    for layer in self.refiner:
      a = layer(a, mask_BxN, train)
    if self.refine:
      a = self.refiner_norm(a)
    kv = self.ctx2att(a)
    # The code's attention is called as forward(query, value, key): the first half is the values.
    v, k = jnp.split(kv, 2, axis=-1)
    return {"mask": mask_BxN, "mean": masked_mean(a, mask_BxN),
            "k": _heads(k, self.num_heads), "v": _heads(v, self.num_heads)}

  def init_cache(self, enc, max_len: int):
    del max_len  # A recurrent state does not grow with time.
    zeros = jnp.zeros((enc["mean"].shape[0], self.dim), jnp.float32)
    return {"h": zeros, "c": zeros, "ctx": zeros}

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    del t  # The state carries the position.
    det = not train
    x = self.drop(nn.relu(self.embed(tokens_B)), deterministic=det)
    ctx = self.drop(cache["ctx"], deterministic=det) if self.ctx_drop else cache["ctx"]
    gates = self.lstm_ih(jnp.concatenate([x, enc["mean"] + ctx], -1)) + self.lstm_hh(cache["h"])
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = nn.sigmoid(f) * cache["c"] + nn.sigmoid(i) * jnp.tanh(g)
    h = nn.sigmoid(o) * jnp.tanh(c)
    q = _heads(self.attn_query(self.attn_norm(h)), self.num_heads)[:, None]  # [B, 1, H, Dk]
    w = layers.attention_weights(q, enc["k"], enc["mask"][:, None, :])  # [B, H, 1, N]
    att = jnp.einsum("bhlm,bmhd->blhd", self.attn_dropout(w, deterministic=det), enc["v"])
    att = att.reshape(att.shape[0], -1)
    new_ctx = _glu(self.att2ctx(jnp.concatenate([att, h], -1)))
    out = new_ctx + h if self.out_res else new_ctx
    return self.drop(out, deterministic=det), {"h": h, "c": c, "ctx": new_ctx}, {"attention": w[:, :, 0].mean(1)}

  def output_layer(self, out_BxD, train: bool = False):
    del train
    return self.out_proj(out_BxD).astype(jnp.float32)
