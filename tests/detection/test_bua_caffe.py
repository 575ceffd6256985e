"""MILVLG/bottom-up-attention.pytorch's bua-caffe checkpoints (the Caffe model's blobs under
detectron2 names, read with the Caffe geometry) against its own code: scripts/detection/
make_bua_fixture.py built its model (its config, its modules, detectron2's build_model) at the
tests' small width, saved it with detectron2's checkpointer, loaded it back, and ran its extraction
(its get_image_blob, model, save_roi_features) on four photos of different sizes
(tests/detection/fixtures/bua_caffe/). jaxcap reads the .pth without torch, turns its heads into
the reference's layout (jaxcap.detection.weights.from_bua_caffe) and runs the detector with
``bua_caffe=True`` on its preprocessed images: its proposals, class and attribute probabilities,
features and saved regions are compared."""

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.detection import boxes as box_ops
from jaxcap.detection import frcnn, weights
from jaxcap.errors import BadInput

FIXTURES = Path(__file__).parent / "fixtures"
BUA = FIXTURES / "bua_caffe" / "bua-caffe-tiny.pth"
# The fixture's settings the file cannot hold (make_bua_fixture.py's OPTS).
SETTINGS = dict(pre_nms_topk=200, post_nms_topk=30)
HEAD, RPN = "roi_heads.box_predictor.", "proposal_generator.rpn_head."


@functools.lru_cache(maxsize=None)
def _fixture():
  with np.load(FIXTURES / "bua_caffe" / "bua_tiny.npz") as z:
    return {k: z[k] for k in z.files}


@functools.lru_cache(maxsize=None)
def _load():
  return weights.load(BUA, **SETTINGS)


def _bg_last(x):
  return np.concatenate([x[:, 1:], x[:, :1]], 1)


def test_the_file_is_read_into_the_reference_layout():
  raw = weights.read(BUA)
  cfg, v = _load()
  assert cfg.bua_caffe and cfg.bbox_reg_weights == (1.0, 1.0, 1.0, 1.0) and cfg.min_box_size == 16.0
  assert (cfg.num_classes, cfg.num_attrs, cfg.attr_embed, cfg.attr_hidden) == (20, 6, 256, 512)
  p = v["params"]
  a = cfg.num_anchors
  obj = raw[f"{RPN}objectness_logits.weight"][:, :, 0, 0]  # [2A, C]: background half first
  np.testing.assert_allclose(p["rpn_head"]["objectness_logits"]["kernel"][0, 0], (obj[a:] - obj[:a]).T, atol=1e-6)
  np.testing.assert_array_equal(p["box_predictor"]["cls_score"]["kernel"], _bg_last(raw[f"{HEAD}cls_score.weight"].T))
  np.testing.assert_array_equal(p["box_predictor"]["bbox_pred"]["kernel"], raw[f"{HEAD}bbox_pred.weight"][4:].T)
  np.testing.assert_array_equal(p["box_predictor"]["cls_embedding"]["embedding"],
                                _bg_last(raw[f"{HEAD}cls_embed.weight"].T).T)
  np.testing.assert_array_equal(p["box_predictor"]["fc_attr"]["kernel"], raw[f"{HEAD}attr_linear1.weight"].T)
  np.testing.assert_array_equal(p["box_predictor"]["attr_score"]["bias"], _bg_last(raw[f"{HEAD}attr_linear2.bias"][None])[0])
  np.testing.assert_array_equal(v["consts"]["cell_anchors"], raw[weights.CELL_ANCHORS])
  # Its backbone and res5 are the LXMERT fixture's tensors under the same names: the same variables.
  _, v_ref = weights.load(FIXTURES / "pytorch_model.bin", **SETTINGS)
  for part in ("backbone", "res5"):
    jax.tree.map(np.testing.assert_array_equal, v["params"][part], v_ref["params"][part])
    jax.tree.map(np.testing.assert_array_equal, v["batch_stats"][part], v_ref["batch_stats"][part])


@functools.lru_cache(maxsize=None)
def _run(i: int, bua_caffe: bool = True):
  f = _fixture()
  cfg, v = _load()
  cfg = dataclasses.replace(cfg, bua_caffe=bua_caffe)
  blob = f[f"blob_{i}"][None]
  hw = jnp.asarray([blob.shape[1:3]], jnp.int32)
  out = jax.jit(frcnn.Detector(cfg).apply)(v, jnp.asarray(blob), hw, jnp.asarray([f[f"im_scale_{i}"]], jnp.float32))
  out = jax.tree.map(lambda x: x[0], out)
  s = 1.0 / float(f[f"im_scale_{i}"])  # its save_roi_features divides by the one im_scale
  sel = jax.jit(lambda o: frcnn.select_caffe(cfg, o, (s, s), 0.2, 5, 10, 0.3))(out)
  return cfg, jax.tree.map(np.asarray, out), jax.tree.map(np.asarray, sel)


@pytest.mark.parametrize("i", range(4))
def test_the_detector_computes_what_its_code_computes(i):
  f = _fixture()
  cfg, out, sel = _run(i)
  n = len(f[f"proposals_{i}"])
  assert out["valid"].sum() == n
  # Its RPN: 2-way softmax objectness, "+1" decoding, clipping to w - 1, its filters before the
  # top-k, its NMS kernel; the proposals in its order.
  # 5e-4 px: float32 rounding through the backbone differs by CPU (2.6e-4 px on an AVX2-only
  # host, below 2e-4 on the one the fixture was first checked on); its rules move boxes >= 0.5 px.
  np.testing.assert_allclose(out["proposals"][:n], f[f"proposals_{i}"], atol=5e-4)
  np.testing.assert_allclose(np.asarray(jax.nn.softmax(out["cls_logits"][:n], -1)), _bg_last(f[f"probs_{i}"]), atol=1e-5)
  np.testing.assert_allclose(np.asarray(frcnn.attribute_probs(cfg, out["attr_logits"][:n])),
                             f[f"attr_{i}"][:, 1:], atol=1e-5)
  ref = f[f"feats_{i}"]
  np.testing.assert_allclose(out["features"][:n], ref, atol=1e-4 * np.abs(ref).max())
  # Its saved regions: the boxes (original pixels), classes, attributes, features.
  c = int(sel["count"])
  assert c == len(f[f"bbox_{i}"])
  np.testing.assert_allclose(sel["boxes"][:c], f[f"bbox_{i}"], atol=1e-3)
  np.testing.assert_array_equal(sel["obj_ids"][:c], f[f"objects_id_{i}"])
  np.testing.assert_array_equal(sel["attr_ids"][:c], f[f"attrs_id_{i}"])
  np.testing.assert_allclose(sel["obj_probs"][:c], f[f"objects_conf_{i}"], atol=1e-5)
  np.testing.assert_allclose(sel["attr_probs"][:c], f[f"attrs_conf_{i}"], atol=1e-5)
  np.testing.assert_allclose(sel["features"][:c], f[f"x_{i}"], atol=1e-4 * np.abs(f[f"x_{i}"]).max())


def test_the_reference_geometry_does_not_give_its_proposals():
  """The switch is what makes the file's proposals: read with detectron2's geometry (no "+1",
  clipping to w, top-k before the filters) the same weights give other boxes."""
  f = _fixture()
  _, out, _ = _run(0, bua_caffe=False)
  n = len(f["proposals_0"])
  assert np.abs(out["proposals"][:n] - f["proposals_0"]).max() > 0.5


def test_caffe_anchors_are_py_faster_rcnns():
  # generate_anchors.py's own printout for its defaults (ratios 0.5 / 1 / 2, scales 8 / 16 / 32).
  published = [[-84, -40, 99, 55], [-176, -88, 191, 103], [-360, -184, 375, 199],
               [-56, -56, 71, 71], [-120, -120, 135, 135], [-248, -248, 263, 263],
               [-36, -80, 51, 95], [-80, -168, 95, 183], [-168, -344, 183, 359]]
  np.testing.assert_array_equal(box_ops.caffe_cell_anchors(scales=(8, 16, 32)), published)
  assert box_ops.caffe_cell_anchors().shape == (12, 4)  # the VG model's scales 4-32


def test_a_file_without_anchors_gets_the_caffe_models():
  tensors = dict(weights.read(BUA))
  del tensors[weights.CELL_ANCHORS]
  converted, _ = weights.from_bua_caffe(tensors, "f.pth")
  np.testing.assert_array_equal(converted[weights.CELL_ANCHORS], box_ops.caffe_cell_anchors())


@pytest.mark.parametrize("change, needle", [
    (lambda t: t.pop(f"{HEAD}attr_linear2.weight"), f"missing tensor {HEAD}attr_linear2.weight"),
    (lambda t: t.update({f"{HEAD}bbox_pred.weight": t[f"{HEAD}bbox_pred.weight"][4:]}), "bbox_pred.weight has 80 rows"),
    (lambda t: t.update({f"{HEAD}cls_embed.weight": t[f"{HEAD}cls_embed.weight"][1:]}), "cls_embed.weight has 20 rows"),
    (lambda t: t.update({f"{RPN}objectness_logits.bias": t[f"{RPN}objectness_logits.bias"][1:]}),
     "objectness_logits.bias [23]"),
    (lambda t: t.update({f"{HEAD}attr_extra.weight": np.zeros(3, np.float32)}), "unexpected tensor"),
])
def test_a_damaged_file_is_one_line_naming_it(change, needle):
  tensors = dict(weights.read(BUA))
  change(tensors)
  with pytest.raises(BadInput, match="f.pth: ") as e:
    weights.from_bua_caffe(tensors, "f.pth")
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_setting_that_contradicts_the_file_is_refused():
  with pytest.raises(BadInput, match="bua_caffe=False contradicts the file"):
    weights.load(BUA, bua_caffe=False)
  with pytest.raises(BadInput, match="bbox_reg_weights"):
    weights.load(BUA, bbox_reg_weights=(10.0, 10.0, 5.0, 5.0))


def test_its_nms_suppresses_at_the_threshold_itself():
  """maskrcnn-benchmark's kernel (its nms_cpu.cpp): "+1" areas, suppressed when IoU >= the
  threshold; torchvision's keeps a box at exactly the threshold."""
  b = jnp.asarray([[0.0, 0.0, 9.0, 9.0], [0.0, 0.0, 9.0, 4.0]])  # +1 areas 100 and 50, overlap 50: IoU 0.5
  s = jnp.asarray([0.9, 0.8])
  _, n_bua = box_ops.nms(b, s, 0.5, 2, plus_one=True, inclusive=True)
  _, n_tv = box_ops.nms(b, s, 0.5, 2, plus_one=True)
  assert (int(n_bua), int(n_tv)) == (1, 2)


@pytest.mark.slow  # four canvas shapes compiled: past the quick loop's CPU limit
def test_from_its_photos_to_its_regions():
  """RegionDetector's default (the Caffe original's resize: get_image_blob's; its selection) on
  the photos it read with cv2 (BGR, given here as RGB) gives the regions its save_roi_features
  wrote."""
  from jaxcap.detection import regions  # noqa: PLC0415
  f = _fixture()
  cfg, v = _load()
  detect = regions.RegionDetector(cfg, v, short=96, long=160, min_boxes=5, max_boxes=10)
  for i in range(4):
    rgb = f[f"raw_{i}"][..., ::-1]
    canvas, _, scales = detect.preprocess([rgb])
    np.testing.assert_allclose(canvas[0], f[f"blob_{i}"], atol=1e-4)
    np.testing.assert_allclose(scales[0], 1.0 / f[f"im_scale_{i}"], rtol=1e-6)
    got = detect([rgb])[0]
    np.testing.assert_allclose(got["boxes"], f[f"bbox_{i}"], atol=1e-3)
    np.testing.assert_array_equal(got["obj_ids"], f[f"objects_id_{i}"])
    np.testing.assert_array_equal(got["attr_ids"], f[f"attrs_id_{i}"])
    np.testing.assert_allclose(got["features"], f[f"x_{i}"], atol=1e-4 * np.abs(f[f"x_{i}"]).max())
