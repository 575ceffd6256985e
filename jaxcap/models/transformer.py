"""The vanilla Transformer captioner ("Transformer_v" of the ETA paper's tables).

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region feature width,
  T caption positions, D model width, H heads, Dh = D / H, V vocabulary.

Encoder: region features -> Dense(D) + ReLU + Dropout (self-critical.pytorch's ``att_embed``;
``region_activation="linear"`` drops the ReLU, the linear projection of ETA's section 4.1, so
that ETA's ``transformer_v`` rows differ from its ETA rows only where the paper says)
-> ``num_layers`` post-norm self-attention blocks with the padding regions masked.
Decoder: token embedding x sqrt(D) + sinusoidal positions -> ``num_dec_layers`` blocks of
masked self-attention, cross-attention to the regions and FFN, each ``LayerNorm(x + sublayer)``
-> Dense(V). The cross-attention keys/values of every decoder layer are computed in
``encode``, once per image, so step-wise decoding only projects the new token. In training
(``decode_train_grouped``) the queries of an image's S captions attend to that one copy as
one query set of length S*T (``group=S``): the same attention, without the S-fold copy of the
keys/values and the reduction of its gradient.
``norm_position="pre"`` + ``layer_norm="annotated"`` is self-critical.pytorch's Transformer
instead (pre-norm blocks, a final norm after each stack: its checkpoints import into it).
Deviation: the attention key projections have no bias (the softmax cancels it, so its
gradient is identically zero; :class:`layers.MultiHeadAttention`).

``decode_step``'s aux: ``cross_attention`` ``[B, L, H, N]`` (L = ``num_dec_layers``), every
decoder layer's and head's cross-attention weights over the regions, and ``attention``
``[B, N]``, the last layer's mean over heads (:func:`cross_attention_aux`); with a fused
``attention_impl`` ("xla", "cudnn") the kernels return no weights and the aux is empty.
Teacher forcing (``decode_train``) returns no attention.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import flax.linen as nn

from jaxcap.errors import BadInput
from jaxcap.models import fields, layers
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register


REGION_ACTIVATIONS = ("relu", "linear")


class DecoderBlock(layers.BlockSizes):
  """Masked self-attention -> cross-attention over regions -> FFN (post-norm residuals)."""

  def setup(self):
    self.self_attn = layers.CausalSelfAttention(self.num_heads, self.dim, self.dropout, self.dtype,
                                                self.attention_impl)
    self.cross_attn = layers.MultiHeadAttention(self.num_heads, self.dim, self.dropout, self.dtype,
                                                self.attention_impl)
    self.ffn = layers.FeedForward(self.dim, self.ff_dim, self.dropout, self.dtype)
    self.norm1, self.norm2, self.norm3 = self.add_norm(), self.add_norm(), self.add_norm()

  def cross_kv(self, memory_BxNxD):
    return self.cross_attn.project_kv(memory_BxNxD)

  def _rest(self, x, k, v, mask_BxN, train, return_weights: bool = False):
    """Cross-attention + FFN: ``(x, cross-attention weights [B, H, L, N] float32 or None)``."""
    y = self.cross_attn.attend_kv(self.norm2.normed(x), k, v, mask_BxN[:, None, :], train,
                                  return_weights=return_weights)
    y, w_BxHxLxN = y if return_weights else (y, None)
    x = self.norm2(x, y, train)
    return self.norm3(x, self.ffn(self.norm3.normed(x), train), train), w_BxHxLxN

  def __call__(self, x_BxTxD, k, v, mask_GxN, train: bool = False, group: int = 1):
    """Teacher-forced block. ``k``, ``v``, ``mask_GxN`` hold G = B / group images; after the
    self-attention every sub-layer acts on each position alone, so the ``group`` consecutive
    rows of an image run as one sequence of length group*T against one copy of its keys/values."""
    x = self.norm1(x_BxTxD, self.self_attn(self.norm1.normed(x_BxTxD), train), train)
    bs, t, d = x.shape
    x, _ = self._rest(x.reshape(bs // group, group * t, d), k, v, mask_GxN, train)
    return x.reshape(bs, t, d)

  def step(self, x_Bx1xD, cache, t, k, v, mask_BxN, train: bool = False):
    """One position: ``(x, cache, cross-attention weights [B, H, N] float32 or None)``; the
    weights exist with ``attention_impl="einsum"`` only (the fused kernels do not return them)."""
    h, cache = self.self_attn.step(self.norm1.normed(x_Bx1xD), cache, t, train)
    x = self.norm1(x_Bx1xD, h, train)
    x, w_BxHx1xN = self._rest(x, k, v, mask_BxN, train,
                              return_weights=self.attention_impl == "einsum")
    return x, cache, (None if w_BxHx1xN is None else w_BxHx1xN[:, :, 0])


class TransformerSizes(CaptionModel):
  """The fields that lead a Transformer-style captioner's (the Transformer's and ETA's): V, the
  longest caption, then the sizes and dropout; num_layers may be 0 (no encoder blocks: the
  projected regions are the memory)."""

  vocab_size: int
  max_len: int = 16
  dim: int = 512
  num_layers: int = 6
  num_dec_layers: int = 6
  num_heads: int = 8
  ff_dim: int = 2048
  dropout: float = 0.1

  field_checks = {"dim": fields.POSITIVE, "num_layers": fields.at_least(0),
                  "num_dec_layers": fields.POSITIVE, "num_heads": fields.POSITIVE,
                  "ff_dim": fields.POSITIVE, "dropout": fields.RATE}
  check_fields = staticmethod(fields.heads_divide_dim)

  def encoder_stack(self, **block):
    """The encoder: ``num_layers`` blocks of this model's sizes (``block``: other fields of
    :class:`layers.BlockSizes`)."""
    return layers.Encoder(self.dim, self.num_heads, self.ff_dim, self.dropout, self.dtype,
                          num_layers=self.num_layers, **block)


@register("transformer")
class TransformerCaptioner(TransformerSizes):
  """Transformer encoder over regions + Transformer decoder (Vaswani et al., 2017).

  Attributes:
    vocab_size: V.
    max_len: longest caption in words (the data's); positions are computed for the length
      decoded or teacher-forced, whatever it is (:func:`layers.embed_tokens`).
    dim, num_layers, num_dec_layers, num_heads, ff_dim, dropout: the usual sizes
      (defaults d=512, 6+6 layers, 8 heads, d_ff=2048, dropout 0.1).
    share_embeddings: tie the output projection to the word embedding.
    region_activation: ``"relu"`` (default, self-critical.pytorch's ``att_embed``) or
      ``"linear"`` (ETA's region projection, sec. 4.1) after the region projection.
    norm_position: ``"post"`` (default: Vaswani et al.'s ``LayerNorm(x + sublayer(x))``) or
      ``"pre"`` (``x + sublayer(LayerNorm(x))`` and a final layer norm after the encoder and
      the decoder: self-critical.pytorch's Transformer, whose checkpoints ``jaxcap-import``
      reads into this model).
    layer_norm: ``"flax"`` (default) or ``"annotated"`` (self-critical.pytorch's layer norm:
      unbiased std, eps outside the root; :class:`layers.AnnotatedLayerNorm`).
    vocab_pad_multiple: 1 (default) or e.g. 128: the output layer's product runs at the
      vocabulary rounded up to this multiple (aligned GEMMs on GPUs; the padded columns are
      zeros, sliced off inside the layer: the same logits and parameters,
      :class:`layers.PaddedDot`).
    dtype: compute dtype; parameters stay float32, logits are float32.
    attention_impl: ``"einsum"`` (default), ``"xla"`` or ``"cudnn"``: how every attention layer
      runs (:mod:`jaxcap.models.layers`; the fused two do not drop out the attention weights,
      and ``"cudnn"`` needs a GPU and a bfloat16 / float16 ``dtype``).
  """

  share_embeddings: bool = False
  dtype: Any = jnp.float32
  # After dtype: models that build a TransformerCaptioner positionally (ETA's late fusion)
  # keep their meaning.
  region_activation: str = "relu"
  attention_impl: str = "einsum"
  norm_position: str = "post"
  layer_norm: str = "flax"
  vocab_pad_multiple: int = 1

  decode_train_groups = True  # decode_train(..., group=S): one image's S captions at once
  field_checks = dict(TransformerSizes.field_checks, vocab_pad_multiple=fields.POSITIVE,
                      region_activation=fields.one_of(REGION_ACTIVATIONS),
                      attention_impl=fields.one_of(layers.ATTENTION_IMPLEMENTATIONS),
                      norm_position=fields.one_of(layers.NORM_POSITIONS),
                      layer_norm=fields.one_of(layers.LAYER_NORMS))

  @staticmethod
  def check_fields(values):
    fields.heads_divide_dim(values)
    if values["attention_impl"] == "cudnn" and values["dtype"] == jnp.float32:
      raise BadInput("config field model.attention_impl: 'cudnn' runs in bfloat16 or float16 only; expected "
                       "model.dtype='bfloat16' with it, or attention_impl 'einsum' / 'xla'")

  def setup(self):
    self.feat_proj = nn.Dense(self.dim, dtype=self.dtype)
    self.feat_dropout = nn.Dropout(self.dropout)
    block = dict(attention_impl=self.attention_impl, norm_position=self.norm_position,
                 layer_norm=self.layer_norm)
    self.encoder = self.encoder_stack(**block)
    self.embed = layers.Embed(self.vocab_size, self.dim, dtype=self.dtype)
    self.emb_dropout = nn.Dropout(self.dropout)
    self.dec_layers = [DecoderBlock(self.dim, self.num_heads, self.ff_dim, self.dropout, self.dtype, **block)
                       for _ in range(self.num_dec_layers)]
    if self.norm_position == "pre":
      self.dec_final_norm = layers.make_layer_norm(self.layer_norm, self.dtype)
    if not self.share_embeddings:
      self.logits_proj = layers.output_dense(self.vocab_size, self.dtype, self.vocab_pad_multiple)

  def encode(self, batch, train: bool = False):
    mask_BxN = batch["feats_mask"]
    x = self.feat_proj(batch["feats"].astype(self.dtype))
    if self.region_activation == "relu":
      x = nn.relu(x)
    x = self.feat_dropout(x, deterministic=not train)
    memory_BxNxD = self.encoder(x, mask_BxN, train)
    kv = [layer.cross_kv(memory_BxNxD) for layer in self.dec_layers]
    return {"mask": mask_BxN, "k": tuple(k for k, _ in kv), "v": tuple(v for _, v in kv)}

  def _logits(self, x):
    if self.norm_position == "pre":
      x = self.dec_final_norm(x)
    return layers.output_logits(self.embed, None if self.share_embeddings else self.logits_proj, x,
                                self.vocab_pad_multiple)

  def decode_train(self, enc, tokens_BxT, train: bool = False, group: int = 1):
    """Teacher-forced logits ``[B, T, V]``; with ``group > 1``, ``enc`` holds B / group images
    and each ``group`` consecutive rows of ``tokens_BxT`` are captions of one of them."""
    x = layers.embed_tokens(self.embed, tokens_BxT, tokens_BxT.shape[-1])
    x = self.emb_dropout(x, deterministic=not train)
    for i, layer in enumerate(self.dec_layers):
      x = layer(x, enc["k"][i], enc["v"][i], enc["mask"], train, group)
    return self._logits(x), {}

  def init_cache(self, enc, max_len: int):
    b = enc["mask"].shape[0]
    cache_dtype = self.dtype
    return tuple(layers.init_self_attention_cache(b, max_len, self.num_heads, self.dim, cache_dtype)
                 for _ in range(self.num_dec_layers))

  def decode_step(self, enc, cache, tokens_B, t, train: bool = False):
    x = layers.embed_tokens(self.embed, tokens_B[:, None], cache[0]["k"].shape[1], offset=t)
    x = self.emb_dropout(x, deterministic=not train)
    new_cache, weights = [], []
    for i, layer in enumerate(self.dec_layers):
      x, c, w_BxHxN = layer.step(x, cache[i], t, enc["k"][i], enc["v"][i], enc["mask"], train)
      new_cache.append(c)
      weights.append(w_BxHxN)
    return self._logits(x[:, 0]), tuple(new_cache), cross_attention_aux(weights)


def cross_attention_aux(weights, prefix: str = "") -> dict:
  """A decoder's per-step cross-attention aux from one ``[B, H, N]`` array per layer:
  ``{prefix + "cross_attention": [B, L, H, N], prefix + "attention": [B, N]}`` (float32, the
  weights before dropout), or ``{}`` when the layers returned none (a fused ``attention_impl``).

  The per-word summary is the mean over heads of the last layer: the last layer's attention
  output is what the output layer reads (earlier layers' reach it only through later ones),
  and the output projection weighs the heads alike. Computed in every step; when decoding
  does not ask for aux, XLA drops it as dead code (benchmarks/decode_aux.py measures it).
  """
  if not weights or any(w is None for w in weights):
    return {}
  cross_BxLxHxN = jnp.stack(weights, axis=1).astype(jnp.float32)
  return {f"{prefix}cross_attention": cross_BxLxHxN,
          f"{prefix}attention": cross_BxLxHxN[:, -1].mean(axis=1)}
