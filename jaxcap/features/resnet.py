"""ResNet-50/101/152 image features: torchvision's architecture (v1.5), or, with the two Caffe-style
fields, self-critical.pytorch's ``captioning/utils/resnet.py`` that its ``prepro_feats.py`` runs.

Dimension legend:
  B batch (images), H image height, W image width, h, w the last feature map's height and width
  (H / 32, W / 32 rounded up), g the ``att`` grid side (``att_size``), D = 8 * width * expansion
  (2048 for the standard width 64).

Stem: Conv 7x7 stride 2 pad 3 -> BatchNorm -> ReLU -> MaxPool 3x3 stride 2 pad 1. Then four
stages of ``depths`` Bottleneck blocks of widths ``width * (1, 2, 4, 8)``: Conv 1x1 -> BN -> ReLU
-> Conv 3x3 (the stage's stride 2, except the first stage, is on this conv: torchvision v1.5)
-> BN -> ReLU -> Conv 1x1 (x ``expansion``) -> BN, plus the shortcut (Conv 1x1 with the stride
-> BN when the shape changes, else the identity), then ReLU. No classifier. BatchNorm is in
inference mode (running statistics, eps 1e-5), so the features are a function of each image alone.

self-critical.pytorch's ResNet (the ``resnet*_self_critical`` backbones of the registry) is the
original Caffe ResNet's layout on torchvision's modules and parameter names:
``maxpool_ceil`` makes the stem's MaxPool 3x3 stride 2 with no padding and ``ceil_mode=True``
(a last, partial window on the bottom / right edge instead of a -inf border on every side), and
``stride_on_1x1`` puts the stride of the first block of stages 2-4 on its 1x1 ``conv1`` (the
3x3 ``conv2`` then has stride 1). The weights are the same shapes, so one name map loads both.

Outputs: ``fc [B, D]``, the mean of the last map over its h x w cells, and ``att [B, g, g, D]``,
its adaptive average pooling to g x g (``att_size``; 14 at 448 px is prepro_feats' default, at
224 px each of the 7 x 7 cells is repeated). ``att_size=None`` keeps the native h x w grid.
Parameter names mirror torchvision's (``conv1``, ``bn1``, ``layer3_5/conv2``, ``layer1_0/downsample_conv``)
so that :mod:`jaxcap.features.weights` maps them one to one.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax.numpy as jnp
import flax.linen as nn

from jaxcap.features import image


def _conv(features: int, kernel: int, stride: int, dtype, name: str) -> nn.Conv:
  pad = kernel // 2
  return nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding=((pad, pad), (pad, pad)),
                 use_bias=False, dtype=dtype, name=name)


def _bn(dtype, name: str) -> nn.BatchNorm:
  return nn.BatchNorm(use_running_average=True, momentum=0.9, epsilon=1e-5, dtype=dtype, name=name)


def _max_pool_ceil(x_BxhxwxC):
  """PyTorch's ``MaxPool2d(3, stride=2, padding=0, ceil_mode=True)``: ``ceil((n - 3) / 2) + 1``
  windows per side, the last one cut by the edge (padded with -inf on the bottom / right only).
  With no padding a window never starts past the input, so torch drops none."""
  pads = []
  for n in x_BxhxwxC.shape[1:3]:
    out = max(1, -(-(n - 3) // 2) + 1)
    pads.append((0, max(0, 2 * (out - 1) + 3 - n)))
  return nn.max_pool(x_BxhxwxC, (3, 3), strides=(2, 2), padding=pads)


class Bottleneck(nn.Module):
  """torchvision's ``Bottleneck`` (stride on the 3x3 conv), or Caffe's (``stride_on_1x1``)."""
  width: int
  stride: int = 1
  expansion: int = 4
  downsample: bool = False
  stride_on_1x1: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxhxwxC):
    s1, s3 = (self.stride, 1) if self.stride_on_1x1 else (1, self.stride)
    out = nn.relu(_bn(self.dtype, "bn1")(_conv(self.width, 1, s1, self.dtype, "conv1")(x_BxhxwxC)))
    out = nn.relu(_bn(self.dtype, "bn2")(_conv(self.width, 3, s3, self.dtype, "conv2")(out)))
    out = _bn(self.dtype, "bn3")(_conv(self.width * self.expansion, 1, 1, self.dtype, "conv3")(out))
    shortcut = x_BxhxwxC
    if self.downsample:
      shortcut = _conv(self.width * self.expansion, 1, self.stride, self.dtype,
                       "downsample_conv")(shortcut)
      shortcut = _bn(self.dtype, "downsample_bn")(shortcut)
    return nn.relu(out + shortcut)


class ResNet(nn.Module):
  """uint8 images ``[B, H, W, 3]`` -> ``{"fc": [B, D], "att": [B, g, g, D]}`` float32."""
  depths: Sequence[int] = (3, 4, 23, 3)
  width: int = 64
  expansion: int = 4
  att_size: Optional[int] = 14
  mean: Sequence[float] = image.IMAGENET_MEAN  # the pixel statistics torchvision's weights expect
  std: Sequence[float] = image.IMAGENET_STD
  # self-critical.pytorch's Caffe-style ResNet (module docstring); both False is torchvision's.
  stride_on_1x1: bool = False
  maxpool_ceil: bool = False
  dtype: Any = jnp.float32
  remat: bool = False  # recompute each block's activations in the backward pass (nn.remat)

  @property
  def feature_dim(self) -> int:
    return 8 * self.width * self.expansion

  @nn.compact
  def __call__(self, images_BxHxWx3):
    x = image.normalize(images_BxHxWx3, self.mean, self.std, self.dtype)
    x = nn.relu(_bn(self.dtype, "bn1")(_conv(self.width, 7, 2, self.dtype, "conv1")(x)))
    if self.maxpool_ceil:
      x = _max_pool_ceil(x)
    else:
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))  # pads with -inf
    in_features = self.width
    bottleneck = nn.remat(Bottleneck) if self.remat else Bottleneck
    for stage, depth in enumerate(self.depths):
      width = self.width * 2 ** stage
      for block in range(depth):
        stride = 2 if stage > 0 and block == 0 else 1
        downsample = block == 0 and (stride != 1 or in_features != width * self.expansion)
        x = bottleneck(width, stride, self.expansion, downsample, self.stride_on_1x1, self.dtype,
                       name=f"layer{stage + 1}_{block}")(x)
        in_features = width * self.expansion
    x_BxhxwxD = x.astype(jnp.float32)
    fc_BxD = x_BxhxwxD.mean(axis=(1, 2))
    att = x_BxhxwxD if self.att_size is None else image.adaptive_avg_pool(x_BxhxwxD, self.att_size)
    return {"fc": fc_BxD, "att": att}
