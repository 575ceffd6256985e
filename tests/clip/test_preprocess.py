"""CLIP's host preprocessing against ``clip.clip._transform`` (its Resize, CenterCrop, RGB
conversion, ToTensor, Normalize) on PNGs of several sizes and modes (make_fixtures.py)."""

import glob
import os

import numpy as np
import pytest

from jaxcap.clip import model as model_lib
from jaxcap.clip import preprocess
from jaxcap.features import image

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def test_pixels_equal_clip_transform():
  reference = np.load(os.path.join(FIXTURES, "embeddings.npz"))
  files = sorted(glob.glob(os.path.join(FIXTURES, "images", "*.png")))
  assert len(files) == 5
  for path in files:
    name = os.path.basename(path)[:-4]
    for n_px in (16, 32):
      pixels = preprocess.load_image(path, n_px)
      assert pixels.shape == (n_px, n_px, 3) and pixels.dtype == np.uint8
      got = np.asarray(image.normalize(pixels, model_lib.CLIP_MEAN, model_lib.CLIP_STD))
      np.testing.assert_allclose(got, reference[f"pre_{name}_{n_px}"], rtol=0, atol=1e-6)


def test_bad_image_files(tmp_path):
  bad = tmp_path / "bad.jpg"
  bad.write_bytes(b"not an image")
  with pytest.raises(ValueError, match=r"bad\.jpg: not an image PIL reads"):
    preprocess.load_image(str(bad))
  with pytest.raises(ValueError, match=r"gone\.jpg: no such image file"):
    preprocess.load_image(str(tmp_path / "gone.jpg"))
