"""Backbone weights from checkpoints users download themselves: torchvision ResNet and timm ViT
``state_dict``s saved as ``.safetensors``, read with ``safetensors.numpy`` (no torch).

Dimension legend:
  O output channels / features, I input channels / features, Kh, Kw kernel size,
  D width, Hh heads, Dh = D / Hh.

Every tensor goes through an explicit name map, ``torch name -> Target`` (the flax variable
paths it fills, the conversion, the torch shape expected from the module's own variable
shapes):

- conv ``weight [O, I, Kh, Kw]`` -> ``kernel [Kh, Kw, I, O]`` (OIHW -> HWIO);
- linear ``weight [O, I]`` -> ``kernel [I, O]``; vectors (biases, LayerNorm, BatchNorm
  ``weight`` -> ``scale``, ``running_mean`` / ``running_var`` -> ``batch_stats`` ``mean`` / ``var``)
  as they are;
- timm's fused ``attn.qkv.weight [3D, D]`` -> ``attn/{query,key,value}/kernel [D, Hh, Dh]``
  (rows q, then k, then v, heads contiguous, as timm's reshape reads them), ``qkv.bias [3D]``
  -> ``{query,key,value}/bias [Hh, Dh]``; ``attn.proj.weight [D, D]`` -> ``attn/out/kernel [Hh, Dh, D]``.

Tensors of the classifier head (``fc.*``, ``head.*``) and BatchNorm's ``num_batches_tracked``
counters are skipped and counted. A missing tensor, a tensor no target takes, or a wrong shape
is one ``BadInput`` line naming the file, the first offending tensor (in the map's order)
and the expected and found shapes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import numpy as np
import jax

from jaxcap.errors import BadInput
from jaxcap.features import registry
from jaxcap.features.resnet import ResNet
from jaxcap.features.vit import ViT

Path = tuple[str, ...]

IGNORED_PREFIXES = ("fc.", "head.")
IGNORED_SUFFIXES = (".num_batches_tracked",)


@dataclasses.dataclass(frozen=True)
class Target:
  paths: tuple[Path, ...]                       # ("params", "conv1", "kernel"), ...
  torch_shape: tuple[int, ...]
  convert: Callable[[np.ndarray], tuple[np.ndarray, ...]]  # one array per path


def _leaf_shapes(tree) -> dict[Path, tuple[int, ...]]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {tuple(k.key for k in path): tuple(leaf.shape) for path, leaf in flat}


def _conv(shapes, path: Path) -> Target:
  kh, kw, i, o = shapes[path]
  return Target((path,), (o, i, kh, kw), lambda w: (np.transpose(w, (2, 3, 1, 0)),))


def _linear(shapes, path: Path) -> Target:
  i, o = shapes[path]
  return Target((path,), (o, i), lambda w: (w.T,))


def _same(shapes, path: Path) -> Target:
  return Target((path,), shapes[path], lambda w: (w,))


def _batch_norm(shapes, torch_prefix: str, path: Path) -> dict[str, Target]:
  return {f"{torch_prefix}.weight": _same(shapes, ("params",) + path + ("scale",)),
          f"{torch_prefix}.bias": _same(shapes, ("params",) + path + ("bias",)),
          f"{torch_prefix}.running_mean": _same(shapes, ("batch_stats",) + path + ("mean",)),
          f"{torch_prefix}.running_var": _same(shapes, ("batch_stats",) + path + ("var",))}


def resnet_name_map(module: ResNet) -> dict[str, Target]:
  """torchvision ``resnet*`` names -> the variables of ``module``."""
  shapes = _leaf_shapes(registry.abstract_variables(module, 64))
  out = {"conv1.weight": _conv(shapes, ("params", "conv1", "kernel")),
         **_batch_norm(shapes, "bn1", ("bn1",))}
  for stage, depth in enumerate(module.depths):
    for block in range(depth):
      t, f = f"layer{stage + 1}.{block}", f"layer{stage + 1}_{block}"
      for k in (1, 2, 3):
        out[f"{t}.conv{k}.weight"] = _conv(shapes, ("params", f, f"conv{k}", "kernel"))
        out.update(_batch_norm(shapes, f"{t}.bn{k}", (f, f"bn{k}")))
      if ("params", f, "downsample_conv", "kernel") in shapes:
        out[f"{t}.downsample.0.weight"] = _conv(shapes, ("params", f, "downsample_conv", "kernel"))
        out.update(_batch_norm(shapes, f"{t}.downsample.1", (f, "downsample_bn")))
  return out


def _qkv_weight(shapes, prefix: Path) -> Target:
  d, h, dh = shapes[prefix + ("query", "kernel")]
  paths = tuple(prefix + (n, "kernel") for n in ("query", "key", "value"))
  return Target(paths, (3 * h * dh, d),
                lambda w: tuple(part.T.reshape(d, h, dh) for part in np.split(w, 3, axis=0)))


def _qkv_bias(shapes, prefix: Path) -> Target:
  h, dh = shapes[prefix + ("query", "bias")]
  paths = tuple(prefix + (n, "bias") for n in ("query", "key", "value"))
  return Target(paths, (3 * h * dh,), lambda b: tuple(p.reshape(h, dh) for p in np.split(b, 3)))


def _proj_weight(shapes, path: Path) -> Target:
  h, dh, d = shapes[path]
  return Target((path,), (d, h * dh), lambda w: (w.T.reshape(h, dh, d),))


def vit_name_map(module: ViT) -> dict[str, Target]:
  """timm ``vit_*`` names -> the variables of ``module``."""
  shapes = _leaf_shapes(registry.abstract_variables(module))
  p = ("params",)
  out = {"cls_token": _same(shapes, p + ("cls_token",)),
         "pos_embed": _same(shapes, p + ("pos_embed",)),
         "patch_embed.proj.weight": _conv(shapes, p + ("patch_embed", "kernel")),
         "patch_embed.proj.bias": _same(shapes, p + ("patch_embed", "bias"))}
  for i in range(module.depth):
    t, f = f"blocks.{i}", p + (f"blocks_{i}",)
    for norm in ("norm1", "norm2"):
      out[f"{t}.{norm}.weight"] = _same(shapes, f + (norm, "scale"))
      out[f"{t}.{norm}.bias"] = _same(shapes, f + (norm, "bias"))
    out[f"{t}.attn.qkv.weight"] = _qkv_weight(shapes, f + ("attn",))
    out[f"{t}.attn.qkv.bias"] = _qkv_bias(shapes, f + ("attn",))
    out[f"{t}.attn.proj.weight"] = _proj_weight(shapes, f + ("attn", "out", "kernel"))
    out[f"{t}.attn.proj.bias"] = _same(shapes, f + ("attn", "out", "bias"))
    for fc in ("fc1", "fc2"):
      out[f"{t}.mlp.{fc}.weight"] = _linear(shapes, f + ("mlp", fc, "kernel"))
      out[f"{t}.mlp.{fc}.bias"] = _same(shapes, f + ("mlp", fc, "bias"))
  out["norm.weight"] = _same(shapes, p + ("norm", "scale"))
  out["norm.bias"] = _same(shapes, p + ("norm", "bias"))
  return out


def name_map(module) -> dict[str, Target]:
  if isinstance(module, ResNet):
    return resnet_name_map(module)
  if isinstance(module, ViT):
    return vit_name_map(module)
  raise ValueError(f"no checkpoint name map for {type(module).__name__}: expected a ResNet or ViT")


def _default_ignored(name: str) -> bool:
  return name.startswith(IGNORED_PREFIXES) or name.endswith(IGNORED_SUFFIXES)


def from_state_dict(module, tensors: dict[str, np.ndarray], source: str = "state_dict",
                    targets: dict[str, Target] | None = None, ignored=None):
  """``(variables, num_ignored)`` from torch-named arrays; ``source`` names them in errors.
  ``targets`` (default: :func:`name_map`'s) and ``ignored`` (a name -> bool predicate, default:
  classifier heads and BatchNorm counters) serve other towers (jaxcap.clip.weights)."""
  targets = name_map(module) if targets is None else targets
  is_ignored = _default_ignored if ignored is None else ignored
  for name, target in targets.items():
    if name not in tensors:
      raise BadInput(f"{source}: missing tensor {name} (expected shape {list(target.torch_shape)})")
    found = tuple(np.shape(tensors[name]))
    if found != target.torch_shape:
      raise BadInput(f"{source}: tensor {name}: expected shape {list(target.torch_shape)}, "
                       f"found {list(found)}")
  skipped = [n for n in tensors if n not in targets and is_ignored(n)]
  extra = [n for n in tensors if n not in targets and not is_ignored(n)]
  if extra:
    raise BadInput(f"{source}: unexpected tensor {extra[0]} {list(np.shape(tensors[extra[0]]))}: "
                     f"no parameter of this {type(module).__name__} takes it")
  variables: dict = {}
  for name, target in targets.items():
    arrays = target.convert(np.asarray(tensors[name], np.float32))
    for path, array in zip(target.paths, arrays):
      node = variables
      for key in path[:-1]:
        node = node.setdefault(key, {})
      node[path[-1]] = np.array(array, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
  return jax.tree_util.tree_map(jax.numpy.asarray, variables), len(skipped)


def check_finite(tensors: dict, path: str) -> dict:
  """``tensors`` (``{name: array}`` as the user's file names them) unless a floating-point one
  holds NaN or Inf: one line naming the file and the tensor (a diverged or damaged checkpoint
  would otherwise caption, or train, on NaNs without a word)."""
  for name, value in tensors.items():
    a = np.asarray(value)
    if np.issubdtype(a.dtype, np.floating) and a.size:
      bad = ~np.isfinite(a)
      if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), a.shape)
        raise BadInput(f"{path}: tensor {name!r} {list(a.shape)} holds {int(bad.sum())} NaN / Inf "
                       f"value(s) (first at {list(map(int, first))}); expected finite weights")
  return tensors


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """The file's tensors as numpy arrays, checked finite (:func:`check_finite`); one line when it
  is not a safetensors file."""
  from safetensors.numpy import load_file
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such checkpoint file")
  try:
    tensors = load_file(path)
  except Exception as e:  # safetensors raises its own SafetensorError (and others) on bad bytes
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise BadInput(f"{path}: not a readable safetensors file ({reason})") from None
  return check_finite(tensors, path)


def load(path: str, module):
  """``(variables, num_ignored)`` for ``module`` from a torchvision / timm ``.safetensors`` file."""
  return from_state_dict(module, read_safetensors(path), source=str(path))
