"""The detector from photo FILES against its reference: eight photos of different sizes and modes
(RGB / grayscale JPEG, grayscale, RGBA, palette, grayscale + alpha PNG, an EXIF-rotated JPEG, a
small PNG upscaled 3x) that LXMERT's own code read (its img_tensorize: cv2.imread, then the
local-file RGB-as-BGR quirk), preprocessed and ran through the tests' small detector, one photo
per call (scripts/detection/make_frcnn_photos_fixture.py wrote tests/detection/fixtures/photos/).
jaxcap reads each file as the detector's routes do (images.read_image, upright, native size) and
runs RegionDetector with the reference's switches (resize="reference", rgb_as_bgr=True,
selection="reference"): preprocessing, proposals before and after NMS, the heads and the final
regions are compared."""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import images as images_lib
from jaxcap.detection import frcnn, regions, weights

FIXTURES = Path(__file__).parent / "fixtures"
PHOTOS = FIXTURES / "photos"
NAMES = ["rgb.jpg", "gray.png", "rgba.png", "palette.png", "gray_alpha.png", "rotated.jpg", "gray.jpg", "small.png"]
SETTINGS = dict(pre_nms_topk=200, post_nms_topk=30)  # make_frcnn_fixture.py's CONFIG
NMS, MIN_D, MAX_D = (0.3, 0.5, 0.7, 0.9), 5, 10


@functools.lru_cache(maxsize=None)
def _reference():
  with np.load(PHOTOS / "reference.npz") as z:
    return {k: z[k] for k in z.files}


@functools.lru_cache(maxsize=None)
def _detector():
  cfg, v = weights.load(FIXTURES / "pytorch_model.bin", **SETTINGS)
  return regions.RegionDetector(cfg, v, short=96, long=160, resize="reference", rgb_as_bgr=True,
                                selection="reference", nms_thresholds=NMS, min_boxes=MIN_D, max_boxes=MAX_D)


def _photo(i):
  return images_lib.read_image(str(PHOTOS / NAMES[i]), images_lib.NATIVE, exif=True)


def test_the_photos_are_of_different_sizes_and_modes():
  from PIL import Image  # noqa: PLC0415
  modes, sizes = set(), set()
  for name in NAMES:
    with Image.open(PHOTOS / name) as im:
      modes.add((im.format, im.mode))
      sizes.add(im.size)
  assert len(modes) >= 7 and len(sizes) == len(NAMES)


@pytest.mark.parametrize("i", range(len(NAMES)))
def test_preprocessing_from_the_file_is_the_reference_s(i):
  f = _reference()
  canvas, sizes, scales = _detector().preprocess([_photo(i)])
  ref = f[f"images_{i}"].transpose(1, 2, 0)
  np.testing.assert_array_equal(sizes[0], f[f"sizes_{i}"])
  assert canvas[0].shape == ref.shape
  # within 1e-5 of the pixel range (jax's bilinear and torch's round their float32 differently)
  np.testing.assert_allclose(canvas[0], ref, atol=1e-5 * 255)
  np.testing.assert_allclose(scales[0], f[f"scales_yx_{i}"], rtol=1e-6)


@functools.lru_cache(maxsize=None)
def _run(i):
  det = _detector()
  cfg, v = det.cfg, det.variables
  canvas, sizes, scales = det.preprocess([_photo(i)])
  model = frcnn.Detector(cfg)

  def stages(v, x, hw):
    feat = model.apply(v, x, method=lambda m, x: m.backbone(x))
    logits, deltas = model.apply(v, feat, method=lambda m, f: m.rpn_head(f))
    cell = v["consts"]["cell_anchors"]
    return frcnn.pre_nms(cfg, logits[0], deltas[0], cell, hw[0]), model.apply(v, x, hw)

  (pre, top, _), out = jax.jit(stages)(v, jnp.asarray(canvas), jnp.asarray(sizes))
  sel = det([_photo(i)])[0]
  return jax.tree.map(np.asarray, (pre, top)), jax.tree.map(lambda a: np.asarray(a[0]), out), sel


@pytest.mark.slow  # a detector program per photo size: past the quick loop's CPU limit
@pytest.mark.parametrize("i", range(len(NAMES)))
def test_proposals_heads_and_regions_are_the_reference_s(i):
  f = _reference()
  (pre, top), out, sel = _run(i)
  # Before NMS: its top-k, decoded and clipped, within 1e-4 of the image's size, in its order
  # except inside a run of logits within float32 rounding of each other (its sort's order there
  # is not a rule): such a run holds the same boxes.
  ref_pre, ref_top = f[f"pre_nms_{i}"], f[f"pre_nms_logits_{i}"]
  tol = 1e-4 * np.abs(ref_pre).max()
  runs = np.concatenate([[0], np.cumsum(np.abs(np.diff(ref_top)) > 1e-4)])
  for r in np.unique(runs):
    rows = np.flatnonzero(runs == r)
    a, b = pre[rows], ref_pre[rows]
    np.testing.assert_allclose(a[np.lexsort(a.T[::-1])], b[np.lexsort(b.T[::-1])], atol=tol)
  np.testing.assert_allclose(top, f[f"pre_nms_logits_{i}"], rtol=1e-4, atol=1e-4)
  # After NMS: the same set (in the same order here: no ties).
  ref = f[f"proposals_{i}"]
  n = len(ref)
  assert out["valid"].sum() == n
  np.testing.assert_allclose(out["proposals"][:n], ref, atol=1e-3)
  np.testing.assert_allclose(out["features"][:n], f[f"pooled_{i}"], atol=1e-4 * np.abs(f[f"pooled_{i}"]).max())
  np.testing.assert_allclose(out["cls_logits"][:n], f[f"obj_logits_{i}"], rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(out["attr_logits"][:n], f[f"attr_logits_{i}"], rtol=1e-4, atol=1e-3)
  # Its final regions: boxes in order within 1e-3 px, features, argmax classes and attributes.
  c = int(f[f"out_preds_per_image_{i}"])
  assert len(sel["boxes"]) == c and sel["enough"]
  np.testing.assert_allclose(sel["boxes"], f[f"out_boxes_{i}"][:c], atol=1e-3)
  np.testing.assert_allclose(sel["features"], f[f"out_roi_features_{i}"][:c],
                             atol=1e-4 * np.abs(f[f"out_roi_features_{i}"]).max())
  np.testing.assert_array_equal(sel["obj_ids"], f[f"out_obj_ids_{i}"][:c])
  np.testing.assert_array_equal(sel["attr_ids"], f[f"out_attr_ids_{i}"][:c])
  np.testing.assert_allclose(sel["obj_probs"], f[f"out_obj_probs_{i}"][:c], atol=1e-5)
