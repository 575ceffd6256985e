"""The bottom-up-attention region detector (jaxcap.detection): photos per second, compile and memory.

  python benchmarks/detector.py [--batch 1,8] [--dtype float32,bfloat16] [--hw 480x640]
      [--windows 3 --steps 3] [--small] [--out record.json]

The VG model's sizes (ResNet-101 C4, 1,600 objects, 400 attributes, RPN 6000 -> 300) with random
weights (``Detector.init``, tamed by :func:`tame` so that the selection sees regions inside the
photo as with trained weights; the program's shapes, and so its work, do not depend on the values), the
default resize and selection (the original's: ``resize_caffe``, ``select_caffe``, 10-100 regions).
Each row is one batch of same-size photos (``--hw``: COCO's typical 480 x 640 becomes a 600 x 800
canvas): ``device`` times the jitted canvas -> regions program alone on a canvas already on the
device; ``end_to_end`` times ``RegionDetector(photos)`` (the host's resize, the transfer, the
program, the copy back), what ``python -m jaxcap.detection.extract`` does per batch.
``--small``: a tiny detector and photos, a smoke run of the script on a CPU. Writes one JSON
record (``--out``; default ``benchmarks/results/detector_<device>_<date>.json``).
"""

from __future__ import annotations

import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)
BENCHMARK = "benchmarks/detector.py"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxcap import cli  # noqa: E402


def _hw(text: str) -> tuple[int, int]:
  try:
    h, w = (int(t) for t in text.lower().split("x"))
  except ValueError:
    raise cli.BadInput(f"--hw: expected HEIGHTxWIDTH in pixels (480x640), got {text!r}") from None
  if h < 1 or w < 1:
    raise cli.BadInput(f"--hw: expected positive sizes, got {text!r}")
  return h, w


def tame(variables):
  """Random weights whose activations stay of order one, so that the proposals fall inside the
  photo and the selection keeps its 10-100 regions as with trained weights: each residual branch
  starts at zero (its last batch norm's scale 0, as in Goyal et al.'s zero-init-residual) and the
  stem's batch norm divides by the pixels' spread. ``Detector.init``'s own weights grow the
  activations through 33 blocks until every proposal is shifted off the photo: no region at all,
  a case trained weights never reach."""
  import flax
  flat = flax.traverse_util.flatten_dict(variables)
  for k in flat:
    name = "/".join(k)
    if name.endswith("conv3/norm/scale"):
      flat[k] = jnp.zeros_like(flat[k])
    elif "stem" in name and name.endswith("norm/var"):
      flat[k] = jnp.full_like(flat[k], 60.0 ** 2)  # the BGR pixels' spread after the means
  return flax.traverse_util.unflatten_dict(flat)


def _peak_bytes() -> int | None:
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # noqa: BLE001 - a backend without memory statistics (CPU)
    return None
  return stats.get("peak_bytes_in_use")


def main(argv=None) -> dict:
  p = cli.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", default="1,8", help="photos per call, comma-separated")
  p.add_argument("--dtype", default="float32,bfloat16")
  p.add_argument("--hw", type=_hw, default=(480, 640), help="the photos' HEIGHTxWIDTH")
  p.add_argument("--windows", type=cli.positive_int, default=3)
  p.add_argument("--steps", type=cli.positive_int, default=3, help="calls per timed window")
  p.add_argument("--small", action="store_true", help="a tiny detector and photos (a CPU smoke run)")
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  import common
  import run as bench_run  # the same environment record as run.py
  from jaxcap.detection import frcnn, regions

  batches = common.positive_ints(p, "--batch", a.batch)
  dtypes = common.check_dtypes(p, "--dtype", a.dtype)
  t0 = time.perf_counter()
  if a.small:  # the tests' tiny detector and its weights (scripts/detection/make_frcnn_fixture.py)
    from jaxcap.detection import weights
    cfg, variables = weights.load(os.path.join(_REPO, "tests", "detection", "fixtures", "pytorch_model.bin"),
                                  pre_nms_topk=200, post_nms_topk=30)
    short, long, min_boxes, max_boxes = 96, 160, 3, 12
    hw = (60, 80)
  else:
    cfg = frcnn.DetectorConfig()
    short, long, min_boxes, max_boxes = 600, 1000, 10, 100
    hw = a.hw
    ch, cw = frcnn.caffe_scale(hw[0], hw[1], short, long)[1]  # the default resize's canvas
    variables = tame(jax.jit(frcnn.Detector(cfg).init)(
        jax.random.key(0), jnp.zeros((1, ch, cw, 3)), jnp.asarray([[ch, cw]], jnp.int32)))
  jax.block_until_ready(variables)
  init_s = time.perf_counter() - t0
  rng = np.random.default_rng(0)
  rows = []
  for dtype in dtypes:
    detect = regions.RegionDetector(cfg, variables, short=short, long=long, min_boxes=min_boxes,
                                    max_boxes=max_boxes, dtype=jnp.dtype(dtype))
    for b in batches:
      photos = [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for _ in range(b)]
      canvas, sizes, scales = (jnp.asarray(x) for x in detect.preprocess(photos))
      first, med, spread, _ = common.timed_windows(
          lambda: detect._forward(detect.variables, canvas, sizes, scales)["count"],  # noqa: B023
          warmup=1, windows=a.windows, steps=a.steps)
      t0 = time.perf_counter()
      out = None
      for _ in range(a.steps):
        out = detect(photos)
      e2e = (time.perf_counter() - t0) / a.steps
      counts = [len(o["boxes"]) for o in out]
      row = {"dtype": dtype, "batch": b, "photo_hw": list(hw), "canvas_hw": [int(canvas.shape[1]), int(canvas.shape[2])],
             "compile_and_first_s": round(first, 3), "device_step_ms": round(med * 1e3, 3),
             "device_photos_per_s": round(b / med, 2), "spread": round(spread, 3),
             "end_to_end_ms": round(e2e * 1e3, 3), "end_to_end_photos_per_s": round(b / e2e, 2),
             "regions_min": min(counts), "regions_max": max(counts), "peak_bytes": _peak_bytes()}
      print(json.dumps(row), flush=True)
      rows.append(row)
  env = dict(bench_run.environment(), cpu_count=os.cpu_count())
  record = {"benchmark": BENCHMARK, "environment": env, "small": a.small, "init_s": round(init_s, 3),
            "config": {"depth": cfg.depth, "num_classes": cfg.num_classes, "num_attrs": cfg.num_attrs,
                       "pre_nms_topk": cfg.pre_nms_topk, "post_nms_topk": cfg.post_nms_topk,
                       "short": short, "long": long, "min_boxes": min_boxes, "max_boxes": max_boxes,
                       "resize": "caffe", "selection": "caffe"},
            "windows": a.windows, "steps": a.steps, "rows": rows}
  common.write_record("detector", record, a.out)
  return record


if __name__ == "__main__":
  cli.run_script(main)
