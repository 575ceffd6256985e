"""Writes tests/detection/fixtures/bua_caffe/: a checkpoint in MILVLG/bottom-up-attention.pytorch's
bua-caffe layout, written and run by its own code, which this script imports, never copies:

    git clone https://github.com/MILVLG/bottom-up-attention.pytorch /tmp/bua          # 4dbce86
    git clone https://github.com/facebookresearch/detectron2 /tmp/d2 && \\
        git -C /tmp/d2 checkout be792b959bca9af0aacfa04799537856c7a92802             # its submodule
    pip install torch==2.14.1 torchvision==0.29.1 opencv-python-headless fvcore pycocotools \\
        iopath cloudpickle matplotlib
    python scripts/detection/make_bua_fixture.py --bua /tmp/bua --detectron2 /tmp/d2

What runs, and the few things done around it (each said where it is done):
  * its model: ``bua.add_config`` (mode "caffe"), its ``configs/caffe/test-caffe-r101.yaml``, then
    ``--opts``-style overrides to the tests' small detector (the widths of
    tests/detection/fixtures/pytorch_model.bin, LXMERT's fixture: ResNet-50 layout, 8 / 16
    channels, a 16-channel RPN, 20 objects, 6 attributes, anchors 16-128, RPN 200 -> 30), built by
    detectron2's ``build_model`` (what its extraction scripts' ``DefaultTrainer.build_model`` calls).
  * its weights: that fixture's tensors, moved into the bua-caffe layout (background row 0 of
    ``cls_score``, a background row block first in ``bbox_pred`` with the (10, 10, 5, 5) weights
    divided out, the 2-way objectness with a random background half (the object logits scaled by 0.2: its
    ranking by probability must not saturate into ties); its attribute head, whose
    widths its code fixes at 256 / 512, random), loaded with ``load_state_dict(strict=True)`` and
    saved by detectron2's ``DetectionCheckpointer.save`` (``{"model": state_dict}``), then read
    back by its ``resume_or_load`` into a fresh model, the one that runs.
  * its run: ``utils/extract_utils.get_image_blob`` (mean subtracted, ``cv2.resize``; its module
    constants TEST_SCALES / TEST_MAX_SIZE set to the small detector's 96 / 160), ``model([blob])``
    in EXTRACT_FEATS mode 1 (``extract_features.py``'s ``roi_feats``), its outputs moved to the CPU as
    ``utils/extract_features_singlegpu.py`` does, and ``save_roi_features``
    (MIN / MAX_BOXES 5 / 10), whose ``.npz`` is read back here.
  * compiled parts: its NMS kernel (``bua/caffe/modeling/layers/csrc``) is built with torch's
    ``cpp_extension`` from a copy with ONE line patched (``AT_DISPATCH_FLOATING_TYPES(dets.type()``
    -> ``dets.scalar_type()``: the old overload is gone from torch 2.x); ``apex.amp.float_function``
    (a half-precision cast wrapper) is the identity (everything here is float32); detectron2's
    own ``_C`` (deformable and rotated ops, unused by this model) is an empty module; Pillow's
    removed ``Image.LINEAR`` alias is restored for detectron2's import.

Written: ``bua-caffe-tiny.pth`` and ``bua_tiny.npz``: per image ``raw_<i>`` (BGR uint8),
``blob_<i>`` (its preprocessed image, HWC), ``im_scale_<i>``, ``proposals_<i>`` /
``objectness_<i>`` (its RPN's output: the boxes the heads see), ``probs_<i>`` (its class softmax, background first),
``feats_<i>``, ``attr_<i>`` (its attribute softmax, no-attribute first) and its saved regions
``x_<i>``, ``bbox_<i>``, ``objects_id_<i>``, ``objects_conf_<i>``, ``attrs_id_<i>``, ``attrs_conf_<i>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "tests", "detection", "fixtures")

# The tests' small detector (LXMERT's fixture's widths; make_frcnn_fixture.py's CONFIG).
OPTS = [
    "MODEL.DEVICE", "cpu",
    "MODEL.WEIGHTS", "",
    "MODEL.RESNETS.DEPTH", 50, "MODEL.RESNETS.STEM_OUT_CHANNELS", 8, "MODEL.RESNETS.RES2_OUT_CHANNELS", 16,
    "MODEL.RESNETS.NUM_GROUPS", 1, "MODEL.RESNETS.WIDTH_PER_GROUP", 4, "MODEL.RESNETS.STRIDE_IN_1X1", True,
    "MODEL.BUA.RPN.CONV_OUT_CHANNELS", 16,
    "MODEL.ANCHOR_GENERATOR.SIZES", [[16, 32, 64, 128]],
    "MODEL.RPN.PRE_NMS_TOPK_TEST", 200, "MODEL.RPN.POST_NMS_TOPK_TEST", 30,
    "MODEL.ROI_HEADS.NUM_CLASSES", 21, "MODEL.BUA.ATTRIBUTE.NUM_CLASSES", 7,
    "MODEL.BUA.EXTRACT_FEATS", True, "MODEL.BUA.EXTRACTOR.MODE", 1,
    "MODEL.BUA.EXTRACTOR.MIN_BOXES", 5, "MODEL.BUA.EXTRACTOR.MAX_BOXES", 10,
]
SHORT, LONG = 96, 160
HF_BOX_WEIGHTS = np.array([10.0, 10.0, 5.0, 5.0], np.float32)
OBJECTNESS_SCALE = 0.2


def _stubs(bua_root: str, torch):
  """The compiled and optional pieces its imports need (the module docstring says each)."""
  from PIL import Image  # noqa: PLC0415
  for name, value in (("LINEAR", Image.BILINEAR), ("CUBIC", Image.BICUBIC), ("ANTIALIAS", Image.LANCZOS)):
    if not hasattr(Image, name):
      setattr(Image, name, value)
  sys.modules.setdefault("detectron2._C", types.ModuleType("detectron2._C"))
  apex = types.ModuleType("apex")
  apex.amp = types.SimpleNamespace(float_function=lambda f: f)
  sys.modules["apex"] = apex
  from torch.utils import cpp_extension  # noqa: PLC0415
  build = tempfile.mkdtemp(prefix="bua_nms_")
  src = os.path.join(build, "csrc")
  shutil.copytree(os.path.join(bua_root, "bua", "caffe", "modeling", "layers", "csrc"), src)
  kernel = os.path.join(src, "nms", "nms_cpu.cpp")
  with open(kernel) as f:
    text = f.read()
  old = "AT_DISPATCH_FLOATING_TYPES(dets.type(),"
  assert text.count(old) == 1, "the NMS kernel changed: check the patch"
  with open(kernel, "w") as f:
    f.write(text.replace(old, "AT_DISPATCH_FLOATING_TYPES(dets.scalar_type(),"))
  ext = cpp_extension.load(name="bua_caffe_nms", sources=[os.path.join(src, "vision.cpp"), kernel],
                           extra_include_paths=[src], build_directory=build, verbose=False)
  sys.modules["bua.caffe.modeling._C"] = ext


def to_bua_layout(hf: dict, bua_sd: dict, rng) -> dict:
  """The LXMERT fixture's tensors in the bua-caffe layout, for every name of ``bua_sd`` (the
  model's own ``state_dict``, whose names and shapes rule)."""
  out = {}
  head, rpn = "roi_heads.box_predictor.", "proposal_generator.rpn_head."
  for k, v in bua_sd.items():
    if k.endswith("num_batches_tracked") or k.endswith("cell_anchors.0"):
      out[k] = v.numpy()  # its own counters and the anchors its generator made from the config
    elif k.startswith(f"{rpn}objectness_logits."):
      # Its RPN ranks by the softmax PROBABILITY, which float32 rounds to 1.0 above a logit of
      # ~17 (ties, ordered by an unstable sort): the logits scaled down keep the ranking strict.
      fg = hf[k] * OBJECTNESS_SCALE
      bg = rng.normal(0, 0.5 * float(np.std(fg)) + 1e-3, fg.shape).astype(np.float32)
      out[k] = np.concatenate([bg, fg + bg])  # softmax([bg, fg + bg])[1] = sigmoid(fg)
    elif k.startswith(f"{head}cls_score."):
      src = hf[k]
      out[k] = np.concatenate([src[-1:], src[:-1]])  # background first
    elif k.startswith((f"{head}cls_embed.", f"{head}attr_linear")):
      # Its attribute head's widths are fixed (256-d embedding, 512 hidden: the full model's
      # D / 8 and D / 4), not the small fixture's: random, scaled as make_frcnn_fixture's heads.
      std = 1.0 if "cls_embed" in k else (1.5 if "linear1" in k else 3.0) / np.sqrt(v.shape[-1])
      out[k] = rng.normal(0, std if k.endswith("weight") else 0.3, tuple(v.shape)).astype(np.float32)
    elif k.startswith(f"{head}bbox_pred."):
      src = hf[k]
      scale = np.tile(1.0 / HF_BOX_WEIGHTS, src.shape[0] // 4).reshape((-1,) + (1,) * (src.ndim - 1))
      bg = rng.normal(0, float(np.std(src)), (4,) + src.shape[1:]).astype(np.float32)
      out[k] = np.concatenate([bg, (src * scale).astype(np.float32)])
    else:
      out[k] = hf[k]
    assert tuple(out[k].shape) == tuple(v.shape), (k, out[k].shape, tuple(v.shape))
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--bua", required=True, help="MILVLG/bottom-up-attention.pytorch checkout")
  p.add_argument("--detectron2", required=True, help="detectron2 at its submodule's commit be792b9")
  p.add_argument("--out", default=os.path.join(FIXTURES, "bua_caffe"))
  args = p.parse_args(argv)
  import torch  # noqa: PLC0415
  torch.manual_seed(0)
  sys.path.insert(0, HERE)
  import make_frcnn_fixture  # noqa: PLC0415  (the fixtures' photo drawing)
  sys.path[:0] = [os.path.abspath(args.detectron2), os.path.abspath(args.bua)]
  _stubs(os.path.abspath(args.bua), torch)
  from detectron2.checkpoint import DetectionCheckpointer  # noqa: PLC0415
  from detectron2.config import get_cfg  # noqa: PLC0415
  from detectron2.modeling import build_model  # noqa: PLC0415
  from bua import add_config  # noqa: PLC0415
  # utils/__init__.py imports its multi-process extractors (ray); extract_utils alone is what runs.
  import importlib.util  # noqa: PLC0415
  spec = importlib.util.spec_from_file_location("extract_utils", os.path.join(args.bua, "utils", "extract_utils.py"))
  extract_utils = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(extract_utils)

  cfg = get_cfg()
  add_config(types.SimpleNamespace(mode="caffe"), cfg)
  cfg.merge_from_file(os.path.join(args.bua, "configs", "caffe", "test-caffe-r101.yaml"))
  cfg.merge_from_list(OPTS)
  cfg.freeze()
  extract_utils.TEST_SCALES, extract_utils.TEST_MAX_SIZE = (SHORT,), LONG

  rng = np.random.default_rng(0)
  hf = {k: v.numpy() for k, v in torch.load(os.path.join(FIXTURES, "pytorch_model.bin")).items()}
  model = build_model(cfg)
  sd = to_bua_layout(hf, model.state_dict(), rng)
  model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=True)
  os.makedirs(args.out, exist_ok=True)
  DetectionCheckpointer(model, save_dir=args.out).save("bua-caffe-tiny")
  for extra in ("last_checkpoint",):  # the checkpointer's pointer file: not part of the fixture
    if os.path.exists(os.path.join(args.out, extra)):
      os.remove(os.path.join(args.out, extra))
  model = build_model(cfg)
  DetectionCheckpointer(model).resume_or_load(os.path.join(args.out, "bua-caffe-tiny.pth"), resume=False)
  model.eval()

  rpn_out = {}
  model.proposal_generator.register_forward_hook(lambda m, i, o: rpn_out.update(p=o[0][0]))
  with np.load(os.path.join(FIXTURES, "frcnn_tiny.npz")) as z:
    raws = [z["raw_0"], z["raw_1"]]
  # a square one that upscales, a wide one the long side caps
  raws += [make_frcnn_fixture.picture(rng, h, w, blocks=5) for h, w in ((64, 64), (50, 190))]
  fixture = {}
  with tempfile.TemporaryDirectory() as tmp:
    save_args = types.SimpleNamespace(output_dir=tmp)
    for i, im in enumerate(raws):
      blob = extract_utils.get_image_blob(im, cfg.MODEL.PIXEL_MEAN)
      with torch.set_grad_enabled(False):
        boxes, scores, feats, attrs = model([blob])
      # as utils/extract_features_singlegpu.py hands them to generate_npz / save_roi_features
      boxes = [box.tensor.cpu() for box in boxes]
      scores, feats, attrs = ([t.cpu() for t in ts] for ts in (scores, feats, attrs))
      extract_utils.save_roi_features(save_args, cfg, f"img{i}.jpg", im, blob, boxes, scores, feats, attrs)
      with np.load(os.path.join(tmp, f"img{i}.npz"), allow_pickle=True) as z:
        info = z["info"].item()
        saved = {"x": z["x"], "bbox": z["bbox"]}
      fixture.update({
          f"raw_{i}": im, f"blob_{i}": blob["image"].permute(1, 2, 0).numpy(),
          f"im_scale_{i}": np.float64(blob["im_scale"]),
          f"proposals_{i}": rpn_out["p"].proposal_boxes.tensor.numpy(),
          f"objectness_{i}": rpn_out["p"].objectness_logits.numpy(),
          f"probs_{i}": scores[0].numpy(), f"feats_{i}": feats[0].numpy(), f"attr_{i}": attrs[0].numpy(),
          f"x_{i}": saved["x"], f"bbox_{i}": saved["bbox"],
          **{f"{k}_{i}": np.asarray(info[k]) for k in ("objects_id", "objects_conf", "attrs_id", "attrs_conf")}})
      print(f"image {i}: {im.shape[:2]} -> {tuple(blob['image'].shape[1:])} scale {blob['im_scale']:.4f}, "
            f"{len(fixture[f'proposals_{i}'])} proposals, {len(saved['x'])} regions")
  np.savez_compressed(os.path.join(args.out, "bua_tiny.npz"), **fixture)


if __name__ == "__main__":
  main()
