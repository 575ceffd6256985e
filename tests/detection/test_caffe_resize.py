"""The default preprocessing is the Caffe original's: frcnn.caffe_scale / frcnn.resize_caffe
against OpenCV's own output (tests/detection/fixtures/caffe_resize.npz, written by
scripts/detection/make_caffe_resize_fixture.py from the original's ``_get_image_blob``), and
RegionDetector's canvas and box scales with it; the reference's reading (``resize="reference"``)
is a switch, and differs."""

import functools
from pathlib import Path

import numpy as np
import pytest

from jaxcap.detection import frcnn
from jaxcap.errors import BadInput

FIXTURE = Path(__file__).parent / "fixtures" / "caffe_resize.npz"
# float32 values up to ~230 in magnitude carry ~1.5e-5 of rounding each; OpenCV (IPP) and NumPy
# order the two passes' products differently: a few ulps, measured 3.1e-5 at most.
ATOL = 1e-4
# Cases whose reference reading maps pixels the same way (its per-axis ratio size / photo size
# equals the one scale, and the same size): the two agree up to rounding there, nowhere else.
SAME_MAPPING = {"square", "upscaled by 15", "exact halving", "COCO's 480 x 640 at 600 / 1000"}


@functools.lru_cache(maxsize=None)
def _fixture():
  with np.load(FIXTURE) as z:
    return {k: z[k] for k in z.files}


def _cases():
  f = _fixture()
  for i, name in enumerate(f["names"].tolist()):
    if f"image_{i}" in f:
      im = f[f"image_{i}"]
    else:  # a real-size photo: tiles of a stored block
      (h, w), tile = f[f"hw_{i}"], f[f"tile_{i}"]
      im = np.tile(tile, (-(-h // tile.shape[0]), -(-w // tile.shape[1]), 1))[:h, :w]
    short, long = (int(v) for v in f[f"settings_{i}"])
    yield i, name, im, short, long


def _compare(i, got_hxwx3):
  """``got`` against OpenCV's blob (or its stored samples): the largest absolute difference."""
  f = _fixture()
  if f"blob_{i}" in f:
    return float(np.abs(got_hxwx3 - f[f"blob_{i}"]).max())
  return float(np.abs(got_hxwx3.reshape(-1)[f[f"sample_idx_{i}"]] - f[f"sample_{i}"]).max())


def _caffe(im, short, long):
  scale, hw = frcnn.caffe_scale(im.shape[0], im.shape[1], short, long)
  x = (im - np.asarray(frcnn.PIXEL_MEAN_BGR, np.float64)).astype(np.float32)  # means first
  return scale, hw, frcnn.resize_caffe(x, scale, hw)


def test_the_fixture_covers_the_rules():
  f = _fixture()
  names = f["names"].tolist()
  assert len(names) >= 8 and len({tuple(f[f"out_hw_{i}"]) for i in range(len(names))}) >= 8
  shapes = [im.shape[:2] for _, _, im, _, _ in _cases()]
  assert any(h > w for h, w in shapes) and any(h < w for h, w in shapes) and any(h == w for h, w in shapes)
  assert any(float(f[f"im_scale_{i}"]) >= 10 for i in range(len(names)))  # a large upscale
  assert any(tuple(f[f"settings_{i}"]) == (600, 1000) for i in range(len(names)))


def test_scale_size_and_pixels_are_opencv_s():
  f = _fixture()
  for i, name, im, short, long in _cases():
    scale, hw, got = _caffe(im, short, long)
    assert scale == float(f[f"im_scale_{i}"]), name  # the same float64, exactly
    assert hw == tuple(int(v) for v in f[f"out_hw_{i}"]) and got.shape == (*hw, 3), name
    assert got.dtype == np.float32
    d = _compare(i, got)
    assert d <= ATOL, (name, d)  # measured 3.1e-5 at most (the fixture's OpenCV 5.1.0, IPP)


def test_sizes_round_half_to_even_where_the_reference_rounds_half_up():
  # 27 * 1.5 = 40.5: cv2.resize's output 40 (the fixture's), the reference's 41
  assert frcnn.caffe_scale(20, 27, 30, 50) == (1.5, (30, 40))
  assert frcnn.preprocess_size(20, 27, 30, 50) == (30, 41)
  # 101 * 0.5 = 50.5: np.round gives 50, not past the cap of 50, so the short side's scale stays
  assert frcnn.caffe_scale(60, 101, 30, 50) == (0.5, (30, 50))
  # the cap binds: the long side's scale, exactly long pixels
  assert frcnn.caffe_scale(250, 900, 600, 1000) == (1000 / 900, (278, 1000))


def test_the_reference_reading_differs():
  """The reference's resize (its sizes, the uint8 image resized, its per-axis ratio, the means
  after) against OpenCV's: another size or values apart by more than rounding wherever its mapping
  differs, and only rounding apart where the two map pixels the same way."""
  differs = set()
  for i, name, im, short, long in _cases():
    h, w = frcnn.preprocess_size(im.shape[0], im.shape[1], short, long)
    ref = np.asarray(frcnn.resize_bilinear(im, (h, w))) - np.asarray(frcnn.PIXEL_MEAN_BGR, np.float32)
    _, hw, caffe = _caffe(im, short, long)
    if (h, w) != hw or np.abs(ref - caffe).max() > 1.0:
      differs.add(name)
    else:
      assert np.abs(ref - caffe).max() < 0.05, name
      assert _compare(i, ref) < 0.05, name
  assert differs == set(_fixture()["names"].tolist()) - SAME_MAPPING


def _detector(**kw):
  from jaxcap.detection import regions  # noqa: PLC0415
  return regions.RegionDetector(frcnn.DetectorConfig(), None, **kw)  # preprocess needs no weights


def test_the_detector_s_default_canvas_and_scales_are_the_original_s():
  f = _fixture()
  picked = [c for c in _cases() if c[1] in ("landscape upscaled", "half to even: 27 * 1.5 = 40.5 -> 40")]
  (i0, _, im0, short, long), (i1, _, im1, _, _) = picked
  rgb = [im0[..., ::-1], im1[..., ::-1]]  # the fixture's photos are BGR, as cv2.imread gives them
  detect = _detector(short=short, long=long)
  canvas, sizes, scales = detect.preprocess(rgb)
  hws = [tuple(int(v) for v in f[f"out_hw_{i}"]) for i in (i0, i1)]
  assert sizes.tolist() == [list(hw) for hw in hws]
  assert canvas.shape == (2, max(h for h, _ in hws), max(w for _, w in hws), 3)
  for k, (i, (h, w)) in enumerate(zip((i0, i1), hws)):
    assert _compare(i, canvas[k, :h, :w]) <= ATOL
    assert not canvas[k, h:].any() and not canvas[k, :, w:].any()  # padded with 0
    assert detect.canvas_shape(rgb[k].shape[:2]) == (h, w)
    inv = np.float32(1.0 / float(f[f"im_scale_{i}"]))
    assert scales[k].tolist() == [inv, inv]  # one scale for both axes, as the original's boxes
  # the reference's reading: its sizes and per-axis ratios
  detect = _detector(short=short, long=long, resize="reference")
  _, sizes, scales = detect.preprocess(rgb)
  assert sizes[1].tolist() == [30, 41] and detect.canvas_shape(rgb[1].shape[:2]) == (30, 41)
  np.testing.assert_array_equal(scales[1], np.float32([20, 27]) / np.float32([30, 41]))


def test_a_wrong_resize_and_a_photo_resized_to_nothing_are_one_line():
  with pytest.raises(BadInput, match=r"^resize='cv2': expected one of caffe, reference$"):
    _detector(resize="cv2")
  # 1 x 200 at 30 / 50: the cap's scale 0.25 leaves 0.25 of a row (cv2.resize refuses it too)
  with pytest.raises(BadInput, match=r"^image 0: 1 x 200 pixels resize to 0 x 50 \(short=30, long=50\)"):
    _detector(short=30, long=50).preprocess([np.zeros((1, 200, 3), np.uint8)])
