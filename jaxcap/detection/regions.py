"""From photos to bottom-up region features: the detector's preprocessing, one jitted forward per
canvas shape, and the selection of the regions (jaxcap.detection.frcnn).

Dimension legend: B images, H x W the canvas, M the largest number of regions kept, D the feature.

    cfg, variables = weights.load("pytorch_model.bin")
    detect = regions.RegionDetector(cfg, variables)
    out = detect([rgb_uint8_HxWx3, ...])   # per image: boxes [n, 4], features [n, D], ...

Preprocessing, ``resize="caffe"`` (default; the Caffe original's ``_get_image_blob``, whose
features the captioning models were trained on): the Caffe BGR means subtracted from the float
image FIRST, then one scale for both axes, ``short / min(h, w)`` unless the long side would round
(half to even) past ``long``, then ``long / max(h, w)``; ``cv2.resize(INTER_LINEAR)`` at that
scale (frcnn.resize_caffe: OpenCV's half-pixel mapping with the scale itself, its border, no
antialiasing), its output size each side times the scale rounded half to even; the regions'
boxes divided by that one scale. ``resize="reference"`` (LXMERT's ``Preprocess``): the side
sizes as above rounded half up and the long side capped without rounding, the uint8 image
resized bilinear without antialiasing (``align_corners=False``, the per-axis ratio of the sizes),
THEN the means subtracted; the boxes scaled back per axis (photo size / resized size). The two
differ by a pixel of size now and then, and by tens of grey levels unless resized size / photo
size is the scale on both axes (480 x 640 -> 600 x 800 is; tests/detection/test_caffe_resize.py
checks the default against OpenCV's own output). Either
way the canvas is padded bottom / right with 0 to the batch's largest size (rounded up to
``canvas_multiple``: 1 is the reference's batch exactly; a larger multiple compiles fewer
programs, at the cost of features that differ near the padded edges, as they do in the reference
between batch sizes). Images are given as RGB (what PIL and jaxcap's readers give) and flipped to
BGR, the model's order; ``rgb_as_bgr=True`` reproduces the reference's reading of LOCAL files,
which hands RGB to the model as if it were BGR.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.detection import frcnn
from jaxcap.errors import BadInput

SELECTIONS = ("caffe", "reference")
RESIZES = ("caffe", "reference")


class RegionDetector:
  """``images -> [dict per image]``: ``boxes [n, 4]`` (x1, y1, x2, y2 in the original image's
  pixels), ``features [n, D]``, ``obj_ids`` / ``obj_probs``, ``attr_ids`` / ``attr_probs``,
  ``image_hw``; ``n`` the number of regions selected.

  ``selection="caffe"`` (default): the original's (frcnn.select_caffe: ``conf_thresh``,
  ``min_boxes`` / ``max_boxes``, per-class NMS ``nms_thresh``), the reading the captioning
  models' features came from. ``"reference"``: LXMERT's (frcnn.select_hf: ``nms_thresholds``
  tried in order, ``min_boxes`` / ``max_boxes``); where no threshold keeps ``min_boxes`` the
  reference fails or reuses the previous image's regions; here the last threshold's are kept
  (fewer than ``min_boxes``) and the image's ``enough`` is False.

  ``resize="caffe"`` (default): the original's preprocessing; ``"reference"``: LXMERT's (module
  docstring)."""

  def __init__(self, cfg: frcnn.DetectorConfig, variables, *, short: int = 600, long: int = 1000,
               resize: str = "caffe", selection: str = "caffe", conf_thresh: float = 0.2, min_boxes: int = 10,
               max_boxes: int = 100, nms_thresh: float = 0.3, nms_thresholds: Sequence[float] = (0.6,),
               canvas_multiple: int = 1, rgb_as_bgr: bool = False, dtype=jnp.float32):
    if resize not in RESIZES:
      raise BadInput(f"resize={resize!r}: expected one of {', '.join(RESIZES)}")
    if selection not in SELECTIONS:
      raise BadInput(f"selection={selection!r}: expected one of {', '.join(SELECTIONS)}")
    if not 0 < min_boxes <= max_boxes:
      raise BadInput(f"min_boxes={min_boxes}, max_boxes={max_boxes}: expected 0 < min_boxes <= max_boxes")
    if not 0 < short <= long:
      raise BadInput(f"short={short}, long={long}: expected 0 < short <= long")
    if canvas_multiple < 1:
      raise BadInput(f"canvas_multiple={canvas_multiple}: expected an integer >= 1")
    self.cfg, self.variables = cfg, variables
    self.short, self.long, self.canvas_multiple, self.rgb_as_bgr = short, long, canvas_multiple, rgb_as_bgr
    self.resize = resize
    model = frcnn.Detector(cfg, dtype=dtype)
    if selection == "caffe":
      pick = functools.partial(frcnn.select_caffe, cfg, conf_thresh=conf_thresh, min_boxes=min_boxes,
                               max_boxes=max_boxes, nms_thresh=nms_thresh)

      def select(out, hw, scale):
        del hw
        return pick(out, scale)
    else:
      thresholds = tuple(float(t) for t in nms_thresholds)

      def select(out, hw, scale):
        return frcnn.select_hf(cfg, out, hw, thresholds, min_boxes, max_boxes, scale)

    def forward(variables, images, sizes, scales):
      # The resize factor (resized / photo) sets bua_caffe's smallest proposal: its one
      # im_scale under the Caffe resize (both axes the same).
      out = model.apply(variables, images, sizes, 1.0 / scales[:, 1])
      return jax.vmap(select)(out, sizes, scales)

    self._forward = jax.jit(forward)  # one program per canvas shape

  def canvas_shape(self, hw) -> tuple[int, int]:
    """The canvas ``(H, W)`` a photo of ``hw = (height, width)`` pixels becomes alone: photos
    of one canvas shape batch without padding (and share one compiled program)."""
    if self.resize == "caffe":
      h, w = frcnn.caffe_scale(int(hw[0]), int(hw[1]), self.short, self.long)[1]
    else:
      h, w = frcnn.preprocess_size(int(hw[0]), int(hw[1]), self.short, self.long)
    m = self.canvas_multiple
    return -(-h // m) * m, -(-w // m) * m

  def preprocess(self, images):
    """``(canvas [B, H, W, 3] float32, sizes [B, 2] int32, scales_yx [B, 2] float32)``:
    ``scales_yx`` maps the canvas's pixels back to the photo's (both entries ``1 / scale`` with
    ``resize="caffe"``, photo size / resized size per axis with ``"reference"``)."""
    resized, raw, im_scales = [], [], []
    for k, im in enumerate(images):
      a = np.asarray(im)
      if a.ndim != 3 or a.shape[-1] != 3 or a.dtype != np.uint8 or min(a.shape[:2]) < 1:
        raise BadInput(f"image {k}: expected a uint8 RGB array [H, W, 3], got {a.dtype} {list(a.shape)}")
      bgr = a if self.rgb_as_bgr else a[..., ::-1]
      if self.resize == "caffe":
        scale, (h, w) = frcnn.caffe_scale(a.shape[0], a.shape[1], self.short, self.long)
        if min(h, w) < 1:  # cv2.resize refuses an empty size: the original fails on such a photo
          raise BadInput(f"image {k}: {a.shape[0]} x {a.shape[1]} pixels resize to {h} x {w} "
                         f"(short={self.short}, long={self.long}); expected a photo whose resized sides "
                         "are at least 1 pixel")
        # float64 means subtracted into float32, as the original's ``im_orig -= PIXEL_MEANS``
        x = (bgr - np.asarray(frcnn.PIXEL_MEAN_BGR, np.float64)).astype(np.float32)
        resized.append(frcnn.resize_caffe(x, scale, (h, w)))
        im_scales.append(scale)
      else:
        h, w = frcnn.preprocess_size(a.shape[0], a.shape[1], self.short, self.long)
        x = np.asarray(frcnn.resize_bilinear(np.ascontiguousarray(bgr), (h, w)))
        resized.append(x - np.asarray(frcnn.PIXEL_MEAN_BGR, np.float32))
      raw.append(a.shape[:2])
    canvas, sizes = frcnn.canvas(resized)
    m = self.canvas_multiple
    if m > 1:
      hh, ww = -(-canvas.shape[1] // m) * m, -(-canvas.shape[2] // m) * m
      canvas = np.pad(canvas, ((0, 0), (0, hh - canvas.shape[1]), (0, ww - canvas.shape[2]), (0, 0)))
    if self.resize == "caffe":  # the original divides the boxes by its one scale
      scales = np.repeat(1.0 / np.asarray(im_scales, np.float64)[:, None], 2, axis=1).astype(np.float32)
    else:
      scales = np.asarray(raw, np.float32) / sizes.astype(np.float32)
    return canvas, sizes, scales

  def __call__(self, images):
    if not len(images):
      return []
    canvas, sizes, scales = self.preprocess(images)
    sel = jax.tree.map(np.asarray, self._forward(self.variables, jnp.asarray(canvas), jnp.asarray(sizes),
                                                 jnp.asarray(scales)))
    out = []
    for i in range(len(images)):
      n = int(sel["count"][i])
      one = {k: v[i][:n] for k, v in sel.items() if k not in ("count", "enough")}
      one["image_hw"] = tuple(np.asarray(images[i]).shape[:2])
      if "enough" in sel:
        one["enough"] = bool(sel["enough"][i])
      out.append(one)
    return out
