"""Images in, captions out: a ``jaxcap-extract`` backbone feeding any region-feature captioner,
trained jointly (issue 58; ExpansionNet v2's end-to-end stage, big_vision's CapPa from pixels).

Dimension legend: B images, S the square image side, g the backbone's output grid side
(``g*g`` regions), D the backbone's feature width.

:class:`FromPixels` is a :class:`jaxcap.models.base.CaptionModel` that wraps two modules: the
backbone (:mod:`jaxcap.features.registry`: ViT-B/16, the ResNets) reads ``batch["pixels"]``
(uint8 ``[B, S, S, 3]``) and its output becomes the batch's region features exactly as
``jaxcap-extract``'s files would (the ``att`` grid's cells as regions, row-major, with grid
boxes; ``fc`` as the global feature; every region valid), which the captioner then encodes; the
decoder protocol (``init_cache``, ``decode_step``, ``decode_train``) is the captioner's, so
decoding, SCST, ensembles, export and serving carry it unchanged. The variables are
``{"params": {"backbone": ..., "captioner": ...}}`` (a ResNet's BatchNorm statistics under
``batch_stats``, frozen: fine-tuning uses the running averages, as captioning work does with a
batch of a few images per device).

A trained run splits back into the two (:func:`split_variables`): its backbone as a
:class:`TrainedBackbone` (what ``jaxcap-extract``'s record rebuilds for a feature run: read
images, compute ``fc`` / ``att``) and its captioner decoding feature batches laid out by
:data:`FEATURE_LAYOUT`, so ``Run.caption_images``, ``jaxcap-serve`` and ``jaxcap-export`` treat
a run from pixels as a feature run whose backbone is the trained one.

``freeze_backbone`` stops the gradient at the backbone's output, so XLA drops the backbone's
backward pass: the program of the "features first" phase (the backbone's optimiser is also held
still then: :func:`jaxcap.training.optim.make_optimizer`).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.data.base import grid_boxes
from jaxcap.errors import BadInput
from jaxcap.features import record as record_lib
from jaxcap.features import registry as backbones
from jaxcap.models import base

# The data fields under which jaxcap.data.base.image_features_batch lays a backbone's output out
# as FromPixels.features does: the att grid's cells as regions with grid boxes, fc as the global
# feature (the values only need to be set; no file is read).
FEATURE_LAYOUT = {"att_dir": "backbone", "fc_dir": "backbone", "grid": True}

class FromPixels(base.CaptionModel):
  """``backbone`` (pixels -> ``{"fc" [B, D], "att" [B, g, g, D]}``) then ``captioner``."""
  backbone: nn.Module
  captioner: base.CaptionModel
  freeze_backbone: bool = False
  # The backbone's initial weights: a .safetensors file as jaxcap-extract reads it (timm's /
  # torchvision's names), loaded into a fresh run's variables; "" keeps the random ones.
  weights: str = ""

  def check_prepare(self, dataset) -> None:
    if self.weights:
      self._read_weights()

  def _read_weights(self):
    from jaxcap.features import weights as weights_lib
    if not os.path.isfile(self.weights):
      raise BadInput(f"{self.weights}: config field backbone.weights: no such file; expected "
                       "the backbone's .safetensors (as jaxcap-extract --weights reads it)")
    return weights_lib.load(self.weights, self.backbone)[0]

  def prepare_variables(self, variables: dict, dataset) -> dict:
    """A fresh run's variables with ``weights`` loaded into the backbone's."""
    if not self.weights:
      return variables
    loaded = self._read_weights()
    out = {col: dict(tree) for col, tree in variables.items()}
    for col, tree in loaded.items():
      out.setdefault(col, {})["backbone"] = tree
    return out

  # The protocol's switches are the captioner's.
  @property
  def decode_train_groups(self):
    return self.captioner.decode_train_groups

  @property
  def scan_broadcast(self):
    return self.captioner.scan_broadcast

  @property
  def reads_global_feat(self):
    return self.captioner.reads_global_feat

  @property
  def frozen_collections(self):
    # A ResNet's BatchNorm statistics are inputs of the loss (running averages), never trained.
    return tuple(self.captioner.frozen_collections) + ("batch_stats",)

  def required_inputs(self) -> tuple[str, ...]:
    return tuple(x for x in self.captioner.required_inputs() if x not in ("image", "boxes")) + ("pixels",)

  def features(self, pixels_BxSxSx3) -> dict:
    """The batch's region-feature keys from the backbone's output (as jaxcap-extract's files
    read by ``data.grid=True``)."""
    out = self.backbone(pixels_BxSxSx3)
    if self.freeze_backbone:
      out = jax.lax.stop_gradient(out)
    att_BxgxgxD = out["att"]
    b, g, _, d = att_BxgxgxD.shape
    feats_BxNxD = att_BxgxgxD.reshape(b, g * g, d)
    return {"feats": feats_BxNxD, "feats_mask": jnp.ones((b, g * g), bool),
            "boxes": jnp.broadcast_to(jnp.asarray(grid_boxes(g)), (b, g * g, 4)),
            "global_feat": out["fc"]}

  def encode(self, batch: dict, train: bool = False) -> Any:
    return self.captioner.encode(dict(batch, **self.features(batch["pixels"])), train=train)

  def init_cache(self, enc: Any, max_len: int) -> Any:
    return self.captioner.init_cache(enc, max_len)

  def decode_step(self, enc, cache, tokens, t, train: bool = False):
    return self.captioner.decode_step(enc, cache, tokens, t, train)

  def decode_train(self, enc, tokens, train: bool = False, **kwargs):
    return self.captioner.decode_train(enc, tokens, train=train, **kwargs)


def split_variables(variables: dict) -> tuple[dict, dict]:
  """``(backbone variables, captioner variables)`` of a :class:`FromPixels` run's variables:
  each collection's ``backbone`` / ``captioner`` subtree (a ResNet's ``batch_stats`` go with
  the backbone)."""
  parts = ({}, {})
  for col, tree in variables.items():
    for part, name in zip(parts, ("backbone", "captioner")):
      if name in tree:
        part[col] = tree[name]
  return parts


class TrainedBackbone(record_lib.Backbone):
  """A run's trained backbone with the interface of the extractor a ``features.json`` record
  rebuilds (``size``, ``module``, ``variables``, ``read``, ``features``, ``pixel_features``):
  images read as ``jaxcap-extract`` reads them at the run's ``data.image_size``, features as
  ``FromPixels.features`` computes them (float32)."""

  def __init__(self, name: str, module, variables: dict, size: int, workdir: str | None = None,
               step: int | None = None):  # pylint: disable=super-init-not-called
    # Nothing to check or load: the weights are the run's own (no record, no weights file).
    self.module, self.variables, self.size = module, variables, int(size)
    self.record = {"backbone": name, "size": self.size,
                   "weights": {"trained": True, "workdir": workdir, "step": step}}
    self._extract = backbones.make_extract(module)


def backbone_info(backbone) -> dict:
  """What the captioner is built for (``info``'s feature fields): the backbone's width, its
  grid's cells as regions."""
  size = getattr(backbone, "image_size", None) or 224
  shapes = jax.eval_shape(lambda: backbone.init(jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3), jnp.uint8)))
  out = jax.eval_shape(backbone.apply, shapes, jax.ShapeDtypeStruct((1, size, size, 3), jnp.uint8))
  g, d = out["att"].shape[1], out["att"].shape[3]
  return {"feature_dim": int(d), "global_dim": int(out["fc"].shape[-1]), "max_regions": int(g * g)}


def backbone_config(config):
  """``config.backbone`` when the run reads pixels (its ``name`` set), else None."""
  section = config.get("backbone") if hasattr(config, "get") else None
  return section if section is not None and section.get("name") else None


def build_for_run(config, info: dict):
  """``(model, info)`` of a run's config: ``config.model`` built by the registry, wrapped in
  :class:`FromPixels` with ``config.backbone``'s module when the run reads pixels, its ``info``
  then carrying the backbone's feature sizes (what the captioner is built for, and what the
  workdir's info records). One line naming the field when the data and the backbone disagree."""
  from jaxcap.models import registry
  section = backbone_config(config)
  size = int(info.get("image_size", 0) or 0)
  if section is None:
    if size:
      raise BadInput(f"config field backbone.name: the data is image files (data.images_dir, "
                       f"{size} x {size} px) and no backbone reads them; expected a backbone "
                       "name (e.g. vit_b16, resnet50), or feature files")
    return registry.build(config.model, info), info
  if not size:
    raise BadInput(f"config field data.images_dir: backbone.name={section.name!r} reads image "
                     "files; expected data.images_dir (with data.image_size), not feature files")
  from jaxcap.features import extract
  try:
    module, _, _ = extract.build_backbone(section.name, section.get("fields") or None,
                                          dtype=str(section.get("dtype", "float32")))
  except BadInput as e:  # its messages name jaxcap-extract's flags
    raise BadInput(f"config field backbone: {e}") from None
  if getattr(module, "image_size", size) != size:
    raise BadInput(f"config field data.image_size: {section.name} takes {module.image_size} x "
                     f"{module.image_size} images; expected data.image_size={module.image_size}, got {size}")
  if section.get("remat"):
    module = module.clone(remat=True)
  info = dict(info, **backbone_info(module))
  return FromPixels(backbone=module, captioner=registry.build(config.model, info),
                    weights=str(section.get("weights") or "")), info
