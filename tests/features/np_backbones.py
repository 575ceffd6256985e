"""Independent float64 NumPy references of the backbones, written from the architectures and fed
torch-layout (NCHW, ``[out, in]``) state dicts with torchvision / timm names.

Dimension legend:
  B batch, C channels, H, W spatial size, O output channels, K kernel side, L tokens, D width.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

IMAGENET = (np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225]))  # torchvision
MINUS_ONE_TO_ONE = (np.full(3, 0.5), np.full(3, 0.5))  # timm's augreg ViTs


def normalize(images_uint8, stats):
  """uint8 [B, H, W, 3] -> float64 [B, 3, H, W] with the (mean, std) ``stats``."""
  mean, std = stats
  x = (images_uint8.astype(np.float64) / 255.0 - mean) / std
  return x.transpose(0, 3, 1, 2)


def conv2d(x_BxCxHxW, w_OxCxKxK, stride=1, pad=0, bias=None):
  x = np.pad(x_BxCxHxW, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  k = w_OxCxKxK.shape[-1]
  win = sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]  # B C h w K K
  out = np.einsum("bchwij,ocij->bohw", win, w_OxCxKxK)
  return out if bias is None else out + bias[None, :, None, None]


def batch_norm(x, sd, prefix, eps=1e-5):
  g, b = sd[f"{prefix}.weight"], sd[f"{prefix}.bias"]
  m, v = sd[f"{prefix}.running_mean"], sd[f"{prefix}.running_var"]
  return (x - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + eps) * g[None, :, None, None] \
      + b[None, :, None, None]


def relu(x):
  return np.maximum(x, 0.0)


def max_pool_3x3_s2_p1(x):
  x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
  return sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-1, -2))


def adaptive_avg_pool(x_BxCxHxW, out):
  b, c, h, w = x_BxCxHxW.shape
  res = np.zeros((b, c, out, out))
  for i in range(out):
    h0, h1 = (i * h) // out, math.ceil((i + 1) * h / out)
    for j in range(out):
      w0, w1 = (j * w) // out, math.ceil((j + 1) * w / out)
      res[:, :, i, j] = x_BxCxHxW[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
  return res


def bottleneck(x, sd, prefix, stride, residual=True, use_bn=True):
  bn = (lambda y, p: batch_norm(y, sd, p)) if use_bn else (lambda y, p: y)
  out = relu(bn(conv2d(x, sd[f"{prefix}.conv1.weight"]), f"{prefix}.bn1"))
  out = relu(bn(conv2d(out, sd[f"{prefix}.conv2.weight"], stride, 1), f"{prefix}.bn2"))
  out = bn(conv2d(out, sd[f"{prefix}.conv3.weight"]), f"{prefix}.bn3")
  if f"{prefix}.downsample.0.weight" in sd:
    x = bn(conv2d(x, sd[f"{prefix}.downsample.0.weight"], stride), f"{prefix}.downsample.1")
  return relu(out + x) if residual else relu(out)


def resnet(sd, images_uint8, depths, att_size, residual=True, use_bn=True):
  """``(fc [B, D], att [B, g, g, D])`` of torchvision's ResNet trunk."""
  sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  bn = (lambda y, p: batch_norm(y, sd, p)) if use_bn else (lambda y, p: y)
  x = relu(bn(conv2d(normalize(images_uint8, IMAGENET), sd["conv1.weight"], 2, 3), "bn1"))
  x = max_pool_3x3_s2_p1(x)
  for stage, depth in enumerate(depths):
    for block in range(depth):
      stride = 2 if stage > 0 and block == 0 else 1
      x = bottleneck(x, sd, f"layer{stage + 1}.{block}", stride, residual, use_bn)
  fc = x.mean(axis=(2, 3))
  att = adaptive_avg_pool(x, att_size).transpose(0, 2, 3, 1)
  return fc, att


def layer_norm(x, g, b, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * g + b


_erf = np.vectorize(math.erf)


def gelu(x):
  return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def vit(sd, images_uint8, patch, num_heads):
  """``(fc [B, D], att [B, g, g, D])`` of timm's ViT (token pooling, no head)."""
  sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  x = conv2d(normalize(images_uint8, MINUS_ONE_TO_ONE), sd["patch_embed.proj.weight"], patch, 0,
             sd["patch_embed.proj.bias"])
  b, d, g, _ = x.shape
  x = x.reshape(b, d, g * g).transpose(0, 2, 1)  # timm: flatten(2).transpose(1, 2)
  x = np.concatenate([np.broadcast_to(sd["cls_token"], (b, 1, d)), x], axis=1) + sd["pos_embed"]
  i = 0
  while f"blocks.{i}.norm1.weight" in sd:
    p = f"blocks.{i}"
    h = layer_norm(x, sd[f"{p}.norm1.weight"], sd[f"{p}.norm1.bias"])
    qkv = h @ sd[f"{p}.attn.qkv.weight"].T + sd[f"{p}.attn.qkv.bias"]  # B L 3D
    L = qkv.shape[1]
    qkv = qkv.reshape(b, L, 3, num_heads, d // num_heads).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    a = softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // num_heads))
    o = (a @ v).transpose(0, 2, 1, 3).reshape(b, L, d)
    x = x + o @ sd[f"{p}.attn.proj.weight"].T + sd[f"{p}.attn.proj.bias"]
    h = layer_norm(x, sd[f"{p}.norm2.weight"], sd[f"{p}.norm2.bias"])
    h = gelu(h @ sd[f"{p}.mlp.fc1.weight"].T + sd[f"{p}.mlp.fc1.bias"])
    x = x + h @ sd[f"{p}.mlp.fc2.weight"].T + sd[f"{p}.mlp.fc2.bias"]
    i += 1
  x = layer_norm(x, sd["norm.weight"], sd["norm.bias"])
  return x[:, 0], x[:, 1:].reshape(b, g, g, d)
