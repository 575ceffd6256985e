"""Tiny backbones and random torch-layout state dicts for them (torchvision / timm names)."""

import numpy as np
import pytest

from jaxcap import features

TINY_RESNET = dict(width=4, depths=(1, 1, 1, 1), att_size=3)   # widths / 16, D = 128
TINY_VIT = dict(image_size=32, patch=8, dim=32, depth=2, num_heads=4, mlp_dim=64)


def random_state_dict(module, seed=0, head=True):
  """Random tensors of the shapes ``module``'s name map expects, plus what the loader skips."""
  rng = np.random.default_rng(seed)
  sd = {}
  for name, target in features.name_map(module).items():
    shape = target.torch_shape
    if name.endswith("running_var"):
      sd[name] = rng.uniform(0.5, 1.5, shape)
    elif name.endswith(("running_mean", ".bias")):
      sd[name] = 0.1 * rng.standard_normal(shape)
    elif len(shape) == 1:  # BatchNorm / LayerNorm scales
      sd[name] = rng.uniform(0.5, 1.5, shape)
    elif name in ("cls_token", "pos_embed"):
      sd[name] = 0.5 * rng.standard_normal(shape)
    else:
      sd[name] = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
    sd[name] = sd[name].astype(np.float32)
    if name.endswith("running_var"):
      sd[name.replace("running_var", "num_batches_tracked")] = np.array(7, np.int64)
  if head:
    d = module.feature_dim
    prefix = "fc" if isinstance(module, features.resnet.ResNet) else "head"
    sd[f"{prefix}.weight"] = rng.standard_normal((10, d)).astype(np.float32)
    sd[f"{prefix}.bias"] = np.zeros(10, np.float32)
  return sd


@pytest.fixture(scope="session")
def tiny_resnet():
  return features.build("resnet50", **TINY_RESNET)


@pytest.fixture(scope="session")
def tiny_vit():
  return features.build("vit_b16", **TINY_VIT)


def random_images(n, size, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
