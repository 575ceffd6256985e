"""OpenAI CLIP's ViT image tower and its text tower in linen, computing what ``clip/model.py``
(openai/CLIP) computes.

Dimension legend:
  B batch, S = ``image_resolution``, P patch side, g = S / P, N = g * g patches,
  Dv / Dt image / text tower width, E joint embedding width, T = ``context_length`` tokens,
  V vocabulary.

Image tower: uint8 ``[B, S, S, 3]`` (resized and centre-cropped on the host,
:mod:`jaxcap.clip.preprocess`) -> ``(x / 255 - mean) / std`` with CLIP's statistics -> conv P x P
stride P without bias -> ``[B, N, Dv]``; a learned class embedding prepended; position
embeddings ``[1 + N, Dv]`` added; ``ln_pre``; ``layers`` pre-LN blocks (LayerNorm eps 1e-5,
multi-head attention with biases, MLP 4 Dv with QuickGELU); ``ln_post`` of the class token;
``@ proj [Dv, E]``.

Text tower: token ids ``[B, T]`` -> embedding + position embeddings ``[T, Dt]``; the same blocks
under a causal mask (each token sees itself and the tokens before it); ``ln_final``; the token at
the position of the largest id (the end-of-text token 49407, the largest in CLIP's vocabulary:
``text.argmax(-1)`` in their code) ``@ text_projection [Dt, E]``.

The blocks are :class:`jaxcap.features.vit.Block` (timm's ViT block, the same computation with
another epsilon and activation); softmax in float32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

from jaxcap.errors import BadInput
from jaxcap.features import image
from jaxcap.features.vit import Block

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
EPS = 1e-5  # torch's LayerNorm default, which CLIP's LayerNorm subclass keeps


@dataclasses.dataclass(frozen=True)
class ClipSizes:
  """The sizes ``clip.model.build_model`` reads off a state dict (heads: width / 64, as theirs)."""
  embed_dim: int = 512
  image_resolution: int = 224
  vision_layers: int = 12
  vision_width: int = 768
  vision_patch_size: int = 32
  context_length: int = 77
  vocab_size: int = 49408
  transformer_width: int = 512
  transformer_heads: int = 8
  transformer_layers: int = 12
  vision_heads: int = 12
  activation: str = "quick_gelu"  # OpenAI's towers; open_clip's non-"quickgelu" models: "gelu"

  @property
  def grid(self) -> int:
    return self.image_resolution // self.vision_patch_size


VIT_B_32 = ClipSizes()  # ViT-B/16 and others: their sizes are read off their weights (weights.sizes_of)


def _layer_norm(name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=EPS, name=name)


class PatchEmbed(nn.Module):
  """Their ``conv1`` (P x P, stride P, no bias) as one matrix product over the image's P x P
  patches: the same parameter (``kernel [P, P, 3, D]``, nn.Conv's layout and initialiser), half
  the time of XLA's CPU convolution (ViT-B/32 at 64 images: 0.13 s against 0.30 s here).
  ``[B, S, S, C] -> [B, N, D]``, patches in row-major order, as the convolution's output."""
  features: int
  patch: int

  @nn.compact
  def __call__(self, x_BxSxSxC):
    b, h, w, c = x_BxSxSxC.shape
    p = self.patch
    kernel_PxPxCxD = self.param("kernel", nn.initializers.lecun_normal(), (p, p, c, self.features))
    g_h, g_w = h // p, w // p
    patches = x_BxSxSxC[:, :g_h * p, :g_w * p].reshape(b, g_h, p, g_w, p, c).transpose(0, 1, 3, 2, 4, 5)
    return patches.reshape(b, g_h * g_w, p * p * c) @ kernel_PxPxCxD.reshape(p * p * c, self.features)


class ImageTower(nn.Module):
  sizes: ClipSizes

  @nn.compact
  def __call__(self, images_BxSxSx3):
    s = self.sizes
    b, h, w, _ = images_BxSxSx3.shape
    if (h, w) != (s.image_resolution, s.image_resolution):
      raise BadInput(f"images: expected {s.image_resolution} x {s.image_resolution} pixels for "
                       f"this CLIP, got {h} x {w} (jaxcap.clip.preprocess resizes and crops)")
    x = image.normalize(images_BxSxSx3, CLIP_MEAN, CLIP_STD)
    x_BxNxD = PatchEmbed(s.vision_width, s.vision_patch_size, name="conv1")(x)
    init = nn.initializers.normal(s.vision_width ** -0.5)
    cls_D = self.param("class_embedding", init, (s.vision_width,))
    pos_LxD = self.param("positional_embedding", init, (1 + s.grid * s.grid, s.vision_width))
    x_BxLxD = jnp.concatenate([jnp.broadcast_to(cls_D, (b, 1, s.vision_width)), x_BxNxD], 1)
    x_BxLxD = _layer_norm("ln_pre")(x_BxLxD + pos_LxD)
    for i in range(s.vision_layers):
      # The last block computes the class token alone: it is all the tower reads.
      last = i == s.vision_layers - 1
      x_BxLxD = Block(s.vision_heads, 4 * s.vision_width, EPS, activation=s.activation,
                      name=f"resblocks_{i}")(x_BxLxD, rows_BxR=jnp.zeros((b, 1), jnp.int32) if last else None)
    cls_BxD = _layer_norm("ln_post")(x_BxLxD[:, 0])
    proj_DxE = self.param("proj", init, (s.vision_width, s.embed_dim))
    return cls_BxD @ proj_DxE


class TextTower(nn.Module):
  sizes: ClipSizes

  @nn.compact
  def __call__(self, tokens_BxT, project: bool = True):
    """``[B, E]`` embeddings; ``project=False``: the pooled ``[B, Dt]`` before the projection
    (what CLIP-Caption-Reward's grammar head reads)."""
    s = self.sizes
    t = tokens_BxT.shape[-1]
    if not 0 < t <= s.context_length:
      raise BadInput(f"tokens: expected at most {s.context_length} per caption, got {t}")
    d = s.transformer_width
    x_BxTxD = nn.Embed(s.vocab_size, d, embedding_init=nn.initializers.normal(0.02),
                       name="token_embedding")(tokens_BxT)
    # Fewer than context_length tokens (every caption's end of text among them) give the same
    # embeddings: under the causal mask no position sees a later one, so the padding past the
    # longest caption changes nothing it pools (jaxcap.clip.score cuts batches to their length).
    x_BxTxD = x_BxTxD + self.param("positional_embedding", nn.initializers.normal(0.01),
                                   (s.context_length, d))[:t]
    causal_1x1xTxT = nn.make_causal_mask(jnp.ones((1, t)))
    eot_B = jnp.argmax(tokens_BxT, axis=-1)  # their pooling: the end-of-text token has the largest id
    # The last block computes the end-of-text token alone (all the tower reads), its causal row.
    eot_mask_Bx1x1xT = (jnp.arange(t)[None, :] <= eot_B[:, None])[:, None, None, :]
    for i in range(s.transformer_layers):
      last = i == s.transformer_layers - 1
      x_BxTxD = Block(s.transformer_heads, 4 * d, EPS, activation=s.activation, name=f"resblocks_{i}")(
          x_BxTxD, eot_mask_Bx1x1xT if last else causal_1x1xTxT, rows_BxR=eot_B[:, None] if last else None)
    if s.transformer_layers:
      x_BxD = x_BxTxD[:, 0]  # the last block returned the end-of-text row alone: [B, 1, D]
    else:  # no blocks: the embeddings' end-of-text position
      x_BxD = jnp.take_along_axis(x_BxTxD, eot_B[:, None, None], axis=1)[:, 0]
    pooled_BxD = _layer_norm("ln_final")(x_BxD)
    proj_DxE = self.param("text_projection", nn.initializers.normal(d ** -0.5), (d, s.embed_dim))
    return pooled_BxD @ proj_DxE if project else pooled_BxD


class CLIP(nn.Module):
  """Both towers and the logit scale; ``encode_image`` / ``encode_text`` as their methods."""
  sizes: ClipSizes = VIT_B_32

  def setup(self):
    self.visual = ImageTower(self.sizes)
    self.text = TextTower(self.sizes)
    self.logit_scale = self.param("logit_scale", nn.initializers.constant(np.log(1 / 0.07)), ())

  def encode_image(self, images_BxSxSx3):
    return self.visual(images_BxSxSx3)

  def encode_text(self, tokens_BxT):
    return self.text(tokens_BxT)

  def encode_text_pooled(self, tokens_BxT):
    """The text tower's pooled output before ``text_projection`` ``[B, Dt]``."""
    return self.text(tokens_BxT, project=False)

  def __call__(self, images_BxSxSx3, tokens_BxT):
    return self.encode_image(images_BxSxSx3), self.encode_text(tokens_BxT), self.logit_scale


def abstract_variables(sizes: ClipSizes):
  """The variables' shapes (no computation), for the weight name map."""
  s = sizes
  model = CLIP(s)
  return jax.eval_shape(
      model.init, jax.random.key(0),
      jax.ShapeDtypeStruct((1, s.image_resolution, s.image_resolution, 3), jnp.uint8),
      jax.ShapeDtypeStruct((1, s.context_length), jnp.int32))


def init_variables(sizes: ClipSizes, seed: int = 0):
  """Random variables of a CLIP of ``sizes`` (trials and tests; scores need the user's weights)."""
  s = sizes
  return jax.jit(CLIP(s).init)(
      jax.random.key(seed), jnp.zeros((1, s.image_resolution, s.image_resolution, 3), jnp.uint8),
      jnp.zeros((1, s.context_length), jnp.int32))


def normalized(x_BxE):
  """Rows scaled to unit length, in float32 (their ``x / sqrt(sum(x ** 2))``)."""
  x_BxE = jnp.asarray(x_BxE, jnp.float32)
  return x_BxE / jnp.sqrt(jnp.sum(x_BxE ** 2, axis=-1, keepdims=True))
