"""A float64 NumPy reading of lium-lst/nmtpy at dc0a161 (the multimodal-attention NMT paper's
released code), written from nmtpy's files, not from jaxcap's module; ``file:line`` comments
name the lines each piece follows.

It works on nmtpy's own parameters (``tparams``: its names, stacked gate matrices ``[r | u]``
and update-gate sign) and nmtpy's time-major layout (``x [Tx, n]``, ``x_img [196, n, C]``,
``y [Ty, n]``). :func:`from_jaxcap` maps a jaxcap ``decoder="nmtpy"`` parameter tree onto
the parameters that nmtpy's ``init_params`` creates for the row's model, and fails when a
jaxcap array is left over or an nmtpy parameter has no jaxcap array: the mapping is the
check that the two trees hold the same tensors.

Table 2 row -> nmtpy model: MNMT1-4 ``fusion_sum_{ind_ind, ind_dep, dep_ind, dep_dep}``,
MNMT5-8 ``fusion_concat_*`` in the same order (``<encoder>_<decoder>``), NMT ``attention``.
nmtpy has no image-only model; ``imgtxt`` here is ``gru_cond_layer`` over the adapted image
with basefusion's readout and an initial state from the mean adapted annotation (jaxcap's
choice, said in its module).

jaxcap's GRUs write ``(1 - z) * n + z * h``, nmtpy's ``gru_step`` ``u * n + (1 - u) * h``
(layers.py:134): ``u = 1 - z``, so :func:`from_jaxcap` negates the update gate's weights and
bias (``sigmoid(-a) = 1 - sigmoid(a)``). ``c_att`` (U_att's bias, which jaxcap has not) is set
to a non-zero constant: it cancels in the softmax.
"""

from __future__ import annotations

import numpy as np

# Table 2 row -> (nmtpy model, fusion, encoder side, decoder side).
ROWS = {
    "mnmt1": ("fusion_sum_ind_ind", "sum", "ind", "ind"),
    "mnmt2": ("fusion_sum_ind_dep", "sum", "ind", "dep"),
    "mnmt3": ("fusion_sum_dep_ind", "sum", "dep", "ind"),
    "mnmt4": ("fusion_sum_dep_dep", "sum", "dep", "dep"),
    "mnmt5": ("fusion_concat_ind_ind", "concat", "ind", "ind"),
    "mnmt6": ("fusion_concat_ind_dep", "concat", "ind", "dep"),
    "mnmt7": ("fusion_concat_dep_ind", "concat", "dep", "ind"),
    "mnmt8": ("fusion_concat_dep_dep", "concat", "dep", "dep"),
    "nmt": ("attention", None, None, None),
    "imgtxt": ("(none)", None, None, None),
}
C_ATT = 0.37  # U_att's bias c_att: any value (it cancels in the softmax)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def decoder_param_names(row: str) -> list[str]:
  """The decoder parameters nmtpy creates for ``row`` (without the ``decoder[_multi]_`` prefix):
  layers.py:299-331 ``param_init_gru_cond`` and each fusion model's ``init_gru_decoder_multi``
  (e.g. fusion_sum_ind_dep.py:25-35, fusion_concat_ind_dep.py:27-40)."""
  names = ["W", "b", "U", "Wx", "bx", "Ux", "U_nl", "b_nl", "Ux_nl", "bx_nl", "Wc", "Wcx",
           "W_comb_att", "Wc_att", "b_att", "U_att", "c_att"]
  _, fusion, enc, dec = ROWS[row]
  if fusion is None:
    return names
  if (enc, dec) != ("ind", "ind"):
    names += ["Wc_att2", "b_att2"]  # every row but ind_ind gives the image its own keys
  if enc == "dep":
    names += ["U_att2", "c_att2"]
  if dec == "dep":
    names += ["W_comb_att2"]
  if fusion == "concat":
    names += ["W_fus", "c_fus"]
  return names


# ---------------------------------------------------------------------------------------------
# jaxcap -> nmtpy parameters


class _Leaves:
  """jaxcap's parameter tree; every array must be taken exactly once."""

  def __init__(self, tree):
    self.left = {}

    def walk(node, path):
      for k, v in node.items():
        if isinstance(v, dict) or hasattr(v, "items"):
          walk(v, path + (k,))
        else:
          self.left["/".join(path + (k,))] = np.asarray(v, np.float64)
    walk(tree, ())

  def take(self, path: str) -> np.ndarray:
    if path not in self.left:
      raise KeyError(f"jaxcap has no array {path!r} for this nmtpy parameter")
    return self.left.pop(path)


def _gru_input_side(j: _Leaves, cell: str) -> dict:
  """A GRU with its biases on the input side (layers.py:64-88 ``param_init_gru``): ``W = [W_r |
  W_u]``, ``b``, ``U = [U_r | U_u]``, ``Wx``, ``bx``, ``Ux``; u = 1 - z negates z's weights."""
  k = lambda g: j.take(f"{cell}/{g}/kernel")
  bias = lambda g: j.take(f"{cell}/{g}/bias")
  return {"W": np.concatenate([k("ir"), -k("iz")], 1), "b": np.concatenate([bias("ir"), -bias("iz")]),
          "U": np.concatenate([k("hr"), -k("hz")], 1), "Wx": k("in"), "bx": bias("in"), "Ux": k("hn")}


def from_jaxcap(params: dict, row: str) -> dict:
  """nmtpy's ``tparams`` for ``row`` from a jaxcap ``decoder="nmtpy"`` tree (``params["params"]``)."""
  model = ROWS[row][0]
  fusion = ROWS[row][1]
  j = _Leaves(params)
  tp = {}
  multimodal = fusion is not None
  enc_prefix = "text_encoder" if multimodal else "encoder"  # basefusion.py:110-113, attention.py:336-338
  dec = "decoder_multi" if multimodal else "decoder"  # basefusion.py:132, attention.py:357
  if row != "imgtxt":
    tp["Wemb_enc"] = j.take("src_embed/embedding")  # attention.py:75, :328
    for suffix, rnn in (("", "forward_rnn"), ("_r", "backward_rnn")):
      for k, v in _gru_input_side(j, f"encoder/{rnn}/cell").items():
        tp[f"{enc_prefix}{suffix}_{k}"] = v
    init = "ff_text_state_init" if multimodal else "ff_state"  # basefusion.py:120, attention.py:351
  else:
    init = "ff_state"
  tp[f"{init}_W"], tp[f"{init}_b"] = j.take("W_init/kernel"), j.take("W_init/bias")
  tp["Wemb_dec"] = j.take("trg_embed/embedding")
  if row != "nmt":
    tp["ff_img_adaptor_W"] = j.take("W_im/kernel")  # basefusion.py:103-104 (ff: W and b)
    tp["ff_img_adaptor_b"] = j.take("W_im/bias")
  # CGRU: GRU1 (biases with the word, layers.py:33-37) and GRU2 (U_nl/b_nl, Ux_nl/bx_nl with the
  # state, Wc/Wcx with the context; layers.py:309-317).
  for k, v in _gru_input_side(j, "g1").items():
    tp[f"{dec}_{k}"] = v
  g = lambda gate, kind: j.take(f"g2/{gate}/{kind}")
  tp[f"{dec}_U_nl"] = np.concatenate([g("hr", "kernel"), -g("hz", "kernel")], 1)
  tp[f"{dec}_b_nl"] = np.concatenate([g("hr", "bias"), -g("hz", "bias")])
  tp[f"{dec}_Ux_nl"], tp[f"{dec}_bx_nl"] = g("hn", "kernel"), g("hn", "bias")
  tp[f"{dec}_Wc"] = np.concatenate([g("ir", "kernel"), -g("iz", "kernel")], 1)
  tp[f"{dec}_Wcx"] = g("in", "kernel")
  # Attention. The first modality (text; the image for imgtxt) takes the un-suffixed names.
  names = set(decoder_param_names(row))
  first = "im" if row == "imgtxt" else "txt"

  def att(jax_name, m):
    """The jaxcap array of a projection for modality m: its own or the shared one."""
    own = f"{jax_name}_{m}/kernel"
    return own if own in j.left else f"{jax_name}/kernel"

  shared_keys = "Wc_att2" not in names
  w_c = att("W_C", first)
  tp[f"{dec}_Wc_att"], tp[f"{dec}_b_att"] = j.take(w_c), j.take(w_c.replace("kernel", "bias"))
  if multimodal and not shared_keys:
    tp[f"{dec}_Wc_att2"] = j.take("W_C_im/kernel")
    tp[f"{dec}_b_att2"] = j.take("W_C_im/bias")
  tp[f"{dec}_W_comb_att"] = j.take(att("W_D", first) if "W_comb_att2" in names else "W_D/kernel")
  if "W_comb_att2" in names:
    tp[f"{dec}_W_comb_att2"] = j.take("W_D_im/kernel")
  tp[f"{dec}_U_att"] = j.take(att("U_A", first) if "U_att2" in names else "U_A/kernel")
  tp[f"{dec}_c_att"] = np.full(1, C_ATT)
  if "U_att2" in names:
    tp[f"{dec}_U_att2"] = j.take("U_A_im/kernel")
    tp[f"{dec}_c_att2"] = np.full(1, -C_ATT)
  if fusion == "concat":
    tp[f"{dec}_W_fus"], tp[f"{dec}_c_fus"] = j.take("W_fus/kernel"), j.take("W_fus/bias")
  # Readout: basefusion.py:136-141, attention.py:362-367 (every ff has W and b).
  for nm, jx in (("ff_logit_gru", "L_s"), ("ff_logit_ctx", "L_c"), ("ff_logit", "L_o")) + (
      (("ff_logit_prev", "L_y"),) if row == "nmt" else ()):
    tp[f"{nm}_W"], tp[f"{nm}_b"] = j.take(f"{jx}/kernel"), j.take(f"{jx}/bias")
  if j.left:
    raise AssertionError(f"jaxcap arrays with no nmtpy parameter in {model}: {sorted(j.left)}")
  want = {f"{dec}_{n}" for n in names}
  got = {k for k in tp if k.startswith(dec + "_")}
  if want != got:
    raise AssertionError(f"{model}: nmtpy parameters {sorted(want ^ got)} missing or extra")
  return tp


# ---------------------------------------------------------------------------------------------
# nmtpy's computation


def gru_step(m_, x_, xx_, h_, U, Ux):
  """layers.py:118-138: ``x_ = x W + b`` and ``xx_ = x Wx + bx`` come precomputed."""
  dim = Ux.shape[1]
  preact = _sigmoid(h_ @ U + x_)  # :122
  r, u = preact[:, :dim], preact[:, dim:]  # :125-126
  h_tilda = np.tanh((h_ @ Ux) * r + xx_)  # :130
  h = u * h_tilda + (1.0 - u) * h_  # :134
  return m_[:, None] * h + (1.0 - m_)[:, None] * h_  # :136


def gru_layer(tp, state_below, prefix, mask):
  """layers.py:198-245: ``state_below [T, n, E]``, zero initial state, one state per step."""
  x_ = state_below @ tp[f"{prefix}_W"] + tp[f"{prefix}_b"]  # :220
  xx_ = state_below @ tp[f"{prefix}_Wx"] + tp[f"{prefix}_bx"]  # :224
  h = np.zeros((state_below.shape[1], tp[f"{prefix}_Ux"].shape[1]))
  out = []
  for t in range(state_below.shape[0]):
    h = gru_step(mask[t], x_[t], xx_[t], h, tp[f"{prefix}_U"], tp[f"{prefix}_Ux"])
    out.append(h)
  return np.stack(out)


def ff(tp, x, prefix, activ="linear"):
  """layers.py ``fflayer``: ``activ(x W + b)``."""
  y = x @ tp[f"{prefix}_W"] + tp[f"{prefix}_b"]
  return np.tanh(y) if activ == "tanh" else y


def _attend(pctx_, pstate_, U_att, c_att, cc_, mask, mutant):
  """fusion_*.py ``_step`` (e.g. fusion_concat_ind_dep.py:127-157): energies, exp-normalise with
  the source mask multiplied in (the image has none), context."""
  pctx__ = np.tanh(pctx_ + pstate_[None])  # :127
  alpha = (pctx__ @ U_att + c_att)[..., 0]  # :134, :138
  alpha = np.exp(alpha - alpha.max(0, keepdims=True))  # :142
  if mask is not None:
    alpha = alpha * mask  # :147-148
  alpha = alpha / alpha.sum(0, keepdims=True)  # :151
  return (cc_ * alpha[:, :, None]).sum(0)  # :156


def _gru2(tp, dec, h1, ctx_, m_):
  """The second GRU of the conditional GRU (layers.py:470-493; fusion_concat_ind_dep.py:174-197)."""
  dim = tp[f"{dec}_Wcx"].shape[1]
  preact = _sigmoid(h1 @ tp[f"{dec}_U_nl"] + tp[f"{dec}_b_nl"] + ctx_ @ tp[f"{dec}_Wc"])  # :174-182
  r2, u2 = preact[:, :dim], preact[:, dim:]
  preactx = (h1 @ tp[f"{dec}_Ux_nl"] + tp[f"{dec}_bx_nl"]) * r2 + ctx_ @ tp[f"{dec}_Wcx"]  # :188-189
  h2 = u2 * np.tanh(preactx) + (1.0 - u2) * h1  # :192-196
  return m_[:, None] * h2 + (1.0 - m_)[:, None] * h1  # :197


def forward(tp, row, x, x_mask, x_img, y, mutant=""):
  """nmtpy's ``build`` for ``row``: log-probabilities ``[Ty, n, V]`` of every target position.

  ``x [Tx, n]`` source ids (0-padded) with ``x_mask``; ``x_img [N, n, C]``; ``y [Ty, n]`` the
  targets. ``mutant`` (a reading nmtpy does not have, to show the comparison is sharp):
  ``shared_image_keys`` (the image keyed by the text's Wc_att/b_att), ``tanh_concat`` (a tanh on
  CONCAT's fusion), ``bos_embedding`` (the first input a BOS embedding, id 1, not zeros),
  ``gru1_own_state`` (GRU1 fed its own previous output, the paper's g1 chain),
  ``readout_from_gru1`` (the readout from h1 instead of the step's output).
  """
  model, fusion, _, _ = ROWS[row]
  multimodal = fusion is not None
  dec = "decoder_multi" if multimodal else "decoder"
  n = y.shape[1]
  ctxs = []  # (context [L, n, 2H], its keys [L, n, A], mask or None, first modality?)
  if row != "imgtxt":
    enc = "text_encoder" if multimodal else "encoder"
    emb = tp["Wemb_enc"][x]  # basefusion.py:179-180 (attention.py:395-397)
    xr, xr_mask = x[::-1], x_mask[::-1]  # basefusion.py:159-160
    forw = gru_layer(tp, emb, enc, x_mask)  # :181
    back = gru_layer(tp, tp["Wemb_enc"][xr], enc + "_r", xr_mask)  # :184-186
    text_ctx = np.concatenate([forw, back[::-1]], axis=-1)  # :190
    mean = (text_ctx * x_mask[:, :, None]).sum(0) / x_mask.sum(0)[:, None]  # :198
    init_state = ff(tp, mean, "ff_text_state_init" if multimodal else "ff_state", "tanh")  # :202
  if row != "nmt":
    img_ctx = ff(tp, x_img, "ff_img_adaptor")  # basefusion.py:223, linear
    if row == "imgtxt":
      init_state = ff(tp, img_ctx.mean(0), "ff_state", "tanh")
  # Keys: pctx1_ = ctx1 Wc_att + b_att, pctx2_ = ctx2 Wc_att2 + b_att2 (fusion_*_ind_dep.py:79-80;
  # ind_ind: both with Wc_att, fusion_sum_ind_ind.py:70-71).
  key = lambda c, s: c @ tp[f"{dec}_Wc_att{s}"] + tp[f"{dec}_b_att{s}"]
  if row == "nmt":
    ctxs.append((text_ctx, key(text_ctx, ""), x_mask, ""))
  elif row == "imgtxt":
    ctxs.append((img_ctx, key(img_ctx, ""), None, ""))
  else:
    own = f"{dec}_Wc_att2" in tp and mutant != "shared_image_keys"
    ctxs.append((text_ctx, key(text_ctx, ""), x_mask, ""))
    ctxs.append((img_ctx, key(img_ctx, "2" if own else ""), None, "2"))
  # Shifted target embeddings: the first input is zeros (basefusion.py:237-239, attention.py:431-433).
  emb_trg = tp["Wemb_dec"][y]
  shifted = np.zeros_like(emb_trg)
  shifted[1:] = emb_trg[:-1]
  if mutant == "bos_embedding":
    shifted[0] = tp["Wemb_dec"][1]
  x_ = shifted @ tp[f"{dec}_W"] + tp[f"{dec}_b"]  # fusion_*.py:71-75 / layers.py:366-370
  xx_ = shifted @ tp[f"{dec}_Wx"] + tp[f"{dec}_bx"]
  ones = np.ones(n)
  h, h1_prev = init_state, init_state
  hs, sumctx = [], []
  for t in range(y.shape[0]):
    h1 = gru_step(ones, x_[t], xx_[t], h1_prev if mutant == "gru1_own_state" else h,
                  tp[f"{dec}_U"], tp[f"{dec}_Ux"])  # :111
    parts = []
    for cc_, pctx_, mask, s in ctxs:
      w_comb = f"{dec}_W_comb_att{s}" if f"{dec}_W_comb_att{s}" in tp else f"{dec}_W_comb_att"
      u_att = f"{dec}_U_att{s}" if f"{dec}_U_att{s}" in tp else f"{dec}_U_att"
      c_att = f"{dec}_c_att{s}" if f"{dec}_c_att{s}" in tp else f"{dec}_c_att"
      parts.append(_attend(pctx_, h1 @ tp[w_comb], tp[u_att], tp[c_att], cc_, mask, mutant))  # :119-157
    if fusion == "sum":
      ctx_ = np.tanh(parts[0] + parts[1])  # fusion_sum_ind_dep.py:157
    elif fusion == "concat":
      ctx_ = np.concatenate(parts, axis=1) @ tp[f"{dec}_W_fus"] + tp[f"{dec}_c_fus"]  # fusion_concat_ind_dep.py:163
      if mutant == "tanh_concat":
        ctx_ = np.tanh(ctx_)
    else:
      ctx_ = parts[0]  # gru_cond_layer: one context (layers.py:126 of the step)
    h2 = _gru2(tp, dec, h1, ctx_, ones)
    h1_prev, h = h1, h2
    hs.append(h1 if mutant == "readout_from_gru1" else h2)
    sumctx.append(ctx_)
  hs, sumctx = np.stack(hs), np.stack(sumctx)
  # Readout: basefusion.py:260-267 (tanh(ff_logit_gru(h) + emb + ff_logit_ctx(ctx))) or
  # attention.py:449-458 (+ ff_logit_prev(emb) in place of emb).
  prev = ff(tp, shifted, "ff_logit_prev") if row == "nmt" else shifted
  logit = ff(tp, np.tanh(ff(tp, hs, "ff_logit_gru") + prev + ff(tp, sumctx, "ff_logit_ctx")), "ff_logit")
  logit = logit - logit.max(-1, keepdims=True)
  return logit - np.log(np.exp(logit).sum(-1, keepdims=True))  # :274 (log-softmax)
