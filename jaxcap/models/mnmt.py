"""Multimodal attention NMT (Caglayan et al., 2016, "Multimodal Attention for Neural Machine
Translation"): an English source sentence and the image's convolutional features are attended
by one conditional-GRU decoder that writes the German description.

Dimension legend:
  B batch (images, or images x captions / beams), Ls source positions (words, EOS, PAD),
  N image grid cells (196 in the paper), C image feature width, T target positions,
  E word embedding width (620), H GRU width (1000), A attention width (2H by default),
  V target vocabulary, Vs source vocabulary.

Textual encoder (section 3.1, eq. 3): a bidirectional GRU over the source embeddings,
``a_i^txt = [h->_i; h<-_i]`` in R^{2H}. flax's ``nn.Bidirectional`` of two ``nn.RNN(GRUCell)``
with ``seq_lengths`` = the number of non-PAD source tokens, so the backward GRU starts at the
last real token and a padded source gives the same annotations as the unpadded one.
Visual encoder (section 3.2): the batch's ``feats`` (grid cells) through a linear ``W_im``
(no bias) to 2H: ``A^im``.

Conditional GRU decoder (section 3.3), at target step t (1-based) with the previous word
``y_{t-1}`` (BOS at t = 1):
  ``h_0^(1) = tanh(W_init mean_i(a_i^txt) + b_init)``  (eq. 4; mean over non-PAD tokens)
  ``h_t^(1) = g1(h_{t-1}^(1), E y_{t-1})``
  ``alpha_t^m = softmax(U_A^m tanh(W_D^m h_t^(1) + W_C^m A^m))``, m in {txt, im}   (eqs. 9-10)
  ``c_t^m = sum_i alpha_ti^m a_i^m``                                              (eq. 11)
  ``c_t = tanh(c^txt + c^im)`` (SUM, eq. 5) or ``tanh(W_fus [c^txt; c^im] + b_fus)`` (CONCAT, eq. 6)
  ``h_t^(2) = g2(h_{t-1}^(2), c_t)`` with ``h_0^(2) = h_1^(1)``                         (eqs. 4, 7)
  ``logits_t = L_o tanh(L_s h_t^(2) + L_c c_t + E y_{t-1})``                            (eq. 8)
Encoder-(in)dependent attention: one shared ``{W_C, U_A}`` (parameters ``W_C``, ``U_A``) or one
per modality (``W_C_txt``, ``U_A_txt``, ``W_C_im``, ``U_A_im``); decoder-(in)dependent: one
``W_D`` or ``W_D_txt`` / ``W_D_im``. A shared projection is one module applied to both
modalities, so it is a single array in the parameter tree. Padded source tokens (and padded
regions) get zero attention weight. ``W_C A^m`` is computed once in ``encode``.

Variants (Table 2 order, :data:`VARIANTS`): MNMT1-4 SUM, MNMT5-8 CONCAT, each with encoder
IND/IND/DEP/DEP x decoder IND/DEP/IND/DEP; ``nmt`` (text only: ``c_t = c_t^txt``) and
``imgtxt`` (image only: ``c_t = c_t^im``, ``h_0^(1)`` from the mean visual annotation).

``decoder="nmtpy"``: the authors' released decoder (lium-lst/nmtpy at dc0a161), read (not
copied) from ``nmtpy/layers.py`` (``gru_step``, ``param_init_gru``/``gru_layer``,
``param_init_gru_cond``/``gru_cond_layer``), ``nmtpy/models/basefusion.py`` (``init_params``,
``build``, ``build_sampler``: the multimodal models' initial state, zero first embedding and
readout), ``nmtpy/models/fusion_{sum,concat}_{ind,dep}_{ind,dep}.py`` (``gru_decoder_multi``:
the multimodal CGRU step) and ``nmtpy/models/attention.py`` (the text-only model), checked
against nyu-dl/dl4mt-tutorial (c476acb) ``session3/nmt.py`` (``gru_layer``, ``gru_cond_layer``,
``build_model``) and ``docs/cgru.tex``. One recurrent state ``h`` is carried between steps:
  ``h_0 = tanh(W_init mean_i(a_i^txt) + b_init)``  (as above: nmtpy's ``init_cgru='text'``)
  ``x_t = E y_{t-1}`` for t > 1, ``x_1 = 0``  (nmtpy/dl4mt shift a zero vector in, no BOS word)
  ``h'_t = GRU1(h_{t-1}, x_t)``                                      (biases on the word side)
  ``alpha_t^m = softmax(U_A^m tanh(W_D^m h'_t + W_C^m A^m + b_C^m))``  (``b_C``: nmtpy's ``b_att``)
  ``c_t``: fusion as above (nmtpy's CONCAT is linear: with ``fusion_tanh=False``)
  ``h_t = GRU2(h'_t, c_t)``  (biases on the state side); ``h_t`` is the state of step t + 1
  ``logits_t = L_o tanh(L_s h_t + b_s + L_c c_t + b_c + x_t)``  (basefusion's readout,
  ``ff_logit_gru``/``ff_logit_ctx`` being affine); text only (nmtpy's ``attention`` model):
  ``L_y x_t + b_y`` (``ff_logit_prev``) in place of ``x_t``.
with dl4mt's GRU ``GRU(h, x) = (1 - z) * n + z * h``, ``r = sigma(W_r x + U_r h + b_r)``,
``z = sigma(W_z x + U_z h + b_z)`` and GRU1: ``n = tanh(W x + b + r * (U h))`` (dl4mt's ``W/b``,
``Wx/bx``, ``U``, ``Ux``), GRU2: ``n = tanh(W c + r * (U h' + b))`` (``Wc``, ``Wcx``, ``U_nl/b_nl``,
``Ux_nl/bx_nl``): :class:`DL4MTGRUCell`. The reset gate multiplies ``U h`` (after the matrix, as
flax's ``GRUCell`` does), not ``h`` (Cho et al.'s form): dl4mt's ``preactx = dot(h_, Ux) * r +
xx_``, cgru.tex's ``r (.) (U s)``, nmtpy's ``tanh(dot(h_, Ux) * r + xx_)``; flax's cell differs
only by its bias on both sides of the candidate. nmtpy's ``gru_step`` writes ``u * n + (1 - u)
* h`` where dl4mt writes ``u * h + (1 - u) * n``: one family (``u = 1 - z`` negates the gate's
weights); we use dl4mt's and flax's labelling. Not switched: the encoders (flax's GRUCell, with
a ``b_hn`` that nmtpy's ``gru_layer`` lacks; ``W_im`` without ``ff_img_adaptor``'s bias),
initialisation, dropout (nmtpy drops no target embeddings and has ``ctx_dropout``), IMGTXT
(nmtpy has no image-only model: initial state as above, the multimodal readout), and ``U_A``'s
bias ``c_att`` (it cancels in the softmax).

Deviations and choices where the paper is silent (each documented against lium-lst/nmtpy,
whose CGRU follows dl4mt's ``gru_cond_layer``):

* **Two recurrent states (paper) vs one (nmtpy).** The paper keeps two GRU states: g1 runs on
  the target embeddings only and g2 on the contexts, ``h_t^(2) = g2(h_{t-1}^(2), c_t)``, with
  ``h_0^(2) = h_1^(1)``. nmtpy/dl4mt's CGRU has one state: ``h'_t = g1(h_{t-1}, E y_{t-1})``,
  attention from ``h'_t``, then ``h_t = g2(h'_t, c_t)`` (g2's previous state is g1's *output*
  at the same step) and ``h_t`` feeds the next g1. The two agree at t = 1 only. The default
  (``decoder="paper"``) follows the paper and its cache holds both states; ``decoder="nmtpy"``
  is the released form above (cache: ``h``).
* **GRU equations.** flax's ``GRUCell`` (the reset gate multiplies ``W_hn h + b_hn``, as in
  dl4mt / nmtpy) rather than Cho et al.'s ``r * h`` inside the matrix product; flax's cell has
  a bias on both sides of the candidate (``b_in`` and ``b_hn``), dl4mt's GRUs on one.
* **Biases.** Eqs. 8-10 have none; the paper decoder adds none there except ``b`` of ``L_o`` (a
  per-word prior, nmtpy has it; ``decoder="nmtpy"`` adds nmtpy's others). ``W_im`` and ``W_C``
  are bias-free, ``W_init``/``W_fus`` carry ``b_init``/``b_fus``.
  nmtpy's attention has a bias inside the tanh and on ``U_A``; the latter cancels in the softmax.
* **CONCAT tanh.** Eq. 6 puts a tanh on ``W_fus [c^txt; c^im] + b_fus``; nmtpy's
  ``fusion_concat_*`` is linear. ``fusion_tanh=False`` gives nmtpy's form (default: the paper).
* **Monomodal baselines.** The paper gives them "exactly the same architecture but with a single
  source modality" and no fusion; we use the modality's context as ``c_t`` without a tanh
  (as nmtpy's ``attention`` model), and IMGTXT initialises ``h_0^(1)`` from the mean visual
  annotation (it has no text).
* **Source EOS.** The mean in eq. 4 and the attention run over every non-PAD source token,
  the final EOS included (nmtpy appends ``<eos>`` to the source too).
* **Attention width.** ``A = 2H`` by default (dl4mt projects to the context width); configurable.
* **Initialisation.** Xavier-uniform for every kernel and embedding (the paper), recurrent
  kernels included (nmtpy uses orthogonal ones); biases zero.
* **Dropout** is not in the paper (default 0); when set it acts on both embeddings and on the
  input of ``L_o`` (nmtpy's ``dropout_emb`` / ``dropout_out``).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcap.data.vocab import PAD
from jaxcap.models import fields, layers
from jaxcap.models.base import CaptionModel
from jaxcap.models.layers import masked_mean
from jaxcap.models.registry import register

# Table 2: variant -> (fusion, encoder-dependent attention, decoder-dependent projection).
VARIANTS = {
    "mnmt1": ("sum", False, False),
    "mnmt2": ("sum", False, True),
    "mnmt3": ("sum", True, False),
    "mnmt4": ("sum", True, True),
    "mnmt5": ("concat", False, False),
    "mnmt6": ("concat", False, True),
    "mnmt7": ("concat", True, False),
    "mnmt8": ("concat", True, True),
}
# What a Table 2 row (``variant``) sets.
VARIANT_FIELDS = ("modalities", "fusion", "encoder_dependent", "decoder_dependent")
MODALITIES = ("both", "text", "image")
FUSIONS = ("sum", "concat")
DECODERS = ("paper", "nmtpy")
_XAVIER = nn.initializers.xavier_uniform()


def _gru(features: int, dtype):
  return nn.GRUCell(features, kernel_init=_XAVIER, recurrent_kernel_init=_XAVIER, dtype=dtype,
                    param_dtype=jnp.float32)


def _dense(features: int, dtype, use_bias: bool = False):
  return nn.Dense(features, use_bias=use_bias, kernel_init=_XAVIER, dtype=dtype,
                  param_dtype=jnp.float32)


class DL4MTGRUCell(nn.Module):
  """dl4mt's / nmtpy's GRU: ``(1 - z) * n + z * h`` with ``n = tanh(W x + r * (U h))``, the
  biases on one side only (``bias="input"``: ``b_r, b_z`` and ``b`` added to ``W x``, GRU1 of
  the CGRU and ``gru_layer``; ``"hidden"``: added to ``U h``, so the candidate's bias is inside
  the reset gate, GRU2 of the CGRU). flax's ``GRUCell`` has the same gates and reset placement
  but biases on both sides of the candidate (``b_in`` outside, ``b_hn`` inside the reset gate),
  one more vector than either dl4mt cell: hence this cell. Submodules are named as flax's
  (``ir, iz, in, hr, hz, hn``). ``__call__(h [B, H], x [B, D]) -> (h', h')``.
  """

  features: int
  bias: str = "input"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, h_BxH, x_BxD):
    if self.bias not in ("input", "hidden"):
      raise ValueError(f"DL4MTGRUCell.bias: expected 'input' or 'hidden', got {self.bias!r}")
    dense = functools.partial(nn.Dense, self.features, kernel_init=_XAVIER, dtype=self.dtype,
                              param_dtype=jnp.float32)
    dense_i = functools.partial(dense, use_bias=self.bias == "input")
    dense_h = functools.partial(dense, use_bias=self.bias == "hidden")
    r_BxH = jax.nn.sigmoid(dense_i(name="ir")(x_BxD) + dense_h(name="hr")(h_BxH))
    z_BxH = jax.nn.sigmoid(dense_i(name="iz")(x_BxD) + dense_h(name="hz")(h_BxH))
    n_BxH = jnp.tanh(dense_i(name="in")(x_BxD) + r_BxH * dense_h(name="hn")(h_BxH))
    new_BxH = (1.0 - z_BxH) * n_BxH + z_BxH * h_BxH
    return new_BxH, new_BxH


@register("mnmt")
class MultimodalNMT(CaptionModel):
  """Bi-GRU text encoder, linear visual encoder, conditional GRU with multimodal attention.

  Attributes:
    vocab_size: V (target).
    src_vocab_size: Vs (source; unused when ``modalities == "image"``).
    embed_dim: E.
    hidden_dim: H.
    att_dim: A (0: 2H).
    modalities: ``both`` (MNMT), ``text`` (NMT) or ``image`` (IMGTXT).
    fusion: ``sum`` (eq. 5) or ``concat`` (eq. 6); only with both modalities.
    fusion_tanh: the tanh of eq. 6 (False: nmtpy's linear CONCAT).
    encoder_dependent: one ``{W_C, U_A}`` per modality (else shared).
    decoder_dependent: one ``W_D`` per modality (else shared).
    decoder: ``paper`` (eq. 7 read literally: two recurrent states) or ``nmtpy`` (the authors'
      released CGRU: one state, dl4mt's GRUs, zero first embedding, readout biases; see the
      module docstring).
    dropout: rate on embeddings and the output layer's input (not in the paper).
    dtype: compute dtype (parameters stay float32; softmax and logits float32).
  """

  vocab_size: int
  src_vocab_size: int = 0
  embed_dim: int = 620
  hidden_dim: int = 1000
  att_dim: int = 0
  modalities: str = "both"
  fusion: str = "concat"
  fusion_tanh: bool = True
  encoder_dependent: bool = True
  decoder_dependent: bool = False
  decoder: str = "paper"
  dropout: float = 0.0
  dtype: Any = jnp.float32

  field_checks = {"embed_dim": fields.POSITIVE, "hidden_dim": fields.POSITIVE,
                  "att_dim": fields.Check(fields.at_least(0).test, "an int >= 0 (0: 2 x hidden_dim)"),
                  "modalities": fields.one_of(MODALITIES), "fusion": fields.one_of(FUSIONS),
                  "decoder": fields.one_of(DECODERS), "dropout": fields.RATE}

  @staticmethod
  def config_presets(values: dict) -> dict:
    """``variant``: a row of Table 2 (``nmt``, ``imgtxt``, ``mnmt1``..``mnmt8``) sets the
    :data:`VARIANT_FIELDS`; empty: those fields as given."""
    values = dict(values)
    variant = values.pop("variant", "")
    both = [f for f in VARIANT_FIELDS if f in values]
    if variant and both:
      raise ValueError(f"config field model.{both[0]}: set by model.variant={variant!r}; expected "
                       f"model.variant='' to set it directly")
    if variant == "nmt":
      values["modalities"] = "text"
    elif variant == "imgtxt":
      values["modalities"] = "image"
    elif variant in VARIANTS:
      values["modalities"] = "both"
      values["fusion"], values["encoder_dependent"], values["decoder_dependent"] = VARIANTS[variant]
    elif variant:
      raise ValueError(f"config field model.variant: expected one of "
                       f"{sorted(VARIANTS) + ['nmt', 'imgtxt']}, got {variant!r}")
    return values

  @staticmethod
  def check_data(values) -> None:
    if values["modalities"] != "image" and values["src_vocab_size"] <= 0:
      raise ValueError("config field data.task: the mnmt model reads a translation source, but "
                       "the data has none (source vocabulary of 0 words); expected "
                       "task='translate'")

  def required_inputs(self) -> tuple[str, ...]:
    return {"both": ("image", "src"), "text": ("src",), "image": ("image",)}[self.modalities]

  # ------------------------------------------------------------------------------ modules
  @property
  def _mods(self) -> tuple[str, ...]:
    return {"both": ("txt", "im"), "text": ("txt",), "image": ("im",)}[self.modalities]

  @property
  def _nmtpy(self) -> bool:
    if self.decoder not in DECODERS:  # registry.build checks it first; this is for direct use
      raise ValueError(f"config field model.decoder: expected one of {DECODERS}, "
                       f"got {self.decoder!r}")
    return self.decoder == "nmtpy"

  def setup(self):
    dt = jnp.dtype(self.dtype)
    h2 = 2 * self.hidden_dim
    att = self.att_dim or h2
    both = self.modalities == "both"
    nmtpy = self._nmtpy
    if "txt" in self._mods:
      self.src_embed = layers.Embed(self.src_vocab_size, self.embed_dim, embedding_init=_XAVIER,
                                dtype=dt, param_dtype=jnp.float32)
      self.encoder = nn.Bidirectional(nn.RNN(_gru(self.hidden_dim, dt)),
                                      nn.RNN(_gru(self.hidden_dim, dt)))
    if "im" in self._mods:
      self.W_im = _dense(h2, dt)
    self.W_init = _dense(self.hidden_dim, dt, use_bias=True)
    self.trg_embed = layers.Embed(self.vocab_size, self.embed_dim, embedding_init=_XAVIER, dtype=dt,
                              param_dtype=jnp.float32)
    if nmtpy:
      # dl4mt's CGRU: GRU1's biases on the word side (W/b, Wx/bx), GRU2's on the state side
      # (U_nl/b_nl, Ux_nl/bx_nl), the context entering bias-free (Wc, Wcx).
      self.g1 = DL4MTGRUCell(self.hidden_dim, "input", dt)
      self.g2 = DL4MTGRUCell(self.hidden_dim, "hidden", dt)
    else:
      self.g1 = _gru(self.hidden_dim, dt)
      self.g2 = _gru(self.hidden_dim, dt)
    # Shared projections are one module (one array) used for both modalities. nmtpy's
    # ``Wc_att`` carries ``b_att`` (inside the energy's tanh).
    if both and self.encoder_dependent:
      self.W_C_txt, self.W_C_im = _dense(att, dt, nmtpy), _dense(att, dt, nmtpy)
      self.U_A_txt, self.U_A_im = _dense(1, dt), _dense(1, dt)
    else:
      self.W_C, self.U_A = _dense(att, dt, nmtpy), _dense(1, dt)
    if both and self.decoder_dependent:
      self.W_D_txt, self.W_D_im = _dense(att, dt), _dense(att, dt)
    else:
      self.W_D = _dense(att, dt)
    if both and self.fusion == "concat":
      self.W_fus = _dense(h2, dt, use_bias=True)
    # nmtpy's ff_logit_gru / ff_logit_ctx are affine; its text-only model also projects the
    # previous word (ff_logit_prev), its multimodal models add the raw embedding (eq. 8).
    self.L_s = _dense(self.embed_dim, dt, nmtpy)
    self.L_c = _dense(self.embed_dim, dt, nmtpy)
    if nmtpy and self.modalities == "text":
      self.L_y = _dense(self.embed_dim, dt, use_bias=True)
    self.L_o = _dense(self.vocab_size, dt, use_bias=True)
    self.drop = nn.Dropout(self.dropout)

  def _proj(self, name: str, m: str, dependent: bool):
    both = self.modalities == "both"
    return getattr(self, f"{name}_{m}") if both and dependent else getattr(self, name)

  # ------------------------------------------------------------------------------ protocol
  def encode(self, batch, train: bool = False):
    """Annotations, their attention keys ``W_C A^m`` and ``h_0^(1)``; leaves ``[B, ...]``."""
    det = not train
    enc = {}
    if "txt" in self._mods:
      src_BxL = batch["src"]
      mask_BxL = src_BxL != PAD
      x_BxLxE = self.drop(self.src_embed(src_BxL), deterministic=det)
      a_BxLx2H = self.encoder(x_BxLxE, seq_lengths=mask_BxL.sum(-1).astype(jnp.int32))
      enc.update(txt=a_BxLx2H, txt_mask=mask_BxL,
                 txt_keys=self._proj("W_C", "txt", self.encoder_dependent)(a_BxLx2H))
      pooled_Bx2H = masked_mean(a_BxLx2H, mask_BxL)
    if "im" in self._mods:
      mask_BxN = batch["feats_mask"].astype(bool)
      a_BxNx2H = self.W_im(batch["feats"].astype(jnp.float32))
      enc.update(im=a_BxNx2H, im_mask=mask_BxN,
                 im_keys=self._proj("W_C", "im", self.encoder_dependent)(a_BxNx2H))
      if "txt" not in self._mods:
        pooled_Bx2H = masked_mean(a_BxNx2H, mask_BxN)
    enc["h0"] = jnp.tanh(self.W_init(pooled_Bx2H))
    return enc

  def init_cache(self, enc, max_len: int):
    del max_len  # Recurrent states do not grow with time.
    if self._nmtpy:
      return {"h": enc["h0"]}  # one state: h_0, then GRU2's output
    # h2 is replaced by h_1^(1) at the first step (eq. 4).
    return {"h1": enc["h0"], "h2": jnp.zeros_like(enc["h0"])}

  def _attend(self, enc, m: str, h1_BxH):
    """Eqs. 9-11 for modality ``m``: ``(c [B, 2H], alpha [B, L] float32)``."""
    q_BxA = self._proj("W_D", m, self.decoder_dependent)(h1_BxH)
    u_A = self._proj("U_A", m, self.encoder_dependent)
    e_BxL = u_A(jnp.tanh(enc[f"{m}_keys"] + q_BxA[:, None, :]))[..., 0].astype(jnp.float32)
    # A large finite value keeps an all-padding row (evaluation padding) finite.
    e_BxL = jnp.where(enc[f"{m}_mask"], e_BxL, -1e9)
    alpha_BxL = jax.nn.softmax(e_BxL, axis=-1)
    c_Bx2H = jnp.einsum("bl,bld->bd", alpha_BxL.astype(enc[m].dtype), enc[m])
    return c_Bx2H, alpha_BxL

  def _fuse(self, ctx: dict):
    if self.modalities != "both":
      return ctx[self._mods[0]]
    if self.fusion == "sum":
      return jnp.tanh(ctx["txt"] + ctx["im"])  # eq. 5
    z = self.W_fus(jnp.concatenate([ctx["txt"], ctx["im"]], axis=-1))  # eq. 6
    return jnp.tanh(z) if self.fusion_tanh else z

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    """g1, attention, fusion and g2 of one step (eqs. 4, 7, 9-11; no output layer).

    Returns ``((h_t^(2), c_t, E y_{t-1}), cache, {"attention_<m>": [B, L_m]})``; teacher
    forcing scans this step (``CaptionModel.decode_train``: aux ``[B, T, L_m]``), then eq. 8
    runs on all steps at once.
    """
    y_BxE = self.drop(self.trg_embed(tokens_B), deterministic=not train)
    if self._nmtpy:
      return self._nmtpy_step(enc, cache, y_BxE, t)
    h1_BxH, _ = self.g1(cache["h1"], y_BxE)
    h2_prev_BxH = jnp.where(t == 0, h1_BxH, cache["h2"])  # h_0^(2) = h_1^(1) (eq. 4)
    ctx, aux = {}, {}
    for m in self._mods:
      ctx[m], aux[f"attention_{m}"] = self._attend(enc, m, h1_BxH)
    c_Bx2H = self._fuse(ctx)
    h2_BxH, _ = self.g2(h2_prev_BxH, c_Bx2H)  # eq. 7
    return (h2_BxH, c_Bx2H, y_BxE), {"h1": h1_BxH, "h2": h2_BxH}, aux

  def _nmtpy_step(self, enc, cache, y_BxE, t):
    """nmtpy's / dl4mt's CGRU step: one state ``h``, ``h'_t = GRU1(h_{t-1}, x_t)``, attention
    from ``h'_t``, ``h_t = GRU2(h'_t, c_t)``; ``x_1 = 0`` (their shifted embeddings)."""
    x_BxE = jnp.where(t == 0, jnp.zeros_like(y_BxE), y_BxE)
    hp_BxH, _ = self.g1(cache["h"], x_BxE)
    ctx, aux = {}, {}
    for m in self._mods:
      ctx[m], aux[f"attention_{m}"] = self._attend(enc, m, hp_BxH)
    c_Bx2H = self._fuse(ctx)
    h_BxH, _ = self.g2(hp_BxH, c_Bx2H)
    return (h_BxH, c_Bx2H, x_BxE), {"h": h_BxH}, aux

  def output_layer(self, features, train: bool = False):
    """Eq. 8 (logits; the softmax is the loss's / the search's), with the dropout on L_o's input;
    ``decoder="nmtpy"``: with ``L_s``'s and ``L_c``'s biases (and ``L_y`` for text only)."""
    h2, c, y = features
    if self._nmtpy and self.modalities == "text":
      y = self.L_y(y)
    hid = jnp.tanh(self.L_s(h2) + self.L_c(c) + y)
    return self.L_o(self.drop(hid, deterministic=not train)).astype(jnp.float32)
