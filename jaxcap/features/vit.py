"""Vision Transformer image features with timm's ``vit_base_patch16_224`` layout (the CLIP image
tower's, without its pre-LayerNorm).

Dimension legend:
  B batch (images), H = W = ``image_size``, P patch side, g = H / P patches per side,
  N = g * g patches, D width, Hh heads, Dh = D / Hh, F MLP width.

Pixels are scaled with ``mean`` / ``std`` (0.5 / 0.5, timm's augreg ViTs: values in [-1, 1]).
Patch embedding: Conv P x P stride P (with bias) -> ``[B, N, D]``, a learned class token
prepended, learned position embeddings ``[1, 1 + N, D]`` added. Then ``depth`` pre-LN blocks:
``x + Attn(LN(x))``, ``x + MLP(LN(x))`` with multi-head self-attention (qkv and output
projections with biases, scores scaled by 1 / sqrt(Dh)) and MLP = Dense(F) -> GELU (exact, erf)
-> Dense(D); LayerNorm eps 1e-6; a final LayerNorm. No classifier.

Outputs: ``fc [B, D]``, the class token after the final LayerNorm (timm's ``token`` pooling), and
``att [B, g, g, D]``, the patch tokens after it. The position embeddings are learned for one
size, so images must be ``image_size`` square (no interpolation of the table).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import flax.linen as nn

from jaxcap.errors import BadInput
from jaxcap.features import image


def quick_gelu(x):
  """OpenAI CLIP's activation, ``x * sigmoid(1.702 x)`` (its towers were trained with it)."""
  return x * nn.sigmoid(1.702 * x)


ACTIVATIONS = {"gelu": lambda x: nn.gelu(x, approximate=False), "quick_gelu": quick_gelu}


class Mlp(nn.Module):
  mlp_dim: int
  dtype: Any = jnp.float32
  activation: str = "gelu"  # exact (erf) GELU: timm's; "quick_gelu": OpenAI CLIP's

  @nn.compact
  def __call__(self, x_BxLxD):
    h = ACTIVATIONS[self.activation](nn.Dense(self.mlp_dim, dtype=self.dtype, name="fc1")(x_BxLxD))
    return nn.Dense(x_BxLxD.shape[-1], dtype=self.dtype, name="fc2")(h)


class Block(nn.Module):
  """Pre-LN transformer block (timm's ViT; OpenAI CLIP's towers with ``eps=1e-5``,
  ``activation="quick_gelu"`` and, for the text tower, a causal ``mask``)."""
  num_heads: int
  mlp_dim: int
  eps: float = 1e-6
  dtype: Any = jnp.float32
  activation: str = "gelu"

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxHxLxL=None, rows_BxR=None):
    """``rows_BxR``: only those positions' outputs ``[B, R, D]`` (their queries against every
    key, then their MLP; ``mask`` then ``[B, 1, R, L]``): the last block of a tower that reads
    one token computes that token alone, the same numbers for it."""
    h_BxLxD = nn.LayerNorm(epsilon=self.eps, dtype=self.dtype, name="norm1")(x_BxLxD)
    q_BxRxD, x_BxRxD = h_BxLxD, x_BxLxD
    if rows_BxR is not None:  # LayerNorm is per position: norm1's rows are the rows' norm1
      q_BxRxD = jnp.take_along_axis(h_BxLxD, rows_BxR[..., None], axis=1)
      x_BxRxD = jnp.take_along_axis(x_BxLxD, rows_BxR[..., None], axis=1)
    x_BxRxD = x_BxRxD + nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype, deterministic=True,
        force_fp32_for_softmax=True, name="attn")(q_BxRxD, h_BxLxD, mask=mask_BxHxLxL)  # bfloat16 softmax loses small weights
    h = nn.LayerNorm(epsilon=self.eps, dtype=self.dtype, name="norm2")(x_BxRxD)
    return x_BxRxD + Mlp(self.mlp_dim, self.dtype, self.activation, name="mlp")(h)


class ViT(nn.Module):
  """uint8 images ``[B, S, S, 3]`` (S = ``image_size``) -> ``{"fc": [B, D], "att": [B, g, g, D]}``."""
  image_size: int = 224  # the one size the position table is learned for
  patch: int = 16
  eps: float = 1e-6  # LayerNorm's (timm's ViTs; torch's default 1e-5 elsewhere)
  dim: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  # timm's augreg ViTs are trained on pixels scaled to [-1, 1] (mean = std = 0.5), not on
  # ImageNet-normalised ones; OpenAI CLIP towers would need CLIP's own statistics here.
  mean: Sequence[float] = image.INCEPTION_MEAN
  std: Sequence[float] = image.INCEPTION_STD
  dtype: Any = jnp.float32
  # Recompute each block's activations in the backward pass instead of keeping them (nn.remat):
  # the memory of a fine-tuned backbone for a third more arithmetic; the same numbers.
  remat: bool = False

  @property
  def feature_dim(self) -> int:
    return self.dim

  @property
  def grid(self) -> int:
    return self.image_size // self.patch

  @nn.compact
  def __call__(self, images_BxHxWx3):
    b, h, w, _ = images_BxHxWx3.shape
    if self.image_size % self.patch:  # the size itself is wrong, whatever the images are
      below = self.image_size // self.patch * self.patch
      raise BadInput(f"image size {self.image_size}: expected a multiple of this ViT's patch "
                       f"{self.patch} (e.g. {below or self.patch} or {below + self.patch})")
    if (h, w) != (self.image_size, self.image_size):
      raise BadInput(f"images: expected {self.image_size} x {self.image_size} pixels for this ViT, "
                       f"got {h} x {w}")
    x = image.normalize(images_BxHxWx3, self.mean, self.std, self.dtype)
    x = nn.Conv(self.dim, (self.patch, self.patch), strides=(self.patch, self.patch), padding="VALID",
                dtype=self.dtype, name="patch_embed")(x)
    g = self.grid
    x_BxNxD = x.reshape(b, g * g, self.dim)
    init = nn.initializers.normal(0.02)
    cls_1x1xD = self.param("cls_token", init, (1, 1, self.dim))
    pos_1xLxD = self.param("pos_embed", init, (1, 1 + g * g, self.dim))
    x_BxLxD = jnp.concatenate([jnp.broadcast_to(cls_1x1xD, (b, 1, self.dim)).astype(self.dtype),
                               x_BxNxD], axis=1) + pos_1xLxD.astype(self.dtype)
    block = nn.remat(Block) if self.remat else Block
    for i in range(self.depth):
      x_BxLxD = block(self.num_heads, self.mlp_dim, self.eps, self.dtype, name=f"blocks_{i}")(x_BxLxD)
    x_BxLxD = nn.LayerNorm(epsilon=self.eps, dtype=self.dtype, name="norm")(x_BxLxD).astype(jnp.float32)
    return {"fc": x_BxLxD[:, 0], "att": x_BxLxD[:, 1:].reshape(b, g, g, self.dim)}
