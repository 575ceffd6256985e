"""The authors' state_dict (aimagelab/meshed-memory-transformer) as M²'s flax variables.

Dimension legend: D model width, H heads, Dh = D / H, F region feature width, V vocabulary,
m memory slots. torch ``Linear`` weights are ``[out, in]``; flax kernels ``[in, out]``.

``to_variables(state, model)`` takes their ``Transformer.state_dict()`` as NumPy arrays (their
names) and the :class:`~jaxcap.papers.m2.model.MeshedMemoryTransformer` it fills, and returns
``{"params": ..., "constants": ...}``. Every parameter of theirs is used or named as dropped
(a checkpoint that does not fit is refused, one line); their decoding-state buffers
(``running_*``) are skipped. Dropped: the key biases of the attentions without memory (the
softmax cancels them exactly; the jaxcap model has none there). Their model has to be the one
this model reads: ``positions="authors"`` (their frozen ``pos_emb`` table), ``meshed="meshed"``
with 3 encoder layers (their decoder's three ``fc_alpha``); the other switches change no
parameter (``pad_mask``, ``mesh_scale``: their code's readings to reproduce it).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxcap.errors import BadInput


def _linear(state, name, use_bias=True):
  out = {"kernel": np.asanyarray(state.pop(f"{name}.weight")).T}
  if use_bias:
    out["bias"] = np.asanyarray(state.pop(f"{name}.bias"))
  return out


def _layer_norm(state, name):
  return {"scale": np.asanyarray(state.pop(f"{name}.weight")), "bias": np.asanyarray(state.pop(f"{name}.bias"))}


def _attention(state, name, h, memory: bool):
  """Their ScaledDotProductAttention(Memory) ``name`` -> the flax ``Attention``."""
  def heads(lin):  # [in, H*Dh] -> [in, H, Dh]
    if lin["kernel"].shape[1] % h:  # their file's width, not jaxcap's: the tensor named
      raise BadInput(f"{name}: a width of {lin['kernel'].shape[1]} does not split into {h} heads; "
                     "expected --heads to divide the attention width (their default: 8)")
    out = {"kernel": lin["kernel"].reshape(lin["kernel"].shape[0], h, -1)}
    if "bias" in lin:
      out["bias"] = lin["bias"].reshape(h, -1)
    return out

  p = {"query": heads(_linear(state, f"{name}.fc_q")),
       "key": heads(_linear(state, f"{name}.fc_k", use_bias=memory)),
       "value": heads(_linear(state, f"{name}.fc_v"))}
  if not memory:
    state.pop(f"{name}.fc_k.bias")  # cancelled by the softmax (module docstring)
  o = _linear(state, f"{name}.fc_o")
  p["out"] = {"kernel": o["kernel"].reshape(h, -1, o["kernel"].shape[1]), "bias": o["bias"]}
  if memory:
    p["memory_k"] = np.asanyarray(state.pop(f"{name}.m_k"))[0]  # [1, m, D] -> [m, D]
    p["memory_v"] = np.asanyarray(state.pop(f"{name}.m_v"))[0]
  return p


def _block(state, name, h, memory=False):
  """Their MultiHeadAttention (attention + LayerNorm) -> ``AttentionBlock``."""
  return {"attn": _attention(state, f"{name}.attention", h, memory),
          "norm": _layer_norm(state, f"{name}.layer_norm")}


def _ffn(state, name):
  return {"fc1": _linear(state, f"{name}.fc1"), "fc2": _linear(state, f"{name}.fc2"),
          "norm": _layer_norm(state, f"{name}.layer_norm")}


def to_variables(state_dict: Mapping[str, np.ndarray], model) -> dict:
  """``{"params", "constants"}`` of ``model`` from their state_dict (module docstring)."""
  if model.positions != "authors" or model.meshed != "meshed" or model.num_layers != 3:
    raise BadInput("m2 import: their model reads positions='authors', meshed='meshed' and "
                     f"3 encoder layers; got positions={model.positions!r}, "
                     f"meshed={model.meshed!r}, num_layers={model.num_layers}")
  state = {k: np.asanyarray(v) for k, v in state_dict.items() if ".running_" not in k}
  h, memory = model.num_heads, model.memory_slots > 0
  n_enc = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layers."))
  n_dec = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("decoder.layers."))
  if (n_enc, n_dec) != (model.num_layers, model.num_dec_layers):
    raise BadInput(f"m2 import: the checkpoint has {n_enc} encoder and {n_dec} decoder layers, "
                     f"the model {model.num_layers} and {model.num_dec_layers}")
  p = {"feat_proj": _linear(state, "encoder.fc"), "feat_norm": _layer_norm(state, "encoder.layer_norm")}
  for i in range(n_enc):
    e = f"encoder.layers.{i}"
    p[f"enc_layers_{i}"] = {"self_attn": _block(state, f"{e}.mhatt", h, memory),
                            "ffn": _ffn(state, f"{e}.pwff")}
  p["embed"] = {"embedding": state.pop("decoder.word_emb.weight")}
  for i in range(n_dec):
    d = f"decoder.layers.{i}"
    layer = {"self_attn": _block(state, f"{d}.self_att", h), "enc_attn": _block(state, f"{d}.enc_att", h),
             "ffn": _ffn(state, f"{d}.pwff")}
    for j in range(model.num_layers):
      layer[f"gate_{j}"] = _linear(state, f"{d}.fc_alpha{j + 1}")
    p[f"dec_layers_{i}"] = layer
  p["logits_proj"] = _linear(state, "decoder.fc", use_bias=False)
  positions = state.pop("decoder.pos_emb.weight")
  if positions.shape[0] != model.max_positions + 1:
    raise BadInput(f"m2 import: the checkpoint's position table has {positions.shape[0]} rows; "
                     f"expected model.max_positions + 1 = {model.max_positions + 1}")
  if state:
    raise BadInput(f"m2 import: parameters the model does not read: {sorted(state)[:5]}")
  return {"params": p, "constants": {"positions": positions}}
