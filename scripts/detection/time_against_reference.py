"""Seconds per photo of the region detector on this CPU: jaxcap's against its reference's own
PyTorch code (LXMERT's ``modeling_frcnn.py`` / ``processing_image.py``, imported from
huggingface/transformers-research-projects' ``lxmert/``, never copied), in one run, on the same
photo files and the same weights:

    git clone https://github.com/huggingface/transformers-research-projects /tmp/hfrp
    pip install torch==2.14.1 torchvision==0.29.1 opencv-python-headless requests wget filelock \\
        huggingface_hub pyyaml tqdm "transformers<6"      # a venv of its own, with jaxcap's requirements
    python scripts/detection/time_against_reference.py --lxmert /tmp/hfrp/lxmert

The model is the VG detector at its full size (ResNet-101 C4, res5 dilated, RPN 6000 -> 300 at
NMS 0.7, RoI pool 14 x 14, 1,600 objects and 400 attributes, photos resized to a short side of 600 /
long side <= 1000: the values jaxcap's ``DetectorConfig`` assumes) built by the reference's
``GeneralizedRCNN`` on random weights shaped as the fixture's (``make_frcnn_fixture.randomise``),
saved as the hub's ``pytorch_model.bin`` and read by ``jaxcap.detection.weights.load``: both sides
compute with the same tensors. Each photo is a JPEG file read by each side's own reader (the
reference: its ``Preprocess`` on the path, ``cv2``; jaxcap: ``jaxcap.images``, then
``RegionDetector``), then detected at batch 1 (the reference: ``model(..., padding="max_detections")``
as its demo calls it; jaxcap: its defaults, the original's resize and selection, and the
reference's resize and selection).
The sides alternate photo by photo; each side's first photo is timed apart (jaxcap's includes
compiling). ``--threads``: torch's intra-op threads (JAX uses every core). Writes one JSON record
(``--out``; default ``benchmarks/results/detector_vs_reference_cpu_<date>.json``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _HERE)
sys.path.insert(0, _REPO)

from make_frcnn_fixture import CONFIG, randomise  # noqa: E402  (the fixture's settings and weights)

BENCHMARK = "scripts/detection/time_against_reference.py"
REFERENCE = "reference (LXMERT modeling_frcnn, torch)"

# The VG detector (jaxcap.detection.frcnn.DetectorConfig's defaults) in the reference's keys.
VG = {
    "INPUT": {"FORMAT": "BGR", "MIN_SIZE_TEST": 600, "MAX_SIZE_TEST": 1000},
    "MIN_DETECTIONS": 10, "MAX_DETECTIONS": 100,
    "RESNETS": {"DEPTH": 101, "STEM_OUT_CHANNELS": 64, "RES2_OUT_CHANNELS": 256, "WIDTH_PER_GROUP": 64,
                "RES5_DILATION": 2},
    "ANCHOR_GENERATOR": {"SIZES": [[64, 128, 256, 512]]},
    "PROPOSAL_GENERATOR": {"HIDDEN_CHANNELS": 512},
    "RPN": {"PRE_NMS_TOPK_TEST": 6000, "POST_NMS_TOPK_TEST": 300},
    "ROI_HEADS": {"NUM_CLASSES": 1600, "NMS_THRESH_TEST": [0.6]},
    "ROI_BOX_HEAD": {"NUM_ATTRS": 400},
}


def vg_config() -> dict:
  cfg = json.loads(json.dumps(CONFIG))
  for k, v in VG.items():
    if isinstance(v, dict):
      cfg[k].update(v)
    else:
      cfg[k] = v
  return cfg


def photos(folder: str, n: int, hw: tuple[int, int], seed: int = 0) -> list[str]:
  """``n`` JPEG photos of ``hw`` with structure (gradients and blocks), written with Pillow."""
  from PIL import Image
  rng = np.random.default_rng(seed)
  h, w = hw
  paths = []
  for i in range(n):
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 / w), (yy * 255 / h), ((xx + yy) * 127 / (h + w))], -1)
    for _ in range(12):
      y0, x0 = rng.integers(0, h - 20), rng.integers(0, w - 20)
      img[y0:y0 + rng.integers(10, h // 2), x0:x0 + rng.integers(10, w // 2)] = rng.uniform(0, 255, 3)
    path = os.path.join(folder, f"photo_{i:02d}.jpg")
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=92)
    paths.append(path)
  return paths


def main(argv=None) -> int:
  from jaxcap import cli  # noqa: PLC0415  (one-line refusals, a bug's traceback: cli.run_script)
  p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--lxmert", required=True, help="the reference's lxmert/ folder")
  p.add_argument("--photos", type=cli.positive_int, default=4, help="photos timed per side, after the first")
  p.add_argument("--hw", default="480x640", help="the photos' HEIGHTxWIDTH (COCO's typical)")
  p.add_argument("--threads", type=cli.positive_int, default=os.cpu_count(), help="torch's intra-op threads")
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  try:
    hw = tuple(int(t) for t in args.hw.lower().split("x"))
  except ValueError:
    hw = ()
  if len(hw) != 2 or min(hw) < 32:
    raise cli.BadInput(f"--hw={args.hw}: expected HEIGHTxWIDTH in pixels, each at least 32 (480x640)")
  if not os.path.isfile(os.path.join(args.lxmert, "modeling_frcnn.py")):
    raise cli.BadInput(f"--lxmert={args.lxmert}: no modeling_frcnn.py there; expected the lxmert/ folder "
                       "of huggingface/transformers-research-projects")
  sys.path.insert(0, os.path.abspath(args.lxmert))
  import torch  # noqa: PLC0415
  import modeling_frcnn  # noqa: PLC0415
  import processing_image  # noqa: PLC0415
  from utils import Config  # noqa: PLC0415
  import jax  # noqa: PLC0415
  from jaxcap import images as images_lib  # noqa: PLC0415
  from jaxcap.detection import regions, weights  # noqa: PLC0415

  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  cfg = Config(vg_config())
  model = modeling_frcnn.GeneralizedRCNN(cfg).eval()
  randomise(model, torch, np.random.default_rng(0))
  pre = processing_image.Preprocess(cfg)

  with tempfile.TemporaryDirectory() as tmp:
    bin_path = os.path.join(tmp, "pytorch_model.bin")
    torch.save(model.state_dict(), bin_path)  # the file from_pretrained loads
    dcfg, variables = weights.load(bin_path)
    paths = photos(tmp, args.photos + 1, hw)

    def reference(path):
      with torch.no_grad():
        images, sizes, scales_yx = pre(path)
        out = model(images, sizes, scales_yx=scales_yx, padding="max_detections",
                    max_detections=cfg.MAX_DETECTIONS, return_tensors="np")
      return int(np.asarray(out["preds_per_image"])[0])

    detectors = {"jaxcap (caffe resize and selection, default)": regions.RegionDetector(dcfg, variables),
                 "jaxcap (reference resize and selection)": regions.RegionDetector(
                     dcfg, variables, resize="reference", selection="reference")}

    def ours(name):
      def run(path):
        return len(detectors[name]([images_lib.read_image(path, images_lib.NATIVE, exif=True)])[0]["boxes"])  # as extract reads
      return run

    sides = {REFERENCE: reference, **{k: ours(k) for k in detectors}}
    rows = {name: {"first_s": None, "seconds": [], "regions": []} for name in sides}
    for i, path in enumerate(paths):
      for name, fn in sides.items():
        t = time.perf_counter()
        n = fn(path)
        s = time.perf_counter() - t
        row = rows[name]
        if i == 0:
          row["first_s"] = round(s, 3)
        else:
          row["seconds"].append(round(s, 3))
        row["regions"].append(n)
        print(f"photo {i} {name}: {s:.2f} s, {n} regions", flush=True)
  for row in rows.values():
    row["median_s"] = round(statistics.median(row["seconds"]), 3)
    row["mean_s"] = round(statistics.fmean(row["seconds"]), 3)
  ref = rows[REFERENCE]["median_s"]
  for row in rows.values():
    row["reference_over_this"] = round(ref / row["median_s"], 3)  # > 1: faster than the reference
  import cv2  # noqa: PLC0415
  sys.path.insert(0, os.path.join(_REPO, "benchmarks"))
  from run import environment  # noqa: PLC0415  (the shared records' environment)
  env = environment()
  env.update(torch=torch.__version__, opencv=cv2.__version__, torch_threads=torch.get_num_threads(),
             cpus=os.cpu_count())
  record = {
      "benchmark": BENCHMARK, "environment": env,
      "photo_hw": list(hw), "photos_timed": args.photos, "batch": 1,
      "config": vg_config(), "detector": dict(vars(dcfg)),
      "rows": [{"side": name, **row} for name, row in rows.items()],
  }
  out = args.out or os.path.join(_REPO, "benchmarks", "results",
                                 f"detector_vs_reference_cpu_{env['date'][:10]}.json")
  with open(out, "w") as f:
    json.dump(record, f, indent=1, default=list)
  print(json.dumps({k: (v["median_s"], v["reference_over_this"]) for k, v in rows.items()}))
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)
