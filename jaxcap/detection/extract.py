"""Bottom-up region features of a folder of photos, in the layout self-critical.pytorch's
``scripts/make_bu_data.py`` writes from the Caffe original's TSV (and that jaxcap's COCO configs,
the imported self-critical and M² models and the Image Transformer read):

  python -m jaxcap.detection.extract --images photos/ --out data/mine --weights pytorch_model.bin

- ``<out>/cocobu_att/<stem>.npz``: key ``feat``, ``[n, 2048]`` float32, the regions' pooled res5
  features (``n`` between ``--min_boxes`` and ``--max_boxes``);
- ``<out>/cocobu_fc/<stem>.npy``: ``[2048]``, their mean (make_bu_data's ``fc``);
- ``<out>/cocobu_box/<stem>.npy``: ``[n, 4]`` x1 y1 x2 y2 in the photo's pixels;
- ``<out>/regions.json``: the detector's weights (file name and sha256), its shape and every
  setting, written before the first feature so that two detectors never share a folder;
- with ``--hdf5``, also ``<out>/coco_detections.hdf5``, the M² authors' layout (their
  ``ImageDetectionsField`` reads it; jaxcap's ``data.detections_hdf5`` too): per photo
  ``<id>_features [n, 2048]``, ``<id>_boxes [n, 4]`` (x1 y1 x2 y2, pixels) and ``<id>_cls_prob
  [n, K + 1]`` (the class softmax, background first as in the Caffe model's ``cls_prob``; M²'s
  ``sort_by_prob`` orders the regions by its row maxima), ``<id>`` the integer that ends the
  photo's name as their loader parses it (``COCO_val2014_000000391895.jpg`` -> ``391895``). It is
  assembled, atomically, from the per-photo files once every photo is done (each ``.npz`` then
  keeps ``cls_prob`` beside ``feat``), so a stopped extraction resumes as without it.

Each photo is read upright (its EXIF orientation applied, as the original's ``cv2.imread``
does), as RGB, and goes through :class:`jaxcap.detection.regions.RegionDetector`, alone by
default (the original's one image at a time); ``--batch N`` detects N photos of one canvas shape
per call (a GPU's throughput: no photo is padded beyond its own canvas, so each photo's regions
are its own up to float rounding; photos wait in per-shape buckets, at most 4 N of them, the
fullest bucket going first when that many wait); ``--canvas_multiple`` pads each canvas further
so that photos of nearby sizes share a compiled program and a bucket (1: each size its own, the
reference's features exactly).
Each file is written atomically; a second run skips the photos whose three files exist, and
refuses a folder whose ``regions.json`` another detector or setting wrote. An unreadable photo
is a warning line, skipped. Exit 2 with one line on bad input, before anything is written.
``--resize`` (``caffe``, the default: the original's resize, whose features the captioning models
read; ``reference``: LXMERT's) is one of the recorded settings; a ``regions.json`` written before
it existed records the reference's resize, the only one then.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

from jaxcap import atomic, cli
from jaxcap.errors import BadInput
from jaxcap.images import NATIVE, read_image, unreadable_reason

RECORD_FILE = "regions.json"
FOLDERS = ("cocobu_att", "cocobu_fc", "cocobu_box")
HDF5_FILE = "coco_detections.hdf5"


def parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog="python -m jaxcap.detection.extract", description=__doc__.split("\n")[0])
  add = p.add_argument
  add("--images", required=True, help="Folder of photos (not recursive).")
  add("--out", required=True, help="Output folder (cocobu_att/, cocobu_fc/, cocobu_box/, regions.json).")
  add("--weights", required=True, help="The detector's pytorch_model.bin (LXMERT's frcnn-vg-finetuned), "
      "airsplay's faster_rcnn_from_caffe_attr.pkl or MILVLG's bua-caffe-frcn-r101*.pth (read with its "
      "Caffe geometry).")
  add("--resize", choices=["caffe", "reference"], default="caffe",
      help="caffe: the original's _get_image_blob (means subtracted first, one scale, cv2.resize's "
      "bilinear and rounding; default); reference: LXMERT's Preprocess.")
  add("--selection", choices=["caffe", "reference"], default="caffe",
      help="caffe: the original's generate_tsv.py selection (default); reference: LXMERT's.")
  add("--conf_thresh", type=float, default=0.2, help="caffe selection: a region's least max_conf.")
  add("--nms_thresh", type=float, default=0.3, help="caffe selection: the per-class NMS IoU.")
  add("--nms_thresholds", default="0.6", help="reference selection: IoU thresholds tried in order, comma-separated.")
  add("--min_boxes", type=cli.positive_int, default=10, help="Fewest regions per photo.")
  add("--max_boxes", type=cli.positive_int, default=100, help="Most regions per photo.")
  add("--short", type=cli.positive_int, default=600, help="Resized short side.")
  add("--long", type=cli.positive_int, default=1000, help="Resized long side, at most.")
  add("--pre_nms_topk", type=cli.positive_int, default=6000, help="RPN proposals before its NMS.")
  add("--post_nms_topk", type=cli.positive_int, default=300, help="RPN proposals kept after its NMS.")
  add("--batch", type=cli.positive_int, default=1,
      help="Photos of one canvas shape per call (a GPU's throughput; 1: one at a time, the original's way).")
  add("--canvas_multiple", type=cli.positive_int, default=1,
      help="Pad each canvas to a multiple of this many pixels (fewer compiled programs; 1: exact).")
  add("--hdf5", action="store_true", help=f"Also write <out>/{HDF5_FILE} (M²'s layout: <id>_features, "
      "<id>_boxes, <id>_cls_prob; <id> the integer ending each photo's name).")
  add("--no_progress", action="store_true", help="No progress bar.")
  add("--overwrite", action="store_true", help="Write into an --out folder that holds files jaxcap did not write.")
  return p


def _thresholds(text: str) -> tuple:
  try:
    values = tuple(float(t) for t in text.split(","))
  except ValueError:
    values = ()
  if not values or not all(0.0 <= t <= 1.0 for t in values):
    raise BadInput(f"--nms_thresholds={text}: expected IoU thresholds in [0, 1], comma-separated")
  return values


def m2_ids(names: list[str], images_dir: str) -> list[int]:
  """Each photo's M² image id: the integer after the last ``_`` of its name's stem, as
  ``ImageDetectionsField.preprocess`` parses it (``int(x.split('_')[-1].split('.')[0])``)."""
  ids, seen = [], {}
  for n in names:
    tail = os.path.splitext(n)[0].split("_")[-1]
    if not (tail.isascii() and tail.isdigit()):
      raise BadInput(f"{os.path.join(images_dir, n)}: --hdf5 keys each photo by the integer ending its "
                     "name (M²'s loader parses COCO_val2014_000000391895.jpg as 391895); expected names "
                     "like that, or no --hdf5")
    i = int(tail)
    if i in seen:
      raise BadInput(f"{os.path.join(images_dir, n)}: its id {i} is also {seen[i]}'s; --hdf5 expected one "
                     "photo per id")
    seen[i] = n
    ids.append(i)
  return ids


def write_hdf5(out: str, names: list[str], ids: list[int]) -> int:
  """``<out>/coco_detections.hdf5`` from the per-photo files of the photos done (module
  docstring), written to a temporary file and renamed; returns how many photos it holds."""
  import h5py  # noqa: PLC0415

  done = [(n, i) for n, i in zip(names, ids) if _done(out, os.path.splitext(n)[0])]

  def write(f):
    with h5py.File(f, "w") as h:
      for name, i in done:
        stem = os.path.splitext(name)[0]
        with np.load(os.path.join(out, "cocobu_att", stem + ".npz")) as z:
          feat, cls_prob = z["feat"], z["cls_prob"]
        h.create_dataset(f"{i}_features", data=feat)
        h.create_dataset(f"{i}_boxes", data=np.load(os.path.join(out, "cocobu_box", stem + ".npy")))
        # background first, as the Caffe model's cls_prob (the detector's is last)
        h.create_dataset(f"{i}_cls_prob", data=np.concatenate([cls_prob[:, -1:], cls_prob[:, :-1]], 1))

  atomic.write_with(os.path.join(out, HDF5_FILE), write, mode="w+b")
  return len(done)


def is_regions_folder(path: str) -> bool:
  record = atomic.read_json(os.path.join(path, RECORD_FILE))
  return isinstance(record, dict) and "detector" in record


def _as_now(record):
  """A ``regions.json`` as this version writes it: one written before ``--resize`` existed
  records no resize, and its photos were resized as the reference does (the only resize then), so
  it reads as ``resize: reference`` (resumed by ``--resize reference``, refused otherwise)."""
  settings = record.get("settings") if isinstance(record, dict) else None
  if isinstance(settings, dict) and "resize" not in settings:
    record = {**record, "settings": {**settings, "resize": "reference"}}
  return record


def _differences(old, new) -> str:
  """`` (resize: 'reference' there, 'caffe' asked)``: the settings that differ, when both records
  have settings (the weights' difference speaks for itself)."""
  a, b = (r.get("settings") if isinstance(r, dict) else None for r in (old, new))
  if not (isinstance(a, dict) and isinstance(b, dict)):
    return ""
  diff = [f"{k}: {a.get(k)!r} there, {b.get(k)!r} asked" for k in sorted(set(a) | set(b))
          if a.get(k) != b.get(k)]
  return f" ({'; '.join(diff)})" if diff else ""


def _done(out: str, stem: str) -> bool:
  return all(os.path.isfile(os.path.join(out, d, stem + (".npz" if d == "cocobu_att" else ".npy")))
             for d in FOLDERS)


def run(images_dir: str, out: str, detector, record: dict, *, progress: bool = True, log=None,
        hdf5: bool = False, batch: int = 1) -> dict:
  """Detects the regions of every photo of ``images_dir`` not done yet (module docstring),
  ``batch`` photos of one canvas shape per call; returns ``{"total", "done_before", "extracted",
  "failed": [(name, reason)], "seconds"}`` (and ``"hdf5"``: the photos :data:`HDF5_FILE` holds,
  with ``hdf5``)."""
  from jaxcap.features.extract import list_images  # noqa: PLC0415
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  names = list_images(images_dir)
  if not names:
    raise BadInput(f"--images={images_dir}: no image files; expected a folder of photos")
  ids = m2_ids(names, images_dir) if hdf5 else None
  path = os.path.join(out, RECORD_FILE)
  if os.path.isfile(path):
    old = _as_now(atomic.read_json(path))
    if old != record:
      raise BadInput(f"{path}: regions of another detector or setting are there{_differences(old, record)}; "
                     "expected a new --out folder (or the same weights and settings, to resume)")
  left = [p for d in (out,) + tuple(os.path.join(out, f) for f in FOLDERS) for p in atomic.remove_leftovers(d)]
  if left:
    log(f"removed {len(left)} temporary file(s) a stopped extraction left (e.g. {left[0]})")
  for d in FOLDERS:
    os.makedirs(os.path.join(out, d), exist_ok=True)
  atomic.write_json(path, record)
  todo = [n for n in names if not _done(out, os.path.splitext(n)[0])]
  result = {"total": len(names), "done_before": len(names) - len(todo), "extracted": 0, "failed": [],
            "seconds": 0.0}
  bar = None
  if progress and todo:
    from tqdm import tqdm  # noqa: PLC0415
    bar = tqdm(total=len(todo), unit="img", file=sys.stderr, dynamic_ncols=True)
  start = time.perf_counter()

  def write(name, r):
    stem = os.path.splitext(name)[0]
    feat = np.asarray(r["features"], np.float32)
    # The fc file last: a photo counts as done only when all three are there.
    arrays = {"feat": feat, **({"cls_prob": np.asarray(r["class_probs"], np.float32)} if hdf5 else {})}
    atomic.write_with(os.path.join(out, "cocobu_att", stem + ".npz"), lambda f: np.savez_compressed(f, **arrays))
    atomic.write_with(os.path.join(out, "cocobu_box", stem + ".npy"),
                      lambda f: np.save(f, np.asarray(r["boxes"], np.float32)))
    atomic.write_with(os.path.join(out, "cocobu_fc", stem + ".npy"), lambda f: np.save(f, feat.mean(0)))
    result["extracted"] += 1
    if bar is not None:
      bar.update(1)

  buckets: dict = {}  # canvas shape -> [(name, pixels)] waiting for a full batch

  def detect(shape):
    waiting = buckets.pop(shape)
    for (name, _), r in zip(waiting, detector([img for _, img in waiting])):
      write(name, r)

  try:
    for name in todo:
      file = os.path.join(images_dir, name)
      try:
        img = read_image(file, NATIVE, exif=True)
      except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
        reason = unreadable_reason(e)
        result["failed"].append((name, reason))
        msg = f"warning: {file}: unreadable image ({reason}); skipped"
        (bar.write(msg, file=sys.stderr) if bar is not None else log(msg))
        if bar is not None:
          bar.update(1)
        continue
      shape = detector.canvas_shape(img.shape[:2]) if batch > 1 else None
      buckets.setdefault(shape, []).append((name, img))
      if len(buckets[shape]) >= batch:
        detect(shape)
      elif sum(map(len, buckets.values())) >= 4 * batch:  # held photos bounded: the fullest goes
        detect(max(buckets, key=lambda k: len(buckets[k])))
    for shape in list(buckets):  # the partly filled buckets, at the end
      detect(shape)
  finally:
    if bar is not None:
      bar.close()
  if hdf5:
    result["hdf5"] = write_hdf5(out, names, ids)
  result["seconds"] = time.perf_counter() - start
  return result


def main(argv=None) -> int:
  a = parser().parse_args(argv)
  thresholds = _thresholds(a.nms_thresholds)
  if not os.path.isdir(a.images):
    raise BadInput(f"--images={a.images}: not a directory; expected a folder of photos")
  if a.min_boxes > a.max_boxes:
    raise BadInput(f"--min_boxes={a.min_boxes} --max_boxes={a.max_boxes}: expected min_boxes <= max_boxes")
  if a.short > a.long:
    raise BadInput(f"--short={a.short} --long={a.long}: expected short <= long")
  if a.post_nms_topk > a.pre_nms_topk:
    raise BadInput(f"--post_nms_topk={a.post_nms_topk} --pre_nms_topk={a.pre_nms_topk}: expected "
                   "post_nms_topk <= pre_nms_topk")
  for flag, v in (("--conf_thresh", a.conf_thresh), ("--nms_thresh", a.nms_thresh)):
    if not 0.0 <= v <= 1.0:
      raise BadInput(f"{flag}={v}: expected a value in [0, 1]")
  if os.path.exists(a.out) and not os.path.isdir(a.out):
    raise BadInput(f"--out={a.out}: is a file; expected a folder to write the regions into")
  atomic.check_output(a.out, f"--out={a.out}", folder=True, overwrite=a.overwrite, mine=is_regions_folder,
                      what="one this command wrote (to resume)")
  if a.hdf5:  # every photo's id, before anything is written
    from jaxcap.features.extract import list_images  # noqa: PLC0415
    m2_ids(list_images(a.images), a.images)
  if not os.path.isfile(a.weights):
    raise BadInput(f"--weights={a.weights}: no such file; expected the detector's pytorch_model.bin, "
                   "faster_rcnn_from_caffe_attr.pkl or bua-caffe-frcn-r101*.pth")
  from jaxcap.detection import regions, weights  # noqa: PLC0415  (jax: after the checks)
  from jaxcap.features.extract import sha256  # noqa: PLC0415
  cfg, variables = weights.load(a.weights, pre_nms_topk=a.pre_nms_topk, post_nms_topk=a.post_nms_topk)
  settings = dict(short=a.short, long=a.long, resize=a.resize, selection=a.selection, conf_thresh=a.conf_thresh,
                  min_boxes=a.min_boxes, max_boxes=a.max_boxes, nms_thresh=a.nms_thresh,
                  nms_thresholds=list(thresholds), canvas_multiple=a.canvas_multiple)
  record = {"detector": {"weights": os.path.basename(a.weights), "sha256": sha256(a.weights),
                         "config": dataclasses.asdict(cfg)}, "settings": settings}
  if a.hdf5:  # its .npz files keep cls_prob: a folder started without it is another setting
    record["hdf5"] = True
  record = json.loads(json.dumps(record))  # tuples as lists: what the file reads back
  detector = regions.RegionDetector(cfg, variables, **{**settings, "nms_thresholds": thresholds})
  atomic.mark_folder(a.out, "jaxcap.detection.extract")
  result = run(a.images, a.out, detector, record, progress=not a.no_progress, hdf5=a.hdf5, batch=a.batch)
  if result["extracted"]:
    print(f"detected the regions of {result['extracted']} photos in {result['seconds']:.1f} s "
          f"(compilation included); {result['done_before']} done before", flush=True)
  else:
    print(f"nothing to do: the {result['done_before']} photos' regions are there", flush=True)
  if a.hdf5:
    print(f"wrote {os.path.join(a.out, HDF5_FILE)} ({result['hdf5']} photos)", flush=True)
  if result["failed"]:
    print(f"{len(result['failed'])} unreadable photo(s) skipped, e.g. {result['failed'][0][0]}", file=sys.stderr)
  if result["failed"] and not (result["extracted"] or result["done_before"]):
    raise BadInput(f"--images={a.images}: no photo could be read (e.g. {result['failed'][0][0]}: "
                   f"{result['failed'][0][1]})")
  return 0


if __name__ == "__main__":
  cli.run_script(main)
