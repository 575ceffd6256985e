"""tests/detection/fixtures/caffe_resize.npz: the Caffe original's preprocessing, computed by
OpenCV itself, that jaxcap's default resize (frcnn.caffe_scale / frcnn.resize_caffe) must give.

The original (peteanderson80/bottom-up-attention, lib/fast_rcnn/test.py ``_get_image_blob``;
MILVLG/bottom-up-attention.pytorch's utils/extract_utils.py ``get_image_blob`` is the same)
subtracts the BGR means from the float32 image, takes one scale for both axes (short side to
``short`` unless ``np.round`` of the long side passes ``long``) and calls ``cv2.resize(fx=fy=
scale, INTER_LINEAR)``. Its lines are transcribed in :func:`get_image_blob` below, with the
sizes a parameter. Needs numpy and opencv-python(-headless), not jaxcap:

    python scripts/detection/make_caffe_resize_fixture.py [--out tests/detection/fixtures/caffe_resize.npz]

Photos of random uint8 pixels (seed 0), each chosen for a rule (``names``): portrait, landscape,
square, an output side where rounding half to even differs from half up, a long side of exactly
``long + 0.5`` (np.round keeps the short-side scale), the long-side cap binding, upscaling by 15,
exact halving (OpenCV then runs its INTER_AREA code, which equals the linear one), and two at the
real 600 / 1000. Small photos use ``short`` / ``long`` of 30 / 50 (one 60 / 100), keeping the
file small; the two real-size photos are tiles of a stored 37 x 53 block (``tile_<i>``, cropped
to ``hw_<i>``) and keep 4,096 output values at stored flat indices (``sample_idx_<i>``,
``sample_<i>``) instead of the whole blob (``blob_<i>``).

OpenCV's result depends on its build: with IPP (opencv-python's wheels, the default) a float32
INTER_LINEAR resize computes each source coordinate in double precision; without it (OpenCV's own
code, and in any build for a photo 1 pixel high or wide) the coordinate is first rounded to
float32. The blobs are the IPP build's, as this OpenCV runs by default; ``generic_maxdiff_<i>``
records how far OpenCV's own code (``cv2.ipp.setUseIPP(False)``) is from them.
"""

from __future__ import annotations

import argparse
import os

import cv2
import numpy as np

PIXEL_MEANS = np.array([[[102.9801, 115.9465, 122.7717]]])  # the original's cfg.PIXEL_MEANS (float64)
SMALL, REAL = (30, 50), (600, 1000)
# (name, h, w, (short, long))
CASES = [
    ("landscape upscaled", 19, 27, SMALL),
    ("portrait upscaled", 27, 19, SMALL),
    ("square", 20, 20, SMALL),
    ("half to even: 27 * 1.5 = 40.5 -> 40", 20, 27, SMALL),
    ("long side 101 * 0.5 = 50.5 rounds to 50: no cap", 60, 101, SMALL),
    ("the long cap binds", 10, 45, SMALL),
    ("upscaled by 15", 2, 3, SMALL),
    ("exact halving", 60, 80, SMALL),
    ("downscaled, 60 / 100", 97, 131, (60, 100)),
    ("upscaled by 4.3", 7, 11, SMALL),
    ("COCO's 480 x 640 at 600 / 1000", 480, 640, REAL),
    ("the long cap binds at 600 / 1000", 250, 900, REAL),
]
TILE_HW = (37, 53)
SAMPLES = 4096


def get_image_blob(im, short, long):
  """``_get_image_blob`` for one scale (cfg.TEST.SCALES = (short,), cfg.TEST.MAX_SIZE = long):
  ``(blob [h', w', 3] float32, im_scale)``."""
  im_orig = im.astype(np.float32, copy=True)
  im_orig -= PIXEL_MEANS
  im_shape = im_orig.shape
  im_size_min = np.min(im_shape[0:2])
  im_size_max = np.max(im_shape[0:2])
  im_scale = float(short) / float(im_size_min)
  # Prevent the biggest axis from being more than MAX_SIZE
  if np.round(im_scale * im_size_max) > long:
    im_scale = float(long) / float(im_size_max)
  im = cv2.resize(im_orig, None, None, fx=im_scale, fy=im_scale, interpolation=cv2.INTER_LINEAR)
  return im, im_scale


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  p.add_argument("--out", default=os.path.join(repo, "tests", "detection", "fixtures", "caffe_resize.npz"))
  a = p.parse_args(argv)
  rng = np.random.default_rng(0)
  ipp = bool(cv2.ipp.useIPP())
  out = {"names": np.asarray([c[0] for c in CASES]), "opencv": np.asarray(cv2.__version__),
         "ipp": np.asarray(ipp)}
  for i, (name, h, w, (short, long)) in enumerate(CASES):
    if (short, long) == REAL:
      tile = rng.integers(0, 256, (*TILE_HW, 3), dtype=np.uint8)
      im = np.tile(tile, (-(-h // TILE_HW[0]), -(-w // TILE_HW[1]), 1))[:h, :w]
      out[f"tile_{i}"], out[f"hw_{i}"] = tile, np.asarray([h, w])
    else:
      im = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
      out[f"image_{i}"] = im
    blob, im_scale = get_image_blob(im, short, long)
    cv2.ipp.setUseIPP(False)
    generic, _ = get_image_blob(im, short, long)
    cv2.ipp.setUseIPP(ipp)
    assert blob.shape == generic.shape and blob.dtype == np.float32, (blob.shape, generic.shape)
    out[f"settings_{i}"] = np.asarray([short, long])
    out[f"im_scale_{i}"] = np.asarray(im_scale, np.float64)
    out[f"out_hw_{i}"] = np.asarray(blob.shape[:2])
    out[f"generic_maxdiff_{i}"] = np.asarray(np.abs(blob - generic).max(), np.float32)
    if (short, long) == REAL:
      idx = rng.choice(blob.size, SAMPLES, replace=False).astype(np.int64)
      out[f"sample_idx_{i}"], out[f"sample_{i}"] = idx, blob.reshape(-1)[idx]
    else:
      out[f"blob_{i}"] = blob
    print(f"{i} {name}: {h} x {w} at {short}/{long} -> {blob.shape[0]} x {blob.shape[1]}, scale {im_scale!r}, "
          f"OpenCV's own code within {float(out[f'generic_maxdiff_{i}']):.2g}")
  np.savez_compressed(a.out, **out)
  print(f"wrote {a.out} ({os.path.getsize(a.out) / 1024:.0f} KiB; OpenCV {cv2.__version__}, IPP {ipp})")


if __name__ == "__main__":
  main()
