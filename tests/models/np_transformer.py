"""NumPy references of the whole Transformer captioner (Vaswani et al., 2017) and of the whole
ETA-Transformer (Li et al., ICCV 2019), written from the papers' equations.

Dimension legend: N regions, A attributes, T caption positions, D model width, H heads,
Dh = D / H, F feed-forward width, V vocabulary.

Everything works on ONE image in float64, one head at a time, with explicit loops, and is fed
the model's own parameters (flax's parameter names are the only thing shared with jaxcap):

- sets are cut to their real elements before anything runs (``feats[mask]``,
  ``attributes[attributes != PAD]``), so padding cannot leak in by construction, and no mask
  of the model's is reproduced;
- the decoder's self-attention at position t only ever sees positions <= t (a slice, not a
  mask);
- sinusoidal positions are computed from the formula of Vaswani et al. sec. 3.5,
  ``PE(pos, 2i) = sin(pos / 10000^(2i/D))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/D))``;
- a missing key bias (``p["key"].get("bias")``) is read as zero, so the references hold
  whether or not the key projections carry a bias.

Paper points (Vaswani et al.): post-norm residual sub-layers ``LayerNorm(x + Sublayer(x))``
(sec. 3.1, eps 1e-6 as flax), multi-head attention ``Concat(head_i) W^O`` with
``head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(Dh)) V W_i^V`` (sec. 3.2.2), FFN
``max(0, x W1 + b1) W2 + b2`` (eq. 2), embeddings multiplied by sqrt(D) (sec. 3.4).
ETA (sec. 4): visual input ``V^0`` a *linear* projection of the regions, ``S^0`` the attributes
through the decoder's (shared) word embedding, N encoder blocks each (eqs. 4-5); decoder
block eqs. 7-12 with every attention followed by a residual connection and LayerNorm, the FFN
sub-layer after the GBC output ``e``. jaxcap's documented choices where the paper leaves room
(eta.py's docstring): attribute embeddings scaled by sqrt(D), no positions on regions or
attributes (sets), no residual around the GBC, a bias in W_c, an empty attribute set
contributing zero to its attentions.
"""

from __future__ import annotations

import functools

import numpy as np
import jax
import jax.numpy as jnp

PAD = 0


def as_np(tree):
  """The flax parameter tree as nested dicts of float64 NumPy arrays."""
  if isinstance(tree, dict) or hasattr(tree, "items"):
    return {k: as_np(v) for k, v in tree.items()}
  return np.asarray(tree, np.float64)


def layer_norm(p, x, eps=1e-6):
  p = p.get("LayerNorm_0", p)
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def linear(p, x):
  return x @ p["kernel"] + (p["bias"] if "bias" in p else 0.0)


def positional_encoding(length, dim):
  """``[length, dim]``: PE(pos, 2i) = sin(pos / 10000^(2i/dim)), PE(pos, 2i+1) = cos(.)."""
  pe = np.zeros((length, dim))
  for pos in range(length):
    for i in range(0, dim, 2):
      angle = pos / 10000.0 ** (i / dim)
      pe[pos, i] = np.sin(angle)
      if i + 1 < dim:
        pe[pos, i + 1] = np.cos(angle)
  return pe


def multihead(p, queries_LxD, keys_MxD):
  """MultiHead(Q, K, K) over an (unmasked) key set; an empty key set contributes zero."""
  w_q, w_k, w_v, w_o = (p[n]["kernel"] for n in ("query", "key", "value", "out"))
  heads = w_q.shape[1]
  if len(keys_MxD) == 0:
    return np.zeros((len(queries_LxD), w_o.shape[-1]))
  out = []
  for h in range(heads):
    q = queries_LxD @ w_q[:, h] + p["query"]["bias"][h]
    k = keys_MxD @ w_k[:, h] + (p["key"]["bias"][h] if p["key"].get("bias") is not None else 0.0)
    v = keys_MxD @ w_v[:, h] + p["value"]["bias"][h]
    out.append(softmax(q @ k.T / np.sqrt(q.shape[-1])) @ v)
  return np.concatenate(out, -1) @ w_o.reshape(-1, w_o.shape[-1]) + p["out"]["bias"]


def causal_self_attention(p, x_TxD):
  """Eq. 7 / Vaswani's masked self-attention: position t attends to x[:t+1] only."""
  return np.stack([multihead(p, x_TxD[t:t + 1], x_TxD[:t + 1])[0] for t in range(len(x_TxD))])


def ffn(p, x):
  return linear(p["fc2"], np.maximum(linear(p["fc1"], x), 0.0))


def encoder_block(p, x_MxD):
  """Eqs. 4-5 with the residual connection and LayerNorm after each sub-layer."""
  m = layer_norm(p["norm1"], x_MxD + multihead(p["self_attn"], x_MxD, x_MxD))
  return layer_norm(p["norm2"], m + ffn(p["ffn"], m))


def encoder(p, x_MxD):
  for i in range(len(p or {})):
    x_MxD = encoder_block(p[f"layer_{i}"], x_MxD)
  return x_MxD


def embed_words(embedding_VxD, tokens_T):
  d = embedding_VxD.shape[1]
  return embedding_VxD[np.asarray(tokens_T)] * np.sqrt(d) + positional_encoding(len(tokens_T), d)


def classifier(p, x_TxD):
  if "logits_proj" in p:
    return linear(p["logits_proj"], x_TxD)
  return x_TxD @ p["embed"]["embedding"].T  # tied to the word embedding


# --- the Transformer captioner ------------------------------------------------------------------


def transformer_encode(p, feats_NxF, mask_N, region_activation="relu"):
  """Region projection (+ ReLU unless linear) and the encoder stack, over real regions only."""
  x = linear(p["feat_proj"], feats_NxF[np.asarray(mask_N, bool)])
  if region_activation == "relu":
    x = np.maximum(x, 0.0)
  return encoder(p.get("encoder"), x)  # zero blocks: no "encoder" parameters


def transformer_decoder_block(p, h_TxD, memory_MxD):
  a = layer_norm(p["norm1"], h_TxD + causal_self_attention(p["self_attn"]["mha"], h_TxD))
  c = layer_norm(p["norm2"], a + multihead(p["cross_attn"], a, memory_MxD))
  return layer_norm(p["norm3"], c + ffn(p["ffn"], c))


def transformer_logits(p, feats_NxF, mask_N, tokens_T, region_activation="relu"):
  """Teacher-forced logits ``[T, V]`` of one image and one decoder input sequence."""
  memory = transformer_encode(p, feats_NxF, mask_N, region_activation)
  h = embed_words(p["embed"]["embedding"], tokens_T)
  for i in range(sum(k.startswith("dec_layers_") for k in p)):
    h = transformer_decoder_block(p[f"dec_layers_{i}"], h, memory)
  return classifier(p, h)


# --- the ETA-Transformer ------------------------------------------------------------------------

F_ACT = {"identity": lambda x: x, "sigmoid": sigmoid, "tanh": np.tanh,
         "relu": lambda x: np.maximum(x, 0.0)}


def eta_encode(p, feats_NxF, mask_N, attributes_A, variant="eta", visual_encoder=True,
               semantic_encoder=True):
  """Dual-way encoder (sec. 4.1): ``(V^N [n_v, D] or None, S^N [n_s, D] or None)``; a removed
  sub-encoder (Table 4's "- Encoder" rows) passes its input through."""
  v = s = None
  if variant != "transformer_s":  # V^0: a linear transformation of the real regions
    v = linear(p["feat_proj"], feats_NxF[np.asarray(mask_N, bool)])
    v = encoder(p["v_encoder"], v) if visual_encoder else v
  if variant != "transformer_v":  # S^0: the shared word embedding of the real attributes
    emb = p["embed"]["embedding"]
    attrs = np.asarray(attributes_A)
    s = emb[attrs[attrs != PAD]] * np.sqrt(emb.shape[1])
    s = encoder(p["s_encoder"], s) if semantic_encoder else s
  return v, s


def eta_decoder_block(p, h_TxD, v_mem, s_mem, variant, f="identity"):
  """Eqs. 7-12 (+ the FFN sub-layer) of one multimodal decoder block."""
  a = layer_norm(p["self_norm"], h_TxD + causal_self_attention(p["self_attn"]["mha"], h_TxD))

  def att(name, q, memory):  # MultiHead(q, memory, memory) + residual + LayerNorm
    return layer_norm(p[f"attn_norm_{name}"], q + multihead(p[f"attn_{name}"], q, memory))

  if variant == "transformer_v":
    e = att("a_v", a, v_mem)
  elif variant == "transformer_s":
    e = att("a_s", a, s_mem)
  elif variant == "stacked_v":  # semantic guidance, then the visual attention (eqs. 9-10)
    e = att("gs_v", att("a_s", a, s_mem), v_mem)
  elif variant == "stacked_s":  # visual guidance, then the semantic attention
    e = att("gv_s", att("a_v", a, v_mem), s_mem)
  else:
    g_s = att("a_s", a, s_mem)  # eq. 9
    g_v = att("a_v", a, v_mem)
    if variant == "eta":
      v_t, s_t = att("gs_v", g_s, v_mem), att("gv_s", g_v, s_mem)  # eq. 10 and its mirror
    else:  # parallel: no preliminary-modality injection
      v_t, s_t = g_v, g_s
    c = sigmoid(linear(p["gate"], np.concatenate([g_s, g_v, a], -1)))  # eq. 11
    e = F_ACT[f](v_t) * c + F_ACT[f](s_t) * (1.0 - c)  # eq. 12
  return layer_norm(p["ffn_norm"], e + ffn(p["ffn"], e))


def eta_logits(p, feats_NxF, mask_N, attributes_A, tokens_T, variant="eta", f="identity",
               visual_encoder=True, semantic_encoder=True):
  """Teacher-forced logits ``[T, V]`` of one image for any ETA variant (late fusion: the
  normalised mean of its two members' log-probabilities)."""
  if variant == "late_fusion":
    # Transformer_v: the linear region projection of sec. 4.1 / 5.2, as in every other row.
    lv = transformer_logits(p["member_v"], feats_NxF, mask_N, tokens_T, "linear")
    ls = eta_logits(p["member_s"], feats_NxF, mask_N, attributes_A, tokens_T, "transformer_s",
                    semantic_encoder=semantic_encoder)
    return log_softmax(0.5 * (log_softmax(lv) + log_softmax(ls)))
  v_mem, s_mem = eta_encode(p, feats_NxF, mask_N, attributes_A, variant, visual_encoder,
                            semantic_encoder)
  h = embed_words(p["embed"]["embedding"], tokens_T)
  for i in range(sum(k.startswith("dec_layers_") for k in p)):
    h = eta_decoder_block(p[f"dec_layers_{i}"], h, v_mem, s_mem, variant, f)
  return classifier(p, h)


def log_softmax(x):
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@functools.partial(jax.jit, static_argnums=(0, 4),
                   compiler_options={"xla_backend_optimization_level": 0})
def run_model(model, params, batch, tokens, steps):
  """What the references are compared with (jaxcap side): teacher-forced logits
  ``[B, S, T, V]`` and ``steps`` greedy decode steps through the decoder protocol: logits
  ``[B, steps, V]`` and the tokens fed ``[B, steps]`` (BOS, then each step's argmax)."""
  from jaxcap.data.vocab import BOS
  train_logits, _ = model.apply(params, batch, tokens)
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, steps, method="init_cache")

  def body(carry, t):
    cache, tok = carry
    logits, cache, _ = model.apply(params, enc, cache, tok, t, method="decode_step")
    return (cache, jnp.argmax(logits, -1).astype(jnp.int32)), (logits, tok)

  start = jnp.full((tokens.shape[0],), BOS, jnp.int32)
  _, (step_logits, fed) = jax.lax.scan(body, (cache, start), jnp.arange(steps, dtype=jnp.int32))
  return train_logits, step_logits.swapaxes(0, 1), fed.swapaxes(0, 1)
