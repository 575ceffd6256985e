"""The region detector in front of a run trained on bottom-up region features.

A run imported from self-critical.pytorch or M² (or a jaxcap run on ``cocobu_att`` files) was
trained on the regions of Anderson et al.'s detector and has no ``features.json``: it cannot
caption a photo with a grid backbone. Given the detector's weights, :class:`RegionBackbone` turns
photos into the batch such a run reads, as its training read the files
``python -m jaxcap.detection.extract`` writes: the selected regions' 2,048-d features as regions,
their boxes divided by the photo's width and height (``cocobu_box`` through the COCO reader), the
regions' mean as the global feature (``cocobu_fc``), the first ``max_regions`` of them when there
are more (the collation's truncation, as the run's reader reads a longer file: M²'s loader keeps
each file's first 50).

  run = jaxcap.load("runs/imported_transformer")
  run.caption_images(["photo.jpg"], "pytorch_model.bin")  # LXMERT's frcnn-vg-finetuned weights
"""

from __future__ import annotations

import os

import numpy as np

from jaxcap.errors import BadInput
from jaxcap.images import NATIVE, read_image, read_many

# The checkpoint files the detector's reader takes (jaxcap.detection.weights.read).
SUFFIXES = (".bin", ".pkl", ".pth", ".pt")


def is_detector_weights(path) -> bool:
  """``path`` names a file of a kind the detector's reader reads (by its suffix; its contents
  are checked when read)."""
  return isinstance(path, (str, os.PathLike)) and os.fspath(path).lower().endswith(SUFFIXES)


class RegionBackbone:
  """Photos -> the region batch of a run trained on bottom-up features.

  Args:
    weights: the detector's ``pytorch_model.bin``, ``faster_rcnn_from_caffe_attr.pkl`` or MILVLG's ``bua-caffe-frcn-r101*.pth``.
    info: the run's dataset description (``feature_dim``, ``max_regions``): the detector's
      feature width must be the run's.
    **settings: :class:`jaxcap.detection.regions.RegionDetector`'s (``short``, ``long``,
      ``resize``, ``selection``, ``min_boxes``, ...) and the RPN's ``pre_nms_topk`` /
      ``post_nms_topk``; the defaults are ``python -m jaxcap.detection.extract``'s (the
      original's: its resize, 10-100 regions).
  """

  size = NATIVE  # photos keep their sizes (the detector resizes them itself)

  def __init__(self, weights: str, info: dict, **settings):
    from jaxcap.detection import regions, weights as weights_lib  # noqa: PLC0415 (jax)
    if not os.path.isfile(weights):
      raise BadInput(f"{weights}: no such file; expected the region detector's pytorch_model.bin, "
                     "faster_rcnn_from_caffe_attr.pkl or bua-caffe-frcn-r101*.pth")
    if info.get("grid"):
      raise BadInput(f"{weights}: this run was trained on grid features (data.grid), not on a "
                     "detector's regions; expected the backbone its features came from")
    rpn = {k: settings.pop(k) for k in ("pre_nms_topk", "post_nms_topk") if k in settings}
    cfg, variables = weights_lib.load(weights, **rpn)
    if cfg.feature_dim != int(info["feature_dim"]):
      raise BadInput(f"{weights}: a detector of {cfg.feature_dim}-d region features; this run reads "
                     f"{int(info['feature_dim'])}-d features (feature_dim); expected the detector its "
                     "features came from")
    self.weights = weights
    self.detector = regions.RegionDetector(cfg, variables, **settings)

  def read(self, images, *, skip_unreadable: bool = False):
    """``(photos, kept)``: uint8 RGB ``[H, W, 3]`` arrays of image file paths (EXIF orientation
    applied, as ``jaxcap.detection.extract`` reads them) and / or arrays, and the indices into
    ``images`` they are. An unreadable file is a one-line ``BadInput``, or with
    ``skip_unreadable`` one ``warning:`` line on stderr and left out."""
    def array(item, i):
      a = np.asarray(item)
      if a.ndim != 3 or a.shape[-1] != 3 or a.dtype != np.uint8 or min(a.shape[:2]) < 1:
        raise BadInput(f"images[{i}]: {a.dtype} {list(a.shape)}; expected a uint8 RGB array [H, W, 3]")
      return a

    return read_many(images, lambda path: read_image(path, NATIVE, exif=True), array,
                     skip_unreadable=skip_unreadable)

  def regions(self, photos) -> list[dict]:
    """The detector's regions of each photo (:class:`RegionDetector`), one call per photo: the
    canvases of photos of different sizes differ, and each photo's features are then those of
    the command, which runs them one at a time."""
    return [self.detector([p])[0] for p in photos]

  def batch(self, photos, info: dict) -> dict:
    """The batch keys (``feats``, ``feats_mask``, ``boxes``, ``global_feat``, ``valid``,
    ``image_index``) of ``photos`` as the run's reader and collation lay out the extracted files."""
    from jaxcap.data import base as data_base  # noqa: PLC0415
    return data_base.region_features_batch(self.regions(photos), info)
