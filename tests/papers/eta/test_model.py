"""ETA-Transformer: one decoder block against an independent NumPy implementation of the
paper's eqs. 7-12 (every variant, every f), gate overrides, masking, causality, caching.

Dimension legend: B batch, T positions, N regions, A attributes, D width, H heads, V vocab.

Mutant tried: the Transformer's ReLU after the region projection kept for
``region_activation="linear"`` fails test_transformer_region_activation[linear].
"""

import numpy as np
import jax
import jax.numpy as jnp
import ml_collections
import pytest

from jaxcap.data.vocab import EOS
from jaxcap.models import registry
from jaxcap.models.base import repeat_batch, shift_right
from jaxcap.papers.eta.model import ETACaptioner, ETADecoderBlock
from jaxcap.models.transformer import TransformerCaptioner
from tests.tiers import one_in_default

D, H, FF = 16, 2, 24
B, T, N, A = 3, 5, 6, 4


# --- NumPy reference (written from the paper, not from the jaxcap code) -------------------------


def np_layer_norm(x, p, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_multihead(p, q_LxD, kv_MxD, mask_LxM):
  """Eq. 3: Concat(head_1..head_h) W^O, head_i = softmax(Q_i K_i^T / sqrt(d_h)) V_i.

  An empty key set (no True in a row) contributes zero (jaxcap's documented convention for an
  image without attributes).
  """
  out = np.zeros((q_LxD.shape[0], p["out"]["kernel"].shape[-1]))
  if not mask_LxM.any():
    return out
  heads = []
  for h in range(p["query"]["kernel"].shape[1]):
    qh = q_LxD @ p["query"]["kernel"][:, h] + p["query"]["bias"][h]
    kh = kv_MxD @ p["key"]["kernel"][:, h]  # no key bias (the softmax cancels it)
    vh = kv_MxD @ p["value"]["kernel"][:, h] + p["value"]["bias"][h]
    scores = qh @ kh.T / np.sqrt(qh.shape[-1])
    scores = np.where(mask_LxM, scores, -np.inf)
    heads.append(np_softmax(scores) @ vh)
  concat = np.concatenate(heads, axis=-1)
  w_o = p["out"]["kernel"].reshape(-1, p["out"]["kernel"].shape[-1])
  return concat @ w_o + p["out"]["bias"]


def np_sublayer(p_norm, x, y):
  """Residual connection followed by layer normalisation."""
  return np_layer_norm(x + y, p_norm["LayerNorm_0"])


F_NP = {"identity": lambda x: x, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh,
        "relu": lambda x: np.maximum(x, 0)}


def np_block(p, h_TxD, v_NxD, v_mask_N, s_AxD, s_mask_A, variant, f="identity", force=None):
  """One multimodal decoder block for one image, eqs. 7-12; returns (output, gate or None)."""
  t = h_TxD.shape[0]
  causal = np.tril(np.ones((t, t), bool))
  a = np_sublayer(p["self_norm"], h_TxD, np_multihead(p["self_attn"]["mha"], h_TxD, h_TxD, causal))

  def att(name, q, memory):
    mem, m = (v_NxD, v_mask_N) if memory == "v" else (s_AxD, s_mask_A)
    mask = np.broadcast_to(m[None], (q.shape[0], m.shape[0]))
    return np_sublayer(p[f"attn_norm_{name}"], q, np_multihead(p[f"attn_{name}"], q, mem, mask))

  c = None
  if variant == "transformer_v":
    e = att("a_v", a, "v")
  elif variant == "transformer_s":
    e = att("a_s", a, "s")
  elif variant == "stacked_v":  # SA_v: g_s = MH(a, S), v = MH(g_s, V)
    e = att("gs_v", att("a_s", a, "s"), "v")
  elif variant == "stacked_s":
    e = att("gv_s", att("a_v", a, "v"), "s")
  else:
    g_s = att("a_s", a, "s")  # eq. 9
    g_v = att("a_v", a, "v")
    if variant == "eta":
      v = att("gs_v", g_s, "v")  # eq. 10
      s = att("gv_s", g_v, "s")
    else:  # parallel: GBC over MH(a, V) and MH(a, S)
      v, s = g_v, g_s
    z = np.concatenate([g_s, g_v, a], axis=-1) @ p["gate"]["kernel"] + p["gate"]["bias"]
    c = 1 / (1 + np.exp(-z))  # eq. 11
    if force is not None:
      c = np.full_like(c, force)
    e = F_NP[f](v) * c + F_NP[f](s) * (1 - c)  # eq. 12
  ffn = p["ffn"]
  hidden = np.maximum(e @ ffn["fc1"]["kernel"] + ffn["fc1"]["bias"], 0)
  out = np_sublayer(p["ffn_norm"], e, hidden @ ffn["fc2"]["kernel"] + ffn["fc2"]["bias"])
  return out, c


# --- helpers ----------------------------------------------------------------------------------


def block_inputs(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, T, D)).astype(np.float32)
  v_mem = rng.normal(size=(B, N, D)).astype(np.float32)
  s_mem = rng.normal(size=(B, A, D)).astype(np.float32)
  v_mask = np.ones((B, N), bool)
  v_mask[0, 4:] = False
  s_mask = np.ones((B, A), bool)
  s_mask[0, 2:] = False
  s_mask[1, :] = False  # an image whose attributes are all padding
  return x, v_mem, v_mask, s_mem, s_mask


def perturb(params, seed=1, scale=0.3):
  """Random offsets on every parameter, so LayerNorm scales/biases are not the identity."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype)
                                   for x, k in zip(leaves, keys)])


def init_block(variant, f="identity", force=None, seed=0):
  block = ETADecoderBlock(D, H, FF, dropout=0.0, variant=variant, gbc_activation=f,
                          force_gate=force)
  inputs = block_inputs()
  params = block.init(jax.random.PRNGKey(seed), *inputs, method=ETADecoderBlock.forward)
  return block, perturb(params, seed + 1), inputs


def run_block(block, params, inputs):
  out, c = block.apply(params, *inputs, method=ETADecoderBlock.forward)
  return np.asarray(out), (None if c is None else np.asarray(c))


def np_params(params):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), params["params"])


def assert_block_matches(block, params, inputs, variant, f="identity", force=None):
  out, c = run_block(block, params, inputs)
  x, v_mem, v_mask, s_mem, s_mask = [np.asarray(a, np.float64) if a.dtype != bool else a
                                     for a in inputs]
  p = np_params(params)
  for b in range(B):
    ref, ref_c = np_block(p, x[b], v_mem[b], v_mask[b], s_mem[b], s_mask[b], variant, f, force)
    np.testing.assert_allclose(out[b], ref, rtol=2e-4, atol=2e-4)
    if ref_c is not None:
      np.testing.assert_allclose(c[b], ref_c, rtol=2e-4, atol=2e-5)
  return out


# --- the decoder block ------------------------------------------------------------------------


@pytest.mark.parametrize("f", one_in_default(["identity", "sigmoid", "tanh", "relu"]))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_eta_block_matches_numpy_eqs_7_to_12(f):
  block, params, inputs = init_block("eta", f)
  out = assert_block_matches(block, params, inputs, "eta", f)
  assert np.isfinite(out).all()


@pytest.mark.parametrize("variant", ["parallel", "stacked_v", "stacked_s", "transformer_s",
                                     "transformer_v"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_variant_blocks_match_their_definitions(variant):
  block, params, inputs = init_block(variant)
  assert_block_matches(block, params, inputs, variant)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_parallel_has_no_injection_and_stacked_has_no_gate():
  names = lambda v: set(init_block(v)[1]["params"])
  assert {"attn_gs_v", "attn_gv_s"}.isdisjoint(names("parallel")) and "gate" in names("parallel")
  assert "gate" not in names("stacked_v") and "attn_a_v" not in names("stacked_v")
  assert "gate" not in names("stacked_s") and "attn_a_s" not in names("stacked_s")


@pytest.mark.parametrize("force,pathway", [(1.0, "stacked_v"), (0.0, "stacked_s")])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_forced_gate_keeps_one_pathway(force, pathway):
  """c = 1 leaves the visual pathway alone (e = v), c = 0 the semantic one (e = s): the ETA
  block then equals the stacked block built from the same weights."""
  block, params, inputs = init_block("eta", force=force)
  out = assert_block_matches(block, params, inputs, "eta", force=force)
  sub = ETADecoderBlock(D, H, FF, dropout=0.0, variant=pathway)
  sub_params = sub.init(jax.random.PRNGKey(5), *inputs, method=ETADecoderBlock.forward)
  shared = {k: params["params"][k] for k in sub_params["params"]}
  sub_out, _ = run_block(sub, {"params": shared}, inputs)
  np.testing.assert_allclose(out, sub_out, rtol=1e-5, atol=1e-5)
  free_out, _ = run_block(init_block("eta")[0], params, inputs)
  assert not np.allclose(free_out, out, atol=1e-3)  # the gate really mixes both pathways


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_block_ignores_padded_memory_values():
  block, params, inputs = init_block("eta")
  x, v_mem, v_mask, s_mem, s_mask = inputs
  rng = np.random.default_rng(7)
  v2 = np.where(v_mask[..., None], v_mem, 100 * rng.normal(size=v_mem.shape)).astype(np.float32)
  s2 = np.where(s_mask[..., None], s_mem, 100 * rng.normal(size=s_mem.shape)).astype(np.float32)
  out, c = run_block(block, params, inputs)
  out2, c2 = run_block(block, params, (x, v2, v_mask, s2, s_mask))
  np.testing.assert_allclose(out, out2, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(c, c2, rtol=1e-6, atol=1e-6)


# --- the whole captioner ----------------------------------------------------------------------

V, F_IN, MAXLEN = 30, 7, 6


def make_batch(seed=0, num_attr=A):
  rng = np.random.default_rng(seed)
  mask = np.ones((2, N), bool)
  mask[0, 3:] = False
  feats = np.where(mask[..., None], rng.normal(size=(2, N, F_IN)), 0).astype(np.float32)
  attrs = np.zeros((2, num_attr), np.int32)
  attrs[0, :3] = [5, 9, 11]
  attrs[1, :1] = [7]
  caps = rng.integers(4, V, size=(2, 2, MAXLEN + 1)).astype(np.int32)
  return {"feats": feats, "feats_mask": mask, "attributes": attrs, "captions": caps}


def make_model(variant="eta", **kw):
  kw.setdefault("dropout", 0.0)
  model = ETACaptioner(V, max_len=MAXLEN, dim=D, num_layers=1, num_dec_layers=2, num_heads=H,
                       ff_dim=FF, variant=variant, **kw)
  batch = make_batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  params = perturb(model.init(jax.random.PRNGKey(0), batch, tokens), scale=0.1)
  return model, params, batch


def teacher_forced(model, params, batch, tokens_BxT):
  # Eager on purpose: compiled primitives are shared by every test and variant, whereas each
  # jitted variant would pay a whole-program compile on the 2-core CI host.
  enc = model.apply(params, batch, method=model.encode)
  return model.apply(params, enc, tokens_BxT, method=model.decode_train)


@pytest.mark.parametrize("variant", one_in_default(["eta", "stacked_v", "transformer_s", "late_fusion"]))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_cached_decode_step_equals_decode_train(variant):
  model, params, batch = make_model(variant)
  tokens = shift_right(jnp.asarray(batch["captions"][:, 0]))
  logits, aux = teacher_forced(model, params, batch, tokens)
  enc = model.apply(params, batch, method=model.encode)
  cache = model.apply(params, enc, tokens.shape[1], method=model.init_cache)
  for t in range(tokens.shape[1]):
    step_logits, cache, step_aux = model.apply(params, enc, cache, tokens[:, t], jnp.int32(t),
                                               method=model.decode_step)
    np.testing.assert_allclose(step_logits, logits[:, t], rtol=1e-4, atol=1e-4)
    if "gbc_gate" in aux:
      np.testing.assert_allclose(step_aux["gbc_gate"], aux["gbc_gate"][:, t], atol=1e-5)
      assert step_aux["gbc_gate_layers"].shape == (2, 2)
  assert ("gbc_gate" in aux) == (variant == "eta")


@pytest.mark.parametrize("variant", ["eta", "late_fusion"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_decoder_is_causal(variant):
  model, params, batch = make_model(variant)
  tokens = np.asarray(shift_right(jnp.asarray(batch["captions"][:, 0])))
  base, _ = teacher_forced(model, params, batch, jnp.asarray(tokens))
  j = 4
  changed = tokens.copy()
  changed[:, j:] = (changed[:, j:] + 3) % V
  out, _ = teacher_forced(model, params, batch, jnp.asarray(changed))
  np.testing.assert_allclose(out[:, :j], base[:, :j], rtol=1e-5, atol=1e-5)
  assert not np.allclose(out[:, j:], base[:, j:], atol=1e-3)


@pytest.mark.parametrize("variant", ["eta", "parallel", "stacked_s"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_attribute_padding_and_order_do_not_change_the_output(variant):
  model, params, batch = make_model(variant)
  tokens = shift_right(jnp.asarray(batch["captions"][:, 0]))
  base, _ = teacher_forced(model, params, batch, tokens)
  padded = dict(batch, attributes=np.concatenate([batch["attributes"][:, ::-1],
                                                  np.zeros((2, 5), np.int32)], axis=1))
  out, _ = teacher_forced(model, params, padded, tokens)
  np.testing.assert_allclose(out, base, rtol=1e-5, atol=1e-5)
  # The attributes do matter (so the comparison above could fail).
  other = dict(batch, attributes=np.where(batch["attributes"] > 0, batch["attributes"] + 1, 0))
  assert not np.allclose(teacher_forced(model, params, other, tokens)[0], base, atol=1e-4)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_region_padding_values_do_not_change_the_output():
  model, params, batch = make_model("eta")
  tokens = shift_right(jnp.asarray(batch["captions"][:, 0]))
  base, _ = teacher_forced(model, params, batch, tokens)
  noisy = np.where(batch["feats_mask"][..., None], batch["feats"], 50.0).astype(np.float32)
  out, _ = teacher_forced(model, params, dict(batch, feats=noisy), tokens)
  np.testing.assert_allclose(out, base, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["eta", "transformer_s"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_all_padding_attributes_give_finite_logits(variant):
  model, params, batch = make_model(variant)
  empty = dict(batch, attributes=np.zeros_like(batch["attributes"]))
  tokens = shift_right(jnp.asarray(batch["captions"][:, 0]))
  out, _ = teacher_forced(model, params, empty, tokens)
  assert np.isfinite(np.asarray(out)).all()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_semantic_encoder_shares_the_decoder_word_embedding():
  model, params, batch = make_model("transformer_s")
  assert "embed" in params["params"] and not any("attr" in k for k in params["params"])
  tokens = shift_right(jnp.asarray(batch["captions"][:, 0]))
  base, _ = teacher_forced(model, params, batch, tokens)
  # Changing only the embedding row of an attribute word (never a decoder input here) changes
  # the output through the semantic encoder.
  assert 5 not in np.asarray(tokens)[0]
  p2 = jax.tree.map(lambda x: x, params)
  p2["params"]["embed"]["embedding"] = params["params"]["embed"]["embedding"].at[5].add(1.0)
  out, _ = teacher_forced(model, p2, batch, tokens)
  assert not np.allclose(np.asarray(out)[0], np.asarray(base)[0], atol=1e-4)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_encoder_removed_variants_have_no_encoder_blocks():
  model, params, _ = make_model("eta", visual_encoder=False, semantic_encoder=True)
  assert "v_encoder" not in params["params"] and "s_encoder" in params["params"]
  model, params, _ = make_model("eta", visual_encoder=True, semantic_encoder=False)
  assert "v_encoder" in params["params"] and "s_encoder" not in params["params"]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_late_fusion_averages_member_log_probabilities():
  model, params, batch = make_model("late_fusion")
  tokens = shift_right(jnp.asarray(batch["captions"][:, 0]))
  fused, _ = teacher_forced(model, params, batch, tokens)
  member_v = TransformerCaptioner(V, MAXLEN, D, 1, 2, H, FF, 0.0, region_activation="linear")
  member_s = ETACaptioner(V, max_len=MAXLEN, dim=D, num_layers=1, num_dec_layers=2, num_heads=H,
                          ff_dim=FF, dropout=0.0, variant="transformer_s")
  lv, _ = teacher_forced(member_v, {"params": params["params"]["member_v"]}, batch, tokens)
  ls, _ = teacher_forced(member_s, {"params": params["params"]["member_s"]}, batch, tokens)

  def np_log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

  avg = 0.5 * (np_log_softmax(lv) + np_log_softmax(ls))
  np.testing.assert_allclose(fused, np_log_softmax(avg), rtol=1e-5, atol=1e-5)
  # Normalised log-probabilities: a further log_softmax (as the decoder applies) is a no-op.
  np.testing.assert_allclose(jax.nn.log_softmax(fused), fused, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_call_gives_logits_for_every_caption():
  model, params, batch = make_model("eta")
  tokens = shift_right(jnp.asarray(batch["captions"]))
  logits, aux = model.apply(params, batch, tokens)
  assert logits.shape == (2, 2, MAXLEN + 1, V) and logits.dtype == jnp.float32
  assert aux["gbc_gate"].shape == (4, MAXLEN + 1)
  assert ((aux["gbc_gate"] > 0) & (aux["gbc_gate"] < 1)).all()


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["eta", "stacked_v", "late_fusion"])
def test_grouped_training_equals_repeating_the_image(variant):
  """``__call__`` runs each image's captions as one sequence against one copy of its
  keys/values; logits, gates and parameter gradients must equal the S-fold repeated path."""
  model, params, batch = make_model(variant)
  tokens = shift_right(jnp.asarray(batch["captions"]))
  b, s, t = tokens.shape
  # Image 0 keeps 3 of its N regions (make_batch), so its masks differ from image 1's.

  def grouped(p):
    return model.apply(p, batch, tokens)

  def repeated(p):
    enc = repeat_batch(model.apply(p, batch, method=model.encode), s)
    logits, aux = model.apply(p, enc, tokens.reshape(b * s, t), method=model.decode_train)
    return logits.reshape(b, s, t, -1), aux

  (lg, ag), (lr, ar) = grouped(params), repeated(params)
  np.testing.assert_allclose(lg, lr, rtol=1e-5, atol=1e-5)
  assert ag.keys() == ar.keys()
  for k in ag:
    np.testing.assert_allclose(ag[k], ar[k], rtol=1e-5, atol=1e-6)
  w = jax.random.normal(jax.random.PRNGKey(5), lg.shape)
  g1 = jax.grad(lambda p: jnp.sum(w * grouped(p)[0]))(params)
  g2 = jax.grad(lambda p: jnp.sum(w * repeated(p)[0]))(params)
  # The embedding gradient sums one contribution per token occurrence in float32, in another
  # order for the two layouts (3.7e-5 on an entry of 0.158 measured); a wrong grouping moves
  # the gradients by orders of magnitude more.
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=5e-5, err_msg=jax.tree_util.keystr(path))


# --- configs ----------------------------------------------------------------------------------


INFO = {"vocab_size": V, "max_len": MAXLEN, "feature_dim": F_IN, "num_attributes": 10}


@pytest.mark.parametrize("arg,name,variant", [
    ("synthetic", "eta", "eta"),
    ("synthetic,variant=stacked_v,gbc=tanh", "eta", "stacked_v"),
    ("synthetic,variant=transformer_v", "transformer", None),
    ("synthetic,variant=late_fusion", "eta", "late_fusion"),
    ("coco,variant=parallel,gbc=relu,visual_encoder=False", "eta", "parallel"),
])
def test_config_selects_the_ablation(arg, name, variant):
  from jaxcap.papers.eta.configs import eta as eta_config
  c = eta_config.get_config(arg)
  assert c.model.name == name and c.model.get("variant") == variant
  model = registry.build(c.model, INFO)
  if name == "eta":
    assert isinstance(model, ETACaptioner) and model.variant == variant
    assert model.gbc_activation == c.model.gbc_activation
  else:
    assert isinstance(model, TransformerCaptioner)


def test_config_defaults_follow_the_paper():
  from jaxcap.papers.eta.configs import eta as eta_config
  c = eta_config.get_config("coco")
  m = c.model
  assert (m.dim, m.num_layers, m.num_dec_layers, m.ff_dim, m.num_heads) == (512, 6, 6, 2048, 8)
  assert c.batch_size * c.data.seq_per_img == 75 and c.warmup_steps == 20000
  assert (c.adam_b1, c.adam_b2, c.schedule) == (0.9, 0.98, "noam")
  assert c.data.attributes == "detected" and 0 < c.scst.start_step < c.num_train_steps
  s = eta_config.get_config("synthetic")
  assert s.data.attributes == "noisy" and s.data.attr_noise > 0 and s.model.dim < 512
  # ETA^oracle: trained on the default (noisy / detected) attributes, tested on ground truth.
  o = eta_config.get_config("synthetic,attributes=oracle").data
  assert (o.attributes, o.test_attributes, o.attr_noise) == ("noisy", "oracle", 0.3)
  o = eta_config.get_config("coco,attributes=oracle").data
  assert (o.attributes, o.test_attributes) == ("detected", "oracle")
  o = eta_config.get_config("synthetic,attributes=oracle_all").data  # the first tables' oracle
  assert (o.attributes, o.test_attributes, o.attr_noise) == ("oracle", "", 0.0)
  assert eta_config.get_config("coco").data.test_attributes == ""


def test_config_transformer_v_has_eta_s_linear_region_projection_and_xe_only_switch():
  from jaxcap.papers.eta.configs import eta as eta_config
  from configs import transformer as transformer_config
  c = eta_config.get_config("synthetic,variant=transformer_v")
  assert registry.build(c.model, INFO).region_activation == "linear"
  assert registry.build(transformer_config.get_config("synthetic").model,
                        INFO).region_activation == "relu"
  assert eta_config.get_config("coco").scst.start_step > 0
  for arg in ("coco,xe_only=True", "coco,variant=transformer_v,xe_only=True"):
    c = eta_config.get_config(arg)
    assert c.scst.start_step == -1 and c.scst.start_epoch == -1


@pytest.mark.parametrize("activation", ["relu", "linear"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_transformer_region_activation(activation):
  """The encoder input is Dense(feats), through a ReLU only for ``region_activation="relu"``."""
  cfg = ml_collections.ConfigDict({"name": "transformer", "dim": 8, "num_layers": 0,
                                   "num_dec_layers": 1, "num_heads": 2, "ff_dim": 16,
                                   "region_activation": activation})
  model = registry.build(cfg, INFO)
  rng = np.random.default_rng(0)
  batch = {"feats": rng.normal(size=(2, 3, F_IN)).astype(np.float32),
           "feats_mask": np.ones((2, 3), bool)}
  params = model.init(jax.random.key(0), batch, np.full((2, 1, 4), EOS, np.int32))
  _, inter = model.apply(params, batch, method="encode", capture_intermediates=True,
                         mutable=["intermediates"])
  # With no encoder blocks the encoder's output is its input, the projected regions.
  memory = np.asarray(inter["intermediates"]["encoder"]["__call__"][0])
  w = params["params"]["feat_proj"]
  pre = batch["feats"] @ np.asarray(w["kernel"]) + np.asarray(w["bias"])
  want = np.maximum(pre, 0.0) if activation == "relu" else pre
  assert (pre < 0).any()
  np.testing.assert_allclose(memory, want, rtol=1e-5, atol=1e-5)


def test_transformer_rejects_unknown_region_activation():
  cfg = ml_collections.ConfigDict({"name": "transformer", "region_activation": "gelu"})
  with pytest.raises(ValueError, match="model.region_activation"):
    registry.build(cfg, INFO)


@pytest.mark.parametrize("arg", ["synthetic,variant=bogus", "synthetic,gbc=swish",
                                 "synthetic,attributes=perfect", "synthetic,gates=2"])
def test_config_rejects_bad_arguments(arg):
  from jaxcap.papers.eta.configs import eta as eta_config
  with pytest.raises(ValueError):
    eta_config.get_config(arg)


def test_model_rejects_unknown_variant():
  with pytest.raises(ValueError, match="model.variant"):
    make_model("bogus")
  with pytest.raises(ValueError, match="gbc_activation"):
    make_model("eta", gbc_activation="swish")
