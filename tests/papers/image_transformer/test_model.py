"""The Image Transformer and AoANet (jaxcap/papers/image_transformer/model.py) against independent
NumPy code written from the paper's equations (eqs. 4-11 of He et al.; AoANet's AoA).

The NumPy reference works one image, one region pair and one head at a time with explicit
Python loops over the relations / sub-transformers, and is fed the model's own parameters:
the spatial graph (eq. 5) from box coordinates with a plain ``if``; each encoder layer
(eqs. 6-7 in both mask modes, "w/o spatial relations", ordinary layers, AoA) followed by the
FFN (eq. 4); the implicit decoding step (eqs. 8-11) for any M; and the whole model
(projection, every encoder layer, decoder, classifier) for whole captions.

Mutants tried by hand (each made at least one test here fail; then restored):
  1. no residual in the encoder attention sub-layer (``AddNorm(x, y)`` -> ``LayerNorm(y)``);
  2. no LayerNorm after the FFN (``norm2`` returns ``x + y``);
  3. no ReLU on the region projection;
  4. Ω applied before the softmax in "multiply" mode (renormalised weights);
  5. graph: intersection not clamped at zero (the released code's bug);
  6. decoder: the sum instead of the mean over the M sub-transformers;
  7. decoder: LSTM input ``[e_t, Ā]`` without ``c_{t-1}``;
  8. decoder: GLU inputs swapped (``[h_t; att]`` instead of ``[att; h_t]``);
  9. Ω_c not transposed (``child = parent``).

Mutant audit (further mutants, each failed every test_whole_model_matches_numpy case and
AoANet's whole-model test unless noted; decode_step is checked through its equality with
teacher forcing on arbitrary tokens, which covers greedy decoding — the step never sees where
its token came from):
 10. decoder attention without its 1/sqrt(Dh) scale;
 11. decoder attention over padding regions (mask dropped; also fails the decode-step test);
 12. encoder attention scores transposed (queries and keys swapped, ``->brhml``);
 13. Ā over all regions, padding included (also fails the decode-step test);
 14. decoder LSTM state (m, h) swapped on input;
 15. AoA's GLU replaced by its linear half (fails the aoanet, it_layer2_baseline and AoANet cases).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap import config_files
from jaxcap.papers.image_transformer.aoanet import AoANet
from jaxcap.papers.image_transformer.model import (GraphAttention, ImageTransformer,
                                             spatial_graph)
from tests.tiers import one_in_default

D, H, N, F, V = 16, 4, 6, 10, 23

_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


# ----------------------------------------------------------------------------------------------
# NumPy reference, from the paper's equations.


def np_graph(boxes, mask, eps=0.9):
  """Eq. 5 with one pair at a time: ``rel[l, m]`` in {"p", "n", "c", None}."""
  n = len(boxes)
  area = lambda b: max(b[2] - b[0], 0.0) * max(b[3] - b[1], 0.0)
  rel = np.full((n, n), None, object)
  for l in range(n):
    for m in range(n):
      if not (mask[l] and mask[m]):
        continue
      bl, bm = boxes[l], boxes[m]
      inter = max(min(bl[2], bm[2]) - max(bl[0], bm[0]), 0.0) * max(min(bl[3], bm[3]) - max(bl[1], bm[1]), 0.0)
      rl = inter / area(bl) if area(bl) > 0 else 0.0  # zero-area boxes: ratio 0 (documented rule)
      rm = inter / area(bm) if area(bm) > 0 else 0.0
      if rl >= eps and rl > rm:
        rel[l, m] = "p"  # m is l's parent
      elif rm >= eps and rm > rl:
        rel[l, m] = "c"
      else:
        rel[l, m] = "n"
  return rel


def _omegas(rel):
  return [np.vectorize(lambda r, k=k: r == k)(rel).astype(np.float64) for k in ("p", "n", "c")]


def _softmax(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _ln(p, x, eps=1e-6):
  p = p["LayerNorm_0"] if "LayerNorm_0" in p else p
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _glu(x):
  a, b = np.split(x, 2, axis=-1)
  return a * _sigmoid(b)


def _dense(p, x):
  return x @ p["kernel"] + p["bias"]


def np_attention(p, a, mask, omegas, *, relations, graph, mode, aoa):
  """One encoder attention sub-layer for one image ``a [N, D]``: eqs. 6-7 (graph), the mean
  of three plain MHAs (``relations=3, graph=False``), or one MHA; AoA or W_O output."""
  n, d = a.shape
  h = p["query"]["kernel"].shape[1]
  dh = d // h
  out = np.zeros((n, d))
  for l in range(n):
    heads = []
    for hh in range(h):
      q = a[l] @ p["query"]["kernel"][:, hh] + p["query"]["bias"][hh]
      acc = np.zeros(dh)
      for r in range(relations):
        k = a @ p["key"]["kernel"][:, r, hh]  # no key bias (the softmax cancels it)
        v = a @ p["value"]["kernel"][:, r, hh] + p["value"]["bias"][r, hh]
        s = k @ q / np.sqrt(dh)
        if graph and mode == "softmax":
          keep = omegas[r][l] > 0
          w = np.zeros(n)
          if keep.any():
            w[keep] = _softmax(s[keep])
        else:
          w = np.zeros(n)
          w[mask] = _softmax(s[mask])
          if graph:
            w = omegas[r][l] * w  # eq. 6: after the softmax, no renormalisation
        acc += w @ v
      if not graph:
        acc /= relations
      heads.append(acc)
    x = np.concatenate(heads)
    if aoa:
      out[l] = _glu(_dense(p["aoa_proj"], np.concatenate([x, a[l]])))
    else:
      out[l] = np.einsum("hk,hkd->d", x.reshape(h, dh), p["out"]["kernel"]) + p["out"]["bias"]
  return out


def np_encoder_layer(p, a, mask, omegas, *, relations, graph, mode, aoa, ffn):
  am = _ln(p["norm1"], a + np_attention(p["attn"], a, mask, omegas, relations=relations,
                                        graph=graph, mode=mode, aoa=aoa))  # eqs. 3 / 7
  if not ffn:
    return am
  hid = np.maximum(0.0, _dense(p["ffn"]["fc1"], am))
  return _ln(p["norm2"], am + _dense(p["ffn"]["fc2"], hid))  # eq. 4


def _np_lstm(p, x, h, c):
  """flax's LSTM equations (input kernels without bias, hidden kernels with bias)."""
  gate = lambda g: x @ p["i" + g]["kernel"] + h @ p["h" + g]["kernel"] + p["h" + g]["bias"]
  i, f, g, o = _sigmoid(gate("i")), _sigmoid(gate("f")), np.tanh(gate("g")), _sigmoid(gate("o"))
  c = f * c + i * g
  return o * np.tanh(c), c


def np_decode_step(p, a_enc, mask, mean, token, state, num_sub):
  """Eqs. 8-11 for one image: ``(logits [V], state)``; a_enc ``[N, D]`` is A'."""
  h_prev, m_prev, c_prev = state
  x = np.concatenate([p["embed"]["embedding"][token], mean + c_prev])  # eq. 8
  h, m = _np_lstm(p["lstm"], x, h_prev, m_prev)
  heads = p["dec_query"]["kernel"].shape[1]
  dh = h.shape[0] // heads
  subs = []
  for i in range(num_sub):  # eq. 9, one sub-transformer at a time, shared query W_DQ
    parts = []
    for hh in range(heads):
      q = h @ p["dec_query"]["kernel"][:, hh] + p["dec_query"]["bias"][hh]
      k = a_enc @ p["dec_key"]["kernel"][:, i, hh]  # no key bias
      v = a_enc @ p["dec_value"]["kernel"][:, i, hh] + p["dec_value"]["bias"][i, hh]
      w = np.zeros(len(a_enc))
      w[mask] = _softmax((k @ q / np.sqrt(dh))[mask])
      parts.append(w @ v)
    subs.append(np.concatenate(parts))
  c = _glu(_dense(p["glu_proj"], np.concatenate([np.mean(subs, axis=0), h])))  # eq. 10
  return _dense(p["logits_proj"], c), (h, m, c)  # eq. 11 (before the softmax)


def np_encode(p, model, feats, boxes, mask, graph="boxes"):
  """Projection + every encoder layer for one image: ``A' [N, D]``."""
  a = np.maximum(0.0, _dense(p["feat_proj"], feats))
  rel = np_graph(boxes, mask, model.epsilon)
  if graph == "all_neighbour":
    rel = np.where(rel == None, None, "n")  # noqa: E711
  omegas = _omegas(rel)
  for i in range(1, model.num_layers + 1):
    wide = i in model.spatial_layers
    a = np_encoder_layer(p[f"layer_{i}"], a, mask, omegas, relations=3 if wide else 1,
                         graph=wide and model.spatial, mode=model.graph_mask,
                         aoa=model.refine_aoa, ffn=model.ffn)
  return a


def np_forward(p, model, feats, boxes, mask, tokens, graph="boxes"):
  """Teacher-forced logits ``[T, V]`` for one image and one caption."""
  a = np_encode(p, model, feats, boxes, mask, graph)
  mean = a[mask].mean(0)
  state = (np.zeros(model.dim),) * 3
  out = []
  for tok in tokens:
    lg, state = np_decode_step(p, a, mask, mean, tok, state, model.num_sub)
    out.append(lg)
  return np.stack(out)


# ----------------------------------------------------------------------------------------------
# Helpers.


def _np_params(params):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), params)


def _random_boxes(rng, b, n):
  """Random boxes plus, in image 0, the special cases: nested, identical, touching,
  disjoint on both axes, zero-area (a point and a segment)."""
  xy = rng.uniform(0, 0.6, (b, n, 2))
  wh = rng.uniform(0.05, 0.4, (b, n, 2))
  boxes = np.concatenate([xy, xy + wh], -1)
  special = np.array([[0.1, 0.1, 0.9, 0.9],    # 0 big
                      [0.2, 0.2, 0.4, 0.4],    # 1 inside 0
                      [0.2, 0.2, 0.4, 0.4],    # 2 identical to 1
                      [0.4, 0.2, 0.6, 0.4],    # 3 touches 1 / 2 on an edge, inside 0
                      [0.95, 0.95, 1.0, 1.0],  # 4 disjoint from 1 on both axes
                      [0.3, 0.3, 0.3, 0.3]])   # 5 zero area, inside 0 and 1
  boxes[0, :6] = special[:n]
  return boxes.astype(np.float32)


def _tiny_batch(seed=0, b=2, s=2, t=5, boxes=None):
  rng = np.random.default_rng(seed)
  batch = {"feats": rng.normal(size=(b, N, F)).astype(np.float32),
           "feats_mask": np.ones((b, N), bool),
           "boxes": _random_boxes(rng, b, N) if boxes is None else boxes}
  batch["feats_mask"][1, 4:] = False
  batch["boxes"][1, 4:] = 0.0
  # Image 1: a container holding a region (parents / children in the second image as well).
  batch["boxes"][1, 0] = [0.0, 0.0, 0.8, 0.8]
  batch["boxes"][1, 1] = [0.1, 0.1, 0.3, 0.3]
  caps = rng.integers(4, V, size=(b, s, t)).astype(np.int32)
  return batch, shift_right(jnp.asarray(caps))


_MODELS = {
    # name: (class, fields)
    "it": (ImageTransformer, dict(num_sub=3)),
    "it_softmax_m1": (ImageTransformer, dict(num_sub=1, graph_mask="softmax")),
    "it_no_rel": (ImageTransformer, dict(spatial=False, num_sub=2)),
    "it_layer2_baseline": (ImageTransformer, dict(spatial_layers=(2,), refine_aoa=True, ffn=False,
                                                  num_sub=1)),
    "aoanet": (AoANet, dict(num_layers=2)),
}


@functools.lru_cache(maxsize=None)
def _model_and_params(key):
  cls, kw = _MODELS[key]
  model = cls(vocab_size=V, dim=D, num_heads=H, ff_dim=24, dropout=0.0, **kw)
  batch, tokens = _tiny_batch()
  params = _jit(model.init)(jax.random.key(hash(key) % 1000), batch, tokens)
  return model, params


@functools.partial(_jit, static_argnums=(0, 4))
def _train_logits(model, params, batch, tokens, train=False, rngs=None):
  return model.apply(params, batch, tokens, train=train, rngs=rngs)[0]


@functools.partial(_jit, static_argnums=0)
def _decode_step(model, params, enc, cache, tokens, t):
  return model.apply(params, enc, cache, tokens, t, method="decode_step")


# ----------------------------------------------------------------------------------------------
# Eq. 5.


def test_spatial_graph_matches_numpy_with_special_cases():
  rng = np.random.default_rng(3)
  b, n = 4, 9
  boxes = _random_boxes(rng, b, n)
  mask = np.ones((b, n), bool)
  mask[2, 6:] = False
  om = np.asarray(jnp.stack(spatial_graph(jnp.asarray(boxes), jnp.asarray(mask), 0.9)))
  for i in range(b):
    rel = np_graph(boxes[i].astype(np.float64), mask[i])
    for k, name in enumerate("pnc"):
      np.testing.assert_array_equal(om[k, i], rel == name, err_msg=f"image {i} relation {name}")
    valid = mask[i][:, None] & mask[i][None, :]
    np.testing.assert_array_equal(om[:, i].sum(0), valid.astype(int))  # exactly one per valid pair
  np.testing.assert_array_equal(om[0, :, :, :].transpose(0, 2, 1), om[2])  # Ω_c = Ω_pᵀ
  p, nb, c = om[:, 0]
  assert p[1, 0] and c[0, 1]  # nested: 0 is 1's parent
  assert nb[1, 2] and nb[2, 1]  # identical: neighbours
  assert p[3, 0] and nb[1, 3] and nb[3, 1]  # touching: neighbours
  assert nb[1, 4] and nb[4, 1]  # disjoint on both axes: no parent/child (the released code: parent)
  assert nb[5].sum() == n and not p[5].any() and not c[5].any()  # zero area: all neighbours
  assert np.all(np.diag(nb))  # a region is its own neighbour


def test_unclamped_intersection_would_make_disjoint_boxes_parents():
  """The pair used above really distinguishes the clamped overlap from the released code's."""
  small, big = np.array([0.2, 0.2, 0.4, 0.4]), np.array([0.95, 0.95, 1.0, 1.0])
  w, h = min(small[2], big[2]) - max(small[0], big[0]), min(small[3], big[3]) - max(small[1], big[1])
  assert w < 0 and h < 0
  area = lambda b: (b[2] - b[0]) * (b[3] - b[1])
  unclamped = w * h
  assert unclamped / area(big) >= 0.9 and unclamped / area(big) > unclamped / area(small)


# ----------------------------------------------------------------------------------------------
# Eqs. 6-7: the encoding layer in every mode.


@functools.partial(_jit, static_argnums=0)
def _attn_apply(mod, params, a, mask, om):
  return mod.apply({"params": params}, a, mask, om)


@pytest.mark.parametrize("relations,graph,mode,aoa", [
    (3, True, "multiply", False), (3, True, "softmax", False), (3, False, "multiply", False),
    (1, False, "multiply", True)])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_encoding_attention_matches_numpy(relations, graph, mode, aoa):
  rng = np.random.default_rng(5)
  b = 2
  batch, _ = _tiny_batch(seed=5, b=b)
  a = rng.normal(size=(b, N, D)).astype(np.float32)
  mask = batch["feats_mask"]
  om = jnp.stack(spatial_graph(jnp.asarray(batch["boxes"]), jnp.asarray(mask), 0.9))
  mod = GraphAttention(D, H, relations, graph, mode, aoa)
  params = _jit(mod.init)(jax.random.key(1), a, mask, om)["params"]
  out = np.asarray(_attn_apply(mod, params, a, mask, om))
  p64 = _np_params(params)
  for i in range(b):
    omegas = _omegas(np_graph(batch["boxes"][i].astype(np.float64), mask[i]))
    ref = np_attention(p64, a[i].astype(np.float64), mask[i], omegas, relations=relations,
                       graph=graph, mode=mode, aoa=aoa)
    rows = mask[i]
    np.testing.assert_allclose(out[i][rows], ref[rows], rtol=1e-4, atol=1e-5)
  assert np.all(np.isfinite(out))


def test_modes_differ_where_the_graph_bites():
  """After-softmax masking (eq. 6) does not renormalise: it differs from softmax masking."""
  batch, _ = _tiny_batch(seed=5)
  a = np.random.default_rng(6).normal(size=(2, N, D)).astype(np.float32)
  mask = batch["feats_mask"]
  om = jnp.stack(spatial_graph(jnp.asarray(batch["boxes"]), jnp.asarray(mask), 0.9))
  mult = GraphAttention(D, H, 3, True, "multiply")
  params = _jit(mult.init)(jax.random.key(1), a, mask, om)["params"]
  soft = GraphAttention(D, H, 3, True, "softmax")
  diff = np.abs(np.asarray(_attn_apply(mult, params, a, mask, om))
                - np.asarray(_attn_apply(soft, params, a, mask, om)))
  assert diff.max() > 1e-3


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_without_containment_spatial_layer_is_the_sum_of_three_ordinary_mhas():
  """Grid-cell boxes (touching, never containing each other): every pair is a neighbour, so
  the spatial layer is exactly an ordinary multi-head attention (layers.MultiHeadAttention with
  the neighbour projections). With every Ω_i = 1 (no mask) it is the sum of three ordinary
  multi-head attentions (the relation's projections; W_O shared, its bias split in three)."""
  from jaxcap.data.base import grid_boxes
  from jaxcap.models import layers
  g = 3
  boxes = np.broadcast_to(grid_boxes(g), (2, g * g, 4)).copy()
  mask = np.ones((2, g * g), bool)
  om = np.asarray(jnp.stack(spatial_graph(jnp.asarray(boxes), jnp.asarray(mask), 0.9)))
  assert not om[0].any() and not om[2].any() and om[1].all()  # all neighbours
  a = np.random.default_rng(7).normal(size=(2, g * g, D)).astype(np.float32)
  mod = GraphAttention(D, H, 3, True, "multiply")
  params = _jit(mod.init)(jax.random.key(2), a, mask, jnp.asarray(om))["params"]
  ones = jnp.ones_like(jnp.asarray(om))
  spatial = np.asarray(_attn_apply(mod, params, a, mask, ones))
  total = 0.0
  mha = layers.MultiHeadAttention(H, D)
  for r in range(3):
    p = {"query": params["query"],
         "key": {"kernel": params["key"]["kernel"][:, r]},
         "value": {"kernel": params["value"]["kernel"][:, r], "bias": params["value"]["bias"][r]},
         "out": {"kernel": params["out"]["kernel"], "bias": params["out"]["bias"] / 3}}
    total = total + np.asarray(mha.apply({"params": p}, a, a))
  np.testing.assert_allclose(spatial, total, rtol=1e-4, atol=1e-5)
  # And with the grid's own graph (all neighbours), only the neighbour sub-transformer acts.
  neigh = np.asarray(_attn_apply(mod, params, a, mask, jnp.asarray(om)))
  p = {"query": params["query"],
       "key": {"kernel": params["key"]["kernel"][:, 1]},
       "value": {"kernel": params["value"]["kernel"][:, 1], "bias": params["value"]["bias"][1]},
       "out": params["out"]}
  np.testing.assert_allclose(neigh, np.asarray(mha.apply({"params": p}, a, a)), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# The whole model: projection, every encoder layer, the decoder (eqs. 8-11), the classifier.


@pytest.mark.parametrize("key", one_in_default(sorted(_MODELS)))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_whole_model_matches_numpy(key):
  model, params = _model_and_params(key)
  batch, tokens = _tiny_batch(seed=1)
  logits = np.asarray(_train_logits(model, params, batch, tokens))
  p64 = _np_params(params)["params"]
  b, s, t = tokens.shape
  for i in range(b):
    for j in range(s):
      ref = np_forward(p64, model, batch["feats"][i].astype(np.float64),
                       batch["boxes"][i].astype(np.float64), batch["feats_mask"][i],
                       np.asarray(tokens[i, j]))
      np.testing.assert_allclose(logits[i, j], ref, rtol=2e-4, atol=2e-4, err_msg=f"{key} {i} {j}")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_all_neighbour_switch_matches_its_definition():
  """``graph="all_neighbour"`` over the same parameters = the reference with Ω_n = valid."""
  model, params = _model_and_params("it")
  ablated = model.clone(graph="all_neighbour")
  batch, tokens = _tiny_batch(seed=2)
  full = np.asarray(_train_logits(model, params, batch, tokens))
  abl = np.asarray(_train_logits(ablated, params, batch, tokens))
  p64 = _np_params(params)["params"]
  for i in range(2):
    ref = np_forward(p64, model, batch["feats"][i].astype(np.float64),
                     batch["boxes"][i].astype(np.float64), batch["feats_mask"][i],
                     np.asarray(tokens[i, 0]), graph="all_neighbour")
    np.testing.assert_allclose(abl[i, 0], ref, rtol=2e-4, atol=2e-4)
  assert np.abs(full - abl).max() > 1e-4  # the test batch has containment: the graph matters


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_decode_step_equals_teacher_forcing_and_padding_changes_nothing():
  for key in ("it", "aoanet"):
    model, params = _model_and_params(key)
    batch, tokens = _tiny_batch()
    b, s, t = tokens.shape
    logits = np.asarray(_train_logits(model, params, batch, tokens)).reshape(b * s, t, V)
    enc = model.apply(params, batch, method="encode")
    enc = jax.tree.map(lambda x: jnp.repeat(x, s, axis=0), enc)
    cache = model.apply(params, enc, t, method="init_cache")
    flat = tokens.reshape(b * s, t)
    for i in range(t):
      lg, cache, _ = _decode_step(model, params, enc, cache, flat[:, i], jnp.int32(i))
      np.testing.assert_allclose(lg, logits[:, i], rtol=1e-5, atol=1e-5)
    # Padded regions: garbage features and boxes (containing everything) change nothing.
    pad = ~batch["feats_mask"]
    other = dict(batch, feats=np.where(pad[..., None], 99.0, batch["feats"]).astype(np.float32),
                 boxes=np.where(pad[..., None], np.array([0, 0, 1, 1], np.float32), batch["boxes"]))
    np.testing.assert_allclose(np.asarray(_train_logits(model, params, other, tokens)).reshape(b * s, t, V),
                               logits, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_degenerate_boxes_keep_the_model_finite():
  model, params = _model_and_params("it")
  batch, tokens = _tiny_batch()
  boxes = np.zeros_like(batch["boxes"])  # every box zero-area and identical
  logits = np.asarray(_train_logits(model, params, dict(batch, boxes=boxes), tokens))
  assert np.all(np.isfinite(logits))
  # Zero-area boxes are neighbours of everything: the same as the all-neighbour graph.
  abl = np.asarray(_train_logits(model.clone(graph="all_neighbour"), params, batch, tokens))
  np.testing.assert_allclose(logits, abl, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_causality_and_dropout_stream():
  model, params = _model_and_params("it")
  batch, tokens = _tiny_batch()
  logits = np.asarray(_train_logits(model, params, batch, tokens))
  changed = tokens.at[..., 3:].set((tokens[..., 3:] + 5) % V)
  logits2 = np.asarray(_train_logits(model, params, batch, changed))
  np.testing.assert_allclose(logits2[..., :3, :], logits[..., :3, :], rtol=1e-6, atol=1e-6)
  drop = model.clone(dropout=0.5)
  run = lambda k: np.asarray(_train_logits(drop, params, batch, tokens, True, {"dropout": jax.random.key(k)}))
  assert np.abs(run(1) - run(2)).max() > 1e-3
  np.testing.assert_array_equal(run(1), run(1))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_beam_search_runs_through_the_protocol():
  from jaxcap import decoding
  model, params = _model_and_params("it")
  batch, _ = _tiny_batch()
  beam = decoding.beam_search(model, params, batch, beam_size=3, max_len=5)
  assert beam.tokens.shape == (2, 3, 5)
  assert bool(jnp.all(jnp.isfinite(beam.scores[:, 0])))
  greedy = decoding.greedy(model, params, batch, max_len=5)
  assert greedy.tokens.shape == (2, 5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_greedy_decoding_runs():
  from jaxcap import decoding
  model, params = _model_and_params("aoanet")
  batch, _ = _tiny_batch()
  out = decoding.greedy(model, params, batch, max_len=4)
  assert out.tokens.shape == (2, 4)


# ----------------------------------------------------------------------------------------------
# Configs.


@pytest.mark.parametrize("path,arg,layers,spatial,m,aoa", [
    ("image_transformer", "synthetic", 3, (1, 2, 3), 3, False),
    ("image_transformer", "synthetic,spatial_layers=2,M=1,baseline=True", 3, (2,), 1, True),
    ("image_transformer", "synthetic,spatial=False", 3, (1, 2, 3), 3, False),
    ("image_transformer", "coco", 3, (1, 2, 3), 3, False),
    ("aoanet", "synthetic", 3, (), 1, True),
    ("aoanet", "coco", 6, (), 1, True)])
def test_configs_build(path, arg, layers, spatial, m, aoa):
  cfg = config_files.load(f"{path}.py:{arg}")
  model = registry.build(cfg.model, {"vocab_size": 30, "max_len": 16, "feature_dim": 8})
  assert isinstance(model, AoANet if path == "aoanet" else ImageTransformer)
  assert (model.num_layers, model.spatial_layers, model.num_sub, model.refine_aoa) == (layers, spatial, m, aoa)
  if arg == "coco":
    assert model.dim == 1024 and model.epsilon == 0.9 and model.num_heads == 8
    assert cfg.batch_size == 10 and cfg.learning_rate == 2e-3 and cfg.decode.beam_size == 3
    assert cfg.data.min_word_count == 4 and cfg.decay_rate == 0.8


@pytest.mark.parametrize("field,value", [("graph_mask", "before"), ("graph", "none"), ("num_sub", 0),
                                         ("num_heads", 3), ("epsilon", 0.0), ("dropout", 1.0),
                                         ("spatial_layers", "4"), ("spatial", "yes")])
def test_bad_config_is_a_one_line_value_error(field, value):
  import ml_collections
  cfg = ml_collections.ConfigDict({"name": "image_transformer", "dim": 16, "num_heads": 4, field: value})
  with pytest.raises(ValueError, match=f"model.{field}"):
    registry.build(cfg, {"vocab_size": 30, "max_len": 16})
