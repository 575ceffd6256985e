"""Multimodal attention NMT (Caglayan et al., 2016, "Multimodal Attention for Neural Machine
Translation"): an English source sentence and the image's convolutional features are attended
by one conditional-GRU decoder that writes the German description. Notes, choices where the
paper is silent and the deviations: jaxcap/papers/mnmt/README.md ("The model against the paper
and nmtpy").

Dimension legend:
  B batch (images, or images x captions / beams), Ls source positions (words, EOS, PAD),
  N image grid cells (196 in the paper), C image feature width, T target positions,
  E word embedding width (620), H GRU width (1000), A attention width (2H by default),
  V target vocabulary, Vs source vocabulary.

Equations (``decoder="paper"``; section 3):
  ``a_i^txt = [h->_i; h<-_i]``: bi-GRU over the source embeddings (eq. 3; ``seq_lengths``)
  ``A^im = W_im feats``                                                     (section 3.2)
  ``h_0^(1) = tanh(W_init mean_i(a_i^txt) + b_init)``                               (eq. 4)
  ``h_t^(1) = g1(h_{t-1}^(1), E y_{t-1})``
  ``alpha_t^m = softmax(U_A^m tanh(W_D^m h_t^(1) + W_C^m A^m))``, m in {txt, im}  (eqs. 9-10)
  ``c_t^m = sum_i alpha_ti^m a_i^m``                                               (eq. 11)
  ``c_t = tanh(c^txt + c^im)`` (SUM, eq. 5) or ``tanh(W_fus [c^txt; c^im] + b_fus)`` (CONCAT, eq. 6)
  ``h_t^(2) = g2(h_{t-1}^(2), c_t)``, ``h_0^(2) = h_1^(1)``                     (eqs. 4, 7)
  ``logits_t = L_o tanh(L_s h_t^(2) + L_c c_t + E y_{t-1})``                       (eq. 8)
A shared projection is one module (one array) applied to both modalities; ``W_C A^m`` is
computed once in ``encode``.

``decoder="nmtpy"``: lium-lst/nmtpy at dc0a161 (``layers.py``, ``models/basefusion.py``,
``models/attention.py``, ``models/fusion_{sum,concat}_{ind,dep}_{ind,dep}.py``), one state:
  ``x_1 = 0``, ``x_t = E y_{t-1}``;  ``h'_t = GRU1(h_{t-1}, x_t)``;
  ``alpha_t^m = softmax(U_A^m tanh(W_D^m h'_t + W_C^m A^m + b_C^m))``;  ``c_t`` fused;
  ``h_t = GRU2(h'_t, c_t)``;  ``logits_t = L_o tanh(L_s h_t + b_s + L_c c_t + b_c + x_t)``
with dl4mt's GRU (:class:`DL4MTGRUCell`). What the two decoders differ in, row by row (Table 2
row = nmtpy model; IND / DEP = encoder side, then decoder side):

  ============== ===================================== =========================================
  rows           ``decoder="paper"``                   ``decoder="nmtpy"``
  ============== ===================================== =========================================
  all            two states (g1 on words, g2 on c_t)   one state: GRU2's input state is GRU1's
                                                       output of the same step
  all            flax GRUCell everywhere (a candidate  dl4mt's GRU: encoders and GRU1 biased on
                 bias on both sides)                   the input side, GRU2 on the state side
  all            BOS embedding at t = 1                zero vector at t = 1
  all            ``W_C``, ``W_im``, ``L_s``, ``L_c``   ``b_att`` (``b_C``), ``ff_img_adaptor_b``,
                 bias-free                             ``ff_logit_{gru,ctx}_b``
  MNMT1, 5       one W_C, U_A, W_D                     the same (``*_ind_ind``)
  MNMT2, 6       one W_C and U_A; W_D per modality     W_C (+ bias) and W_D per modality, one U_A
                                                       (``*_ind_dep``: ``Wc_att2``, ``b_att2``,
                                                       ``W_comb_att2``)
  MNMT3, 7       W_C, U_A per modality; one W_D        the same (``*_dep_ind``)
  MNMT4, 8       W_C, U_A, W_D per modality            the same (``*_dep_dep``)
  MNMT5-8        CONCAT ``tanh(W_fus [..] + b_fus)``   linear ``W_fus [..] + c_fus``
  NMT            readout ``+ E y_{t-1}``               ``+ L_y x_t + b_y`` (``ff_logit_prev``)
  IMGTXT         initial state from mean_i A^im        the same (nmtpy has no image-only model)
  ============== ===================================== =========================================

``fusion_tanh`` (None: the decoder's own) overrides the CONCAT activation of either. Neither
decoder follows nmtpy in initialisation (Xavier here, nmtpy's normal / orthogonal), dropout
(nmtpy's ``ctx_dropout``) or ``U_A``'s bias ``c_att`` (it cancels in the softmax).
tests/papers/mnmt/np_nmtpy.py is a reading of nmtpy's code that every row is checked against.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcap.data.vocab import PAD
from jaxcap.errors import BadInput
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


class DL4MTGRUCell(nn.RNNCellBase):
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

  @nn.nowrap
  def initialize_carry(self, rng, input_shape):
    del rng
    return jnp.zeros(tuple(input_shape[:-1]) + (self.features,), jnp.float32)

  @property
  def num_feature_axes(self) -> int:
    return 1


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
    fusion_tanh: the tanh of eq. 6; None: the decoder's own (``paper``: tanh, ``nmtpy``: linear,
      as nmtpy's ``fusion_concat_*``).
    encoder_dependent: one ``{W_C, U_A}`` per modality (else shared; under ``nmtpy`` the
      image has its own ``W_C`` whenever either side is dependent).
    decoder_dependent: one ``W_D`` per modality (else shared).
    decoder: ``paper`` (the equations read literally) or ``nmtpy`` (the authors' released code,
      every row; the module docstring's table lists the differences).
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
  fusion_tanh: bool | None = None
  encoder_dependent: bool = True
  decoder_dependent: bool = False
  decoder: str = "paper"
  dropout: float = 0.0
  dtype: Any = jnp.float32

  field_checks = {"embed_dim": fields.POSITIVE, "hidden_dim": fields.POSITIVE,
                  "att_dim": fields.Check(fields.at_least(0).test, "an int >= 0 (0: 2 x hidden_dim)"),
                  "modalities": fields.one_of(MODALITIES), "fusion": fields.one_of(FUSIONS),
                  "decoder": fields.one_of(DECODERS), "dropout": fields.RATE}

  text_only_setting = "model.variant='nmt' (text only)"

  @staticmethod
  def config_presets(values: dict) -> dict:
    """``variant``: a row of Table 2 (``nmt``, ``imgtxt``, ``mnmt1``..``mnmt8``) sets the
    :data:`VARIANT_FIELDS`; empty: those fields as given."""
    values = dict(values)
    variant = values.pop("variant", "")
    both = [f for f in VARIANT_FIELDS if f in values]
    if variant and both:
      raise BadInput(f"config field model.{both[0]}: set by model.variant={variant!r}; expected "
                       f"model.variant='' to set it directly")
    if variant == "nmt":
      values["modalities"] = "text"
    elif variant == "imgtxt":
      values["modalities"] = "image"
    elif variant in VARIANTS:
      values["modalities"] = "both"
      values["fusion"], values["encoder_dependent"], values["decoder_dependent"] = VARIANTS[variant]
    elif variant:
      raise BadInput(f"config field model.variant: expected one of "
                       f"{sorted(VARIANTS) + ['nmt', 'imgtxt']}, got {variant!r}")
    return values

  @staticmethod
  def check_data(values) -> None:
    if values["modalities"] != "image" and values["src_vocab_size"] <= 0:
      raise BadInput("config field data.task: the mnmt model reads a translation source, but "
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
      raise BadInput(f"config field model.decoder: expected one of {DECODERS}, "
                       f"got {self.decoder!r}")
    return self.decoder == "nmtpy"

  @property
  def _keys_dependent(self) -> bool:
    """One key projection ``W_C`` per modality? The paper ties it to ``U_A`` (encoder-dependent
    attention); nmtpy's ``fusion_*_{ind_dep,dep_ind,dep_dep}.py`` all give the image its own
    ``Wc_att2``/``b_att2``: only ``ind_ind`` shares it."""
    return self.encoder_dependent or (self._nmtpy and self.decoder_dependent)

  @property
  def _fusion_tanh(self) -> bool:
    return (not self._nmtpy) if self.fusion_tanh is None else self.fusion_tanh

  def setup(self):
    dt = jnp.dtype(self.dtype)
    h2 = 2 * self.hidden_dim
    att = self.att_dim or h2
    both = self.modalities == "both"
    nmtpy = self._nmtpy
    if "txt" in self._mods:
      self.src_embed = layers.Embed(self.src_vocab_size, self.embed_dim, embedding_init=_XAVIER,
                                dtype=dt, param_dtype=jnp.float32)
      # nmtpy's gru_layer: dl4mt's GRU, biases on the word side only (no b_hn).
      cell = (lambda: DL4MTGRUCell(self.hidden_dim, "input", dt)) if nmtpy else (
          lambda: _gru(self.hidden_dim, dt))
      self.encoder = nn.Bidirectional(nn.RNN(cell()), nn.RNN(cell()))
    if "im" in self._mods:
      self.W_im = _dense(h2, dt, nmtpy)  # nmtpy's ff_img_adaptor is affine
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
    if both and self._keys_dependent:
      self.W_C_txt, self.W_C_im = _dense(att, dt, nmtpy), _dense(att, dt, nmtpy)
    else:
      self.W_C = _dense(att, dt, nmtpy)
    if both and self.encoder_dependent:
      self.U_A_txt, self.U_A_im = _dense(1, dt), _dense(1, dt)
    else:
      self.U_A = _dense(1, dt)
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
                 txt_keys=self._proj("W_C", "txt", self._keys_dependent)(a_BxLx2H))
      pooled_Bx2H = masked_mean(a_BxLx2H, mask_BxL)
    if "im" in self._mods:
      mask_BxN = batch["feats_mask"].astype(bool)
      a_BxNx2H = self.W_im(batch["feats"].astype(jnp.float32))
      enc.update(im=a_BxNx2H, im_mask=mask_BxN,
                 im_keys=self._proj("W_C", "im", self._keys_dependent)(a_BxNx2H))
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
    return jnp.tanh(z) if self._fusion_tanh else z

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    """g1, attention, fusion and g2 of one step (eqs. 4, 7, 9-11; no output layer).

    Returns ``((h_t^(2), c_t, E y_{t-1}), cache, aux)`` with ``aux["attention_<m>"]``
    ``[B, L_m]`` (alpha_t^m, eq. 10) per attended modality, and under the names every
    attention model shares: ``aux["attention"]`` = ``attention_im`` (over the image's N grid
    cells) and ``aux["src_attention"]`` = ``attention_txt`` (over the Ls source positions).
    Teacher forcing scans this step (``CaptionModel.decode_train``: aux ``[B, T, L_m]``), then
    eq. 8 runs on all steps at once.
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
    return (h2_BxH, c_Bx2H, y_BxE), {"h1": h1_BxH, "h2": h2_BxH}, _shared_names(aux)

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
    return (h_BxH, c_Bx2H, x_BxE), {"h": h_BxH}, _shared_names(aux)

  def output_layer(self, features, train: bool = False):
    """Eq. 8 (logits; the softmax is the loss's / the search's), with the dropout on L_o's input;
    ``decoder="nmtpy"``: with ``L_s``'s and ``L_c``'s biases (and ``L_y`` for text only)."""
    h2, c, y = features
    if self._nmtpy and self.modalities == "text":
      y = self.L_y(y)
    hid = jnp.tanh(self.L_s(h2) + self.L_c(c) + y)
    return self.L_o(self.drop(hid, deterministic=not train)).astype(jnp.float32)


def _shared_names(aux: dict) -> dict:
  """Adds the attention keys every attention model shares (``attention`` over the image,
  ``src_attention`` over the source words) to ``attention_<m>``: the same arrays."""
  shared = {"attention": aux.get("attention_im"), "src_attention": aux.get("attention_txt")}
  return {**aux, **{k: v for k, v in shared.items() if v is not None}}
