"""A PNG check that reads the file back independently of matplotlib's writer: the 8-byte
signature, the IHDR width / height, and the decoded pixels holding more than the background."""

import struct

import numpy as np


def check_png(path, min_size=(50, 50)):
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  assert data[12:16] == b"IHDR"
  w, h = struct.unpack(">II", data[16:24])
  assert w >= min_size[0] and h >= min_size[1], (w, h)
  import matplotlib.image
  img = matplotlib.image.imread(str(path))
  assert img.shape[:2] == (h, w)
  rgb = img[..., :3].reshape(-1, 3)
  background = np.all(rgb > 0.99, axis=-1)
  assert background.mean() < 0.995, "blank figure"  # something was drawn
  assert len(np.unique(np.round(rgb, 2), axis=0)) > 3  # more than a couple of flat colours
  return w, h
