"""The Image Transformer (He et al., ACCV 2020) and its AoANet baseline (Huang et al., ICCV 2019).

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region feature width,
  T caption positions, D model width (= LSTM width = word embedding width), H heads,
  Dh = D / H, R relations of an encoder layer (3: parent, neighbour, child; 1: an ordinary
  layer), M sub-transformers of the implicit decoding layer, V vocabulary.

Section 3 of the paper, equation by equation:

* Region projection: ``A = Dropout(ReLU(W_a feats + b_a))`` (the AoANet code's ``att_embed``,
  which the paper builds on; the paper does not write the input layer).
* Spatial graph (eq. 5), computed in ``encode`` from ``batch["boxes"]`` (x1, y1, x2, y2) and
  ``feats_mask``, see :func:`spatial_graph`. With ``I[l, m] = A(l ∩ m)`` (the overlap of the two
  boxes, clamped at zero on each axis), ``Ω_p[l, m] = 1`` iff ``I/A(l) >= ε`` and
  ``I/A(l) > I/A(m)`` (region m is a parent of l: l lies, to a fraction ε, inside the larger m);
  ``Ω_c = Ω_pᵀ``; ``Ω_n = valid − Ω_p − Ω_c``. Every pair of real regions has exactly one
  relation; identical boxes (and so the diagonal) are neighbours since the strict ``>`` fails;
  pairs that involve a padded region have none.
  Degenerate boxes: a zero-area box has ``I/A = 0`` by definition (its overlap with anything
  is zero), so it is no-one's child or parent: all its pairs are neighbours. This keeps the
  graph (and the model) free of NaN for zero-area and identical boxes.
  The authors' released code (wtliao/ImageTransformer) does not clamp the overlap, so two
  boxes disjoint on both axes get a positive "intersection" (the product of two negative
  widths); that is not reproduced here.
* Spatial-graph encoding layer (eqs. 6-7): one query projection ``Q = A W_Q`` shared by the
  three relations, key/value projections ``K_i = A W_Ki``, ``V_i = A W_Vi`` per relation;
  ``Attention(Q, K_i, V_i) = Ω_i ∘ softmax(Q K_iᵀ / sqrt(Dh)) V_i`` per head — the graph
  multiplies the weights after the softmax without renormalising, as eq. 6 writes it
  (``graph_mask="multiply"``); ``graph_mask="softmax"`` masks the logits before the softmax
  instead (the rows of a relation with no region get zero weight).
  ``A_m = Norm(A + Σ_i MultiHead(Q, K_i, V_i))`` (eq. 7), then ``A' = Norm(A_m + FFN(A_m))``
  (eq. 4). 3 layers; ``spatial_layers`` says which of them are spatial (the others are
  ordinary layers: one key/value projection, plain softmax). ``spatial=False`` is section 4.4's
  "w/o spatial relations": the same three projections with the plain softmax and
  ``A_m = Norm(A + ⅓ Σ_i MultiHead(Q, K_i, V_i))``. ``graph="all_neighbour"`` replaces the
  graph by "every real pair is a neighbour" at apply time, over the same parameters (an
  inference-time ablation; the layer is then the neighbour sub-transformer alone).
* Implicit decoding layer (eqs. 8-11): ``x_t = [W_e π_t, Ā + c_{t-1}]``, ``(h_t, m_t) =
  LSTM(x_t, ...)`` with Ā the mean of the encoder output over the real regions;
  ``A^D_{t,i} = MultiHead(W_DQ h_t, W_DKi A', W_DVi A')`` for i = 1..M with one shared query;
  ``c_t = GLU(W_G [Ā^D_t; h_t] + b_G)`` with ``Ā^D_t = (1/M) Σ_i A^D_{t,i}`` (a linear layer to
  2D on the concatenation, then the gated linear unit, as AoANet's "attention on attention");
  ``p = softmax(W_p Dropout(c_t) + b_p)``. The keys/values of all M sub-transformers are
  projected once per image in ``encode`` (``[B, N, M, H, Dh]``).
* AoANet (``aoanet``, :mod:`jaxcap.papers.image_transformer.aoanet`, Table 3's baseline, Huang et al. 2019): the same decoder with M = 1
  (then eq. 10 is exactly AoANet's AoA decoder), and a refiner of ``num_layers`` (6) ordinary
  layers with attention on attention: ``A' = Norm(A + GLU(W [MultiHead'(A, A, A); A] + b))``
  where MultiHead' is multi-head attention without its output projection (the AoA linear
  takes its place), and no feed-forward sub-layer (AoANet's refiner has none). The same
  ``refine_aoa`` / ``ffn`` switches exist on the Image Transformer, so Table 3's
  "baseline + spatial layer" rows can be built literally (``configs/image_transformer.py``'s
  ``baseline=True``).

Deviations from the paper, choices where it is silent and the released code's differences:
jaxcap/papers/image_transformer/README.md, "The model against the paper".
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.errors import BadInput, BadKey
from jaxcap.models import fields, layers
from jaxcap.models.layers import masked_mean
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register

GRAPH_MASKS = ("multiply", "softmax")
GRAPHS = ("boxes", "all_neighbour")
# Areas below this count as zero (a degenerate box): their overlap ratios are defined as 0.
_MIN_AREA = 1e-12


def box_area(boxes_Bx_x4):
  """``max(0, x2 - x1) * max(0, y2 - y1)`` for ``[..., 4]`` boxes."""
  w = jnp.maximum(boxes_Bx_x4[..., 2] - boxes_Bx_x4[..., 0], 0.0)
  h = jnp.maximum(boxes_Bx_x4[..., 3] - boxes_Bx_x4[..., 1], 0.0)
  return w * h


def spatial_graph(boxes_BxNx4, mask_BxN, epsilon: float = 0.9):
  """Eq. 5: ``(Ω_p, Ω_n, Ω_c)`` bool ``[B, N, N]``; ``Ω_p[l, m]``: m is a parent of l.

  See the module docstring for the degenerate-box rule (zero area: neighbour of everything).
  """
  b = boxes_BxNx4.astype(jnp.float32)
  bl, bm = b[:, :, None, :], b[:, None, :, :]
  iw = jnp.maximum(jnp.minimum(bl[..., 2], bm[..., 2]) - jnp.maximum(bl[..., 0], bm[..., 0]), 0.0)
  ih = jnp.maximum(jnp.minimum(bl[..., 3], bm[..., 3]) - jnp.maximum(bl[..., 1], bm[..., 1]), 0.0)
  inter_BxNxN = iw * ih
  area_BxN = box_area(b)
  ok_BxN = area_BxN > _MIN_AREA
  safe_BxN = jnp.where(ok_BxN, area_BxN, 1.0)
  # r_l[l, m] = I / A(l), r_m[l, m] = I / A(m); 0 for a degenerate box.
  r_l = jnp.where(ok_BxN[:, :, None], inter_BxNxN / safe_BxN[:, :, None], 0.0)
  r_m = jnp.where(ok_BxN[:, None, :], inter_BxNxN / safe_BxN[:, None, :], 0.0)
  valid_BxNxN = mask_BxN[:, :, None] & mask_BxN[:, None, :]
  parent = (r_l >= epsilon) & (r_l > r_m) & valid_BxNxN
  child = jnp.swapaxes(parent, 1, 2)
  neighbour = valid_BxNxN & ~parent & ~child
  return parent, neighbour, child


class GraphAttentionFields(nn.Module):
  """The fields of an encoder attention sub-layer, shared by the sub-layer and the encoder
  layer that holds it (see :class:`GraphAttention`)."""

  dim: int
  num_heads: int
  relations: int = 1
  use_graph: bool = False
  graph_mask: str = "multiply"
  aoa: bool = False
  dropout: float = 0.0
  dtype: Any = jnp.float32


class GraphAttention(GraphAttentionFields):
  """One encoder attention sub-layer: ordinary (R = 1), spatial graph (eqs. 6-7, R = 3) or
  "w/o spatial relations" (R = 3, plain softmax, mean of the three).

  Attributes:
    dim: D. num_heads: H.
    relations: R (1 or 3).
    use_graph: multiply / mask the weights by Ω_i (R = 3 only).
    graph_mask: "multiply" (eq. 6) | "softmax".
    aoa: attention on attention instead of the output projection W_O.
    dropout: on the attention weights (and the AoA input).
  """

  def setup(self):
    hd = self.dim // self.num_heads
    self.query = nn.DenseGeneral((self.num_heads, hd), dtype=self.dtype)
    # No key bias (here and in dec_key): the softmax over keys cancels it (zero gradient).
    self.key = nn.DenseGeneral((self.relations, self.num_heads, hd), use_bias=False, dtype=self.dtype)
    self.value = nn.DenseGeneral((self.relations, self.num_heads, hd), dtype=self.dtype)
    if self.aoa:
      self.aoa_proj = nn.Dense(2 * self.dim, dtype=self.dtype)
    else:
      self.out = nn.DenseGeneral(self.dim, axis=(-2, -1), dtype=self.dtype)
    self.drop = nn.Dropout(self.dropout)

  def __call__(self, a_BxNxD, mask_BxN, omega_RxBxNxN=None, train: bool = False):
    """``[B, N, D] -> [B, N, D]`` (before the residual). ``omega`` bool ``[R, B, N, N]``."""
    q_BxNxHxDh = self.query(a_BxNxD)
    k_BxNxRxHxDh = self.key(a_BxNxD)
    v_BxNxRxHxDh = self.value(a_BxNxD)
    logits_BxRxHxNxN = jnp.einsum("blhd,bmrhd->brhlm", q_BxNxHxDh.astype(jnp.float32),
                                  k_BxNxRxHxDh.astype(jnp.float32)) / np.sqrt(q_BxNxHxDh.shape[-1])
    keys_Bx1x1x1xN = mask_BxN[:, None, None, None, :]
    if self.use_graph:
      om_BxRx1xNxN = jnp.swapaxes(omega_RxBxNxN, 0, 1)[:, :, None]
      if self.graph_mask == "softmax":
        w = jax.nn.softmax(jnp.where(om_BxRx1xNxN, logits_BxRxHxNxN, layers.NEG_INF), axis=-1)
      else:
        w = jax.nn.softmax(jnp.where(keys_Bx1x1x1xN, logits_BxRxHxNxN, layers.NEG_INF), axis=-1)
      # Eq. 6: Ω_i ∘ softmax(...); in "softmax" mode this zeroes the rows with no key.
      w_BxRxHxNxN = w * om_BxRx1xNxN.astype(w.dtype)
      scale = 1.0
    else:
      w_BxRxHxNxN = jax.nn.softmax(jnp.where(keys_Bx1x1x1xN, logits_BxRxHxNxN, layers.NEG_INF), axis=-1)
      scale = 1.0 / self.relations  # "w/o spatial relations": the mean of the three
    w_BxRxHxNxN = self.drop(w_BxRxHxNxN, deterministic=not train)
    o_BxNxHxDh = scale * jnp.einsum("brhlm,bmrhd->blhd", w_BxRxHxNxN.astype(self.dtype),
                                    v_BxNxRxHxDh.astype(self.dtype))
    if self.aoa:
      x_BxNxD = o_BxNxHxDh.reshape(o_BxNxHxDh.shape[:2] + (self.dim,))
      x_BxNx2D = self.drop(jnp.concatenate([x_BxNxD, a_BxNxD.astype(x_BxNxD.dtype)], -1),
                           deterministic=not train)
      return nn.glu(self.aoa_proj(x_BxNx2D), axis=-1)
    return self.out(o_BxNxHxDh)


class EncoderLayer(GraphAttentionFields, kw_only=True):
  """``A_m = Norm(A + Drop(Att(A)))``, then ``A' = Norm(A_m + Drop(FFN(A_m)))`` if ``ffn``
  (F = ``ff_dim``); ``dropout`` also on both residual branches."""

  ff_dim: int
  ffn: bool = True
  dropout: float = 0.1

  @nn.compact
  def __call__(self, a_BxNxD, mask_BxN, omega_RxBxNxN=None, train: bool = False):
    att = GraphAttention(self.dim, self.num_heads, self.relations, self.use_graph, self.graph_mask,
                         self.aoa, self.dropout, self.dtype, name="attn")
    x = layers.AddNorm(self.dropout, self.dtype, name="norm1")(
        a_BxNxD, att(a_BxNxD, mask_BxN, omega_RxBxNxN, train), train)
    if not self.ffn:
      return x
    ff = layers.FeedForward(self.dim, self.ff_dim, self.dropout, self.dtype, name="ffn")
    return layers.AddNorm(self.dropout, self.dtype, name="norm2")(x, ff(x, train), train)


def parse_spatial_layers(value, num_layers: int) -> tuple[int, ...]:
  """``"all"`` | ``"none"`` | ``2`` | ``"1,3"`` | a sequence -> sorted 1-based layer indices."""
  if isinstance(value, str):
    v = value.strip().lower()
    if v == "all":
      return tuple(range(1, num_layers + 1))
    if v in ("none", ""):
      return ()
    try:
      items = [int(x) for x in v.replace("+", ",").split(",") if x.strip()]
    except ValueError:
      raise BadInput(f"config field model.spatial_layers: expected 'all', 'none' or layer "
                       f"numbers like '1,3', got {value!r}") from None
  elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
    items = [int(value)]
  elif isinstance(value, Sequence):
    try:
      items = [int(x) for x in value]
    except (TypeError, ValueError):
      raise BadInput(f"config field model.spatial_layers: expected 'all', 'none' or layer "
                     f"numbers, got {value!r}") from None
  else:
    raise BadInput(f"config field model.spatial_layers: expected 'all', 'none' or layer "
                     f"numbers, got {value!r}")
  if any(not 1 <= i <= num_layers for i in items):
    raise BadInput(f"config field model.spatial_layers: expected layers among 1..{num_layers} "
                     f"(model.num_layers), got {value!r}")
  return tuple(sorted(set(items)))


@register("image_transformer")
class ImageTransformer(CaptionModel):
  """Spatial-graph encoder + LSTM with an implicit decoding layer; see the module docstring.

  Attributes:
    vocab_size: V.
    dim: D (paper: LSTM 1024; the released code uses 1024 for every width).
    num_heads: H (8).
    num_layers: encoder layers (3; AoANet: 6).
    spatial_layers: the spatial-graph layers, "all" (default), "none" or 1-based numbers like
      "1,3"; the module holds them as sorted indices.
    spatial: False gives "w/o spatial relations" in those layers (plain softmax, mean of 3).
    num_sub: M sub-transformers in the decoder (3; AoANet: 1).
    epsilon: ε of eq. 5 (0.9).
    graph_mask: "multiply" (eq. 6, after the softmax) | "softmax" (mask the logits).
    graph: "boxes" (eq. 5) | "all_neighbour" (inference-time ablation over the same params).
    refine_aoa: attention on attention in the encoder layers (AoANet: True).
    ffn: the feed-forward sub-layer of eq. 4 (AoANet: False).
    ff_dim: its hidden width (2048, the released code).
    dropout: see the module docstring.
    dtype: compute dtype; parameters stay float32, softmax and logits are float32.
  """

  vocab_size: int
  dim: int = 1024
  num_heads: int = 8
  num_layers: int = 3
  spatial_layers: str | int | tuple = "all"
  spatial: bool = True
  num_sub: int = 3
  epsilon: float = 0.9
  graph_mask: str = "multiply"
  graph: str = "boxes"
  refine_aoa: bool = False
  ffn: bool = True
  ff_dim: int = 2048
  dropout: float = 0.1
  dtype: Any = jnp.float32

  field_checks = {"dim": fields.POSITIVE, "num_heads": fields.POSITIVE,
                  "num_layers": fields.POSITIVE, "num_sub": fields.POSITIVE,
                  "ff_dim": fields.POSITIVE, "graph_mask": fields.one_of(GRAPH_MASKS),
                  "graph": fields.one_of(GRAPHS), "dropout": fields.RATE,
                  "epsilon": fields.in_interval(0.0, 1.0, closed_high=True, what="a fraction")}

  @staticmethod
  def check_fields(values):
    fields.heads_divide_dim(values)
    parse_spatial_layers(values["spatial_layers"], values["num_layers"])

  @classmethod
  def tiny_sizes(cls, model_config):
    """The shared tiny sizes, keeping as many encoder layers as ``spatial_layers`` names."""
    sizes = super().tiny_sizes(model_config)
    listed = [int(t) for t in str(model_config.get("spatial_layers", "")).split(",")
              if t.strip().isdigit()]
    if listed:
      sizes["num_layers"] = max(listed + [sizes.get("num_layers", model_config["num_layers"])])
    return sizes

  def __post_init__(self):
    # Configs name the layers ("all", "none", "1,3"); the module holds their sorted indices.
    object.__setattr__(self, "spatial_layers", parse_spatial_layers(self.spatial_layers, self.num_layers))
    super().__post_init__()

  def setup(self):
    if self.graph_mask not in GRAPH_MASKS:
      raise BadInput(f"config field model.graph_mask: expected one of {GRAPH_MASKS}, got {self.graph_mask!r}")
    if self.graph not in GRAPHS:
      raise BadInput(f"config field model.graph: expected one of {GRAPHS}, got {self.graph!r}")
    self.feat_proj = nn.Dense(self.dim, dtype=self.dtype)
    enc = []
    for i in range(1, self.num_layers + 1):
      wide = i in self.spatial_layers
      enc.append(EncoderLayer(self.dim, self.num_heads, relations=3 if wide else 1,
                              use_graph=wide and self.spatial, graph_mask=self.graph_mask,
                              aoa=self.refine_aoa, ff_dim=self.ff_dim, ffn=self.ffn,
                              dropout=self.dropout, dtype=self.dtype, name=f"layer_{i}"))
    self.layers = enc
    hd = self.dim // self.num_heads
    self.embed = layers.Embed(self.vocab_size, self.dim, dtype=self.dtype)
    self.lstm = nn.OptimizedLSTMCell(self.dim, dtype=self.dtype)
    self.dec_query = nn.DenseGeneral((self.num_heads, hd), dtype=self.dtype)  # W_DQ
    self.dec_key = nn.DenseGeneral((self.num_sub, self.num_heads, hd), use_bias=False,
                                   dtype=self.dtype)  # W_DKi
    self.dec_value = nn.DenseGeneral((self.num_sub, self.num_heads, hd), dtype=self.dtype)  # W_DVi
    self.glu_proj = nn.Dense(2 * self.dim, dtype=self.dtype)
    self.logits_proj = nn.Dense(self.vocab_size, dtype=self.dtype)
    self.drop = nn.Dropout(self.dropout)

  @property
  def uses_boxes(self) -> bool:
    return bool(self.spatial_layers) and self.spatial

  def required_inputs(self) -> tuple[str, ...]:
    return ("image", "boxes") if self.uses_boxes and self.graph == "boxes" else ("image",)

  def graph_from_batch(self, batch):
    """``[3, B, N, N]`` bool ``(Ω_p, Ω_n, Ω_c)`` for ``self.graph``."""
    mask_BxN = batch["feats_mask"].astype(bool)
    if self.graph == "all_neighbour":
      valid = mask_BxN[:, :, None] & mask_BxN[:, None, :]
      none = jnp.zeros_like(valid)
      return jnp.stack([none, valid, none])
    if "boxes" not in batch:
      raise BadKey("image_transformer: the batch has no 'boxes' (needed by the spatial graph; "
                     "set model.graph='all_neighbour' or spatial_layers='none' to run without)")
    return jnp.stack(spatial_graph(batch["boxes"], mask_BxN, self.epsilon))

  def encode_regions(self, batch, train: bool = False):
    """The refined regions ``A'`` ``[B, N, D]`` (the encoder's output)."""
    mask_BxN = batch["feats_mask"].astype(bool)
    a_BxNxD = nn.relu(self.feat_proj(batch["feats"].astype(self.dtype)))
    a_BxNxD = self.drop(a_BxNxD, deterministic=not train)
    omega = self.graph_from_batch(batch) if self.uses_boxes else None
    for layer in self.layers:
      a_BxNxD = layer(a_BxNxD, mask_BxN, omega, train)
    return a_BxNxD

  def encode(self, batch, train: bool = False):
    """``{"mean": Ā [B, D], "k", "v": [B, N, M, H, Dh], "mask": [B, N]}``."""
    mask_BxN = batch["feats_mask"].astype(bool)
    a_BxNxD = self.encode_regions(batch, train)
    return {"mean": masked_mean(a_BxNxD, mask_BxN), "k": self.dec_key(a_BxNxD),
            "v": self.dec_value(a_BxNxD), "mask": mask_BxN}

  def init_cache(self, enc, max_len: int):
    """LSTM state and the previous context: ``{"h", "m", "c"}`` zeros ``[B, D]`` (c_0 = 0)."""
    del max_len
    zeros = jnp.zeros((enc["mean"].shape[0], self.dim), self.dtype)
    return {"h": zeros, "m": zeros, "c": zeros}

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    """Eqs. 8-10 of one word: ``(Dropout(c_t) [B, D], cache, aux)``; teacher forcing scans
    this step (``CaptionModel.decode_train``).

    aux (float32, the weights before dropout): ``cross_attention`` ``[B, M, H, N]``, each
    sub-transformer's and head's attention over the regions (axis 1 is the sub-transformer,
    where the Transformer's is the layer), and ``attention`` ``[B, N]``, their mean over
    sub-transformers and heads: eq. 10 averages the M sub-transformers' outputs with equal
    weight, and each head fills its own D / H channels of ``Ā^D_t``.
    """
    del t  # the recurrent state carries the position
    e_BxD = self.drop(self.embed(tokens_B), deterministic=not train)
    x_Bx2D = jnp.concatenate([e_BxD, (enc["mean"] + cache["c"]).astype(e_BxD.dtype)], axis=-1)
    (m_BxD, h_BxD), _ = self.lstm((cache["m"], cache["h"]), x_Bx2D)
    q_BxHxDh = self.dec_query(h_BxD)
    logits_BxMxHxN = jnp.einsum("bhd,bnmhd->bmhn", q_BxHxDh.astype(jnp.float32),
                                enc["k"].astype(jnp.float32)) / np.sqrt(q_BxHxDh.shape[-1])
    logits_BxMxHxN = jnp.where(enc["mask"][:, None, None, :], logits_BxMxHxN, layers.NEG_INF)
    p_BxMxHxN = jax.nn.softmax(logits_BxMxHxN, axis=-1)
    w_BxMxHxN = self.drop(p_BxMxHxN, deterministic=not train)
    # Mean over the M sub-transformers (eq. 10), heads concatenated.
    o_BxHxDh = jnp.einsum("bmhn,bnmhd->bhd", w_BxMxHxN.astype(self.dtype),
                          enc["v"].astype(self.dtype)) / self.num_sub
    att_BxD = o_BxHxDh.reshape(o_BxHxDh.shape[0], self.dim)
    c_BxD = nn.glu(self.glu_proj(jnp.concatenate([att_BxD, h_BxD.astype(att_BxD.dtype)], -1)), axis=-1)
    new_cache = {"h": h_BxD.astype(self.dtype), "m": m_BxD.astype(self.dtype),
                 "c": c_BxD.astype(self.dtype)}
    aux = {"cross_attention": p_BxMxHxN, "attention": p_BxMxHxN.mean(axis=(1, 2))}
    return self.drop(c_BxD, deterministic=not train), new_cache, aux

  def output_layer(self, c, train: bool = False):
    """``W_p Dropout(c_t) + b_p`` (the dropout is ``step_features``'): logits float32."""
    del train
    return self.logits_proj(c).astype(jnp.float32)

  def decoder_outputs(self, enc, tokens_BxT):
    """``c_t`` ``[B, T, D]`` under teacher forcing, no dropout (the spread analysis of 4.4)."""
    return self.teacher_forced_features(enc, tokens_BxT, train=False)[0]
