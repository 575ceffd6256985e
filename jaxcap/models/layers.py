"""Building blocks shared by the attention models: multi-head attention, FFN, positions.

Dimension legend:
  B batch, L query length, M key/value length, D model width, H heads, Dh = D / H,
  F feed-forward width.

Blocks follow Vaswani et al. (2017) exactly as the captioning papers restate it
(ETA eqs. 1-3, 6): post-norm residual sub-layers ``LayerNorm(x + Dropout(Sublayer(x)))``;
the pre-norm blocks of self-critical.pytorch's Transformer (``norm_position="pre"``, with its
``layer_norm="annotated"``) are an option, for checkpoints imported from it (:class:`AddNorm`).
Attention scores, softmax and the output logits are computed in float32 whatever the
compute dtype, because bfloat16 softmax over long key sets loses the small weights.

Attention runs one of three ways (``attention_impl``, a field of the attention modules):
``"einsum"`` (the default) writes the weights out, drops them out at the model's rate (as
Vaswani et al.'s implementation does) and can return them; ``"xla"`` and ``"cudnn"`` call
``jax.nn.dot_product_attention`` (XLA's fusion, or cuDNN's fused flash-attention kernel on
GPUs: bfloat16 / float16 only). The fused kernels take no per-step dropout key, so those two
do not drop out the attention weights (every other dropout stays); with no dropout the three
compute the same function.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.errors import BadInput

Dtype = Any

NEG_INF = -1e9

ATTENTION_IMPLEMENTATIONS = ("einsum", "xla", "cudnn")


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
  """The fixed sinusoidal position table of Vaswani et al.: ``[length, dim]`` float32."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  div = np.exp(np.arange(0, dim, 2, dtype=np.float64) * -(np.log(10000.0) / dim))
  table = np.zeros((length, dim), np.float64)
  table[:, 0::2] = np.sin(pos * div)
  table[:, 1::2] = np.cos(pos * div)[:, : dim // 2]
  return table.astype(np.float32)


def masked_mean(x_BxNxD, mask_BxN):
  """Mean over the positions where ``mask`` is True, ``[B, D]``, accumulated in float32 (a row
  with no True position gives zeros)."""
  w_BxN = mask_BxN.astype(jnp.float32)
  total_BxD = jnp.einsum("bnd,bn->bd", x_BxNxD.astype(jnp.float32), w_BxN)
  return (total_BxD / jnp.maximum(w_BxN.sum(1, keepdims=True), 1.0)).astype(x_BxNxD.dtype)


def causal_mask(length: int) -> jnp.ndarray:
  """``[1, L, L]`` bool, True where query position i may attend to key j (j <= i)."""
  return jnp.tril(jnp.ones((length, length), bool))[None]


def _one_row(x) -> bool:
  """Whether ``x`` has exactly one row (False for a symbolic batch size: an exported program)."""
  return isinstance(x.shape[0], int) and x.shape[0] == 1


def _cpu_form(summed, product, *args):
  """``summed`` on a CPU (the product where a concrete batch has one row), ``product`` elsewhere;
  for a symbolic batch size (an exported program) the choice of the CPU's is made when it runs."""
  def cpu(*xs):
    if isinstance(xs[0].shape[0], int):
      return summed(*xs)
    return jax.lax.cond(jnp.asarray(xs[0].shape[0]) == 1, product, summed, *xs)

  return jax.lax.platform_dependent(*args, cpu=cpu, default=product)


def query_key(q_BxLxHxDh, k_BxMxHxDh):
  """``q . k`` per head: ``[B, H, L, M]``. For one query (a decoding step) on a CPU, as a product
  and a sum over the head's depth: XLA's CPU batched matrix product over B x H tiny matrices ran
  1.4x slower (0.91 against 0.64 ms at B = 50, M = 36, 8 heads of 64; the same sums in another
  order, within float32 rounding; one row: the product was as fast); elsewhere, and for longer
  queries, the batched product."""
  def product(q, k):
    return jnp.einsum("blhd,bmhd->bhlm", q, k)

  if q_BxLxHxDh.shape[1] != 1 or _one_row(q_BxLxHxDh):
    return product(q_BxLxHxDh, k_BxMxHxDh)

  def summed(q, k):  # [B, 1, H, D] * [B, M, H, D] -> [B, M, H] -> [B, H, 1, M], summed in float32
    out = (q.astype(jnp.float32) * k.astype(jnp.float32)).sum(-1)
    return jnp.moveaxis(out, 1, 2)[:, :, None, :].astype(jnp.result_type(q, k))

  return _cpu_form(summed, product, q_BxLxHxDh, k_BxMxHxDh)


def weighted_values(w_BxHxLxM, v_BxMxHxDh):
  """``sum_m w v`` per head: ``[B, L, H, Dh]``; for one query on a CPU as a product and a sum
  over the keys (XLA's CPU batched product: 3.1x slower, 0.88 against 0.28 ms at B = 50, M = 36),
  elsewhere the batched product."""
  def product(w, v):
    return jnp.einsum("bhlm,bmhd->blhd", w, v)

  if w_BxHxLxM.shape[2] != 1 or _one_row(w_BxHxLxM):
    return product(w_BxHxLxM, v_BxMxHxDh)

  def summed(w, v):  # [B, M, H, 1] * [B, M, H, D] -> [B, H, D] -> [B, 1, H, D], summed in float32
    out = (jnp.moveaxis(w[:, :, 0, :], 1, 2)[..., None].astype(jnp.float32) * v.astype(jnp.float32)).sum(1)
    return out[:, None].astype(jnp.result_type(w, v))

  return _cpu_form(summed, product, w_BxHxLxM, v_BxMxHxDh)


def attention_weights(q_BxLxHxDh, k_BxMxHxDh, mask_BxLxM=None):
  """Scaled dot-product weights ``[B, H, L, M]`` in float32; masked keys get zero weight.

  A query whose keys are all masked gets uniform weights over the (masked) keys instead of
  NaN; callers that can produce such rows (e.g. an image whose attributes are all padding)
  must not rely on the value.
  """
  depth = q_BxLxHxDh.shape[-1]
  logits_BxHxLxM = query_key(q_BxLxHxDh.astype(jnp.float32), k_BxMxHxDh.astype(jnp.float32)) / np.sqrt(depth)
  if mask_BxLxM is not None:
    logits_BxHxLxM = jnp.where(mask_BxLxM[:, None], logits_BxHxLxM, NEG_INF)
  return jax.nn.softmax(logits_BxHxLxM, axis=-1)


def fused_attention(q_BxLxHxDh, k_BxMxHxDh, v_BxMxHxDh, mask_BxLxM, is_causal: bool, implementation: str):
  """``jax.nn.dot_product_attention`` of projected queries, keys and values: ``[B, L, H, Dh]``.

  A mask that is the same for every query (``[B, 1, M]``) is taken as the keys' lengths (its
  True entries must come first, as collate lays out regions and the decoding cache its
  positions): cuDNN's padding mask needs no bias tensor. jax's cuDNN training path treats every
  call as one with a bias, which needs even query and key lengths, so an odd length is padded
  by one row at the end: a query whose output is dropped, a key no query attends (masked, past
  the key lengths, or, with the causal mask, seen only by the padding query).
  """
  b, l, m = q_BxLxHxDh.shape[0], q_BxLxHxDh.shape[1], k_BxMxHxDh.shape[1]
  pad_l, pad_m = l % 2, m % 2
  if is_causal and l != m:
    raise ValueError(f"the causal mask needs as many queries as keys, got {l} and {m}")
  masks = {}
  if mask_BxLxM is not None and mask_BxLxM.shape[1] == 1:
    # At least one key: an all-padding row (a batch's filler image) stays finite.
    lengths_B = jnp.maximum(mask_BxLxM[:, 0].sum(-1), 1).astype(jnp.int32)
  elif mask_BxLxM is not None:
    lengths_B = None
    full = jnp.broadcast_to(mask_BxLxM, (b, l, m))
    masks["mask"] = jnp.pad(full, ((0, 0), (0, pad_l), (0, pad_m)))[:, None]
  else:
    lengths_B = None
    if pad_m and not is_causal:  # no query attends the padding key (a constant: unbatched alike)
      masks["mask"] = (jnp.arange(m + 1) < m)[None, None, None, :]
  if lengths_B is not None:
    lengths_B = jnp.broadcast_to(lengths_B, (b,))
    masks["key_value_seq_lengths"] = lengths_B
    # The query lengths computed from the key lengths, not a constant: under vmap (the
    # per-image training step) cuDNN's batching rule needs both batched alike.
    masks["query_seq_lengths"] = 0 * lengths_B + (l + pad_l)
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0))) if n else x
  o = jax.nn.dot_product_attention(pad(q_BxLxHxDh, pad_l), pad(k_BxMxHxDh, pad_m), pad(v_BxMxHxDh, pad_m),
                                   is_causal=is_causal, implementation=implementation, **masks)
  return o[:, :l]


class Embed(nn.Embed):
  """``nn.Embed`` that gathers rows of the float32 table and then casts them to ``dtype``.

  flax casts the whole table and gathers from the cast copy: the same values, but the
  gradient is then a scatter-add into a bfloat16 table, which rounds each of the many additions
  into a frequent word's row and runs as slow atomics on GPUs (the largest single kernel of the
  Transformer's bfloat16 step on an H100). Gathering first keeps that scatter-add in float32.
  """

  def __call__(self, inputs):
    if self.num_embeddings == 1 or self.dtype is None or jnp.dtype(self.dtype) == jnp.dtype(self.param_dtype):
      return super().__call__(inputs)
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError("Input type must be an integer or unsigned integer.")
    return jnp.take(self.embedding, inputs, axis=0).astype(self.dtype)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

  The query, value and output projections have biases, the key projection none: a key bias
  shifts all of a query's logits by the same amount, which the softmax cancels.

  Split into ``project_kv`` and ``attend_kv`` so that image-side keys/values are computed once
  per image (in ``encode``) and reused at every decoding step.
  """

  num_heads: int
  dim: int
  dropout: float = 0.0
  dtype: Dtype = jnp.float32
  attention_impl: str = "einsum"  # ATTENTION_IMPLEMENTATIONS (module docstring)

  def setup(self):
    if self.attention_impl not in ATTENTION_IMPLEMENTATIONS:
      raise BadInput(f"attention_impl={self.attention_impl!r}: expected one of {ATTENTION_IMPLEMENTATIONS}")
    if self.dim % self.num_heads:
      raise BadInput(f"model width {self.dim} is not divisible by heads={self.num_heads}")
    head_dim = self.dim // self.num_heads
    dense = lambda name, bias=True: nn.DenseGeneral((self.num_heads, head_dim), use_bias=bias,
                                                    dtype=self.dtype, name=name)
    self.query = dense("query")
    # No key bias: q . (k + b) adds the same q . b to every key of a query, which the softmax
    # cancels, so its gradient is identically zero (Adam would turn rounding noise into steps).
    self.key = dense("key", bias=False)
    self.value = dense("value")
    self.out = nn.DenseGeneral(self.dim, axis=(-2, -1), dtype=self.dtype, name="out")
    self.attn_dropout = nn.Dropout(self.dropout)

  def project_kv(self, kv_BxMxD):
    """Keys and values ``([B, M, H, Dh], [B, M, H, Dh])``."""
    return self.key(kv_BxMxD), self.value(kv_BxMxD)

  def project_q(self, q_BxLxD):
    return self.query(q_BxLxD)

  def attend_kv(self, q_BxLxD, k_BxMxHxDh, v_BxMxHxDh, mask_BxLxM=None, train: bool = False,
                return_weights: bool = False, is_causal: bool = False):
    """Attends projected keys/values with raw queries ``[B, L, D] -> [B, L, D]``.

    ``mask_BxLxM`` (True: attend) may be ``[B, 1, M]`` for a mask that is the same for every
    query (with ``attention_impl`` "xla" or "cudnn" its True entries must come first: it is taken
    as the keys' lengths); ``is_causal`` adds the causal mask (query i sees keys j <= i)."""
    q_BxLxHxDh = self.project_q(q_BxLxD)
    if self.attention_impl != "einsum":
      if return_weights:
        raise ValueError(f"attention_impl={self.attention_impl!r} does not return the attention weights; "
                         "use attention_impl='einsum'")
      o_BxLxHxDh = fused_attention(q_BxLxHxDh.astype(self.dtype), k_BxMxHxDh.astype(self.dtype),
                                   v_BxMxHxDh.astype(self.dtype), mask_BxLxM, is_causal, self.attention_impl)
      return self.out(o_BxLxHxDh)
    if is_causal:
      causal = causal_mask(q_BxLxD.shape[1])
      mask_BxLxM = causal if mask_BxLxM is None else mask_BxLxM & causal
    w_BxHxLxM = attention_weights(q_BxLxHxDh, k_BxMxHxDh, mask_BxLxM)
    w_drop = self.attn_dropout(w_BxHxLxM, deterministic=not train)
    o_BxLxHxDh = weighted_values(w_drop.astype(self.dtype), v_BxMxHxDh.astype(self.dtype))
    out_BxLxD = self.out(o_BxLxHxDh)
    if return_weights:
      return out_BxLxD, w_BxHxLxM
    return out_BxLxD

  def __call__(self, q_BxLxD, kv_BxMxD, mask_BxLxM=None, train: bool = False,
               return_weights: bool = False, is_causal: bool = False):
    k, v = self.project_kv(kv_BxMxD)
    return self.attend_kv(q_BxLxD, k, v, mask_BxLxM, train=train, return_weights=return_weights,
                          is_causal=is_causal)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (with dropout on the hidden layer)."""

  dim: int
  hidden: int
  dropout: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.relu(nn.Dense(self.hidden, dtype=self.dtype, name="fc1")(x))
    h = nn.Dropout(self.dropout)(h, deterministic=not train)
    return nn.Dense(self.dim, dtype=self.dtype, name="fc2")(h)


NORM_POSITIONS = ("post", "pre")
LAYER_NORMS = ("flax", "annotated")


class AnnotatedLayerNorm(nn.Module):
  """The layer norm of the Annotated Transformer, which self-critical.pytorch's Transformer
  uses: ``a * (x - mean) / (std + eps) + b`` with the unbiased (n - 1) standard deviation and
  ``eps`` added to it outside the root. flax's ``LayerNorm`` divides by
  ``sqrt(biased variance + eps)``: a different function, so an imported checkpoint needs this one.
  Statistics in float32; the parameters are named as flax's (``scale``, ``bias``)."""

  epsilon: float = 1e-6
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (d,))
    bias = self.param("bias", nn.initializers.zeros, (d,))
    x32 = x.astype(jnp.float32)
    centred = x32 - x32.mean(-1, keepdims=True)
    std = jnp.sqrt((centred * centred).sum(-1, keepdims=True) / max(d - 1, 1))
    return (scale * centred / (std + self.epsilon) + bias).astype(self.dtype)


def make_layer_norm(kind: str, dtype: Dtype, name: str | None = None) -> nn.Module:
  """``"flax"``: ``nn.LayerNorm`` (eps 1e-6); ``"annotated"``: :class:`AnnotatedLayerNorm`."""
  if kind == "annotated":
    return AnnotatedLayerNorm(dtype=dtype, name=name)
  if kind != "flax":
    raise BadInput(f"layer_norm={kind!r}: expected one of {LAYER_NORMS}")
  return nn.LayerNorm(dtype=dtype, name=name)


class AddNorm(nn.Module):
  """A residual connection with its layer norm.

  ``position="post"`` (Vaswani et al., the default): ``LayerNorm(x + Dropout(y))``, where ``y``
  is the sub-layer of ``x``. ``position="pre"`` (self-critical.pytorch's Transformer, after
  the Annotated Transformer): ``x + Dropout(y)``, where ``y`` is the sub-layer of
  ``normed(x) = LayerNorm(x)``; a stack of pre-norm blocks ends with one more layer norm.
  A block calls ``normed`` on the sub-layer's input and then this module on its output:
  ``normed`` is the identity for post-norm.
  """

  dropout: float = 0.0
  dtype: Dtype = jnp.float32
  position: str = "post"  # NORM_POSITIONS
  layer_norm: str = "flax"  # LAYER_NORMS

  def setup(self):
    # The names the compact form gave them, so that parameters and dropout streams are the same.
    self.Dropout_0 = nn.Dropout(self.dropout)
    self.LayerNorm_0 = make_layer_norm(self.layer_norm, self.dtype)

  def normed(self, x):
    return self.LayerNorm_0(x) if self.position == "pre" else x

  def __call__(self, x, y, train: bool = False):
    y = self.Dropout_0(y, deterministic=not train)
    return x + y if self.position == "pre" else self.LayerNorm_0(x + y)


def lstm_word_layers(vocab_size: int, embed_dim: int, hidden_dim: int, dropout: float):
  """The word side of an LSTM captioner (Show and Tell, the soft-attention LSTM): the word
  embedding ``[V, E]``, the LSTM cell of width H, the output layer to V and the dropout.
  A model's ``setup`` assigns them to ``embed``, ``cell``, ``out_proj``, ``drop``."""
  return (nn.Embed(vocab_size, embed_dim), nn.OptimizedLSTMCell(hidden_dim),
          nn.Dense(vocab_size), nn.Dropout(dropout))


class BlockSizes(nn.Module):
  """The fields of a Transformer block (and of a stack of blocks): D, H, F, the dropout rate
  of every sub-layer and the compute dtype."""

  dim: int
  num_heads: int
  ff_dim: int
  dropout: float = 0.1
  dtype: Dtype = jnp.float32
  attention_impl: str = "einsum"  # ATTENTION_IMPLEMENTATIONS (module docstring)
  norm_position: str = "post"  # NORM_POSITIONS (AddNorm)
  layer_norm: str = "flax"  # LAYER_NORMS

  def add_norm(self, name: str | None = None) -> AddNorm:
    return AddNorm(self.dropout, self.dtype, self.norm_position, self.layer_norm, name=name)


class EncoderBlock(BlockSizes):
  """Self-attention + FFN, each wrapped in AddNorm (ETA eq. 4-5 with one modality)."""

  @nn.compact
  def __call__(self, x_BxMxD, mask_BxM, train: bool = False):
    if self.attention_impl == "einsum":
      mask_BxMxM = mask_BxM[:, None, :] & mask_BxM[:, :, None]
    else:  # keys only, one mask for every query: key lengths, no bias tensor (fused_attention);
      mask_BxMxM = mask_BxM[:, None, :]  # a padding region's own output is never attended to
    att = MultiHeadAttention(self.num_heads, self.dim, self.dropout, self.dtype, self.attention_impl,
                             name="self_attn")
    norm1, norm2 = self.add_norm("norm1"), self.add_norm("norm2")
    h = norm1.normed(x_BxMxD)
    x = norm1(x_BxMxD, att(h, h, mask_BxMxM, train), train)
    ffn = FeedForward(self.dim, self.ff_dim, self.dropout, self.dtype, name="ffn")
    return norm2(x, ffn(norm2.normed(x), train), train)


class Encoder(BlockSizes):
  """A stack of ``num_layers`` EncoderBlocks (0: the identity); pre-norm blocks are followed by
  a final layer norm (``final_norm``), as in self-critical.pytorch's Transformer."""

  num_layers: int = 1

  @nn.compact
  def __call__(self, x_BxMxD, mask_BxM, train: bool = False):
    for i in range(self.num_layers):
      x_BxMxD = EncoderBlock(self.dim, self.num_heads, self.ff_dim, self.dropout, self.dtype,
                             self.attention_impl, self.norm_position, self.layer_norm,
                             name=f"layer_{i}")(x_BxMxD, mask_BxM, train)
    if self.norm_position == "pre" and self.num_layers:
      x_BxMxD = make_layer_norm(self.layer_norm, self.dtype, name="final_norm")(x_BxMxD)
    return x_BxMxD


class CausalSelfAttention(nn.Module):
  """Masked self-attention (ETA eq. 7) with a key/value cache for step-wise decoding."""

  num_heads: int
  dim: int
  dropout: float = 0.0
  dtype: Dtype = jnp.float32
  attention_impl: str = "einsum"  # ATTENTION_IMPLEMENTATIONS (module docstring)

  def setup(self):
    self.mha = MultiHeadAttention(self.num_heads, self.dim, self.dropout, self.dtype, self.attention_impl)

  def __call__(self, x_BxLxD, train: bool = False):
    return self.mha(x_BxLxD, x_BxLxD, None, train, is_causal=True)

  def step(self, x_Bx1xD, cache, t, train: bool = False):
    """One position: writes its key/value at ``t`` and attends to positions ``<= t``.

    Args:
      x_Bx1xD: the input at position t.
      cache: ``{"k": [B, Tmax, H, Dh], "v": [B, Tmax, H, Dh]}``.
      t: int32 scalar.
    """
    k_Bx1xHxDh, v_Bx1xHxDh = self.mha.project_kv(x_Bx1xD)
    k = jax.lax.dynamic_update_slice_in_dim(cache["k"], k_Bx1xHxDh.astype(cache["k"].dtype), t, axis=1)
    v = jax.lax.dynamic_update_slice_in_dim(cache["v"], v_Bx1xHxDh.astype(cache["v"].dtype), t, axis=1)
    mask_Bx1xT = (jnp.arange(k.shape[1]) <= t)[None, None, :]
    mask_Bx1xT = jnp.broadcast_to(mask_Bx1xT, (x_Bx1xD.shape[0], 1, k.shape[1]))
    out = self.mha.attend_kv(x_Bx1xD, k, v, mask_Bx1xT, train)
    return out, {"k": k, "v": v}


def init_self_attention_cache(batch: int, max_len: int, num_heads: int, dim: int, dtype=jnp.float32):
  shape = (batch, max_len, num_heads, dim // num_heads)
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def embed_tokens(embed: nn.Embed, tokens, num_positions: int, offset=0, scale=True):
  """Token embedding times sqrt(D) plus sinusoidal position (Vaswani et al., sec. 3.4-3.5).

  The positions are those of a sequence of ``num_positions`` (static: the teacher-forced
  length, or the decoding cache's length for one step at ``offset``), computed for that length
  rather than read from a table of the training length: decoding past the training captions'
  length gets each step's own position (as self-critical.pytorch's 5,000-row table gives it),
  never a clamped read of the last row. ``sinusoidal_positions`` of a longer length starts with
  the rows of a shorter one, so the values are those of any table that covers them.
  """
  x = embed(tokens)
  if scale:
    x = x * np.sqrt(x.shape[-1]).astype(np.float32)
  length = tokens.shape[-1]
  if length > num_positions:
    raise ValueError(f"embed_tokens: {length} tokens, but positions for {num_positions} only")
  table = _positions_table(int(num_positions), x.shape[-1])
  pos = jax.lax.dynamic_slice_in_dim(jnp.asarray(table), offset, length, axis=0)
  return x + pos.astype(x.dtype)


@functools.lru_cache(maxsize=64)
def _positions_table(length: int, dim: int) -> np.ndarray:
  table = sinusoidal_positions(length, dim)
  table.setflags(write=False)  # shared between traces
  return table


@dataclasses.dataclass(frozen=True)
class PaddedDot:
  """``lax.dot_general`` whose right operand's output (last) dimension is zero-padded to a
  multiple of ``multiple`` for the product, and the padded columns sliced off the result.

  The output layer's width is the vocabulary (e.g. 9,487), the one dimension of a captioner
  that is no multiple of 8: on GPUs its three GEMMs (forward, and the two of the backward
  pass) then run unaligned ("align1") kernels. Padding the weight's columns makes them aligned
  GEMMs; the padded columns are zeros and are sliced off inside the layer, so the loss,
  softmax, sampling and beam search never see them and the parameters keep their shape.
  Frozen (hashed and compared by value), so a model holding one is a stable static argument
  of jit.
  """

  multiple: int

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    n = rhs.shape[-1]
    pad = -n % self.multiple
    rhs_padded = jnp.pad(rhs, [(0, 0)] * (rhs.ndim - 1) + [(0, pad)]) if pad else rhs
    y = jax.lax.dot_general(lhs, rhs_padded, dimension_numbers, precision=precision,
                            preferred_element_type=preferred_element_type)
    return y[..., :n] if pad else y


def output_dense(vocab_size: int, dtype, pad_multiple: int = 1, name: str | None = None) -> nn.Dense:
  """The output layer ``nn.Dense(vocab_size)``; with ``pad_multiple > 1`` its product runs at
  the width rounded up to that multiple (:class:`PaddedDot`), with the same parameters."""
  dot = PaddedDot(pad_multiple) if pad_multiple > 1 else None
  return nn.Dense(vocab_size, dtype=dtype, dot_general=dot, name=name)


def output_logits(embed: nn.Embed, proj: nn.Module | None, x, pad_multiple: int = 1):
  """Float32 word logits of ``x``: the output layer ``proj`` (built by :func:`output_dense`),
  or the word embedding transposed (tied output layer) when ``proj`` is None, its product then
  padded to ``pad_multiple`` columns like :func:`output_dense`'s."""
  if proj is not None:
    y = proj(x)
  elif pad_multiple > 1:
    query, table_VxD = embed.promote_dtype(x, embed.embedding, dtype=embed.dtype)
    y = PaddedDot(pad_multiple)(query, table_VxD.T, (((query.ndim - 1,), (0,)), ((), ())))
  else:
    y = embed.attend(x)
  return y.astype(jnp.float32)
