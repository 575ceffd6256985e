"""Random CLIP weights with CLIP's full vocabulary and small towers, and images, for the tests
of the scores' plumbing (the equalities with the reference code use the committed fixtures)."""

import os

import numpy as np
from PIL import Image

from jaxcap.clip import model as model_lib
from jaxcap.clip import weights

SIZES = model_lib.ClipSizes(embed_dim=16, image_resolution=32, vision_layers=1, vision_width=64,
                            vision_patch_size=16, transformer_width=64, transformer_layers=1,
                            transformer_heads=2, vision_heads=2)


def random_weights(folder, seed: int = 3) -> str:
  path = os.path.join(str(folder), "clip.safetensors")
  weights.save_random(path, SIZES, seed)
  return path


def images(folder, n: int, names=None) -> dict:
  """``n`` PNGs of different sizes; ``{key: path}`` (keys 0..n-1, files named ``names[i]``)."""
  rng = np.random.default_rng(0)
  out = {}
  for i in range(n):
    path = os.path.join(str(folder), (names[i] if names else f"img{i}") + ".png")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (40 + 7 * i, 50, 3), dtype=np.uint8)).save(path)
    out[i] = path
  return out
