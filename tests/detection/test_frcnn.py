"""The detector against its reference code: a small bottom-up-attention Faster R-CNN built, loaded
and run by LXMERT's modeling_frcnn.py / processing_image.py (scripts/detection/make_frcnn_fixture.py
wrote tests/detection/fixtures/frcnn_tiny.npz: its state_dict, its preprocessing of two BGR images
of different sizes, its res4 map, proposals, pooled region features, logits and final regions).
jaxcap's detector is given the state_dict by its importer and compared stage by stage, so that a
wrong stride, dilation, pooling bin, anchor order or selection rule fails at the stage it breaks."""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.detection import frcnn, weights
from jaxcap.errors import BadInput

FIXTURE = Path(__file__).parent / "fixtures" / "frcnn_tiny.npz"
# The fixture's inference settings (the script's CONFIG): what the file cannot say.
SETTINGS = dict(pre_nms_topk=200, post_nms_topk=30)
NMS, MIN_D, MAX_D = (0.3, 0.5, 0.7, 0.9), 5, 10


@functools.lru_cache(maxsize=None)
def _fixture():
  with np.load(FIXTURE) as z:
    return {k: z[k] for k in z.files}


def _state_dict(f):
  return {k[3:]: v for k, v in f.items() if k.startswith("sd/")}


@functools.lru_cache(maxsize=None)
def _run():
  f = _fixture()
  sd = _state_dict(f)
  cfg = weights.config_from_state_dict(sd, **SETTINGS)
  variables = weights.from_state_dict(sd, cfg, "frcnn_tiny")
  model = frcnn.Detector(cfg)
  images = jnp.asarray(f["images"].transpose(0, 2, 3, 1))
  sizes = jnp.asarray(f["sizes"], jnp.int32)
  res4 = jax.jit(lambda v, x: model.apply(v, x, method=lambda m, x: m.backbone(x)))(variables, images)
  out = jax.jit(model.apply)(variables, images, sizes)
  select = jax.jit(jax.vmap(lambda o, hw, s: frcnn.select_hf(cfg, o, hw, NMS, MIN_D, MAX_D, s)))
  sel = select(out, sizes, jnp.asarray(f["scales_yx"], jnp.float32))
  return cfg, np.asarray(res4), jax.tree.map(np.asarray, out), jax.tree.map(np.asarray, sel)


def test_config_is_read_off_the_tensors():
  cfg = weights.config_from_state_dict(_state_dict(_fixture()))
  assert (cfg.depth, cfg.stem_out, cfg.res2_out, cfg.width_per_group, cfg.rpn_hidden) == (50, 8, 16, 4, 16)
  assert (cfg.num_classes, cfg.num_attrs, cfg.num_anchors) == (20, 6, 12)


def test_preprocessing_is_the_reference_s():
  f = _fixture()
  for i in range(2):
    raw = f[f"raw_{i}"]
    h, w = frcnn.preprocess_size(*raw.shape[:2], short=96, long=160)
    np.testing.assert_array_equal([h, w], f["sizes"][i])
    x = np.asarray(frcnn.resize_bilinear(raw, (h, w))) - np.asarray(frcnn.PIXEL_MEAN_BGR, np.float32)
    np.testing.assert_allclose(x, f["images"][i].transpose(1, 2, 0)[:h, :w], atol=2e-3)
    # The canvas' padding (bottom / right, 0 = the mean) is the reference's.
    assert not f["images"][i][:, h:, :].any() and not f["images"][i][:, :, w:].any()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_backbone_proposals_and_heads_are_the_reference_s():
  f = _fixture()
  _, res4, out, _ = _run()
  ref4 = f["res4"].transpose(0, 2, 3, 1)
  np.testing.assert_allclose(res4, ref4, rtol=1e-4, atol=1e-4 * np.abs(ref4).max())
  start = 0
  for i in range(2):
    ref = f[f"proposals_{i}"]
    n = len(ref)
    assert out["valid"][i].sum() == n
    np.testing.assert_allclose(out["proposals"][i][:n], ref, atol=1e-3)
    sl = slice(start, start + n)
    np.testing.assert_allclose(out["features"][i][:n], f["pooled"][sl], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["cls_logits"][i][:n], f["obj_logits"][sl], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out["attr_logits"][i][:n], f["attr_logits"][sl], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out["deltas"][i][:n].reshape(n, -1), f["box_deltas"][sl], rtol=1e-4, atol=1e-3)
    start += n


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_selected_regions_are_the_reference_s():
  f = _fixture()
  _, _, _, sel = _run()
  np.testing.assert_array_equal(sel["count"], f["out_preds_per_image"])
  assert sel["enough"].all()
  np.testing.assert_array_equal(sel["obj_ids"], f["out_obj_ids"])
  np.testing.assert_array_equal(sel["attr_ids"], f["out_attr_ids"])
  np.testing.assert_allclose(sel["obj_probs"], f["out_obj_probs"], atol=1e-5)
  np.testing.assert_allclose(sel["attr_probs"], f["out_attr_probs"], atol=1e-5)
  np.testing.assert_allclose(sel["boxes"], f["out_boxes"], atol=1e-3)
  np.testing.assert_allclose(sel["features"], f["out_roi_features"], rtol=1e-4, atol=1e-4)


def test_a_wrong_tensor_is_named_as_the_file_names_it():
  sd = dict(_state_dict(_fixture()))
  cfg = weights.config_from_state_dict(sd, **SETTINGS)
  bad = dict(sd)
  bad["backbone.res3.1.conv2.weight"] = bad["backbone.res3.1.conv2.weight"][:, :-1]
  with pytest.raises(BadInput, match=r"frcnn\.bin: tensor backbone\.res3\.1\.conv2\.weight: expected shape"):
    weights.from_state_dict(bad, cfg, "frcnn.bin")
  missing = {k: v for k, v in sd.items() if k != "roi_heads.box_predictor.fc_attr.bias"}
  with pytest.raises(BadInput, match=r"missing tensor roi_heads\.box_predictor\.fc_attr\.bias"):
    weights.from_state_dict(missing, cfg, "frcnn.bin")
  caffe = dict(sd)
  w = sd["proposal_generator.rpn_head.objectness_logits.weight"]
  caffe["proposal_generator.rpn_head.objectness_logits.weight"] = np.concatenate([w, w])
  with pytest.raises(BadInput, match="2-way softmax over 2A channels"):
    weights.config_from_state_dict(caffe)
  nan = dict(sd)
  nan["roi_heads.res5.2.conv3.norm.running_var"] = np.full_like(sd["roi_heads.res5.2.conv3.norm.running_var"], np.nan)
  with pytest.raises(BadInput, match=r"roi_heads\.res5\.2\.conv3\.norm\.running_var.*NaN"):
    weights.from_state_dict(nan, cfg, "frcnn.bin")
