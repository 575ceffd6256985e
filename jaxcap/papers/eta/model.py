"""ETA-Transformer: EnTangled Attention + Gated Bilateral Controller (Li et al., ICCV 2019).

Dimension legend:
  B batch (images, or images x captions / beams), N regions, F region feature width,
  A attributes per image (PAD-padded), T caption positions, D model width, H heads,
  Dh = D / H, V vocabulary, L decoder layers.

Dual-way encoder (sec. 4.1, eqs. 4-5): the visual sub-encoder projects the regions with a
linear layer to ``V^0`` and runs N post-norm self-attention blocks to ``V^N``; the semantic
sub-encoder embeds the attribute words with the *decoder's* word embedding (shared, as in the
paper) to ``S^0`` and runs N blocks to ``S^N``. Either encoder can be removed
(``visual_encoder`` / ``semantic_encoder`` False: Table 4's "- Encoder" rows, ``X^N = X^0``).

Multimodal decoder block (sec. 4.2-4.4), every attention followed by ``LayerNorm(q + .)``::

  a   = LN(h + MaskedSelfAttn(h))                                   (eq. 7)
  g_s = LN(a + MultiHead(a, S^N, S^N));  v = LN(g_s + MultiHead(g_s, V^N, V^N))   (eqs. 9-10)
  g_v = LN(a + MultiHead(a, V^N, V^N));  s = LN(g_v + MultiHead(g_v, S^N, S^N))
  c   = sigmoid(W_c [g_s, g_v, a] + b_c)                            (eq. 11)
  e   = f(v) * c + f(s) * (1 - c)                                   (eq. 12)
  h'  = LN(e + FFN(e))

Variants (``variant``; every ablation of Tables 2, 4, 5, 6):

- ``eta``: the block above.
- ``parallel`` (PA, Table 5): no injection, GBC directly over the encoder outputs:
  ``v = g_v = LN(a + MultiHead(a, V^N))``, ``s = g_s = LN(a + MultiHead(a, S^N))``,
  ``c = sigmoid(W_c [g_s, g_v, a])``, ``e = f(v) c + f(s) (1 - c)``.
- ``stacked_v`` / ``stacked_s`` (SA, Table 5): one ETA pathway, no GBC: ``e = v`` / ``e = s``.
- ``transformer_s`` (Table 2, 4, 5): attributes only, ``e = g_s`` (the vanilla decoder block
  over ``S^N``). ``transformer_v`` (``e = g_v``) exists for completeness, but the configs
  select the ``transformer`` model for that row.
- ``late_fusion`` ("T_v & T_s fuse", Table 5): a ``transformer`` model (with
  ``region_activation="linear"``, the Transformer_v of the configs) and a
  ``transformer_s`` model side by side; the logits returned are
  ``log_softmax((log p_v + log p_s) / 2)``, i.e. normalised log-probabilities, so the
  decoder's own ``log_softmax`` leaves them unchanged.
- ``gbc_activation`` in {identity, sigmoid, tanh, relu} is ``f`` of eq. 12 (Table 6).

Functional ablation (inference only, over a trained model's parameters; ``jaxcap.load(...)
.ablate(force_gate=1.0)``): ``force_gate`` replaces ``c`` by a constant, 1.0 keeping the visual
pathway's output ``f(v)``, 0.0 the semantic ``f(s)``. With ``gbc_activation="identity"`` these
equal ``variant="stacked_v"`` / ``"stacked_s"`` over the same parameters (one pathway dropped);
on a ``parallel`` model ``force_gate=1.0`` equals ``transformer_v`` (tests/test_ablations.py).
``decode_step`` returns ``aux["gbc_gate"]`` ``[B]`` (mean of c over channels and layers) and
``aux["gbc_gate_layers"]`` ``[B, L]``; ``decode_train`` returns ``aux["gbc_gate"]`` ``[B, T]``.
``decode_step`` also returns every cross-attention's weights, ``aux["cross_attention_<name>"]``
``[B, L, H, M]`` (names as :data:`_ATTENTIONS`: ``a_s``, ``gs_v``, ``a_v``, ``gv_s``; M = N
regions or A attributes), and per memory the one that writes its pathway's output
(:data:`_SUMMARY`: ``gs_v``, the attention that makes the visual pathway's v, and ``gv_s``
for s in ETA) as ``aux["cross_attention"]`` ``[B, L, H, N]`` / ``aux["attention"]`` ``[B, N]``
(regions) and ``aux["attribute_cross_attention"]`` / ``aux["attribute_attention"]`` ``[B, A]``
(attributes): the summaries are the mean over heads of the last layer, not weighted by the
gate c (reported beside them; it mixes the two pathways per channel, not per region).
An image without attributes attends to none (zeros). Late fusion reports its Transformer_v
member's region keys and its Transformer_s member's attribute keys.
In training (``decode_train_grouped``) everything after a block's self-attention acts on each
position alone, so an image's S captions run it as one sequence of S*T positions against one
copy of the image's keys/values (no S-fold copy; same result).

Deviations from the paper, choices where it is silent and the released code's differences:
jaxcap/papers/eta/README.md, "The model against the paper".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.data.vocab import PAD
from jaxcap.errors import BadInput
from jaxcap.models import fields, layers
from jaxcap.models.registry import register
from jaxcap.models.transformer import TransformerCaptioner, TransformerSizes, cross_attention_aux

VARIANTS = ("eta", "parallel", "stacked_v", "stacked_s", "transformer_v", "transformer_s",
            "late_fusion")

# The cross-attention sub-layers of each variant. Names read "query -> memory":
# a_s = MultiHead(a, S^N) (eq. 9), gs_v = MultiHead(g_s, V^N) (eq. 10), and the reversed
# semantic pathway a_v, gv_s.
_ATTENTIONS = {
    "eta": ("a_s", "gs_v", "a_v", "gv_s"),
    "parallel": ("a_s", "a_v"),
    "stacked_v": ("a_s", "gs_v"),
    "stacked_s": ("a_v", "gv_s"),
    "transformer_v": ("a_v",),
    "transformer_s": ("a_s",),
}
_MEMORY = {"a_s": "s", "gv_s": "s", "a_v": "v", "gs_v": "v"}
# The sub-layers whose attention decode_step reports as the word's attention over the regions
# ("cross_attention" / "attention") and over the attributes ("attribute_cross_attention" /
# "attribute_attention"): the last attention over each memory on the way to the block output,
# i.e. the one that writes the visual pathway's v (gs_v) and the semantic pathway's s (gv_s)
# where they exist, else the only one over that memory.
_SUMMARY = {
    "eta": ("gs_v", "gv_s"),
    "parallel": ("a_v", "a_s"),
    "stacked_v": ("gs_v", "a_s"),
    "stacked_s": ("a_v", "gv_s"),
    "transformer_v": ("a_v", None),
    "transformer_s": (None, "a_s"),
}

ACTIVATIONS = {
    "identity": lambda x: x,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
}


def check_variant(variant: str, activation: str = "identity") -> None:
  if variant not in VARIANTS:
    raise BadInput(f"config field model.variant: expected one of {VARIANTS}, got {variant!r}")
  if activation not in ACTIVATIONS:
    raise BadInput(f"config field model.gbc_activation: expected one of {tuple(ACTIVATIONS)}, "
                     f"got {activation!r}")


def uses_modalities(variant: str) -> tuple[bool, bool]:
  """(visual, semantic): which encoder outputs a variant attends to."""
  names = _ATTENTIONS.get(variant, ())
  return (any(_MEMORY[n] == "v" for n in names), any(_MEMORY[n] == "s" for n in names))


class ETADecoderBlock(nn.Module):
  """One multimodal decoder block (eqs. 7-12) of any variant except late fusion."""

  dim: int
  num_heads: int
  ff_dim: int
  dropout: float = 0.1
  variant: str = "eta"
  gbc_activation: str = "identity"
  force_gate: float | None = None
  dtype: Any = jnp.float32

  def setup(self):
    check_variant(self.variant, self.gbc_activation)
    self.self_attn = layers.CausalSelfAttention(self.num_heads, self.dim, self.dropout, self.dtype)
    self.self_norm = layers.AddNorm(self.dropout, self.dtype)
    names = _ATTENTIONS[self.variant]
    self.attn = {n: layers.MultiHeadAttention(self.num_heads, self.dim, self.dropout, self.dtype)
                 for n in names}
    self.attn_norm = {n: layers.AddNorm(self.dropout, self.dtype) for n in names}
    if self.has_gate:
      self.gate = nn.Dense(self.dim, dtype=self.dtype)
    self.ffn = layers.FeedForward(self.dim, self.ff_dim, self.dropout, self.dtype)
    self.ffn_norm = layers.AddNorm(self.dropout, self.dtype)

  @property
  def has_gate(self) -> bool:
    return self.variant in ("eta", "parallel")

  def cross_kv(self, v_mem_BxNxD, s_mem_BxAxD) -> dict:
    """Keys/values of every cross-attention: ``{name: {"k": [B, M, H, Dh], "v": ...}}``.

    In ETA the second attention of each pathway also attends to an encoder output (its
    query is the guidance g), so all of them are computed once per image.
    """
    mem = {"v": v_mem_BxNxD, "s": s_mem_BxAxD}
    out = {}
    for n in _ATTENTIONS[self.variant]:
      k, v = self.attn[n].project_kv(mem[_MEMORY[n]])
      out[n] = {"k": k, "v": v}
    return out

  def _attend(self, name, q_BxLxD, kv, masks, train, weights=None):
    """One cross-attention sub-layer; with a dict ``weights``, its attention weights
    ``[B, H, L, M]`` float32 are stored there under ``name``."""
    mask_BxM = masks[_MEMORY[name]]
    b, l = q_BxLxD.shape[:2]
    mask_BxLxM = jnp.broadcast_to(mask_BxM[:, None, :], (b, l, mask_BxM.shape[1]))
    y_BxLxD = self.attn[name].attend_kv(q_BxLxD, kv[name]["k"], kv[name]["v"], mask_BxLxM, train,
                                        return_weights=weights is not None)
    # An empty key set (an image whose attributes are all padding) contributes nothing, so the
    # sub-layer reduces to LN(q) instead of averaging padding embeddings.
    nonempty_Bx1x1 = jnp.any(mask_BxM, axis=-1)[:, None, None]
    if weights is not None:
      y_BxLxD, w_BxHxLxM = y_BxLxD
      # ... and attends to nothing: zeros, not the uniform weights over padding.
      weights[name] = jnp.where(nonempty_Bx1x1[:, None], w_BxHxLxM, 0.0)
    y_BxLxD = jnp.where(nonempty_Bx1x1, y_BxLxD, jnp.zeros_like(y_BxLxD))
    return self.attn_norm[name](q_BxLxD, y_BxLxD, train)

  def entangle(self, a_BxLxD, kv, masks, train: bool = False, weights=None):
    """ETA + GBC (eqs. 8-12): ``(e [B, L, D], c [B, L, D] float32 or None)``; with a dict
    ``weights``, every cross-attention's weights ``[B, H, L, M]`` are stored there by name."""
    att = lambda name, q: self._attend(name, q, kv, masks, train, weights)
    variant = self.variant
    if variant == "transformer_v":
      return att("a_v", a_BxLxD), None
    if variant == "transformer_s":
      return att("a_s", a_BxLxD), None
    if variant == "stacked_v":
      return att("gs_v", att("a_s", a_BxLxD)), None
    if variant == "stacked_s":
      return att("gv_s", att("a_v", a_BxLxD)), None
    g_s = att("a_s", a_BxLxD)
    g_v = att("a_v", a_BxLxD)
    if variant == "eta":
      v, s = att("gs_v", g_s), att("gv_s", g_v)
    else:  # parallel: no preliminary-modality injection
      v, s = g_v, g_s
    gate_in = jnp.concatenate([g_s, g_v, a_BxLxD], axis=-1)
    c_BxLxD = jax.nn.sigmoid(self.gate(gate_in).astype(jnp.float32))
    if self.force_gate is not None:
      c_BxLxD = jnp.full_like(c_BxLxD, self.force_gate)
    f = ACTIVATIONS[self.gbc_activation]
    e = f(v.astype(jnp.float32)) * c_BxLxD + f(s.astype(jnp.float32)) * (1.0 - c_BxLxD)
    return e.astype(self.dtype), c_BxLxD

  def _rest(self, a, kv, masks, train, weights=None):
    e, c = self.entangle(a, kv, masks, train, weights)
    return self.ffn_norm(e, self.ffn(e, train), train), c

  def __call__(self, x_BxTxD, kv, masks, train: bool = False, group: int = 1):
    """Teacher-forced block: ``(h [B, T, D], c [B, T, D] or None)``.

    Args:
      x_BxTxD: the block input (embeddings or the previous block's output).
      kv: this block's ``cross_kv``, for G = B / group images.
      masks: ``{"v": bool [G, N], "s": bool [G, A]}`` (True on real regions / attributes).
      group: consecutive rows of ``x`` that are captions of one image. Everything after the
        self-attention acts on each position alone, so those rows run as one sequence of
        length group*T against one copy of the image's keys/values.
    """
    a = self.self_norm(x_BxTxD, self.self_attn(x_BxTxD, train), train)
    bs, t, d = a.shape
    h, c = self._rest(a.reshape(bs // group, group * t, d), kv, masks, train)
    return h.reshape(bs, t, d), (None if c is None else c.reshape(bs, t, -1))

  def step(self, x_Bx1xD, cache, t, kv, masks, train: bool = False):
    """One position: ``(h, cache, c or None, {sub-layer name: weights [B, H, M] float32})``."""
    h, cache = self.self_attn.step(x_Bx1xD, cache, t, train)
    a = self.self_norm(x_Bx1xD, h, train)
    weights = {}
    out, c = self._rest(a, kv, masks, train, weights)
    return out, cache, c, {n: w[:, :, 0] for n, w in weights.items()}

  def forward(self, x_BxTxD, v_mem_BxNxD, v_mask_BxN, s_mem_BxAxD, s_mask_BxA,
              train: bool = False):
    """Block over raw encoder outputs (for tests and analysis)."""
    kv = self.cross_kv(v_mem_BxNxD, s_mem_BxAxD)
    return self(x_BxTxD, kv, {"v": v_mask_BxN, "s": s_mask_BxA}, train)


@register("eta")
class ETACaptioner(TransformerSizes):
  """The ETA-Transformer and its ablations (see the module docstring).

  Attributes:
    vocab_size: V.
    max_len: longest caption in words (the data's); positions are computed for the length
      decoded or teacher-forced, whatever it is (:func:`jaxcap.models.layers.embed_tokens`).
    dim, num_layers (encoder blocks per sub-encoder), num_dec_layers, num_heads, ff_dim,
      dropout: sizes (paper: d=512, N=6, 8 heads, d_ff=2048).
    variant: one of :data:`VARIANTS`.
    gbc_activation: f of eq. 12: identity (paper default), sigmoid, tanh or relu.
    visual_encoder, semantic_encoder: False removes that sub-encoder's N blocks.
    share_embeddings: tie the output projection to the word embedding.
    force_gate: None (the learnt gate) or a constant that replaces the GBC gate c at
      inference (functional ablation; see the module docstring).
    dtype: compute dtype; logits are float32.
    vocab_pad_multiple: the output layer's product at the vocabulary rounded up to this
      multiple (as the Transformer's field: the same logits, aligned GEMMs on GPUs).
  """

  variant: str = "eta"
  gbc_activation: str = "identity"
  visual_encoder: bool = True
  semantic_encoder: bool = True
  share_embeddings: bool = False
  force_gate: float | None = None
  dtype: Any = jnp.float32
  vocab_pad_multiple: int = 1

  decode_train_groups = True  # __call__ / decode_train(..., group=S): one image's S captions at once

  @staticmethod
  def word_figures(words, aux, out_prefix, title=""):
    """The gate per word, ``<out_prefix>_gate.png`` (:func:`jaxcap.papers.eta.figures.plot_gate`)."""
    if "gbc_gate_layers" not in aux and "gbc_gate" not in aux:
      return []  # a variant without the gate
    from jaxcap.papers.eta import figures  # matplotlib only when drawing
    out = f"{out_prefix}_gate.png"
    figures.plot_gate(words, aux.get("gbc_gate_layers", aux.get("gbc_gate")), title=title, out=out)
    return [out]
  field_checks = dict(TransformerSizes.field_checks, variant=fields.one_of(VARIANTS),
                      vocab_pad_multiple=fields.POSITIVE,
                      gbc_activation=fields.one_of(tuple(ACTIVATIONS)))

  def required_inputs(self) -> tuple[str, ...]:
    use_v, use_s = (True, True) if self.variant == "late_fusion" else uses_modalities(self.variant)
    return (("image",) if use_v else ()) + (("attributes",) if use_s else ())

  def setup(self):
    check_variant(self.variant, self.gbc_activation)
    if self.variant == "late_fusion":
      self.member_v = TransformerCaptioner(
          self.vocab_size, self.max_len, self.dim,
          self.num_layers if self.visual_encoder else 0, self.num_dec_layers, self.num_heads,
          self.ff_dim, self.dropout, self.share_embeddings, self.dtype,
          # Transformer_v with ETA's linear projection (sec. 4.1)
          region_activation="linear", vocab_pad_multiple=self.vocab_pad_multiple)
      self.member_s = ETACaptioner(
          self.vocab_size, self.max_len, self.dim, self.num_layers, self.num_dec_layers,
          self.num_heads, self.ff_dim, self.dropout, "transformer_s", self.gbc_activation,
          self.visual_encoder, self.semantic_encoder, self.share_embeddings, None, self.dtype,
          self.vocab_pad_multiple)
      return
    self.use_v, self.use_s = uses_modalities(self.variant)
    if self.use_v:
      self.feat_proj = nn.Dense(self.dim, dtype=self.dtype)
      if self.visual_encoder:
        self.v_encoder = self.encoder_stack()
    if self.use_s and self.semantic_encoder:
      self.s_encoder = self.encoder_stack()
    self.embed = layers.Embed(self.vocab_size, self.dim, dtype=self.dtype)
    self.in_dropout = nn.Dropout(self.dropout)
    self.dec_layers = [
        ETADecoderBlock(self.dim, self.num_heads, self.ff_dim, self.dropout, self.variant,
                        self.gbc_activation, self.force_gate, self.dtype)
        for _ in range(self.num_dec_layers)]
    if not self.share_embeddings:
      self.logits_proj = layers.output_dense(self.vocab_size, self.dtype, self.vocab_pad_multiple)

  # --- encoder ----------------------------------------------------------------------------

  def encode(self, batch, train: bool = False):
    """Encodes regions and attributes; precomputes every decoder layer's keys/values."""
    if self.variant == "late_fusion":
      return {"v": self.member_v.encode(batch, train), "s": self.member_s.encode(batch, train)}
    enc, v_mem, s_mem = {}, None, None
    if self.use_v:
      v_mask_BxN = batch["feats_mask"]
      v_mem = self.feat_proj(batch["feats"].astype(self.dtype))
      v_mem = self.in_dropout(v_mem, deterministic=not train)
      if self.visual_encoder:
        v_mem = self.v_encoder(v_mem, v_mask_BxN, train)
      enc["v_mask"] = v_mask_BxN
    if self.use_s:
      attrs_BxA = batch["attributes"]
      s_mask_BxA = attrs_BxA != PAD
      s_mem = self.embed(attrs_BxA) * np.float32(np.sqrt(self.dim))
      s_mem = self.in_dropout(s_mem, deterministic=not train)
      if self.semantic_encoder:
        s_mem = self.s_encoder(s_mem, s_mask_BxA, train)
      enc["s_mask"] = s_mask_BxA
    enc["kv"] = tuple(layer.cross_kv(v_mem, s_mem) for layer in self.dec_layers)
    return enc

  def _masks(self, enc):
    return {"v": enc.get("v_mask"), "s": enc.get("s_mask")}

  def _logits(self, x):
    return layers.output_logits(self.embed, None if self.share_embeddings else self.logits_proj, x,
                                self.vocab_pad_multiple)

  # --- decoder ----------------------------------------------------------------------------

  def decode_train(self, enc, tokens_BxT, train: bool = False, group: int = 1):
    """Teacher-forced logits ``[B, T, V]``; with ``group > 1``, ``enc`` holds B / group images
    and each ``group`` consecutive rows of ``tokens_BxT`` are captions of one of them."""
    if self.variant == "late_fusion":
      lv, _ = self.member_v.decode_train(enc["v"], tokens_BxT, train, group=group)
      ls, _ = self.member_s.decode_train(enc["s"], tokens_BxT, train, group=group)
      return _fuse(lv, ls), {}
    x = layers.embed_tokens(self.embed, tokens_BxT, tokens_BxT.shape[-1])
    x = self.in_dropout(x, deterministic=not train)
    masks, gates = self._masks(enc), []
    for i, layer in enumerate(self.dec_layers):
      x, c = layer(x, enc["kv"][i], masks, train, group)
      if c is not None:
        gates.append(jnp.mean(c, axis=-1))
    aux = {"gbc_gate": jnp.mean(jnp.stack(gates, 0), 0)} if gates else {}
    return self._logits(x), aux

  def init_cache(self, enc, max_len: int):
    if self.variant == "late_fusion":
      return {"v": self.member_v.init_cache(enc["v"], max_len),
              "s": self.member_s.init_cache(enc["s"], max_len)}
    mask = enc["v_mask"] if "v_mask" in enc else enc["s_mask"]
    return tuple(layers.init_self_attention_cache(mask.shape[0], max_len, self.num_heads,
                                                  self.dim, self.dtype)
                 for _ in range(self.num_dec_layers))

  def decode_step(self, enc, cache, tokens_B, t, train: bool = False):
    if self.variant == "late_fusion":
      lv, cv, aux_v = self.member_v.decode_step(enc["v"], cache["v"], tokens_B, t, train)
      ls, cs, aux_s = self.member_s.decode_step(enc["s"], cache["s"], tokens_B, t, train)
      # Regions from the Transformer_v member, attributes from the Transformer_s member.
      return _fuse(lv, ls), {"v": cv, "s": cs}, {**aux_v, **aux_s}
    x = layers.embed_tokens(self.embed, tokens_B[:, None], cache[0]["k"].shape[1], offset=t)
    x = self.in_dropout(x, deterministic=not train)
    masks, new_cache, gates, weights = self._masks(enc), [], [], []
    for i, layer in enumerate(self.dec_layers):
      x, c_cache, c, w = layer.step(x, cache[i], t, enc["kv"][i], masks, train)
      new_cache.append(c_cache)
      weights.append(w)
      if c is not None:
        gates.append(jnp.mean(c[:, 0], axis=-1))
    aux = {}
    if gates:
      per_layer_BxL = jnp.stack(gates, axis=-1)
      aux = {"gbc_gate": jnp.mean(per_layer_BxL, axis=-1), "gbc_gate_layers": per_layer_BxL}
    for name in _ATTENTIONS[self.variant]:
      aux[f"cross_attention_{name}"] = jnp.stack([w[name] for w in weights], axis=1)
    region, attribute = _SUMMARY[self.variant]
    if region:
      aux.update(cross_attention_aux([w[region] for w in weights]))
    if attribute:
      aux.update(cross_attention_aux([w[attribute] for w in weights], prefix="attribute_"))
    return self._logits(x[:, 0]), tuple(new_cache), aux


def _fuse(logits_v, logits_s):
  """Late fusion: normalised average of the two members' log-probabilities (float32)."""
  avg = 0.5 * (jax.nn.log_softmax(logits_v.astype(jnp.float32), axis=-1)
               + jax.nn.log_softmax(logits_s.astype(jnp.float32), axis=-1))
  return jax.nn.log_softmax(avg, axis=-1)
