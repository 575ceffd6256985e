"""Image-side operations shared by the backbones: uint8 checks, ImageNet normalisation, pooling.

Dimension legend:
  B batch (images), H image height, W image width, h, w a feature map's height and width,
  g the pooled grid side (``att_size``), C channels.

The normalisation is ``(x / 255 - mean) / std`` per RGB channel, with the statistics the weights
were trained with: torchvision's ImageNet mean / std for its ResNets (as self-critical.pytorch's
``prepro_feats.py``), 0.5 / 0.5 for timm's augreg ViTs (their pretrained config; Google's
original ViT preprocessing to [-1, 1]). The grid pooling is PyTorch's
``adaptive_avg_pool2d``: output cell ``i`` of ``g`` averages input rows
``floor(i * h / g)`` to ``ceil((i + 1) * h / g)`` (exclusive), so cells may overlap and, when
``g > h``, repeat rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import jax.numpy as jnp

from jaxcap.errors import BadInput

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)


def check_images(images_BxHxWx3, min_size: int = 1) -> None:
  """One-line ``BadInput`` unless ``images`` is a uint8 ``[B, H, W, 3]`` batch."""
  shape = tuple(getattr(images_BxHxWx3, "shape", ()))
  dtype = getattr(images_BxHxWx3, "dtype", None)
  if len(shape) != 4 or shape[-1] != 3 or dtype != np.uint8:
    raise BadInput(f"images: expected a uint8 RGB batch [B, H, W, 3], got {dtype} {list(shape)}")
  if min(shape[1:3]) < min_size:
    raise BadInput(f"images: expected height and width >= {min_size}, got {list(shape[1:3])}")


def normalize(images_BxHxWx3, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype: Any = jnp.float32):
  """uint8 RGB -> ``(x / 255 - mean) / std`` in float32, then cast to the compute ``dtype``."""
  x = images_BxHxWx3.astype(jnp.float32) / 255.0
  x = (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)
  return x.astype(dtype)


def adaptive_pool_matrix(size: int, out: int) -> np.ndarray:
  """``[out, size]`` float32 averaging weights of PyTorch's 1-D adaptive average pooling."""
  m = np.zeros((out, size), np.float32)
  for i in range(out):
    start, end = (i * size) // out, math.ceil((i + 1) * size / out)
    m[i, start:end] = 1.0 / (end - start)
  return m


def adaptive_avg_pool(x_BxhxwxC, out: int):
  """``[B, h, w, C]`` -> ``[B, out, out, C]`` as ``F.adaptive_avg_pool2d`` (separable, exact)."""
  _, h, w, _ = x_BxhxwxC.shape
  ph_gxh = jnp.asarray(adaptive_pool_matrix(h, out), x_BxhxwxC.dtype)
  pw_gxw = jnp.asarray(adaptive_pool_matrix(w, out), x_BxhxwxC.dtype)
  return jnp.einsum("ih,jw,bhwc->bijc", ph_gxh, pw_gxw, x_BxhxwxC)
