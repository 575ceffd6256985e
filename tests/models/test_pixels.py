"""A captioner from pixels (jaxcap/models/pixels.py): the joint model equals its captioner fed
the backbone's features as jaxcap-extract's files and training's reader give them; gradients
reach the backbone unless it is frozen; the backbone's optimiser holds still for
``backbone.freeze_steps`` updates, then starts as a fresh Adam."""

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxcap import features
from jaxcap.data import base as data_base
from jaxcap.models import base, pixels, registry
from jaxcap.training import optim
from tests.features.conftest import TINY_RESNET, TINY_VIT

VOCAB, WORDS = 23, 6


def _info(backbone) -> dict:
  return {**pixels.backbone_info(backbone), "max_len": WORDS, "vocab_size": VOCAB, "num_attributes": 10,
          "src_vocab_size": VOCAB, "max_src_len": WORDS, "grid": True, "seq_per_img": 2,
          "max_attributes": 5}


def _joint(name, fields, captioner="transformer", **model_fields):
  backbone = features.build(name, **fields)
  info = _info(backbone)
  cap = registry.build({"name": captioner, **model_fields}, info)
  return pixels.FromPixels(backbone=backbone, captioner=cap), backbone, cap, info


def _images(b, size, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (b, size, size, 3), dtype=np.uint8)


# The captioners read what the joint model builds: the regions with their grid boxes (the image
# transformer's spatial graph), the global feature (UpDown: the ViT's class token, not the
# patches' mean; mutated, only the UpDown cases fail). The regions' order is checked on the
# encodings, region by region (a transposed grid fails every ViT case there, not in the logits).
CASES = {
    "vit+transformer": ("vit_b16", TINY_VIT, "transformer", dict(dim=32, num_heads=4, ff_dim=64, num_layers=1,
                                                                 num_dec_layers=1, dropout=0.0)),
    "vit+image_transformer": ("vit_b16", TINY_VIT, "image_transformer",
                              dict(dim=32, num_heads=4, ff_dim=64, num_layers=1, dropout=0.0)),
    "vit+updown": ("vit_b16", TINY_VIT, "updown", dict(embed_dim=16, hidden_dim=16, att_dim=16, dropout=0.0)),
    "resnet+updown": ("resnet50", TINY_RESNET, "updown", dict(embed_dim=16, hidden_dim=16, att_dim=16,
                                                              dropout=0.0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_joint_model_is_its_captioner_on_the_extracted_features(case):
  name, fields, cap_name, cap_fields = CASES[case]
  model, backbone, cap, info = _joint(name, fields, cap_name, **cap_fields)
  size = fields.get("image_size", 32)
  images = _images(3, size)
  tokens = jnp.asarray(np.random.default_rng(1).integers(4, VOCAB, (3, 2, WORDS)), jnp.int32)
  bvars = jax.jit(backbone.init)(jax.random.PRNGKey(0), images[:1])
  out = backbone.apply(bvars, images)
  # The features as jaxcap-extract writes them (fc [B, D], att [B, g*g, D]) read back through
  # the reader and collation training uses, data.grid=True.
  att = np.asarray(out["att"]).reshape(3, -1, out["att"].shape[-1])
  data = ml_collections.ConfigDict({"att_dir": "att", "fc_dir": "fc", "grid": True})
  feats_batch = data_base.image_features_batch(np.asarray(out["fc"]), att, data, info)
  batch = {k: jnp.asarray(v) for k, v in feats_batch.items()}
  cvars = jax.jit(cap.init)(jax.random.PRNGKey(1), batch, tokens)
  joint_vars = {"params": {"backbone": bvars["params"], "captioner": cvars["params"]}}
  for col in bvars:
    if col != "params":
      joint_vars[col] = {"backbone": bvars[col]}
  want, _ = cap.apply(cvars, batch, tokens)
  got, _ = model.apply(joint_vars, dict(batch, pixels=jnp.asarray(images)), tokens)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # The variables the model makes itself have this layout.
  own = jax.eval_shape(model.init, jax.random.PRNGKey(0), dict(batch, pixels=jnp.asarray(images)), tokens)
  assert jax.tree.structure(own) == jax.tree.structure(joint_vars)
  # One decoding step through the protocol: the captioner's.
  enc = model.apply(joint_vars, dict(batch, pixels=jnp.asarray(images)), method="encode")
  enc_c = cap.apply(cvars, batch, method="encode")
  # Region by region (a captioner's output may not depend on the regions' order).
  for a, b in zip(jax.tree.leaves(enc), jax.tree.leaves(enc_c)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  cache = model.apply(joint_vars, enc, WORDS, method="init_cache")
  cache_c = cap.apply(cvars, enc_c, WORDS, method="init_cache")
  step = model.apply(joint_vars, enc, cache, tokens[:, 0, 0], 0, method="decode_step")[0]
  step_c = cap.apply(cvars, enc_c, cache_c, tokens[:, 0, 0], 0, method="decode_step")[0]
  np.testing.assert_allclose(step, step_c, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_gradients_reach_the_backbone_unless_it_is_frozen():
  name, fields, cap_name, cap_fields = CASES["vit+transformer"]
  model, *_ = _joint(name, fields, cap_name, **cap_fields)
  images = jnp.asarray(_images(2, 32))
  tokens = jnp.asarray(np.random.default_rng(1).integers(4, VOCAB, (2, 2, WORDS)), jnp.int32)
  batch = {"pixels": images}
  variables = model.init(jax.random.PRNGKey(0), batch, tokens)

  def grads(m):
    return jax.grad(lambda v: m.apply(v, batch, tokens)[0].sum())(variables)["params"]

  live, frozen = grads(model), grads(model.clone(freeze_backbone=True))
  assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(live["backbone"]["patch_embed"]))
  assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(frozen["backbone"]))
  for a, b in zip(jax.tree.leaves(live["captioner"]), jax.tree.leaves(frozen["captioner"])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_the_backbone_optimiser_holds_still_then_starts_fresh():
  config = ml_collections.ConfigDict({
      "schedule": "constant", "learning_rate": 1e-2, "adam_b1": 0.9, "adam_b2": 0.98, "adam_eps": 1e-9,
      "weight_decay": 0.0, "l2": 0.0, "grad_clip_value": 0.0, "grad_clip_norm": 0.0,
      "scst": {"start_step": -1, "start_epoch": -1, "learning_rate": 0.0}, "model": {"dim": 8},
      "backbone": {"name": "vit_b16", "learning_rate": 1e-3, "freeze_steps": 2}})
  tx, _ = optim.make_optimizer(config, 10)
  params = {"params": {"backbone": {"w": jnp.ones(3)}, "captioner": {"w": jnp.ones(3)}}}
  state = tx.init(params)
  grads = [jax.tree.map(lambda x, k=k: (k + 1.0) * jnp.arange(1.0, 4.0) * x, params) for k in range(3)]
  moved = []
  for g in grads:
    updates, state = tx.update(g, state, params)
    moved.append(updates)
  for k in (0, 1):
    assert float(jnp.abs(moved[k]["params"]["backbone"]["w"]).max()) == 0.0
    assert float(jnp.abs(moved[k]["params"]["captioner"]["w"]).max()) > 0.0
  # The third update is a fresh Adam's first at the backbone's own learning rate.
  fresh = optax.adam(1e-3, b1=0.9, b2=0.98, eps=1e-9)
  want, _ = fresh.update(grads[2]["params"]["backbone"], fresh.init(params["params"]["backbone"]))
  np.testing.assert_allclose(moved[2]["params"]["backbone"]["w"], want["w"], rtol=1e-6)
  # The captioner's is the schedule's Adam, untouched by the freeze.
  cap = optax.adam(1e-2, b1=0.9, b2=0.98, eps=1e-9)
  s = cap.init(params["params"]["captioner"])
  for g in grads:
    want, s = cap.update(g["params"]["captioner"], s)
  np.testing.assert_allclose(moved[2]["params"]["captioner"]["w"], want["w"], rtol=1e-6)


def test_a_resnet_batch_norm_statistics_are_frozen():
  name, fields, cap_name, cap_fields = CASES["resnet+updown"]
  model, *_ = _joint(name, fields, cap_name, **cap_fields)
  assert "batch_stats" in model.frozen_collections
  assert model.required_inputs()[-1] == "pixels" and "image" not in model.required_inputs()
  assert isinstance(model, base.CaptionModel)


@pytest.mark.parametrize("name,fields", [("vit_b16", TINY_VIT), ("resnet50", TINY_RESNET)])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_backbone_remat_gives_the_same_numbers(name, fields):
  """``remat`` (backbone.remat) recomputes the blocks' activations: the same variables, outputs
  and gradients."""
  module = features.build(name, **fields)
  images = jnp.asarray(_images(2, fields.get("image_size", 32)))
  variables = module.init(jax.random.PRNGKey(0), images)
  remat = module.clone(remat=True)
  assert jax.tree.structure(remat.init(jax.random.PRNGKey(0), images)) == jax.tree.structure(variables)

  def loss(m, params):
    out = m.apply(dict(variables, params=params), images)
    return out["att"].sum() + out["fc"].sum()

  # jax.checkpoint's primitive ("remat2" in JAX 0.10) is in the remat model's program only.
  programs = [str(jax.make_jaxpr(functools.partial(loss, m))(variables["params"])) for m in (module, remat)]
  has_remat = lambda text: "remat" in text or "checkpoint[" in text
  assert not has_remat(programs[0]) and has_remat(programs[1])
  for a, b in zip(jax.tree.leaves(jax.grad(functools.partial(loss, module))(variables["params"])),
                  jax.tree.leaves(jax.grad(functools.partial(loss, remat))(variables["params"]))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,fields", [("vit_b16", TINY_VIT), ("resnet50", TINY_RESNET)])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bfloat16_is_a_switch_of_the_backbone_and_the_captioner(name, fields):
  """``config.dtype=bfloat16`` (the backbone's and the captioner's compute dtype, float32
  parameters): the same parameters give bfloat16 features and logits close to float32's."""
  size = fields.get("image_size", 32)
  cap_fields = dict(dim=32, num_heads=4, ff_dim=64, num_layers=1, num_dec_layers=1, dropout=0.0)
  f32, _, _, info = _joint(name, fields, **cap_fields)
  b16 = pixels.FromPixels(backbone=features.build(name, **fields, dtype="bfloat16"),
                          captioner=registry.build({"name": "transformer", **cap_fields, "dtype": "bfloat16"}, info))
  px = jnp.asarray(_images(2, size))
  tokens = jnp.asarray(np.random.default_rng(1).integers(4, VOCAB, (2, 2, WORDS)), jnp.int32)
  variables = f32.init(jax.random.PRNGKey(0), {"pixels": px}, tokens)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables["params"]))
  feats = {m: m.apply(variables, px, method="features")["feats"] for m in (f32, b16)}
  scale = float(jnp.abs(feats[f32]).max())
  gap = float(jnp.abs(feats[b16].astype(jnp.float32) - feats[f32]).max())
  assert 1e-4 * scale < gap < 0.05 * scale

  def logits(m):
    return m.apply(variables, {"pixels": px}, tokens)[0]

  lf, lb = logits(f32), logits(b16)
  gap = float(jnp.abs(lb.astype(jnp.float32) - lf).max())
  assert 1e-4 < gap < 0.05 * float(jnp.abs(lf).max()) + 0.05
