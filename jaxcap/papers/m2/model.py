"""Meshed-Memory Transformer, M² (Cornia et al., "Meshed-Memory Transformer for Image
Captioning", CVPR 2020), as the authors' released code computes it (aimagelab/
meshed-memory-transformer, models/transformer/).

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region feature width,
  m memory slots, E encoder layers, L decoder layers, T caption positions, D model width,
  H heads, Dh = D / H (their d_k = d_v), V vocabulary.

Encoder (encoders.py ``MemoryAugmentedEncoder``)::

  X^0 = LN(Dropout(ReLU(X W_in + b_in)))
  X^i = LN(Z + Dropout(FFN(Z))),  Z = LN(X^{i-1} + Dropout(M_mem(X^{i-1})))     (eqs. 2-4)
  M_mem(X) = Attention(X W_q, [X W_k; sqrt(Dh) M_k], [X W_v; sqrt(m) M_v])       (eq. 2)

with learned memory slots ``M_k``, ``M_v`` ``[m, D]`` appended after the projected regions
(never masked; attention.py ``ScaledDotProductAttentionMemory``); the encoder returns every
layer's output ``X^1 .. X^E``. Decoder (decoders.py ``MeshedDecoder``), per layer::

  S   = LN(Y + Dropout(MaskedSelfAttn(Y))) * pad                     (the query pad mask)
  C_i = LN(S + Dropout(Attn(S, X^i))) * pad      (one cross-attention shared by every i)
  a_i = sigmoid([S, C_i] W_i + b_i)                                  (eq. 7)
  M   = sum_i a_i * C_i / sqrt(E) * pad                              (eq. 6, the code's scale)
  Y'  = LN(M + Dropout(FFN(M))) * pad

with word embeddings (no sqrt(D) scale) plus position embeddings of positions 1..T (0 for a
PAD input), and an output layer without bias. No dropout on attention weights or embeddings
(the code has none). Every LayerNorm has torch's eps 1e-5. ``meshed="last"`` is the paper's
ablation without meshed connectivity (the decoder attends the last encoder layer only:
``Y' = LN(C_E + FFN(C_E))``); ``memory_slots=0`` removes the memory.

The released code's departures from the paper are switches (their readings, and the code
lines they follow: jaxcap/papers/m2/README.md): ``pad_mask`` (which regions are masked),
``memory_init`` (the slots' initialiser), ``mesh_scale`` (the 1/sqrt(E) of the mesh) and
``positions`` (their position table is overwritten by ``init_weights`` and frozen).

Incremental decoding caches each decoder layer's self-attention keys/values and which of them
are PAD inputs (their keys are masked, as the code's ``running_mask_self_attention``); the
cross-attention keys/values of every (decoder layer, encoder layer) pair are computed in
``encode``. ``decode_step``'s aux: ``cross_attention`` ``[B, L, E', H, N]`` (E' = E meshed,
1 for ``last``) and ``attention`` ``[B, N]``, the last decoder layer's mean over the attended
encoder layers and heads (the gates weigh the layers per channel, not per region).
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.data.vocab import PAD
from jaxcap.errors import BadInput
from jaxcap.models import fields, layers
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register

PAD_MASKS = ("authors", "input")
MEMORY_INITS = ("authors", "paper")
MESH_SCALES = ("authors", "paper")
POSITIONS = ("authors", "sinusoid")
MESHED = ("meshed", "last")

# torch.nn.LayerNorm's default eps: the authors' every LayerNorm.
LN_EPS = 1e-5
# Their init_weights: xavier_uniform_ on every parameter with more than one axis.
XAVIER = nn.initializers.xavier_uniform()


def _torch_xavier_3d(key, shape, dtype=jnp.float32):
  """xavier_uniform_ of a torch ``[1, m, D]`` parameter stored as ``[m, D]``: torch counts
  fan_in = m * D and fan_out = 1 * D (the trailing axis as receptive field)."""
  m, d = shape
  bound = np.sqrt(6.0 / ((m + 1) * d))
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def _normal(std: float):
  return lambda key, shape, dtype=jnp.float32: std * jax.random.normal(key, shape, dtype)


class Attention(nn.Module):
  """Multi-head scaled dot-product attention, optionally memory-augmented (eq. 2).

  ``key_bias``: the memory attention needs the key bias (it shifts the region logits against
  the memory logits); without memory the softmax cancels it, so it is left out (its gradient
  would be identically zero; :class:`jaxcap.models.layers.MultiHeadAttention`).
  """

  num_heads: int
  dim: int
  memory_slots: int = 0
  memory_init: str = "authors"
  mask_memory: bool = False

  def setup(self):
    h, dh = self.num_heads, self.dim // self.num_heads
    dense = lambda name, bias=True: nn.DenseGeneral((h, dh), use_bias=bias, kernel_init=XAVIER,
                                                    name=name)
    self.query = dense("query")
    self.key = dense("key", bias=self.memory_slots > 0)
    self.value = dense("value")
    self.out = nn.DenseGeneral(self.dim, axis=(-2, -1), kernel_init=XAVIER, name="out")
    if self.memory_slots:
      m = self.memory_slots
      if self.memory_init == "authors":  # overwritten by Transformer.init_weights' xavier
        init_k = init_v = _torch_xavier_3d
      else:  # the slots' own initialiser: normal(0, 1/d_k) and normal(0, 1/m) (std, not var)
        init_k, init_v = _normal(1.0 / dh), _normal(1.0 / m)
      self.memory_k = self.param("memory_k", init_k, (m, self.dim))
      self.memory_v = self.param("memory_v", init_v, (m, self.dim))

  def project_kv(self, kv_BxMxD):
    """``(k, v)`` ``[B, M, H, Dh]`` each (the memory is appended in ``attend``)."""
    return self.key(kv_BxMxD), self.value(kv_BxMxD)

  def attend(self, q_BxLxD, k_BxMxHxDh, v_BxMxHxDh, mask_BxLxM):
    """``(out [B, L, D], weights over the M keys [B, H, L, M] float32)``; True in the mask
    attends. The memory slots follow the keys and are never masked (their weights are not
    returned)."""
    q_BxLxHxDh = self.query(q_BxLxD)
    b, l, h, dh = q_BxLxHxDh.shape
    n = k_BxMxHxDh.shape[1]
    mask_BxLxM = jnp.broadcast_to(mask_BxLxM, (b, l, n))
    if self.memory_slots:
      m = self.memory_slots
      # Scaled by sqrt(d_k) and sqrt(m) as their forward does, after the projected keys.
      mk_MxHxDh = (np.sqrt(dh) * self.memory_k).reshape(m, h, dh)
      mv_MxHxDh = (np.sqrt(m) * self.memory_v).reshape(m, h, dh)
      k_BxMxHxDh = jnp.concatenate([k_BxMxHxDh, jnp.broadcast_to(mk_MxHxDh, (b, m, h, dh))], 1)
      v_BxMxHxDh = jnp.concatenate([v_BxMxHxDh, jnp.broadcast_to(mv_MxHxDh, (b, m, h, dh))], 1)
      # mask_memory (an ablation of a trained model): the slots are there but never attended.
      slots_BxLxm = jnp.full((b, l, m), not self.mask_memory)
      mask_BxLxM = jnp.concatenate([mask_BxLxM, slots_BxLxm], -1)
    # Softmax in float32 (layers.attention_weights: the small weights of long key sets).
    w_BxHxLxM = layers.attention_weights(q_BxLxHxDh, k_BxMxHxDh, mask_BxLxM)
    o_BxLxHxDh = layers.weighted_values(w_BxHxLxM, v_BxMxHxDh.astype(jnp.float32))
    return self.out(o_BxLxHxDh), w_BxHxLxM[..., :n]


class AttentionBlock(nn.Module):
  """Their ``MultiHeadAttention``: ``LN(q + Dropout(Attention(q, k, v)))``."""

  num_heads: int
  dim: int
  dropout: float = 0.1
  memory_slots: int = 0
  memory_init: str = "authors"
  mask_memory: bool = False

  def setup(self):
    self.attn = Attention(self.num_heads, self.dim, self.memory_slots, self.memory_init,
                          self.mask_memory)
    self.drop = nn.Dropout(self.dropout)
    self.norm = nn.LayerNorm(epsilon=LN_EPS)

  def project_kv(self, kv_BxMxD):
    return self.attn.project_kv(kv_BxMxD)

  def __call__(self, q_BxLxD, k, v, mask_BxLxM, train: bool = False):
    """``(LN(q + Dropout(att)) [B, L, D], weights [B, H, L, M])``."""
    y, w_BxHxLxM = self.attn.attend(q_BxLxD, k, v, mask_BxLxM)
    return self.norm(q_BxLxD + self.drop(y, deterministic=not train)), w_BxHxLxM


class FeedForward(nn.Module):
  """Their ``PositionWiseFeedForward``: ``LN(x + Dropout(fc2(Dropout(ReLU(fc1(x))))))``."""

  dim: int
  ff_dim: int
  dropout: float = 0.1

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.relu(nn.Dense(self.ff_dim, kernel_init=XAVIER, name="fc1")(x))
    h = nn.Dropout(self.dropout)(h, deterministic=not train)
    y = nn.Dense(self.dim, kernel_init=XAVIER, name="fc2")(h)
    y = nn.Dropout(self.dropout)(y, deterministic=not train)
    return nn.LayerNorm(epsilon=LN_EPS, name="norm")(x + y)


class EncoderLayer(nn.Module):
  """Memory-augmented self-attention block + FFN (eqs. 2-4)."""

  num_heads: int
  dim: int
  ff_dim: int
  dropout: float
  memory_slots: int
  memory_init: str
  mask_memory: bool = False

  @nn.compact
  def __call__(self, x_BxNxD, mask_BxN, train: bool = False):
    att = AttentionBlock(self.num_heads, self.dim, self.dropout, self.memory_slots,
                         self.memory_init, self.mask_memory, name="self_attn")
    k, v = att.project_kv(x_BxNxD)
    # Keys only, as their (b, 1, 1, N) mask: a padded region still computes its own output.
    z, _ = att(x_BxNxD, k, v, mask_BxN[:, None, :], train)
    return FeedForward(self.dim, self.ff_dim, self.dropout, name="ffn")(z, train)


class DecoderLayer(nn.Module):
  """Their ``MeshedDecoderLayer`` (``num_gates`` encoder layers attended; ``meshed=False``:
  the last one only, no gates)."""

  num_heads: int
  dim: int
  ff_dim: int
  dropout: float
  num_gates: int
  meshed: bool
  mesh_scale: str
  only_layer: int = -1

  def setup(self):
    self.self_attn = AttentionBlock(self.num_heads, self.dim, self.dropout)
    self.enc_attn = AttentionBlock(self.num_heads, self.dim, self.dropout)
    if self.meshed:
      self.gates = [nn.Dense(self.dim, kernel_init=XAVIER, name=f"gate_{i}")
                    for i in range(self.num_gates)]
    self.ffn = FeedForward(self.dim, self.ff_dim, self.dropout)

  def cross_kv(self, enc_BxExNxD):
    """Keys/values of the attended encoder layers: ``[B, E', N, H, Dh]`` each."""
    return jax.vmap(self.enc_attn.project_kv, in_axes=1, out_axes=1)(enc_BxExNxD)

  def _rest(self, s_BxLxD, k_BxExNxHxDh, v_BxExNxHxDh, enc_mask_BxN, pad_BxLx1, train):
    """Everything after the self-attention: ``(Y' [B, L, D], weights [B, E', H, L, N])``."""
    outs, weights = [], []
    for i in range(k_BxExNxHxDh.shape[1]):
      # One enc_att module for every encoder layer (shared weights, as their code).
      c, w = self.enc_attn(s_BxLxD, k_BxExNxHxDh[:, i], v_BxExNxHxDh[:, i],
                           enc_mask_BxN[:, None, :], train)
      outs.append(c * pad_BxLx1)
      weights.append(w)
    if self.meshed:
      # only_layer (an ablation of a trained model): every other layer's gate is 0.
      mixed = sum(c * jax.nn.sigmoid(gate(jnp.concatenate([s_BxLxD, c], -1)))
                  for i, (gate, c) in enumerate(zip(self.gates, outs))
                  if self.only_layer < 0 or i == self.only_layer)
      if self.mesh_scale == "authors":  # their "/ np.sqrt(3)"; the paper's eq. 6 has no scale
        mixed = mixed / np.sqrt(len(outs))
      m_BxLxD = mixed * pad_BxLx1
    else:
      m_BxLxD = outs[-1]
    return self.ffn(m_BxLxD, train) * pad_BxLx1, jnp.stack(weights, 1)

  def __call__(self, y_BxTxD, k, v, enc_mask_BxN, self_mask_BxTxT, pad_BxTx1, train: bool = False):
    s, _ = self.self_attn(y_BxTxD, *self.self_attn.project_kv(y_BxTxD), self_mask_BxTxT, train)
    out, _ = self._rest(s * pad_BxTx1, k, v, enc_mask_BxN, pad_BxTx1, train)
    return out

  def step(self, y_Bx1xD, cache, t, k, v, enc_mask_BxN, pad_Bx1x1, train: bool = False):
    """One position: ``(Y' [B, 1, D], cache, weights [B, E', H, N])``."""
    k_new, v_new = self.self_attn.project_kv(y_Bx1xD)
    ck = jax.lax.dynamic_update_slice_in_dim(cache["k"], k_new, t, axis=1)
    cv = jax.lax.dynamic_update_slice_in_dim(cache["v"], v_new, t, axis=1)
    # A PAD input's key is masked for every later query (their running_mask_self_attention).
    keep_BxT = jax.lax.dynamic_update_slice_in_dim(cache["keep"], pad_Bx1x1[:, :, 0] > 0, t, axis=1)
    mask_Bx1xT = ((jnp.arange(ck.shape[1]) <= t)[None, :] & keep_BxT)[:, None, :]
    s, _ = self.self_attn(y_Bx1xD, ck, cv, mask_Bx1xT, train)
    out, w_BxExHx1xN = self._rest(s * pad_Bx1x1, k, v, enc_mask_BxN, pad_Bx1x1, train)
    return out, {"k": ck, "v": cv, "keep": keep_BxT}, w_BxExHx1xN[:, :, :, 0]


@register("m2")
class MeshedMemoryTransformer(CaptionModel):
  """M²: memory-augmented encoder + meshed decoder (module docstring).

  Attributes:
    vocab_size: V.
    max_positions: with ``positions="authors"``, the frozen table's last position (its rows:
      0 .. max_positions, as their ``MeshedDecoder(max_len=54)``); longer sequences are refused.
    dim, num_heads, ff_dim: D, H, the FFN width (paper: 512, 8, 2048).
    num_layers, num_dec_layers: E encoder and L decoder layers (paper: 3 and 3).
    memory_slots: m (paper: 40); 0: no memory.
    dropout: every dropout (paper: 0.1).
    pad_mask: ``"authors"`` (their encoder masks the regions whose *projected and normalised*
      feature sums to 0, ``sum(out, -1) == 0``, so zero-padded detections are attended) or
      ``"input"`` (the padded regions of the input, ``batch["feats_mask"]``).
    memory_init: ``"authors"`` (xavier-uniform: their ``Transformer.init_weights`` overwrites
      the slots' initialiser) or ``"paper"`` (the slots' own normal(0, 1/d_k), normal(0, 1/m)).
    mesh_scale: ``"authors"`` (the meshed sum divided by sqrt(E), their code) or ``"paper"``
      (eq. 6, no scale).
    positions: ``"authors"`` (a frozen table, ``constants/positions``, xavier-uniform:
      their ``init_weights`` overwrites the sinusoid table of the frozen ``pos_emb`` too) or
      ``"sinusoid"`` (their ``sinusoid_encoding_table``, computed for any length).
    meshed: ``"meshed"`` (the paper) or ``"last"`` (attend the last encoder layer only).
    mask_memory: ablation of a trained model (``Run.ablate``; training leaves it False): the
      memory slots are kept but never attended, as if the encoder had none.
    only_layer: ablation of a trained model: ``k >= 0`` keeps encoder layer k's term of the
      meshed sum and zeroes the other layers' gates (-1: every layer, the model).
  """

  vocab_size: int
  max_positions: int = 54
  dim: int = 512
  num_heads: int = 8
  ff_dim: int = 2048
  num_layers: int = 3
  num_dec_layers: int = 3
  memory_slots: int = 40
  dropout: float = 0.1
  pad_mask: str = "authors"
  memory_init: str = "authors"
  mesh_scale: str = "authors"
  positions: str = "authors"
  meshed: str = "meshed"
  mask_memory: bool = False
  only_layer: int = -1

  frozen_collections = ("constants",)  # the "authors" position table is never trained
  scan_broadcast = ("params", "constants")
  field_checks = {"dim": fields.POSITIVE, "num_heads": fields.POSITIVE,
                  "ff_dim": fields.POSITIVE, "num_layers": fields.POSITIVE,
                  "num_dec_layers": fields.POSITIVE, "memory_slots": fields.at_least(0),
                  "max_positions": fields.POSITIVE,
                  "dropout": fields.RATE, "pad_mask": fields.one_of(PAD_MASKS),
                  "memory_init": fields.one_of(MEMORY_INITS),
                  "mesh_scale": fields.one_of(MESH_SCALES),
                  "positions": fields.one_of(POSITIONS), "meshed": fields.one_of(MESHED),
                  "only_layer": fields.at_least(-1)}

  @staticmethod
  def check_fields(values):
    fields.heads_divide_dim(values)
    if values["mask_memory"] and values["memory_slots"] == 0:
      raise BadInput("config field model.mask_memory: masks the memory slots; expected False "
                       "with memory_slots=0, got True")
    k = values["only_layer"]
    if k >= 0 and (values["meshed"] != "meshed" or k >= values["num_layers"]):
      raise BadInput(f"config field model.only_layer: keeps one encoder layer of the meshed "
                       f"sum; expected -1 or 0 .. {values['num_layers'] - 1} with meshed='meshed', "
                       f"got {k} (meshed={values['meshed']!r})")

  @staticmethod
  def longest_sequence(values):
    """The frozen table's positions 1 .. max_positions with ``positions="authors"``."""
    return values["max_positions"] if values["positions"] == "authors" else None

  @classmethod
  def tiny_sizes(cls, model_config):
    """The shared tiny sizes, two encoder layers (so the mesh has two gates) and 4 slots."""
    sizes = super().tiny_sizes(model_config)
    sizes.update(num_layers=2, num_dec_layers=1, memory_slots=min(4, model_config.get("memory_slots", 4)))
    return sizes

  def setup(self):
    self.feat_proj = nn.Dense(self.dim, kernel_init=XAVIER)
    self.feat_dropout = nn.Dropout(self.dropout)
    self.feat_norm = nn.LayerNorm(epsilon=LN_EPS)
    self.enc_layers = [EncoderLayer(self.num_heads, self.dim, self.ff_dim, self.dropout,
                                    self.memory_slots, self.memory_init, self.mask_memory)
                       for _ in range(self.num_layers)]
    self.embed = nn.Embed(self.vocab_size, self.dim, embedding_init=XAVIER)
    meshed = self.meshed == "meshed"
    self.dec_layers = [DecoderLayer(self.num_heads, self.dim, self.ff_dim, self.dropout,
                                    self.num_layers if meshed else 1, meshed, self.mesh_scale,
                                    self.only_layer)
                       for _ in range(self.num_dec_layers)]
    self.logits_proj = nn.Dense(self.vocab_size, use_bias=False, kernel_init=XAVIER)
    if self.positions == "authors":
      self.position_table = self.variable(
          "constants", "positions",
          lambda: XAVIER(self.make_rng("params"), (self.max_positions + 1, self.dim)))

  def encode(self, batch, train: bool = False):
    x = nn.relu(self.feat_proj(batch["feats"].astype(jnp.float32)))
    x = self.feat_norm(self.feat_dropout(x, deterministic=not train))
    if self.pad_mask == "authors":
      # Their MultiLevelEncoder: (sum(out, -1) == padding_idx) on the normalised projection,
      # so a zero-padded region (whose projection is LN(relu(b_in)), not 0) is attended.
      mask_BxN = jnp.sum(x, -1) != 0
    else:
      mask_BxN = batch["feats_mask"].astype(bool)
    outs = []
    for layer in self.enc_layers:
      x = layer(x, mask_BxN, train)
      outs.append(x)
    enc_BxExNxD = jnp.stack(outs if self.meshed == "meshed" else outs[-1:], 1)
    kv = [layer.cross_kv(enc_BxExNxD) for layer in self.dec_layers]
    return {"mask": mask_BxN, "k": tuple(k for k, _ in kv), "v": tuple(v for _, v in kv)}

  def _embed(self, tokens_BxT, offset, num_positions: int):
    """Word + position embedding: positions ``offset + 1 ..``, 0 for a PAD input."""
    if self.positions == "authors":
      table = self.position_table.value
      if num_positions + 1 > table.shape[0]:
        raise BadInput(f"m2 positions='authors': {num_positions} positions asked, but the frozen "
                         f"table covers {table.shape[0] - 1} (model.max_positions)")
    else:
      table = layers.sinusoidal_positions(num_positions + 1, self.dim)
      table[0] = 0.0  # their sinusoid_encoding_table(..., padding_idx=0): PAD's row is zeros
      table = jnp.asarray(table)
    length = tokens_BxT.shape[1]
    pos_BxT = jnp.where(tokens_BxT == PAD, 0, offset + 1 + jnp.arange(length)[None, :])
    return self.embed(tokens_BxT) + jnp.take(table, pos_BxT, axis=0)

  def decode_train(self, enc, tokens_BxT, train: bool = False):
    t = tokens_BxT.shape[1]
    y = self._embed(tokens_BxT, 0, t)
    pad_BxTx1 = (tokens_BxT != PAD)[..., None].astype(jnp.float32)
    self_mask_BxTxT = layers.causal_mask(t) & (tokens_BxT != PAD)[:, None, :]
    for i, layer in enumerate(self.dec_layers):
      y = layer(y, enc["k"][i], enc["v"][i], enc["mask"], self_mask_BxTxT, pad_BxTx1, train)
    return self.logits_proj(y).astype(jnp.float32), {}

  def init_cache(self, enc, max_len: int):
    b = enc["mask"].shape[0]
    kv = layers.init_self_attention_cache(b, max_len, self.num_heads, self.dim)
    return tuple(dict(kv, keep=jnp.zeros((b, max_len), bool)) for _ in range(self.num_dec_layers))

  def decode_step(self, enc, cache, tokens_B, t, train: bool = False):
    tokens_Bx1 = tokens_B[:, None]
    y = self._embed(tokens_Bx1, t, cache[0]["k"].shape[1])
    pad_Bx1x1 = (tokens_Bx1 != PAD)[..., None].astype(jnp.float32)
    new_cache, weights = [], []
    for i, layer in enumerate(self.dec_layers):
      y, c, w_BxExHxN = layer.step(y, cache[i], t, enc["k"][i], enc["v"][i], enc["mask"],
                                   pad_Bx1x1, train)
      new_cache.append(c)
      weights.append(w_BxExHxN)
    cross_BxLxExHxN = jnp.stack(weights, 1)
    aux = {"cross_attention": cross_BxLxExHxN, "attention": cross_BxLxExHxN[:, -1].mean((1, 2))}
    return self.logits_proj(y[:, 0]).astype(jnp.float32), tuple(new_cache), aux
