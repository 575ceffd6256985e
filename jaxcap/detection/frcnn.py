"""The bottom-up-attention Faster R-CNN (Anderson et al., CVPR 2018) as its PyTorch port computes it:
LXMERT's ``modeling_frcnn.py`` (huggingface/transformers-research-projects ``lxmert/``; the model
users load as ``unc-nlp/frcnn-vg-finetuned``), itself detectron2's reading of the Caffe model.
notes/frcnn_reference_spec.md gives every rule below with the reference's line numbers.

Dimension legend:
  B images, H x W the (padded) canvas, h x w the res4 map (stride 16), C channels, A anchors per
  cell, P proposals kept per image (``post_nms_topk``), S the RoI pool side (14), K classes
  (foreground), T attributes, D the region feature (2048 at full width).

Layers (NHWC; the reference is NCHW, its weights are transposed on import):
  * ResNet C4 backbone: stem Conv 7x7/2 -> BN -> ReLU -> MaxPool 3x3/2 (Caffe's: no padding,
    ceil mode), then res2-res4 of Bottleneck blocks with the stride on the first 1x1 (the MSRA /
    Caffe layout). BatchNorm in inference mode, eps 1e-5.
  * RPN: Conv 3x3 (``rpn_hidden``) -> ReLU, a 1x1 objectness logit per anchor (sigmoid form) and
    a 1x1 of 4 deltas per anchor.
  * RoI head: RoIPool S x S at 1/16 (torchvision's kernel, not RoIAlign), res5 (3 blocks) at
    stride 1 with dilation 2 in every 3x3 (the VG model's "RES5HALVE = False"), mean over S x S.
  * Box predictor: class logits (K + 1, background LAST), class-specific deltas (4K), and the
    attribute head: Embedding(K + 1, D / 8) of the argmax class (background included),
    concatenated after the feature -> Linear(D / 4) -> ReLU -> Linear(T + 1).

Parameter names follow the reference's modules (``backbone/res4_22/conv1``,
``proposal_generator/rpn_head/conv``, ``roi_heads/box_predictor/cls_score``) so that an importer
maps its state_dict one to one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.detection import boxes as box_ops
from jaxcap.features.resnet import _max_pool_ceil

# BGR pixel means of the Caffe model (its PIXEL_MEAN; std 1): pixels are 0..255 minus the mean.
PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)
BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


@dataclasses.dataclass(frozen=True)
class DetectorConfig:
  """The detector's shape and inference settings. Defaults: the VG model (1,600 objects, 400
  attributes, ResNet-101) with the values notes/frcnn_reference_spec.md section 7 derives."""
  depth: int = 101
  stem_out: int = 64
  res2_out: int = 256
  width_per_group: int = 64
  stride_in_1x1: bool = True
  caffe_maxpool: bool = True
  res5_dilation: int = 2  # 2: res5 at stride 1, dilated ("RES5HALVE = False"); 1: stride 2
  rpn_hidden: int = 512
  anchor_sizes: Tuple[float, ...] = (64.0, 128.0, 256.0, 512.0)
  aspect_ratios: Tuple[float, ...] = (0.5, 1.0, 2.0)
  anchor_offset: float = 0.0
  stride: int = 16
  pre_nms_topk: int = 6000
  post_nms_topk: int = 300
  rpn_nms: float = 0.7
  min_box_size: float = 0.0
  pooler_resolution: int = 14
  num_classes: int = 1600
  num_attrs: int = 400
  # The attribute head's embedding and hidden widths; 0: D / 8 and D / 4 (the reference's rule,
  # 256 / 512 at full width; MILVLG's code fixes 256 / 512 whatever D is).
  attr_embed: int = 0
  attr_hidden: int = 0
  bbox_reg_weights: Tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
  # MILVLG's bua-caffe reading (its checkpoints are the Caffe model's blobs; weights.py sets it
  # for a file in that layout): "+1" box widths in every decoding, clipping to w - 1 / h - 1,
  # RPN proposals filtered (empty, or a side of at most min_box_size x the image's resize factor)
  # BEFORE the top pre_nms_topk, NMS with "+1" areas suppressing at IoU >= the threshold
  # (maskrcnn-benchmark's kernel), attribute probabilities a softmax over all T + 1 (no-attribute
  # included, as its head computes them), not renormalised over the T.
  bua_caffe: bool = False

  @property
  def num_anchors(self) -> int:
    return len(self.anchor_sizes) * len(self.aspect_ratios)

  @property
  def feature_dim(self) -> int:
    return self.res2_out * 8


def _conv(features, kernel, stride=1, dilation=1, name=None, dtype=jnp.float32, bias=False):
  if kernel == 1:
    return Conv1x1(features, stride, bias, dtype, name=name)
  pad = dilation * (kernel // 2)
  return nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding=((pad, pad), (pad, pad)),
                 kernel_dilation=(dilation, dilation), use_bias=bias, dtype=dtype, name=name)


class Conv1x1(nn.Module):
  """``nn.Conv`` with a 1 x 1 kernel (the same parameters: ``kernel [1, 1, in, out]``, ``bias``),
  computed as a matrix product over the channels of the (strided) positions: XLA's CPU backend
  runs the product about twice as fast as the same convolution (a [58800, 512] x [512, 512]
  product 0.15 s, the 1 x 1 convolution 0.31 s on 2 cores), and half of ResNet's work is in
  these. Up to float rounding it is the convolution (tests/detection/test_frcnn.py)."""
  features: int
  stride: int = 1
  use_bias: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (1, 1, x.shape[-1], self.features))
    if self.stride > 1:
      x = x[:, ::self.stride, ::self.stride]
    y = jnp.dot(x.astype(self.dtype), kernel[0, 0].astype(self.dtype))
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,)).astype(self.dtype)
    return y


class ConvBN(nn.Module):
  """The reference's ``Conv2d(..., norm=BatchNorm2d)``: conv without bias, then inference BN."""
  features: int
  kernel: int
  stride: int = 1
  dilation: int = 1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = _conv(self.features, self.kernel, self.stride, self.dilation, "conv", self.dtype)(x)
    return nn.BatchNorm(use_running_average=True, epsilon=1e-5, dtype=self.dtype, name="norm")(x)


class Block(nn.Module):
  """detectron2's ``BottleneckBlock``: 1x1 -> 3x3 (dilated) -> 1x1, shortcut conv when the
  channels change, ReLU after the sum."""
  out: int
  bottleneck: int
  stride: int = 1
  dilation: int = 1
  stride_in_1x1: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    s1, s3 = (self.stride, 1) if self.stride_in_1x1 else (1, self.stride)
    y = nn.relu(ConvBN(self.bottleneck, 1, s1, dtype=self.dtype, name="conv1")(x))
    y = nn.relu(ConvBN(self.bottleneck, 3, s3, self.dilation, dtype=self.dtype, name="conv2")(y))
    y = ConvBN(self.out, 1, dtype=self.dtype, name="conv3")(y)
    if x.shape[-1] != self.out:
      x = ConvBN(self.out, 1, self.stride, dtype=self.dtype, name="shortcut")(x)
    return nn.relu(y + x)


class Backbone(nn.Module):
  """Mean-subtracted BGR ``[B, H, W, 3]`` -> res4 ``[B, h, w, 4 * res2_out]``."""
  cfg: DetectorConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    x = nn.relu(ConvBN(c.stem_out, 7, 2, dtype=self.dtype, name="stem_conv1")(x.astype(self.dtype)))
    if c.caffe_maxpool:
      x = _max_pool_ceil(x)  # the grid backbones' Caffe max pool (self-critical's ResNet)
    else:
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    out, bottleneck = c.res2_out, c.width_per_group
    for stage, n in enumerate(BLOCKS[c.depth][:3]):
      for i in range(n):
        stride = 2 if stage > 0 and i == 0 else 1
        x = Block(out, bottleneck, stride, 1, c.stride_in_1x1, self.dtype, name=f"res{stage + 2}_{i}")(x)
      out, bottleneck = out * 2, bottleneck * 2
    return x


class RPNHead(nn.Module):
  """res4 -> objectness logits ``[B, h, w, A]`` and deltas ``[B, h, w, A, 4]``."""
  cfg: DetectorConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    a = self.cfg.num_anchors
    t = nn.relu(_conv(self.cfg.rpn_hidden, 3, name="conv", dtype=self.dtype, bias=True)(x))
    logits = _conv(a, 1, name="objectness_logits", dtype=self.dtype, bias=True)(t)
    deltas = _conv(4 * a, 1, name="anchor_deltas", dtype=self.dtype, bias=True)(t)
    # Channel a * 4 + k is anchor a's delta k (the reference's view(N, A, 4, H, W)).
    return logits.astype(jnp.float32), deltas.astype(jnp.float32).reshape(*deltas.shape[:3], a, 4)


class Res5(nn.Module):
  """Pooled RoIs ``[R, S, S, 4 * res2_out]`` -> ``[R, S', S', 8 * res2_out]``."""
  cfg: DetectorConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    dilated = c.res5_dilation == 2
    for i in range(3):
      stride = 2 if i == 0 and not dilated else 1
      x = Block(c.res2_out * 8, c.width_per_group * 8, stride, c.res5_dilation, c.stride_in_1x1,
                self.dtype, name=f"res5_{i}")(x)
    return x


class BoxPredictor(nn.Module):
  """Pooled features ``[R, D]`` -> class logits ``[R, K + 1]``, deltas ``[R, K, 4]``, attribute
  logits ``[R, T + 1]`` (float32)."""
  cfg: DetectorConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, f_RxD):
    c = self.cfg
    d = f_RxD.shape[-1]
    scores = nn.Dense(c.num_classes + 1, dtype=self.dtype, name="cls_score")(f_RxD).astype(jnp.float32)
    deltas = nn.Dense(4 * c.num_classes, dtype=self.dtype, name="bbox_pred")(f_RxD).astype(jnp.float32)
    # The attribute head sees the argmax over all K + 1 classes, background included.
    emb = nn.Embed(c.num_classes + 1, c.attr_embed or d // 8, dtype=self.dtype,
                   name="cls_embedding")(jnp.argmax(scores, -1))
    h = nn.relu(nn.Dense(c.attr_hidden or d // 4, dtype=self.dtype, name="fc_attr")(jnp.concatenate([f_RxD, emb.astype(f_RxD.dtype)], -1)))
    attrs = nn.Dense(c.num_attrs + 1, dtype=self.dtype, name="attr_score")(h).astype(jnp.float32)
    return scores, deltas.reshape(-1, c.num_classes, 4), attrs


def _bin_table(n_max: int, size: int):
  """``(lo, hi)`` int32 ``[n_max, size]``: RoIPool's bin ``p`` of an ``n``-cell side covers cells
  ``[lo[n, p], hi[n, p])`` (torchvision's float32 formula)."""
  n = np.arange(n_max, dtype=np.float32)[:, None]
  b = n / np.float32(size)
  p = np.arange(size, dtype=np.float32)[None]
  return np.floor(p * b).astype(np.int32), np.ceil((p + np.float32(1)) * b).astype(np.int32)


def roi_pool(feat_hxwxC, boxes_Rx4, size: int, scale: float):
  """torchvision's ``roi_pool`` (= Caffe's ROIPooling) of one image: ``[R, size, size, C]``.

  Each box is rounded to map cells (``round`` half away from zero of ``x * scale``), at least
  one cell wide; bin ``p`` covers ``[floor(p * n / size), ceil((p + 1) * n / size))`` cells of
  its ``n`` (in the kernel's float32: ``n / size`` first), offset by the box's start and clipped
  to the map; an empty bin is 0. Static shapes: a bin spans at most ``kh = ceil(h / size) + 1``
  rows and ``kw = ceil(w / size) + 1`` columns, so the map's maxima over every window of up to
  ``kh x kw`` cells are computed once (``[kh, kw, h, w, C]``, by running maxima: about 24 times
  the map at the VG model's 600 x 1000) and each bin is one gather from them, its window's
  length and start (in float32 max is exact: the values are the windows' own)."""
  h, w, _ = feat_hxwxC.shape
  r = jnp.sign(boxes_Rx4 * scale) * jnp.floor(jnp.abs(boxes_Rx4 * scale) + 0.5)
  r = r.astype(jnp.int32)
  x0, y0, x1, y1 = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
  rw = jnp.maximum(x1 - x0 + 1, 1)
  rh = jnp.maximum(y1 - y0 + 1, 1)

  def bins(start, n, limit):
    # The bin edges of an n-cell side, as the kernel's float32 arithmetic gives them
    # (ceil((p + 1) * (n / size)) with n / size rounded to float32 first): a table computed by
    # NumPy's IEEE float32, not by XLA, which may divide by a reciprocal and move an edge a cell.
    lo_t, hi_t = _bin_table(max(h, w) + 2, size)
    n = jnp.clip(n, 1, lo_t.shape[0] - 1)
    lo = jnp.clip(jnp.asarray(lo_t)[n] + start[:, None], 0, limit)
    hi = jnp.clip(jnp.asarray(hi_t)[n] + start[:, None], 0, limit)
    return lo, hi  # [R, size] each

  hs, he = bins(y0, rh, h)
  ws, we = bins(x0, rw, w)
  kh = -(-h // size) + 1
  kw = -(-w // size) + 1
  neg = jnp.asarray(-jnp.inf, feat_hxwxC.dtype)
  padded = jnp.pad(feat_hxwxC, ((0, kh), (0, kw), (0, 0)), constant_values=neg)
  rows = [padded[:h]]  # rows[a][y, x] = max of rows y .. y + a (past the map: -inf)
  for a in range(1, kh):
    rows.append(jnp.maximum(rows[-1], padded[a:a + h]))
  table = []  # table[a][b][y, x] = max over rows y .. y + a, columns x .. x + b
  for r_a in rows:
    cols = [r_a[:, :w]]
    for b in range(1, kw):
      cols.append(jnp.maximum(cols[-1], r_a[:, b:b + w]))
    table.append(jnp.stack(cols))
  table = jnp.stack(table)  # [kh, kw, h, w, C]
  lh = jnp.clip(he - hs, 0, kh)  # [R, size]: each row bin's length (the window it reads)
  lw = jnp.clip(we - ws, 0, kw)
  a = jnp.maximum(lh - 1, 0)[:, :, None]
  b = jnp.maximum(lw - 1, 0)[:, None, :]
  y = jnp.clip(hs, 0, h - 1)[:, :, None]
  x = jnp.clip(ws, 0, w - 1)[:, None, :]
  g = table[a, b, y, x]  # [R, size, size, C]
  empty = ((lh == 0)[:, :, None] | (lw == 0)[:, None, :])[..., None]
  return jnp.where(empty, jnp.zeros((), g.dtype), g)


def pre_nms(cfg: DetectorConfig, logits_hxwxA, deltas_hxwxAx4, cell_Ax4, image_hw, image_scale=1.0):
  """One image's proposals before NMS: the top ``pre_nms_topk`` anchors by objectness, decoded
  and clipped to the image. Returns ``boxes [k, 4]`` (pixels of the resized image), ``logits
  [k]`` (descending) and ``ok [k]`` (not empty: a side longer than ``min_box_size``).
  ``cfg.bua_caffe``: MILVLG's order (``find_top_bua_rpn_proposals``): every anchor decoded and
  clipped, the empty ones and those with a side (+1) of at most ``min_box_size * image_scale``
  dropped BEFORE the top ``pre_nms_topk``; ``image_scale`` the resized / original size."""
  h, w, a = logits_hxwxA.shape
  anchors = box_ops.grid_anchors(cell_Ax4, h, w, cfg.stride, cfg.anchor_offset)
  logits = logits_hxwxA.reshape(-1)
  k = min(cfg.pre_nms_topk, logits.shape[0])
  if cfg.bua_caffe:
    every = box_ops.apply_deltas(deltas_hxwxAx4.reshape(-1, 4), anchors, plus_one=True)
    every = box_ops.clip(every, image_hw[0], image_hw[1], minus_one=True)
    bw, bh = every[:, 2] - every[:, 0], every[:, 3] - every[:, 1]
    least = cfg.min_box_size * image_scale
    ok = (bw > 0) & (bh > 0) & (bw + 1 > least) & (bh + 1 > least)
    top, idx = jax.lax.top_k(jnp.where(ok, logits, -jnp.inf), k)
    return every[idx], top, ok[idx]
  top, idx = jax.lax.top_k(logits, k)
  props = box_ops.apply_deltas(deltas_hxwxAx4.reshape(-1, 4)[idx], anchors[idx])
  props = box_ops.clip(props, image_hw[0], image_hw[1])
  ok = ((props[:, 2] - props[:, 0]) > cfg.min_box_size) & ((props[:, 3] - props[:, 1]) > cfg.min_box_size)
  return props, top, ok


def propose(cfg: DetectorConfig, logits_hxwxA, deltas_hxwxAx4, cell_Ax4, image_hw, image_scale=1.0):
  """One image's proposals: :func:`pre_nms`'s, NMS at ``rpn_nms`` (``cfg.bua_caffe``: its
  kernel's "+1" areas, suppressed at IoU >= the threshold), the first ``post_nms_topk`` kept.
  Returns ``boxes [P, 4]`` (image pixels of the resized image), ``logits [P]`` (descending) and
  ``valid [P]`` (False on the padding past the kept count)."""
  props, top, ok = pre_nms(cfg, logits_hxwxA, deltas_hxwxAx4, cell_Ax4, image_hw, image_scale)
  keep, count = box_ops.nms(props, top, cfg.rpn_nms, cfg.post_nms_topk, ok, plus_one=cfg.bua_caffe,
                            inclusive=cfg.bua_caffe)
  valid = jnp.arange(cfg.post_nms_topk) < count
  safe = jnp.where(valid, keep, 0)
  return props[safe], jnp.where(valid, top[safe], -jnp.inf), valid


class Detector(nn.Module):
  """Mean-subtracted BGR canvases ``[B, H, W, 3]`` and each image's resized size ``[B, 2]`` (h, w)
  (and, for ``cfg.bua_caffe``, each image's resize factor ``[B]``)
  -> per-proposal outputs: ``proposals [B, P, 4]``, ``valid [B, P]``, ``features [B, P, D]``
  (the mean-pooled res5), ``cls_logits [B, P, K + 1]``, ``deltas [B, P, K, 4]``,
  ``attr_logits [B, P, T + 1]``. Selection of the regions is :func:`select_hf` /
  :func:`select_caffe` (pure functions of these)."""
  cfg: DetectorConfig = DetectorConfig()
  dtype: Any = jnp.float32

  def setup(self):
    self.backbone = Backbone(self.cfg, self.dtype)
    self.rpn_head = RPNHead(self.cfg, self.dtype)
    self.res5 = Res5(self.cfg, self.dtype)
    self.box_predictor = BoxPredictor(self.cfg, self.dtype)
    c = self.cfg
    self.cell_anchors = self.variable(
        "consts", "cell_anchors", lambda: jnp.asarray(box_ops.cell_anchors(c.anchor_sizes, c.aspect_ratios)))

  def __call__(self, images_BxHxWx3, image_hw_Bx2, image_scale_B=None):
    c = self.cfg
    feat = self.backbone(images_BxHxWx3)
    logits, deltas = self.rpn_head(feat)
    cell = self.cell_anchors.value
    if image_scale_B is None:  # only cfg.bua_caffe's minimum proposal side reads it
      image_scale_B = jnp.ones((images_BxHxWx3.shape[0],), jnp.float32)
    props, _, valid = jax.vmap(lambda l, d, hw, s: propose(c, l, d, cell, hw, s))(
        logits, deltas, image_hw_Bx2, image_scale_B)
    pooled = jax.vmap(lambda f, b: roi_pool(f, b, c.pooler_resolution, 1.0 / c.stride))(feat, props)
    b, p = props.shape[:2]
    x = self.res5(pooled.reshape(b * p, *pooled.shape[2:]))
    f = x.astype(jnp.float32).mean(axis=(1, 2))
    scores, box_deltas, attrs = self.box_predictor(f.astype(self.dtype))
    return {"proposals": props, "valid": valid, "features": f.reshape(b, p, -1),
            "cls_logits": scores.reshape(b, p, -1), "deltas": box_deltas.reshape(b, p, c.num_classes, 4),
            "attr_logits": attrs.reshape(b, p, -1)}


def select_hf(cfg: DetectorConfig, out, image_hw, nms_thresholds: Sequence[float] = (0.6,),
              min_detections: int = 36, max_detections: int = 36, scale_yx=(1.0, 1.0)):
  """One image's regions as the reference's ``ROIOutputs.inference`` picks them: the argmax
  foreground class of each proposal (softmax over K + 1, background dropped, not renormalised),
  that class's regressed box clipped to the image, ONE class-agnostic NMS; the thresholds are
  tried in order until one keeps ``min_detections``; the first ``max_detections`` kept. No score
  threshold (the reference passes one and ignores it). Where no threshold keeps enough, the
  reference reuses the previous image's result; here the last threshold's is returned and
  ``enough`` is False.

  ``out``: :class:`Detector`'s outputs of ONE image; ``scale_yx``: original / resized size per
  axis (boxes are returned in the original image's pixels). Returns a dict of ``[M]``-padded
  arrays (``M = max_detections``) and ``count``; ``class_probs`` is each region's softmax over
  the K + 1 classes (background last)."""
  class_probs = jax.nn.softmax(out["cls_logits"], -1)  # [P, K + 1], background last
  probs = class_probs[:, :-1]
  cls = jnp.argmax(probs, -1)
  score = jnp.take_along_axis(probs, cls[:, None], -1)[:, 0]
  d = jnp.take_along_axis(out["deltas"], cls[:, None, None], 1)[:, 0]
  bx = box_ops.clip(box_ops.apply_deltas(d, out["proposals"], cfg.bbox_reg_weights, plus_one=cfg.bua_caffe),
                    image_hw[0], image_hw[1], minus_one=cfg.bua_caffe)
  chosen = None
  for t in reversed(nms_thresholds):  # the first threshold with enough wins: fold from the last
    keep, count = box_ops.nms(bx, score, t, max_detections, out["valid"])
    enough = count >= min_detections
    if chosen is None:
      chosen = (keep, count, enough)
    else:
      chosen = jax.tree.map(lambda a, b: jnp.where(enough, a, b), (keep, count, enough), chosen)
  keep, count, enough = chosen
  valid = jnp.arange(max_detections) < count
  safe = jnp.where(valid, keep, 0)
  attr_p = attribute_probs(cfg, out["attr_logits"])

  def take(x, fill=0):
    v = x[safe]
    return jnp.where(valid.reshape(-1, *([1] * (v.ndim - 1))), v, fill)

  sy, sx = scale_yx[0], scale_yx[1]
  bx = bx * jnp.stack([sx, sy, sx, sy]).astype(jnp.float32)
  return {"boxes": take(bx), "obj_ids": take(cls), "obj_probs": take(score),
          "class_probs": take(class_probs),
          "attr_ids": take(jnp.argmax(attr_p, -1)), "attr_probs": take(attr_p.max(-1)),
          "features": take(out["features"]), "count": count, "enough": enough}


def attribute_probs(cfg: DetectorConfig, attr_logits_PxT1):
  """``[P, T]``: the reference's softmax over the T attributes (the no-attribute logit, last,
  dropped first); ``cfg.bua_caffe``: MILVLG's, a softmax over all T + 1 with no-attribute's
  column then dropped."""
  if cfg.bua_caffe:
    return jax.nn.softmax(attr_logits_PxT1, -1)[:, :-1]
  return jax.nn.softmax(attr_logits_PxT1[:, :-1], -1)


def preprocess_size(h: int, w: int, short: int = 600, long: int = 1000) -> Tuple[int, int]:
  """The reference's ``ResizeShortestEdge`` output size (round half up of the scaled sides)."""
  scale = short / min(h, w)
  nh, nw = (short, scale * w) if h < w else (scale * h, short)
  if max(nh, nw) > long:
    s = long / max(nh, nw)
    nh, nw = nh * s, nw * s
  return int(nh + 0.5), int(nw + 0.5)


def resize_bilinear(image_HxWx3, out_hw):
  """``F.interpolate(mode="bilinear", align_corners=False)`` without antialiasing, float32."""
  x = jnp.asarray(image_HxWx3, jnp.float32)
  return jax.image.resize(x, (*out_hw, x.shape[-1]), "bilinear", antialias=False)


def caffe_scale(h: int, w: int, short: int = 600, long: int = 1000) -> Tuple[float, Tuple[int, int]]:
  """The Caffe original's resize of an ``h`` x ``w`` photo (``_get_image_blob``,
  peteanderson80/bottom-up-attention's lib/fast_rcnn/test.py): ``(scale, (h', w'))``, ONE scale
  for both axes, ``short / min(h, w)`` unless the long side would then round (``np.round``: half
  to even) past ``long``, then ``long / max(h, w)``; and ``cv2.resize``'s output size at ``fx = fy
  = scale``: each side times the scale rounded half to even (OpenCV's ``saturate_cast<int>`` of a
  double), where :func:`preprocess_size` rounds half up."""
  scale = float(short) / float(min(h, w))
  if np.round(scale * max(h, w)) > long:
    scale = float(long) / float(max(h, w))
  return scale, (int(np.round(h * scale)), int(np.round(w * scale)))


def _linear_taps(n_in: int, n_out: int, inv_scale: float):
  """Each output's two source pixels and their weights along one axis: ``cv2.INTER_LINEAR``'s
  half-pixel centres ``(d + 0.5) * inv_scale - 0.5`` with the scale the caller gave (not
  ``n_in / n_out``, which differs once the size is rounded), clamped to the first / last pixel
  (its replicated border), no antialiasing. The coordinate in float64, as opencv-python's IPP
  path computes it; OpenCV's own code rounds it to float32 first, which moves a value by up to
  ~0.007 (of 0..255) at coordinates near 1,000 (scripts/detection/make_caffe_resize_fixture.py)."""
  x = np.clip((np.arange(n_out, dtype=np.float64) + 0.5) * inv_scale - 0.5, 0.0, n_in - 1.0)
  lo = np.minimum(np.floor(x).astype(np.int64), max(n_in - 2, 0))
  frac = x - lo
  return lo, np.minimum(lo + 1, n_in - 1), (1.0 - frac).astype(np.float32), frac.astype(np.float32)


def resize_caffe(image_HxWxC, scale: float, out_hw) -> np.ndarray:
  """``cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)`` of a float32
  image (the original resizes the mean-subtracted float image), ``out_hw`` from
  :func:`caffe_scale`: rows then columns, float32, in NumPy (on the host, as the photos are read:
  no program per photo size)."""
  x = np.asarray(image_HxWxC, np.float32)
  inv = 1.0 / float(scale)
  x0, x1, wx0, wx1 = _linear_taps(x.shape[1], int(out_hw[1]), inv)
  y0, y1, wy0, wy1 = _linear_taps(x.shape[0], int(out_hw[0]), inv)
  rows_HxwxC = x[:, x0] * wx0[:, None] + x[:, x1] * wx1[:, None]
  return rows_HxwxC[y0] * wy0[:, None, None] + rows_HxwxC[y1] * wy1[:, None, None]


def canvas(images, pad_value: float = 0.0):
  """Mean-subtracted float images (each ``[h, w, 3]``) padded bottom / right to the largest:
  ``([B, H, W, 3], sizes [B, 2])``."""
  hmax = max(int(i.shape[0]) for i in images)
  wmax = max(int(i.shape[1]) for i in images)
  out = np.full((len(images), hmax, wmax, 3), pad_value, np.float32)
  for k, im in enumerate(images):
    out[k, :im.shape[0], :im.shape[1]] = np.asarray(im)
  return out, np.asarray([[i.shape[0], i.shape[1]] for i in images], np.int32)


def select_caffe(cfg: DetectorConfig, out, scale_yx=(1.0, 1.0), conf_thresh: float = 0.2,
                 min_boxes: int = 10, max_boxes: int = 100, nms_thresh: float = 0.3):
  """One image's regions as the Caffe original picks them (peteanderson80/bottom-up-attention's
  ``tools/generate_tsv.py``, whose features the captioning models were trained on): for every
  foreground class, NMS at ``nms_thresh`` over the UNREGRESSED proposals (in the original image's
  pixels, "+1" widths, suppressed when IoU > the threshold) ranked by that class's probability;
  each proposal's ``max_conf`` is its largest probability among the classes that kept it; the
  proposals with ``max_conf >= conf_thresh`` in proposal order, or, when fewer than
  ``min_boxes`` / more than ``max_boxes``, the top ``min_boxes`` / ``max_boxes`` by ``max_conf``.
  The boxes are the proposals (not regressed). Ties in a class's ranking go to the lower index
  (NumPy's quicksort leaves them unspecified).

  Returns a dict of ``[max_boxes]``-padded arrays and ``count``; ``obj_ids`` / ``obj_probs`` are
  each region's argmax foreground class and its probability, ``class_probs`` its softmax over the
  K + 1 classes (background last), the attributes as :func:`select_hf`."""
  sy, sx = scale_yx[0], scale_yx[1]
  bx = out["proposals"] * jnp.stack([sx, sy, sx, sy]).astype(jnp.float32)
  valid = out["valid"]
  p = bx.shape[0]
  class_probs = jax.nn.softmax(out["cls_logits"], -1)  # [P, K + 1], background last
  probs = class_probs[:, :-1]  # [P, K], background dropped
  over = box_ops.iou_matrix(bx, bx, plus_one=True) > nms_thresh  # [P, P], shared by every class (same boxes)

  def kept(score_P):
    order = jnp.argsort(-jnp.where(valid, score_P, -jnp.inf), stable=True)
    rank = jnp.zeros((p,), jnp.int32).at[order].set(jnp.arange(p, dtype=jnp.int32))

    def step(i, alive):
      b = order[i]
      return jnp.where(alive[b], alive & ~(over[b] & (rank > i)), alive)

    return jax.lax.fori_loop(0, p, step, valid)

  alive_KxP = jax.vmap(kept, in_axes=1)(probs)
  max_conf = jnp.max(jnp.where(alive_KxP, probs.T, 0.0), axis=0)
  max_conf = jnp.where(valid, max_conf, -1.0)  # padding is never chosen
  above = max_conf >= conf_thresh
  n_above = above.sum()
  n_valid = valid.sum()
  by_conf = jnp.argsort(-max_conf, stable=True)
  in_order = jnp.argsort(~above, stable=True)  # the proposals above the threshold, in index order
  use_top = (n_above < min_boxes) | (n_above > max_boxes)
  count = jnp.where(n_above < min_boxes, jnp.minimum(min_boxes, n_valid),
                    jnp.where(n_above > max_boxes, max_boxes, n_above))
  idx = jnp.where(use_top, by_conf, in_order)
  idx = jnp.concatenate([idx, jnp.zeros((max(0, max_boxes - p),), idx.dtype)])[:max_boxes]
  ok = jnp.arange(max_boxes) < count
  safe = jnp.where(ok, idx, 0)
  attr_p = attribute_probs(cfg, out["attr_logits"])

  def take(x, fill=0):
    v = x[safe]
    return jnp.where(ok.reshape(-1, *([1] * (v.ndim - 1))), v, fill)

  return {"boxes": take(bx), "obj_ids": take(jnp.argmax(probs, -1)), "obj_probs": take(probs.max(-1)),
          "class_probs": take(class_probs), "max_conf": take(max_conf), "attr_ids": take(jnp.argmax(attr_p, -1)),
          "attr_probs": take(attr_p.max(-1)), "features": take(out["features"]), "count": count}
