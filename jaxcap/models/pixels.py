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

``freeze_backbone`` stops the gradient at the backbone's output, so XLA drops the backbone's
backward pass: the program of the "features first" phase (the backbone's optimiser is also held
still then: :func:`jaxcap.training.optim.make_optimizer`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.data.base import grid_boxes
from jaxcap.models import base

BACKBONE = "backbone"  # the variables' key of the backbone's parameters (the optimiser's label)


class FromPixels(base.CaptionModel):
  """``backbone`` (pixels -> ``{"fc" [B, D], "att" [B, g, g, D]}``) then ``captioner``."""
  backbone: nn.Module
  captioner: base.CaptionModel
  freeze_backbone: bool = False

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


def backbone_info(backbone) -> dict:
  """What the captioner is built for (``info``'s feature fields): the backbone's width, its
  grid's cells as regions."""
  size = getattr(backbone, "image_size", None) or 224
  shapes = jax.eval_shape(lambda: backbone.init(jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3), jnp.uint8)))
  out = jax.eval_shape(backbone.apply, shapes, jax.ShapeDtypeStruct((1, size, size, 3), jnp.uint8))
  g, d = out["att"].shape[1], out["att"].shape[3]
  return {"feature_dim": int(d), "global_dim": int(out["fc"].shape[-1]), "max_regions": int(g * g)}
