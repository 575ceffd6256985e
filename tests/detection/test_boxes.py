"""jaxcap.detection.boxes against NumPy transcriptions of the reference's formulas
(notes/frcnn_reference_spec.md sections 3.1, 3.3, 3.4 and 6.1)."""

import math

import numpy as np
import pytest

from jaxcap.detection import boxes


def test_cell_anchors_are_the_reference_s():
  a = boxes.cell_anchors()
  assert a.shape == (12, 4)
  np.testing.assert_allclose(a[0], [-45.254834, -22.627417, 45.254834, 22.627417], rtol=1e-6)
  np.testing.assert_allclose(a[1], [-32, -32, 32, 32])
  np.testing.assert_allclose(a[11], [-181.01934, -362.03867, 181.01934, 362.03867], rtol=1e-6)
  w, h = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
  np.testing.assert_allclose(w * h, np.repeat([64.0 ** 2, 128.0 ** 2, 256.0 ** 2, 512.0 ** 2], 3), rtol=1e-5)


def test_grid_anchors_order_is_y_x_anchor():
  cell = boxes.cell_anchors()
  g = np.asarray(boxes.grid_anchors(cell, 3, 5, stride=16))
  assert g.shape == (3 * 5 * 12, 4)
  for y, x, a in [(0, 0, 0), (2, 4, 11), (1, 3, 5)]:
    np.testing.assert_allclose(g[(y * 5 + x) * 12 + a], cell[a] + [16 * x, 16 * y, 16 * x, 16 * y])


def _np_apply_deltas(d, b, weights, clamp=math.log(1000 / 16)):
  w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
  cx, cy = b[:, 0] + 0.5 * w, b[:, 1] + 0.5 * h
  dx, dy = d[:, 0] / weights[0], d[:, 1] / weights[1]
  dw, dh = np.minimum(d[:, 2] / weights[2], clamp), np.minimum(d[:, 3] / weights[3], clamp)
  pcx, pcy, pw, ph = dx * w + cx, dy * h + cy, np.exp(dw) * w, np.exp(dh) * h
  return np.stack([pcx - pw / 2, pcy - ph / 2, pcx + pw / 2, pcy + ph / 2], 1)


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)])
def test_apply_deltas_and_its_clamp(weights):
  rng = np.random.default_rng(0)
  xy = rng.uniform(0, 400, (50, 2))
  b = np.concatenate([xy, xy + rng.uniform(1, 100, (50, 2))], 1).astype(np.float32)
  d = rng.normal(0, 2, (50, 4)).astype(np.float32)
  d[0, 2:] = 60.0  # past the clamp: exp(4.135) times the width, not exp(60)
  got = np.asarray(boxes.apply_deltas(d, b, weights))
  np.testing.assert_allclose(got, _np_apply_deltas(d, b, weights), rtol=1e-5, atol=1e-3)
  assert np.all(np.isfinite(got))


def test_clip_is_to_the_size_not_size_minus_one():
  got = np.asarray(boxes.clip(np.array([[-5.0, -1.0, 700.0, 90.0]], np.float32), 80, 600))
  np.testing.assert_array_equal(got, [[0.0, 0.0, 600.0, 80.0]])


def _np_nms(b, s, thr):
  """torchvision's rule: by descending score, keep a box unless a kept one overlaps it > thr."""
  order = np.argsort(-s, kind="stable")
  kept = []
  for i in order:
    ok = True
    for j in kept:
      lt = np.maximum(b[i, :2], b[j, :2])
      rb = np.minimum(b[i, 2:], b[j, 2:])
      inter = np.prod(np.clip(rb - lt, 0, None))
      union = np.prod(b[i, 2:] - b[i, :2]) + np.prod(b[j, 2:] - b[j, :2]) - inter
      if union > 0 and inter / union > thr:
        ok = False
        break
    if ok:
      kept.append(i)
  return kept


@pytest.mark.parametrize("thr, max_out", [
    pytest.param(0.7, 300, marks=pytest.mark.slow), (0.3, 10), pytest.param(0.5, 1000, marks=pytest.mark.slow)])
def test_nms_keeps_what_torchvision_s_rule_keeps(thr, max_out):
  rng = np.random.default_rng(1)
  xy = rng.uniform(0, 200, (400, 2))
  wh = rng.uniform(5, 80, (400, 2))
  b = np.concatenate([xy, xy + wh], 1).astype(np.float32)
  s = rng.uniform(0, 1, 400).astype(np.float32)
  want = _np_nms(b, s, thr)[:max_out]
  keep, count = boxes.nms(b, s, thr, max_out)
  keep = np.asarray(keep)
  assert int(count) == len(want)
  np.testing.assert_array_equal(keep[:len(want)], want)
  assert np.all(keep[len(want):] == -1)


def test_nms_leaves_out_invalid_boxes():
  b = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]], np.float32)
  s = np.array([0.9, 0.95, 0.1], np.float32)
  keep, count = boxes.nms(b, s, 0.5, 3, valid_N=np.array([True, False, True]))
  assert int(count) == 2 and list(np.asarray(keep)) == [0, 2, -1]
