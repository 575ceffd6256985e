"""python -m jaxcap.detection.extract: a folder of photos -> make_bu_data's layout, read back by
the COCO reader; resumable; refusals before anything is written."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jaxcap.errors import BadInput
from tests.data.test_detections_hdf5 import _their_field as their_field

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = ["--short=96", "--long=160", "--pre_nms_topk=200", "--post_nms_topk=30", "--min_boxes=3",
         "--max_boxes=12", "--no_progress"]


def _photos(tmp_path):
  with np.load(FIXTURES / "frcnn_tiny.npz") as z:
    raws = [z[f"raw_{i}"] for i in range(2)]
  d = tmp_path / "photos"
  d.mkdir()
  for i, bgr in enumerate(raws):
    Image.fromarray(np.ascontiguousarray(bgr[..., ::-1])).save(d / f"p{i}.png")
  return d, [np.ascontiguousarray(b[..., ::-1]) for b in raws]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_photos_become_region_feature_files_the_coco_reader_reads(tmp_path):
  from jaxcap.data import karpathy  # noqa: PLC0415
  from jaxcap.detection import extract, regions, weights  # noqa: PLC0415
  photos, rgb = _photos(tmp_path)
  out = tmp_path / "bu"
  args = ["--images", str(photos), "--out", str(out), "--weights", str(FIXTURES / "pytorch_model.bin"), *SMALL]
  assert extract.main(args) == 0
  cfg, variables = weights.load(FIXTURES / "pytorch_model.bin", pre_nms_topk=200, post_nms_topk=30)
  detect = regions.RegionDetector(cfg, variables, short=96, long=160, min_boxes=3, max_boxes=12)
  reader = karpathy.DirFeatures(["p0", "p1"], att_dir=str(out / "cocobu_att"), fc_dir=str(out / "cocobu_fc"),
                                box_dir=str(out / "cocobu_box"), sizes=[r.shape[:2][::-1] for r in rgb])
  for i in range(2):
    want = detect([rgb[i]])[0]  # each photo alone, as the command runs them
    with np.load(out / "cocobu_att" / f"p{i}.npz") as z:
      np.testing.assert_array_equal(z["feat"], want["features"])
    np.testing.assert_array_equal(np.load(out / "cocobu_box" / f"p{i}.npy"), want["boxes"])
    np.testing.assert_allclose(np.load(out / "cocobu_fc" / f"p{i}.npy"), want["features"].mean(0), rtol=1e-6)
    assert 3 <= len(want["boxes"]) <= 12
    got = reader.read(i)  # what training and captioning read: regions, boxes in [0, 1], fc
    np.testing.assert_array_equal(got["feats"], want["features"])
    h, w = rgb[i].shape[:2]
    np.testing.assert_allclose(got["boxes"], want["boxes"] / np.asarray([w, h, w, h], np.float32), rtol=1e-5)
  record = json.loads((out / "regions.json").read_text())
  assert record["settings"]["selection"] == "caffe" and record["detector"]["weights"] == "pytorch_model.bin"
  # A second run has nothing to do; a removed file is made again; another setting is refused.
  before = {p: p.stat().st_mtime_ns for p in out.rglob("*.np*")}
  assert extract.main(args) == 0
  assert before == {p: p.stat().st_mtime_ns for p in out.rglob("*.np*")}
  os.remove(out / "cocobu_fc" / "p1.npy")
  assert extract.main(args) == 0 and (out / "cocobu_fc" / "p1.npy").exists()
  with pytest.raises(BadInput, match=r"regions\.json: regions of another detector or setting"):
    extract.main(args[:-1] + ["--max_boxes=11", "--no_progress"])


@pytest.mark.parametrize("change,match", [
    (["--min_boxes=20"], r"--min_boxes=20 --max_boxes=12: expected min_boxes <= max_boxes"),
    (["--nms_thresholds=0.3,x"], r"--nms_thresholds=0.3,x: expected IoU thresholds"),
    (["--weights=nope.bin"], r"--weights=nope\.bin: no such file"),
    (["--conf_thresh=2"], r"--conf_thresh=2\.0: expected a value in \[0, 1\]"),
])
def test_bad_flags_are_one_line_before_anything_is_written(tmp_path, change, match):
  from jaxcap.detection import extract  # noqa: PLC0415
  photos, _ = _photos(tmp_path)
  out = tmp_path / "bu"
  args = ["--images", str(photos), "--out", str(out), "--weights", str(FIXTURES / "pytorch_model.bin"), *SMALL, *change]
  with pytest.raises(BadInput, match=match):
    extract.main(args)
  assert not out.exists()


def test_a_folder_of_other_files_is_not_written_into(tmp_path):
  from jaxcap.detection import extract  # noqa: PLC0415
  photos, _ = _photos(tmp_path)
  out = tmp_path / "bu"
  out.mkdir()
  (out / "notes.txt").write_text("mine")
  args = ["--images", str(photos), "--out", str(out), "--weights", str(FIXTURES / "pytorch_model.bin"), *SMALL]
  with pytest.raises(BadInput, match=r"--out=.*bu: a folder that holds files jaxcap did not write"):
    extract.main(args)
  assert sorted(os.listdir(out)) == ["notes.txt"]
  shutil.rmtree(out)


def test_the_command_s_defaults_are_the_detector_s():
  """One set of defaults: the command's flags (parsed before JAX is imported) and the API's
  RegionDetector / DetectorConfig, which Run.caption_images uses, must not drift apart."""
  import dataclasses  # noqa: PLC0415
  import inspect  # noqa: PLC0415
  from jaxcap.detection import extract, frcnn, regions  # noqa: PLC0415
  flags = vars(extract.parser().parse_args(["--images", "x", "--out", "y", "--weights", "z"]))
  api = {k: p.default for k, p in inspect.signature(regions.RegionDetector).parameters.items()
         if p.default is not inspect.Parameter.empty}
  cfg = {f.name: f.default for f in dataclasses.fields(frcnn.DetectorConfig)}
  for name in ("short", "long", "resize", "selection", "conf_thresh", "min_boxes", "max_boxes", "nms_thresh",
               "canvas_multiple"):
    assert flags[name] == api[name], name
  assert extract._thresholds(flags["nms_thresholds"]) == tuple(api["nms_thresholds"])
  for name in ("pre_nms_topk", "post_nms_topk"):
    assert flags[name] == cfg[name], name


def test_a_folder_from_before_resize_resumes_only_with_the_reference_s_resize(tmp_path):
  """A regions.json written before --resize existed records no resize: its photos were resized
  as the reference does (the only resize then). Resumed with --resize reference (the record then
  says so); refused, naming the setting, with the default's caffe resize."""
  from jaxcap.detection import extract  # noqa: PLC0415
  photos = tmp_path / "photos"
  photos.mkdir()
  Image.fromarray(np.full((8, 6, 3), 7, np.uint8)).save(photos / "p0.png")
  out = tmp_path / "out"
  out.mkdir()
  detector = {"weights": "pytorch_model.bin", "sha256": "0" * 64}
  settings = {"short": 600, "selection": "caffe"}
  (out / extract.RECORD_FILE).write_text(json.dumps({"detector": detector, "settings": settings}))

  class Detector:
    def canvas_shape(self, hw):
      return tuple(hw)

    def __call__(self, images):
      return [{"features": np.ones((2, 4), np.float32), "boxes": np.zeros((2, 4), np.float32)} for _ in images]

  def run(resize):
    record = {"detector": detector, "settings": {**settings, "resize": resize}}
    return record, extract.run(str(photos), str(out), Detector(), record, progress=False, log=lambda s: None)

  with pytest.raises(BadInput, match=r"regions\.json: regions of another detector or setting are there "
                                     r"\(resize: 'reference' there, 'caffe' asked\); expected a new --out"):
    run("caffe")
  assert sorted(os.listdir(out)) == [extract.RECORD_FILE]  # refused before anything was written
  record, result = run("reference")
  assert result["extracted"] == 1 and json.loads((out / extract.RECORD_FILE).read_text()) == record
  with pytest.raises(BadInput, match=r"\(resize: 'reference' there, 'caffe' asked\)"):
    run("caffe")


def _m2_image_detections(path, filename, max_detections=50, sort_by_prob=False):
  """The M² authors' ``ImageDetectionsField.preprocess`` (meshed-memory-transformer,
  data/field.py), its logic as written there (less its missing-id fallback to random features)."""
  import h5py  # noqa: PLC0415
  image_id = int(filename.split("_")[-1].split(".")[0])
  f = h5py.File(path, "r")
  precomp_data = f["%d_features" % image_id][()]
  if sort_by_prob:
    precomp_data = precomp_data[np.argsort(np.max(f["%d_cls_prob" % image_id][()], -1))[::-1]]
  return their_field(precomp_data, max_detections)  # their padding / truncation to max_detections


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_hdf5_is_m2_s_layout_read_by_their_loader_and_jaxcap_s(tmp_path):
  import h5py  # noqa: PLC0415
  from jaxcap.data import karpathy  # noqa: PLC0415
  from jaxcap.detection import extract, regions, weights  # noqa: PLC0415
  photos, rgb = _photos(tmp_path)
  names = ["COCO_val2014_000000000042.png", "000000391895.png"]  # M²'s ids 42 and 391895
  for i, n in enumerate(names):
    os.rename(photos / f"p{i}.png", photos / n)
  out = tmp_path / "bu"
  args = ["--images", str(photos), "--out", str(out), "--weights", str(FIXTURES / "pytorch_model.bin"), *SMALL,
          "--hdf5"]
  assert extract.main(args) == 0
  cfg, variables = weights.load(FIXTURES / "pytorch_model.bin", pre_nms_topk=200, post_nms_topk=30)
  detect = regions.RegionDetector(cfg, variables, short=96, long=160, min_boxes=3, max_boxes=12)
  path = out / extract.HDF5_FILE
  with h5py.File(path, "r") as h:
    assert sorted(h) == sorted(f"{i}_{k}" for i in (42, 391895) for k in ("features", "boxes", "cls_prob"))
  for i, n in enumerate(names):
    want = detect([rgb[i]])[0]
    k = len(want["boxes"])
    got = _m2_image_detections(str(path), n)
    np.testing.assert_array_equal(got[:k], want["features"])
    assert got.shape == (50, want["features"].shape[1]) and not got[k:].any()
    with h5py.File(path, "r") as h:
      image_id = (42, 391895)[i]
      np.testing.assert_array_equal(h[f"{image_id}_boxes"][()], want["boxes"])
      cls_prob = h[f"{image_id}_cls_prob"][()]
    # background first (the Caffe model's order), each row a distribution whose foreground argmax is obj_ids
    np.testing.assert_allclose(cls_prob.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(cls_prob[:, 1:].argmax(1), want["obj_ids"])
    np.testing.assert_allclose(cls_prob[:, 1:].max(1), want["obj_probs"], rtol=1e-6)
    by_prob = _m2_image_detections(str(path), n, sort_by_prob=True)
    np.testing.assert_array_equal(by_prob[:k], want["features"][np.argsort(cls_prob.max(1))[::-1]])
    # jaxcap's reader of that layout (configs' data.detections_hdf5) reads the same regions
    got = karpathy.HDF5Detections([str(image_id)], str(path)).read(0)
    np.testing.assert_array_equal(got["feats"], want["features"])
  # Resumed: nothing detected again, the file rebuilt the same; without --hdf5 it is another setting.
  before = {p: p.stat().st_mtime_ns for p in out.rglob("*.np*")}
  assert extract.main(args) == 0
  assert before == {p: p.stat().st_mtime_ns for p in out.rglob("*.np*")}
  with pytest.raises(BadInput, match=r"regions\.json: regions of another detector or setting"):
    extract.main(args[:-1])


def test_hdf5_refuses_a_photo_without_an_id_before_anything_is_written(tmp_path):
  from jaxcap.detection import extract  # noqa: PLC0415
  photos, _ = _photos(tmp_path)  # p0.png, p1.png: no "_<integer>" ending
  out = tmp_path / "bu"
  args = ["--images", str(photos), "--out", str(out), "--weights", str(FIXTURES / "pytorch_model.bin"), *SMALL,
          "--hdf5"]
  with pytest.raises(BadInput, match=r"p0\.png: --hdf5 keys each photo by the integer ending its name"):
    extract.main(args)
  os.rename(photos / "p0.png", photos / "a_7.png")
  os.rename(photos / "p1.png", photos / "b_007.png")
  with pytest.raises(BadInput, match=r"b_007\.png: its id 7 is also a_7\.png's"):
    extract.main(args)
  assert not out.exists()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_batches_of_one_canvas_shape_give_each_photo_its_own_regions(tmp_path):
  """--batch 3 on five photos of two sizes (three of one canvas, two of the other): the files
  the one-at-a-time run writes, up to float rounding, and a resumed batched run adds nothing."""
  from jaxcap.detection import extract  # noqa: PLC0415
  _, rgb = _photos(tmp_path)
  photos = tmp_path / "many"
  photos.mkdir()
  rng = np.random.default_rng(0)
  for k in range(5):  # p0..p2 the first photo's size, p3 p4 the second's, each its own pixels
    base = rgb[0] if k < 3 else rgb[1]
    noisy = np.clip(base.astype(int) + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(photos / f"p{k}.png")
  outs = {}
  for batch in (1, 3):
    outs[batch] = tmp_path / f"bu{batch}"
    args = ["--images", str(photos), "--out", str(outs[batch]), "--weights", str(FIXTURES / "pytorch_model.bin"),
            *SMALL, f"--batch={batch}"]
    assert extract.main(args) == 0
  for k in range(5):
    with np.load(outs[1] / "cocobu_att" / f"p{k}.npz") as a, np.load(outs[3] / "cocobu_att" / f"p{k}.npz") as b:
      assert a["feat"].shape == b["feat"].shape and 3 <= len(a["feat"]) <= 12
      np.testing.assert_allclose(b["feat"], a["feat"], rtol=1e-5, atol=1e-6, err_msg=f"p{k}")
    np.testing.assert_allclose(np.load(outs[3] / "cocobu_box" / f"p{k}.npy"),
                               np.load(outs[1] / "cocobu_box" / f"p{k}.npy"), atol=1e-3, err_msg=f"p{k}")
  before = {p: p.stat().st_mtime_ns for p in outs[3].rglob("*.np*")}
  assert extract.main(args) == 0
  assert before == {p: p.stat().st_mtime_ns for p in outs[3].rglob("*.np*")}


def test_photos_wait_in_buckets_of_their_canvas_and_are_each_written_once(tmp_path):
  """run()'s batching with a stand-in detector: every call holds photos of one canvas shape, at
  most ``batch`` of them; no more than 4 x batch photos wait; every photo is written once, an
  unreadable one skipped."""
  from jaxcap.detection import extract  # noqa: PLC0415
  photos = tmp_path / "photos"
  photos.mkdir()
  heights = [10, 20, 30, 10, 40, 50, 60, 70, 80, 90, 20, 10, 100, 110, 10]  # 11 canvas shapes
  for k, h in enumerate(heights):
    Image.fromarray(np.full((h, 8, 3), k * 10, np.uint8)).save(photos / f"p{k:02d}.png")
  (photos / "p99.png").write_bytes(b"not a png")
  calls = []

  class Detector:
    def canvas_shape(self, hw):
      return tuple(hw)

    def __call__(self, images):
      calls.append([im.shape[:2] for im in images])
      return [{"features": np.full((2, 4), im[0, 0, 0], np.float32), "boxes": np.zeros((2, 4), np.float32)}
              for im in images]

  result = extract.run(str(photos), str(tmp_path / "out"), Detector(), {"detector": {}}, progress=False,
                       log=lambda s: None, batch=2)
  assert result["extracted"] == len(heights) and len(result["failed"]) == 1
  assert all(len(c) <= 2 and len(set(c)) == 1 for c in calls), calls
  assert sum(map(len, calls)) == len(heights)
  # Full buckets go at once; from p09 on 8 photos wait (4 x 2), so the fullest bucket (the
  # oldest of equals) goes at each new photo; the rest at the end, in the order they began.
  assert [[h for h, _ in c] for c in calls] == [[10, 10], [20], [30], [40], [50], [60], [10, 10], [70], [80],
                                                [90], [20], [100], [110]]
  for k in range(len(heights)):
    with np.load(tmp_path / "out" / "cocobu_att" / f"p{k:02d}.npz") as z:
      assert z["feat"][0, 0] == k * 10
