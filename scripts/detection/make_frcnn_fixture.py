"""Writes the fixture tests/detection/test_frcnn.py reads: a small bottom-up-attention Faster R-CNN
built and run by its reference code, LXMERT's ``modeling_frcnn.py`` / ``processing_image.py``
(huggingface/transformers-research-projects, folder ``lxmert/``), which this script imports,
never copies:

    git clone https://github.com/huggingface/transformers-research-projects /tmp/hfrp
    pip install torch==2.14.1 torchvision==0.29.1 opencv-python-headless requests wget filelock \
        huggingface_hub pyyaml tqdm "transformers<6"
    python scripts/detection/make_frcnn_fixture.py --lxmert /tmp/hfrp/lxmert
    python scripts/detection/make_frcnn_fixture.py --lxmert /tmp/hfrp/lxmert --res2_out 2 \
        --width_per_group 1 --out tests/detection/fixtures/d16/frcnn_d16.npz   # 16-d: M2's fixture

What its code does, done here by its code: its ``Config`` (the hub ``config.yaml``'s keys, at a
small width: ResNet-50 layout with 8 stem / 16 res2 channels, a 16-channel RPN, 20 object and 6
attribute classes, images resized to a short side of 96 / long side <= 160, anchors 16-128,
RPN 200 -> NMS 0.7 -> 30, 5-10 regions at NMS thresholds 0.3 / 0.5 / 0.7 / 0.9); its
``GeneralizedRCNN(cfg)`` on random weights (fixed seed; batch norm statistics and affine moved
off their initial values, the heads' weights widened so that the argmax class and the top-k are
decided by margins far above float32 rounding); its ``Preprocess`` on two BGR images of
different sizes given as float tensors (the path of a batch: resized without antialiasing,
mean-subtracted, padded bottom / right to the batch's largest); then its ``backbone``,
``proposal_generator``, ``roi_heads`` and ``roi_outputs`` as its ``inference`` calls them, and the
whole ``model(...)`` with ``padding="max_detections"``.

Written beside ``--out``: ``pytorch_model.bin`` (``torch.save`` of its ``state_dict()``, the file
``from_pretrained`` loads) and ``faster_rcnn_from_caffe_attr.pkl`` (airsplay's detectron2 pickle
layout: ``{"model": {name: ndarray}, "__author__": ...}``, no ``num_batches_tracked``, no
anchors). Written to ``--out`` (``tests/detection/fixtures/frcnn_tiny.npz``): ``raw_<i>`` the
uint8 BGR images,
``images`` / ``sizes`` / ``scales_yx`` its preprocessing, ``res4`` the backbone map (NCHW),
``proposals_<i>`` / ``proposal_logits_<i>``, ``pooled`` (its RoI pool + res5 mean), ``obj_logits``,
``attr_logits``, ``box_deltas``, and its final outputs ``out_<key>``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

CONFIG = {
    "MODEL": {"DEVICE": "cpu", "PIXEL_MEAN": [102.9801, 115.9465, 122.7717], "PIXEL_STD": [1.0, 1.0, 1.0],
              "MAX_POOL": True},
    "INPUT": {"FORMAT": "BGR", "MIN_SIZE_TEST": 96, "MAX_SIZE_TEST": 160},
    "SIZE_DIVISIBILITY": 0, "PAD_VALUE": 0.0, "MIN_DETECTIONS": 5, "MAX_DETECTIONS": 10,
    "RESNETS": {"DEPTH": 50, "NORM": "BN", "STEM_OUT_CHANNELS": 8, "RES2_OUT_CHANNELS": 16, "NUM_GROUPS": 1,
                "WIDTH_PER_GROUP": 4, "STRIDE_IN_1X1": True, "RES5_DILATION": 1, "OUT_FEATURES": ["res4"]},
    "BACKBONE": {"FREEZE_AT": 2},
    "ANCHOR_GENERATOR": {"SIZES": [[16, 32, 64, 128]], "ASPECT_RATIOS": [[0.5, 1.0, 2.0]], "OFFSET": 0.0},
    "PROPOSAL_GENERATOR": {"HIDDEN_CHANNELS": 16, "MIN_SIZE": 0},
    "RPN": {"IN_FEATURES": ["res4"], "NMS_THRESH": 0.7, "PRE_NMS_TOPK_TEST": 200, "POST_NMS_TOPK_TEST": 30,
            "PRE_NMS_TOPK_TRAIN": 12000, "POST_NMS_TOPK_TRAIN": 2000, "BATCH_SIZE_PER_IMAGE": 256,
            "POSITIVE_FRACTION": 0.5, "SMOOTH_L1_BETA": 0.0, "LOSS_WEIGHT": 1.0, "BOUNDARY_THRESH": -1,
            "IOU_THRESHOLDS": [0.3, 0.7], "IOU_LABELS": [0, -1, 1], "BBOX_REG_WEIGHTS": [1.0, 1.0, 1.0, 1.0]},
    "ROI_HEADS": {"NUM_CLASSES": 20, "IN_FEATURES": ["res4"], "SCORE_THRESH_TEST": 0.2,
                  "NMS_THRESH_TEST": [0.3, 0.5, 0.7, 0.9], "POSITIVE_FRACTION": 0.25, "PROPOSAL_APPEND_GT": True},
    "ROI_BOX_HEAD": {"POOLER_RESOLUTION": 14, "POOLER_SAMPLING_RATIO": 0, "RES5HALVE": False, "ATTR": True,
                     "NUM_ATTRS": 6, "CLS_AGNOSTIC_BBOX_REG": False, "BBOX_REG_WEIGHTS": [10.0, 10.0, 5.0, 5.0],
                     "SMOOTH_L1_BETA": 0.0},
}


def randomise(model, torch, rng) -> None:
  """Random weights shaped so that detections are distinct rather than tied: batch norm
  statistics and affine moved off their initial values, He-scaled convolutions, each residual
  branch small beside its identity, the heads widened (the argmax class and the top-k decided by
  margins far above float32 rounding)."""
  with torch.no_grad():
    for m in model.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        n = m.num_features
        m.weight.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, n).astype(np.float32)))
        m.bias.copy_(torch.from_numpy(rng.normal(0, 0.2, n).astype(np.float32)))
        m.running_mean.copy_(torch.from_numpy(rng.normal(0, 0.2, n).astype(np.float32)))
        m.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, n).astype(np.float32)))
      elif isinstance(m, torch.nn.Conv2d):  # He's scale: activations neither vanish nor explode
        fan_in = m.weight[0].numel()
        m.weight.copy_(torch.from_numpy(rng.normal(0, np.sqrt(2 / fan_in), m.weight.shape).astype(np.float32)))
        if m.bias is not None:
          m.bias.copy_(torch.from_numpy(rng.normal(0, 0.1, m.bias.shape).astype(np.float32)))
    for name, m in model.named_modules():  # each residual branch small beside its identity
      if name.endswith("conv3") or name.endswith("shortcut"):
        m.norm.weight.copy_(torch.from_numpy(rng.uniform(0.2, 0.4, m.norm.num_features).astype(np.float32)))
    rpn = model.proposal_generator.rpn_head
    rpn.anchor_deltas.weight.mul_(0.1)  # proposals near their anchors, not all clipped away
    head = model.roi_heads.box_predictor
    for lin, std in ((head.cls_score, 3.0), (head.bbox_pred, 0.5), (head.fc_attr, 1.5), (head.attr_score, 3.0)):
      fan_in = lin.weight.shape[1]
      lin.weight.copy_(torch.from_numpy(rng.normal(0, std / np.sqrt(fan_in), lin.weight.shape).astype(np.float32)))
      lin.bias.copy_(torch.from_numpy(rng.normal(0, 0.3, lin.bias.shape).astype(np.float32)))
    head.cls_embedding.weight.copy_(torch.from_numpy(rng.normal(0, 1, head.cls_embedding.weight.shape).astype(np.float32)))


def picture(rng, h: int, w: int, blocks: int = 6) -> np.ndarray:
  """``[h, w, 3]`` uint8: smooth gradients plus ``blocks`` flat blocks (structure for the
  backbone; the detector fixtures' photos)."""
  yy, xx = np.mgrid[0:h, 0:w]
  img = np.stack([(xx * 255 / w), (yy * 255 / h), ((xx + yy) * 127 / (h + w))], -1)
  for _ in range(blocks):
    y0, x0 = rng.integers(0, max(1, h - 10)), rng.integers(0, max(1, w - 10))
    img[y0:y0 + rng.integers(5, max(6, h // 2)), x0:x0 + rng.integers(5, max(6, w // 2))] = rng.uniform(0, 255, 3)
  return np.clip(img, 0, 255).astype(np.uint8)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--lxmert", required=True, help="the reference's lxmert/ folder")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "detection",
                                               "fixtures", "frcnn_tiny.npz"))
  p.add_argument("--res2_out", type=int, default=16, help="res2's output channels: the region features "
                 "are 8x wide (16: 128-d, the tests' detector; 2: 16-d, the width of M2's import fixture)")
  p.add_argument("--width_per_group", type=int, default=4, help="the bottlenecks' width at res2")
  args = p.parse_args(argv)
  CONFIG["RESNETS"].update(RES2_OUT_CHANNELS=args.res2_out, WIDTH_PER_GROUP=args.width_per_group)
  sys.path.insert(0, os.path.abspath(args.lxmert))
  import torch  # noqa: PLC0415
  import modeling_frcnn  # noqa: PLC0415
  import processing_image  # noqa: PLC0415
  from utils import Config  # noqa: PLC0415

  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  cfg = Config(CONFIG)
  model = modeling_frcnn.GeneralizedRCNN(cfg).eval()
  randomise(model, torch, rng)

  # Two BGR images with structure (smooth gradients plus blocks), of different sizes and aspects.
  raws = [picture(rng, h, w) for h, w in ((120, 90), (70, 130))]

  pre = processing_image.Preprocess(cfg)
  out = {}
  with torch.no_grad():
    images, sizes, scales_yx = pre([torch.from_numpy(r.copy()) for r in raws])
    features = model.backbone(images)
    proposal_boxes, proposal_logits = model.proposal_generator(images, sizes, features, None)
    obj_logits, attr_logits, box_deltas, pooled = model.roi_heads(features, proposal_boxes, None)
    final = model(images, sizes, scales_yx=scales_yx, padding="max_detections",
                  max_detections=cfg.MAX_DETECTIONS, return_tensors="np")
  folder = os.path.dirname(os.path.abspath(args.out))
  os.makedirs(folder, exist_ok=True)
  # The files users have: the hub's pytorch_model.bin (torch.save of the state_dict, which
  # from_pretrained torch.loads), and airsplay's detectron2 pickle: {"model": {name: ndarray},
  # "__author__": ...} as detectron2's conversion scripts pickle.dump it, without the
  # num_batches_tracked counters (frozen batch norm has none) or the anchors (a buffer there).
  torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
  import pickle  # noqa: PLC0415
  with open(os.path.join(folder, "faster_rcnn_from_caffe_attr.pkl"), "wb") as fh:
    pickle.dump({"model": {k: v.numpy() for k, v in model.state_dict().items()
                           if not k.endswith("num_batches_tracked") and "cell_anchors" not in k},
                 "__author__": "fixture of scripts/detection/make_frcnn_fixture.py"}, fh)
  for i, r in enumerate(raws):
    out[f"raw_{i}"] = r
    out[f"proposals_{i}"] = proposal_boxes[i].numpy()
    out[f"proposal_logits_{i}"] = proposal_logits[i].numpy()
  out.update(images=images.numpy(), sizes=sizes.numpy(), scales_yx=scales_yx.numpy(),
             res4=features["res4"].numpy(), pooled=pooled.numpy(), obj_logits=obj_logits.numpy(),
             attr_logits=attr_logits.numpy(), box_deltas=box_deltas.numpy())
  for k, v in final.items():
    out[f"out_{k}"] = np.asarray(v)
  np.savez_compressed(args.out, **out)
  print(f"wrote {args.out}: {len(out)} arrays, {os.path.getsize(args.out)} bytes; "
        f"proposals {[len(b) for b in proposal_boxes]}, regions {list(np.asarray(final['preds_per_image']))}")


if __name__ == "__main__":
  main()
