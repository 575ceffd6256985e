"""Anchors, box deltas, clipping and non-maximum suppression of the bottom-up-attention detector,
as its reference computes them (LXMERT's modeling_frcnn.py, detectron2's geometry: no "+1"
widths; notes/frcnn_reference_spec.md sections 3 and 6), with static shapes for jit. The
``plus_one`` / ``minus_one`` / ``inclusive`` switches are the Caffe geometry of MILVLG's
bua-caffe checkpoints (bua/caffe/modeling/box_regression.py, its maskrcnn-benchmark NMS kernel).

Dimension legend:
  A anchors per cell, H x W the feature map, N boxes, K kept boxes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# detectron2's clamp of dw / dh before exp: a box at most 1000/16 times its anchor.
SCALE_CLAMP = math.log(1000.0 / 16)


def cell_anchors(sizes=(64, 128, 256, 512), aspect_ratios=(0.5, 1.0, 2.0)) -> np.ndarray:
  """``[A, 4]`` float32 anchors centred at 0, size-major (``a = size_idx * R + ratio_idx``),
  aspect = h / w, no rounding (the reference's ``generate_cell_anchors``)."""
  out = []
  for size in sizes:
    area = float(size) ** 2
    for ratio in aspect_ratios:
      w = math.sqrt(area / ratio)
      h = ratio * w
      out.append([-w / 2, -h / 2, w / 2, h / 2])
  return np.asarray(out, np.float32)


def caffe_cell_anchors(base_size: int = 16, ratios=(0.5, 1.0, 2.0), scales=(4, 8, 16, 32)) -> np.ndarray:
  """``[A, 4]`` anchors of py-faster-rcnn's ``generate_anchors`` (the Caffe model's): the
  ``base_size`` box ``[0, 0, base - 1, base - 1]`` reshaped to each ratio with rounded sides
  ("+1" widths), then scaled; ratio-major (``a = ratio_idx * S + scale_idx``). The Caffe layout's
  anchors where its file holds none (its channels are in this order)."""
  def mk(ws, hs, cx, cy):
    return np.stack([cx - 0.5 * (ws - 1), cy - 0.5 * (hs - 1), cx + 0.5 * (ws - 1), cy + 0.5 * (hs - 1)], -1)

  w = h = float(base_size)
  cx = cy = 0.5 * (base_size - 1)
  out = []
  for r in ratios:
    ws = np.round(np.sqrt(w * h / r))
    hs = np.round(ws * r)
    for s in scales:
      out.append(mk(ws * s, hs * s, cx, cy))
  return np.asarray(out, np.float32)


def grid_anchors(cell_Ax4, height: int, width: int, stride: int = 16, offset: float = 0.0):
  """``[H * W * A, 4]`` anchors of an ``H x W`` map, ordered ``(y * W + x) * A + a``."""
  xs = jnp.arange(width, dtype=jnp.float32) * stride + offset * stride
  ys = jnp.arange(height, dtype=jnp.float32) * stride + offset * stride
  sy_HxW, sx_HxW = jnp.meshgrid(ys, xs, indexing="ij")
  shift_HWx4 = jnp.stack([sx_HxW, sy_HxW, sx_HxW, sy_HxW], -1).reshape(-1, 1, 4)
  return (shift_HWx4 + jnp.asarray(cell_Ax4)[None]).reshape(-1, 4)


def apply_deltas(deltas_Nx4, boxes_Nx4, weights=(1.0, 1.0, 1.0, 1.0), clamp: float = SCALE_CLAMP,
                 plus_one: bool = False):
  """Boxes ``[N, 4]`` (x1, y1, x2, y2) moved by ``deltas`` (dx, dy, dw, dh) / ``weights``
  (detectron2's ``Box2BoxTransform.apply_deltas``; float32). ``plus_one``: MILVLG's
  ``BUABox2BoxTransform`` (a box is ``x2 - x1 + 1`` wide, the new one ``ctr -+ 0.5 w``: unlike
  py-faster-rcnn's, no "- 1" on x2)."""
  boxes = boxes_Nx4.astype(jnp.float32)
  d = deltas_Nx4.astype(jnp.float32)
  wx, wy, ww, wh = weights
  e = 1.0 if plus_one else 0.0
  widths, heights = boxes[:, 2] - boxes[:, 0] + e, boxes[:, 3] - boxes[:, 1] + e
  ctr_x, ctr_y = boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights
  dx, dy = d[:, 0] / wx, d[:, 1] / wy
  dw, dh = jnp.minimum(d[:, 2] / ww, clamp), jnp.minimum(d[:, 3] / wh, clamp)
  pcx, pcy = dx * widths + ctr_x, dy * heights + ctr_y
  pw, ph = jnp.exp(dw) * widths, jnp.exp(dh) * heights
  return jnp.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], -1)


def clip(boxes_Nx4, height, width, minus_one: bool = False):
  """Boxes clipped to ``[0, width] x [0, height]`` (not ``width - 1``: the reference's), or to
  ``width - 1`` / ``height - 1`` (``minus_one``: Caffe's, MILVLG's ``BUABoxes.clip``)."""
  e = 1.0 if minus_one else 0.0
  x = jnp.clip(boxes_Nx4[:, 0::2], 0.0, width - e)
  y = jnp.clip(boxes_Nx4[:, 1::2], 0.0, height - e)
  return jnp.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], -1)


def iou_matrix(a_Nx4, b_Mx4, plus_one: bool = False):
  """``[N, M]`` intersection over union, widths without "+1" (torchvision's ``box_iou``), or
  with it (``plus_one``: py-faster-rcnn's ``nms``, a box ``[x1, x2]`` is ``x2 - x1 + 1`` wide)."""
  e = 1.0 if plus_one else 0.0
  area_a = (a_Nx4[:, 2] - a_Nx4[:, 0] + e) * (a_Nx4[:, 3] - a_Nx4[:, 1] + e)
  area_b = (b_Mx4[:, 2] - b_Mx4[:, 0] + e) * (b_Mx4[:, 3] - b_Mx4[:, 1] + e)
  lt = jnp.maximum(a_Nx4[:, None, :2], b_Mx4[None, :, :2])
  rb = jnp.minimum(a_Nx4[:, None, 2:], b_Mx4[None, :, 2:])
  wh = jnp.clip(rb - lt + e, 0.0)
  inter = wh[..., 0] * wh[..., 1]
  union = area_a[:, None] + area_b[None, :] - inter
  return jnp.where(union > 0, inter / jnp.where(union > 0, union, 1.0), 0.0)


def nms(boxes_Nx4, scores_N, iou_threshold: float, max_out: int, valid_N=None, plus_one: bool = False,
        inclusive: bool = False):
  """Greedy non-maximum suppression with static shapes: ``(keep_K, count)``, ``keep`` the
  indices of the kept boxes in descending score (ties: the lower index first, as a stable
  sort), padded with -1 past ``count``. A box is suppressed by a kept one when their IoU is
  greater than ``iou_threshold`` (torchvision's rule), or at least it (``inclusive``, with
  ``plus_one`` widths: maskrcnn-benchmark's ``nms_cpu``, MILVLG's). ``valid_N``: boxes that take
  part (the padding of a fixed-size proposal list does not)."""
  n = boxes_Nx4.shape[0]
  valid = jnp.ones((n,), bool) if valid_N is None else valid_N
  order = jnp.argsort(-jnp.where(valid, scores_N, -jnp.inf), stable=True)
  boxes = boxes_Nx4[order]
  alive = valid[order]
  iou = iou_matrix(boxes, boxes, plus_one=plus_one)
  over = iou >= iou_threshold if inclusive else iou > iou_threshold

  def step(i, alive):
    # Box i, if still alive, suppresses every later box it overlaps.
    later = jnp.arange(n) > i
    return jnp.where(alive[i], alive & ~(over[i] & later), alive)

  alive = jax.lax.fori_loop(0, n, step, alive)
  count = jnp.minimum(alive.sum(), max_out)
  # The alive positions in order, first max_out of them.
  rank = jnp.cumsum(alive) - 1
  slots = jnp.where(alive & (rank < max_out), rank, max_out)
  keep = jnp.full((max_out + 1,), -1, jnp.int32).at[slots].set(order.astype(jnp.int32), mode="drop")
  return keep[:max_out], count
