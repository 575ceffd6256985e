"""Backbones by name, random variables for them, and the jitted batched extractor.

Dimension legend:
  B batch (images), H image height, W image width, g the ``att`` grid side, D feature width.

``build(name, **fields)`` returns the flax module with the named architecture; any dataclass
field (``width``, ``depths``, ``dim``, ``depth``, ``dtype``, ``att_size``, ...) can be overridden,
which is how the tests build tiny variants. ``make_extract(module)`` returns
``extract(variables, images_BxHxWx3_uint8) -> {"fc": [B, D], "att": [B, g, g, D]}`` (float32),
checking the input in Python (one line) before the jitted call.

``resnet*_self_critical`` are self-critical.pytorch's Caffe-style ResNets (``stride_on_1x1``,
``maxpool_ceil``: :mod:`jaxcap.features.resnet`), which its ``prepro_feats.py`` runs on each image
at its own resolution: :data:`NATIVE_BY_DEFAULT` names the backbones ``jaxcap-extract`` then
feeds unresized by default (``--size native``, :mod:`jaxcap.features.extract`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap.errors import BadInput
from jaxcap.features import image
from jaxcap.features.resnet import ResNet
from jaxcap.features.vit import ViT

_SELF_CRITICAL = {"stride_on_1x1": True, "maxpool_ceil": True}

BACKBONES: dict[str, tuple[type, dict[str, Any]]] = {
    "resnet50": (ResNet, {"depths": (3, 4, 6, 3)}),
    "resnet101": (ResNet, {"depths": (3, 4, 23, 3)}),
    "resnet152": (ResNet, {"depths": (3, 8, 36, 3)}),
    "resnet50_self_critical": (ResNet, {"depths": (3, 4, 6, 3), **_SELF_CRITICAL}),
    "resnet101_self_critical": (ResNet, {"depths": (3, 4, 23, 3), **_SELF_CRITICAL}),
    "resnet152_self_critical": (ResNet, {"depths": (3, 8, 36, 3), **_SELF_CRITICAL}),
    "vit_b16": (ViT, {"image_size": 224, "patch": 16, "dim": 768, "depth": 12, "num_heads": 12,
                      "mlp_dim": 3072}),
}

# prepro_feats.py never resizes: these backbones' features are those of the image as it is.
NATIVE_BY_DEFAULT = frozenset(n for n in BACKBONES if n.endswith("_self_critical"))

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def names() -> list[str]:
  return sorted(BACKBONES)


def build(name: str, **fields):
  """The module registered as ``name`` with ``fields`` overriding its defaults."""
  if name not in BACKBONES:
    raise BadInput(f"backbone {name!r}: expected one of {', '.join(names())}")
  cls, defaults = BACKBONES[name]
  known = set(cls.__dataclass_fields__) - {"parent", "name"}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise BadInput(f"backbone {name!r}: unknown field {unknown[0]!r}, expected one of "
                     f"{', '.join(sorted(known))}")
  values = dict(defaults, **fields)
  if isinstance(values.get("dtype"), str):
    if values["dtype"] not in DTYPES:
      raise BadInput(f"backbone {name!r}: dtype expected one of {', '.join(DTYPES)}, "
                       f"got {values['dtype']!r}")
    values["dtype"] = DTYPES[values["dtype"]]
  return cls(**values)


def example_size(module) -> int:
  """An image side the module accepts (the ViT's fixed size; 224 for a ResNet)."""
  return getattr(module, "image_size", 224)


def random_variables(module, seed: int = 0, size: int | None = None):
  """flax's initial variables (random weights, BatchNorm statistics 0 / 1), float32."""
  size = size or example_size(module)
  dummy = jnp.zeros((1, size, size, 3), jnp.uint8)
  return jax.jit(module.init)(jax.random.PRNGKey(seed), dummy)


def abstract_variables(module, size: int | None = None):
  """The variables' shapes (``jax.ShapeDtypeStruct`` leaves), computing nothing."""
  size = size or example_size(module)
  dummy = jax.ShapeDtypeStruct((1, size, size, 3), jnp.uint8)
  return jax.eval_shape(module.init, jax.random.PRNGKey(0), dummy)


def make_extract(module) -> Callable:
  """``extract(variables, images_BxHxWx3_uint8) -> {"fc", "att"}``, jitted once per input shape."""
  apply = jax.jit(module.apply)

  def extract(variables, images_BxHxWx3):
    if not hasattr(images_BxHxWx3, "dtype"):  # nested lists of pixel values
      images_BxHxWx3 = np.asarray(images_BxHxWx3)
    image.check_images(images_BxHxWx3, min_size=getattr(module, "patch", 1))
    return apply(variables, images_BxHxWx3)

  return extract
