"""The detector against its reference code: a small bottom-up-attention Faster R-CNN built, loaded
and run by LXMERT's modeling_frcnn.py / processing_image.py (scripts/detection/make_frcnn_fixture.py
wrote tests/detection/fixtures/frcnn_tiny.npz: its state_dict, its preprocessing of two BGR images
of different sizes, its res4 map, proposals, pooled region features, logits and final regions).
jaxcap's detector is given the state_dict by its importer and compared stage by stage, so that a
wrong stride, dilation, pooling bin, anchor order or selection rule fails at the stage it breaks."""

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap.detection import frcnn, weights
from jaxcap.errors import BadInput

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "frcnn_tiny.npz"
# The fixture's inference settings (the script's CONFIG): what the file cannot say.
SETTINGS = dict(pre_nms_topk=200, post_nms_topk=30)
NMS, MIN_D, MAX_D = (0.3, 0.5, 0.7, 0.9), 5, 10


@functools.lru_cache(maxsize=None)
def _fixture():
  with np.load(FIXTURE) as z:
    return {k: z[k] for k in z.files}


@functools.lru_cache(maxsize=None)
def _tensors():
  return weights.read(FIXTURES / "pytorch_model.bin")


def _state_dict(f=None):
  del f
  return dict(_tensors())


@functools.lru_cache(maxsize=None)
def _run():
  f = _fixture()
  cfg, variables = weights.load(FIXTURES / "pytorch_model.bin", **SETTINGS)
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
  # RegionDetector's switch to the reference's reading: its canvas, sizes and per-axis scales.
  from jaxcap.detection import regions  # noqa: PLC0415
  detect = regions.RegionDetector(frcnn.DetectorConfig(), None, short=96, long=160, resize="reference")
  canvas, sizes, scales = detect.preprocess([f[f"raw_{i}"][..., ::-1] for i in range(2)])  # as RGB
  np.testing.assert_array_equal(sizes, f["sizes"])
  np.testing.assert_allclose(canvas, f["images"].transpose(0, 2, 3, 1), atol=2e-3)
  np.testing.assert_allclose(scales, f["scales_yx"], rtol=1e-6)


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


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
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


def _np_nms_plus_one(boxes, scores, thresh):
  """py-faster-rcnn's ``py_cpu_nms`` (the Caffe original's CPU NMS), transcribed; order by
  descending score, ties to the lower index."""
  x1, y1, x2, y2 = boxes.T
  areas = (x2 - x1 + 1) * (y2 - y1 + 1)
  order = np.argsort(-scores, kind="stable")
  keep = []
  while order.size:
    i = order[0]
    keep.append(i)
    w = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]]) + 1)
    h = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]]) + 1)
    inter = w * h
    ovr = inter / (areas[i] + areas[order[1:]] - inter)
    order = order[np.where(ovr <= thresh)[0] + 1]
  return np.asarray(keep, int)


def _np_generate_tsv(boxes, probs_fg, conf, min_boxes, max_boxes, thresh):
  """generate_tsv.py's ``get_detections_from_im`` selection, transcribed (its class loop over the
  foreground columns; the background here is the last column, already dropped)."""
  max_conf = np.zeros(len(boxes))
  for c in range(probs_fg.shape[1]):
    s = probs_fg[:, c]
    keep = _np_nms_plus_one(boxes, s, thresh)
    max_conf[keep] = np.where(s[keep] > max_conf[keep], s[keep], max_conf[keep])
  keep = np.where(max_conf >= conf)[0]
  branch = "threshold"
  if len(keep) < min_boxes:
    keep, branch = np.argsort(-max_conf, kind="stable")[:min_boxes], "min"
  elif len(keep) > max_boxes:
    keep, branch = np.argsort(-max_conf, kind="stable")[:max_boxes], "max"
  return keep, max_conf, branch


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_caffe_selection_is_generate_tsv_s():
  f = _fixture()
  cfg, _, out, _ = _run()
  branches = set()
  for conf, mn, mx in ((0.2, 10, 100), (0.9, 4, 12), (0.999999, 8, 12), (0.0, 2, 6)):
    for i in range(2):
      one = jax.tree.map(lambda a: a[i], out)
      n = int(one["valid"].sum())
      sel = jax.tree.map(np.asarray, frcnn.select_caffe(cfg, one, jnp.asarray(f["scales_yx"][i], jnp.float32),
                                                        conf, mn, mx, 0.3))
      sy, sx = f["scales_yx"][i]
      boxes = one["proposals"][:n] * np.asarray([sx, sy, sx, sy], np.float32)
      probs = np.asarray(jax.nn.softmax(one["cls_logits"][:n], -1))[:, :-1]
      keep, max_conf, branch = _np_generate_tsv(boxes, probs, conf, mn, mx, 0.3)
      branches.add(branch)
      assert int(sel["count"]) == len(keep), (conf, mn, mx, i)
      np.testing.assert_array_equal(sel["features"][:len(keep)], one["features"][keep])
      np.testing.assert_allclose(sel["boxes"][:len(keep)], boxes[keep], rtol=1e-6)
      np.testing.assert_allclose(sel["max_conf"][:len(keep)], max_conf[keep], rtol=1e-5)
      np.testing.assert_array_equal(sel["obj_ids"][:len(keep)], probs[keep].argmax(-1))
      assert not sel["features"][len(keep):].any()
  assert branches == {"threshold", "min", "max"}  # each of the three rules was exercised


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_airsplay_s_pickle_gives_the_same_weights():
  """The detectron2 pickle (no batch-norm counters, no anchors: they come from the settings)."""
  cfg, variables = weights.load(FIXTURES / "pytorch_model.bin", **SETTINGS)
  cfg2, variables2 = weights.load(FIXTURES / "faster_rcnn_from_caffe_attr.pkl",
                                  anchor_sizes=(16.0, 32.0, 64.0, 128.0), **SETTINGS)
  assert cfg2 == dataclasses.replace(cfg, anchor_sizes=(16.0, 32.0, 64.0, 128.0))
  jax.tree.map(np.testing.assert_array_equal, variables, variables2)


@pytest.mark.parametrize("damage", ["truncated", "not_a_checkpoint", "a_list"])
def test_a_damaged_file_is_one_line_naming_it(tmp_path, damage):
  src = (FIXTURES / "pytorch_model.bin").read_bytes()
  path = tmp_path / "pytorch_model.bin"
  if damage == "truncated":
    path.write_bytes(src[:len(src) // 2])
  elif damage == "not_a_checkpoint":
    path.write_text("model: frcnn\n")
  else:
    import pickle  # noqa: PLC0415
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps({"model": [1, 2]}))
  with pytest.raises(BadInput, match=str(path)):
    weights.load(path)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_photos_to_regions_end_to_end_are_the_reference_s():
  """RGB photos (as PIL reads them) through RegionDetector: the reference's regions, from the
  BGR images its Preprocess was given."""
  from jaxcap.detection import regions  # noqa: PLC0415
  f = _fixture()
  cfg, variables = weights.load(FIXTURES / "pytorch_model.bin", **SETTINGS)
  rgb = [f[f"raw_{i}"][..., ::-1] for i in range(2)]
  detect = regions.RegionDetector(cfg, variables, short=96, long=160, resize="reference", selection="reference",
                                  nms_thresholds=NMS, min_boxes=MIN_D, max_boxes=MAX_D)
  got = detect(rgb)
  for i, one in enumerate(got):
    n = int(f["out_preds_per_image"][i])
    assert one["enough"] and len(one["boxes"]) == n and one["image_hw"] == rgb[i].shape[:2]
    np.testing.assert_allclose(one["boxes"], f["out_boxes"][i][:n], atol=1e-3)
    np.testing.assert_allclose(one["features"], f["out_roi_features"][i][:n], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(one["obj_ids"], f["out_obj_ids"][i][:n])
    np.testing.assert_array_equal(one["attr_ids"], f["out_attr_ids"][i][:n])
  # The original's resize and selection (the defaults) on the same photos: between min_boxes and
  # max_boxes regions, each a proposal (boxes inside the photo) with its pooled feature.
  caffe = regions.RegionDetector(cfg, variables, short=96, long=160, min_boxes=3, max_boxes=12)(rgb)
  for i, one in enumerate(caffe):
    assert 3 <= len(one["boxes"]) <= 12
    h, w = rgb[i].shape[:2]
    assert (one["boxes"] >= 0).all() and (one["boxes"][:, 2] <= w + 1e-3).all() and (one["boxes"][:, 3] <= h + 1e-3).all()
  with pytest.raises(BadInput, match=r"image 0: expected a uint8 RGB array"):
    detect([rgb[0].astype(np.float32)])


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bfloat16_computes_near_float32():
  """bfloat16 compute (float32 parameters, float32 logits / softmax / boxes): the backbone's map
  within bfloat16's precision of float32's, and the photos' regions still come out."""
  from jaxcap.detection import regions  # noqa: PLC0415
  f = _fixture()
  cfg, variables = weights.load(FIXTURES / "pytorch_model.bin", **SETTINGS)
  images = jnp.asarray(f["images"].transpose(0, 2, 3, 1))
  res4 = {}
  for dt in (jnp.float32, jnp.bfloat16):
    model = frcnn.Detector(cfg, dtype=dt)
    res4[dt] = np.asarray(jax.jit(lambda v, x, m=model: m.apply(v, x, method=lambda mm, x: mm.backbone(x)))(
        variables, images), np.float32)
  err = np.abs(res4[jnp.bfloat16] - res4[jnp.float32]).mean() / np.abs(res4[jnp.float32]).mean()
  assert 0 < err < 0.05, err
  rgb = [f[f"raw_{i}"][..., ::-1] for i in range(2)]
  out = regions.RegionDetector(cfg, variables, short=96, long=160, min_boxes=3, max_boxes=12, dtype=jnp.bfloat16)(rgb)
  for one in out:
    assert 3 <= len(one["boxes"]) <= 12 and one["features"].dtype == np.float32
    assert np.isfinite(one["features"]).all()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_16_wide_detector_is_the_reference_s_too():
  """tests/detection/fixtures/d16 (the script's --res2_out 2: 16-d region features, the width of
  M²'s import fixture, the detector of docs/USAGE.md's trial): photos to regions as its reference
  computed them, and the pickle gives the same weights."""
  from jaxcap.detection import regions  # noqa: PLC0415
  d16 = FIXTURES / "d16"
  with np.load(d16 / "frcnn_d16.npz") as z:
    f = {k: z[k] for k in z.files}
  cfg, variables = weights.load(d16 / "pytorch_model.bin", **SETTINGS)
  assert cfg.feature_dim == 16 and cfg.res2_out == 2
  _, variables2 = weights.load(d16 / "faster_rcnn_from_caffe_attr.pkl", anchor_sizes=(16.0, 32.0, 64.0, 128.0),
                               **SETTINGS)  # the pickle holds no anchors: the settings give them
  jax.tree.map(np.testing.assert_array_equal, variables, variables2)
  rgb = [f[f"raw_{i}"][..., ::-1] for i in range(2)]
  got = regions.RegionDetector(cfg, variables, short=96, long=160, resize="reference", selection="reference",
                               nms_thresholds=NMS, min_boxes=MIN_D, max_boxes=MAX_D)(rgb)
  for i, one in enumerate(got):
    n = int(f["out_preds_per_image"][i])
    assert one["enough"] and len(one["boxes"]) == n
    np.testing.assert_allclose(one["boxes"], f["out_boxes"][i][:n], atol=1e-3)
    np.testing.assert_allclose(one["features"], f["out_roi_features"][i][:n], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(one["obj_ids"], f["out_obj_ids"][i][:n])
    np.testing.assert_array_equal(one["attr_ids"], f["out_attr_ids"][i][:n])


@pytest.mark.parametrize("stride,bias,dtype", [(1, False, jnp.float32), (2, True, jnp.float32),
                                               (2, False, jnp.bfloat16)])
def test_1x1_convolutions_are_flax_s_conv_as_a_product(stride, bias, dtype):
  """frcnn.Conv1x1 (the 1 x 1 convolutions computed as matrix products) takes nn.Conv's
  parameters and gives its outputs, strided included, in float32 and bfloat16."""
  import flax.linen as nn  # noqa: PLC0415
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 7, 9, 6)).astype(np.float32))
  ours = frcnn.Conv1x1(5, stride, bias, dtype)
  theirs = nn.Conv(5, (1, 1), strides=(stride, stride), padding=((0, 0), (0, 0)), use_bias=bias, dtype=dtype)
  params = ours.init(jax.random.PRNGKey(0), x)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, theirs.init(jax.random.PRNGKey(0), x))
  if bias:
    params = jax.tree.map(lambda p: p + 0.5, params)
  got, want = ours.apply(params, x), theirs.apply(params, x)
  assert got.shape == want.shape == (2, -(-7 // stride), -(-9 // stride), 5) and got.dtype == want.dtype
  tol = 1e-6 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


def test_roi_pool_is_a_max_over_each_bin_s_cells():
  """frcnn.roi_pool against its definition, bin by bin in NumPy (torchvision's bin edges):
  boxes inside, across and outside the map, one cell, the whole map; empty bins 0."""
  rng = np.random.default_rng(1)
  h, w, c, size = 9, 13, 3, 4
  feat = rng.normal(size=(h, w, c)).astype(np.float32)
  boxes = np.asarray([[0, 0, 16 * w - 1, 16 * h - 1], [30, 20, 31, 21], [-40, -40, 100, 60],
                      [150, 100, 400, 300], [16 * w + 50, 0, 16 * w + 90, 40]], np.float32)
  corners = np.sort(rng.uniform(-20, 16 * w + 20, (40, 2)), 1), np.sort(rng.uniform(-20, 16 * h + 20, (40, 2)), 1)
  boxes = np.concatenate([boxes, np.stack([corners[0][:, 0], corners[1][:, 0], corners[0][:, 1],
                                           corners[1][:, 1]], 1).astype(np.float32)])
  got = np.asarray(frcnn.roi_pool(jnp.asarray(feat), jnp.asarray(boxes), size, 1 / 16))
  lo_t, hi_t = frcnn._bin_table(max(h, w) + 2, size)
  for i, (bx0, by0, bx1, by1) in enumerate(boxes):
    x0, y0, x1, y1 = (int(np.sign(v / 16) * np.floor(abs(v / 16) + 0.5)) for v in (bx0, by0, bx1, by1))
    rw, rh = max(x1 - x0 + 1, 1), max(y1 - y0 + 1, 1)
    for p in range(size):
      ys = np.clip(lo_t[min(rh, len(lo_t) - 1), p] + y0, 0, h)
      ye = np.clip(hi_t[min(rh, len(lo_t) - 1), p] + y0, 0, h)
      for q in range(size):
        xs = np.clip(lo_t[min(rw, len(lo_t) - 1), q] + x0, 0, w)
        xe = np.clip(hi_t[min(rw, len(lo_t) - 1), q] + x0, 0, w)
        want = feat[ys:ye, xs:xe].max((0, 1)) if ye > ys and xe > xs else np.zeros(c, np.float32)
        np.testing.assert_array_equal(got[i, p, q], want, err_msg=f"box {i} bin {p},{q}")
