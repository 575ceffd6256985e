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

import dataclasses
import math
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
  own = dict(_defaults(cls), **defaults)
  for key, value in fields.items():
    if key != "dtype":
      check_field(name, key, value, own.get(key))
  values = dict(defaults, **fields)
  if cls is ViT and values["dim"] % values["num_heads"]:
    raise BadInput(f"backbone {name!r}: dim {values['dim']} does not split into num_heads "
                   f"{values['num_heads']}; expected a dim that num_heads divides")
  if isinstance(values.get("dtype"), str):
    if values["dtype"] not in DTYPES:
      raise BadInput(f"backbone {name!r}: dtype expected one of {', '.join(DTYPES)}, "
                       f"got {values['dtype']!r}")
    values["dtype"] = DTYPES[values["dtype"]]
  return cls(**values)


def _defaults(cls) -> dict:
  return {k: f.default for k, f in cls.__dataclass_fields__.items()
          if not isinstance(f.default, type(dataclasses.MISSING))}


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
  return isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def check_field(name: str, key: str, value, default) -> None:
  """One-line ``BadInput`` unless ``value`` is a value of field ``key`` (a user's ``--fields``,
  a ``features.json``, a run's config): of its default's kind (a flag, an int >= 1, a
  finite number, a list of them as long as the default's). A 0 patch or a negative depth would fail deep inside the network (a division by
  zero, an empty stack) as if it were jaxcap's error."""
  where = f"backbone {name!r}: field {key!r} = {value!r}"
  if isinstance(default, bool):
    if not isinstance(value, (bool, np.bool_)):
      raise BadInput(f"{where}: expected true or false")
  elif key == "att_size" or _is_int(default):
    if not (_is_int(value) and value >= 1) and not (key == "att_size" and value is None):
      raise BadInput(f"{where}: expected an integer >= 1")
  elif isinstance(default, float):
    if not (_is_real(value) and value > 0):
      raise BadInput(f"{where}: expected a finite number > 0")
  elif isinstance(default, (tuple, list)):
    ok = isinstance(value, (tuple, list)) and len(value) == len(default) and all(
        (_is_int(v) and v >= 1) if _is_int(d) else (_is_real(v) and (key != "std" or v > 0))
        for v, d in zip(value, default))
    if not ok:
      kind = "integers >= 1" if all(_is_int(d) for d in default) else "finite numbers"
      raise BadInput(f"{where}: expected a list of {len(default)} {kind}")


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
