"""``jaxcap-extract`` (``scripts/extract_features.py``): a folder of images -> self-critical's
feature dirs + a Karpathy JSON that train.py reads unchanged.

The folder: random RGB PNGs and JPEGs, a grayscale PNG, a JPEG with an EXIF orientation tag
and a corrupt ``.jpg``; a tiny ResNet (``--fields``) with ``--random_weights`` at 32 px.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jaxcap.commands import extract as command
from jaxcap.data import karpathy
from jaxcap.features import extract
from tests.programs import one_device_env

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "extract_features.py"
TINY = ["--backbone", "resnet50", "--fields", '{"width": 4, "depths": [1, 1, 1, 1]}',
        "--size", "32", "--att_size", "2", "--batch_size", "4", "--random_weights", "--no_progress"]
GOOD = ["a0.png", "a1.jpg", "a2.png", "a3.jpg", "a4.png", "gray.png", "turned.jpg"]


def make_images(folder: Path) -> None:
  rng = np.random.default_rng(0)
  folder.mkdir()
  for i, name in enumerate(GOOD[:5]):
    Image.fromarray(rng.integers(0, 256, (24 + 4 * i, 40, 3), dtype=np.uint8)).save(folder / name)
  Image.fromarray(rng.integers(0, 256, (30, 30), dtype=np.uint8), "L").save(folder / "gray.png")
  exif = Image.Exif()
  exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
  Image.fromarray(rng.integers(0, 256, (20, 40, 3), dtype=np.uint8)).save(folder / "turned.jpg", exif=exif)
  (folder / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
  (folder / "notes.txt").write_text("not an image: ignored")


def run_cli(argv, capsys):
  """The program in-process (``run_script`` exits): ``(exit code, stdout, stderr)``."""
  saved = sys.argv
  sys.argv = ["jaxcap-extract", *map(str, argv)]
  try:
    with pytest.raises(SystemExit) as e:
      command.run()
  finally:
    sys.argv = saved
  out = capsys.readouterr()
  return e.value.code, out.out, out.err


def run_script(argv, cwd):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], capture_output=True,
                        text=True, env=env, timeout=120, cwd=cwd)


def extract_folder(root: Path):
  """The test folder extracted (with captions) under ``root``: ``(images, out, stdout, stderr)``."""
  images, out = root / "images", root / "out"
  make_images(images)
  captions = {name: [f"A Red shape number {i}.", f"some noise in picture {i}"]
              for i, name in enumerate(GOOD + ["broken.jpg"])}
  (root / "captions.json").write_text(json.dumps(captions))
  saved = sys.argv
  sys.argv = ["jaxcap-extract", "--images", str(images), "--out", str(out), *TINY,
              "--captions", str(root / "captions.json"), "--name", "mine", "--val", "2", "--test", "1"]
  stdout, stderr = io.StringIO(), io.StringIO()
  try:
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
      with pytest.raises(SystemExit) as e:
        command.run()
  finally:
    sys.argv = saved
  assert e.value.code == 0, stderr.getvalue()
  return images, out, stdout.getvalue(), stderr.getvalue()


def train_on(out: Path, workdir: Path) -> subprocess.CompletedProcess:
  """train.py for 2 steps of a tiny transformer on the extracted ``out``."""
  argv = [sys.executable, str(REPO / "train.py"), "--config", "configs/transformer.py:coco",
          f"--config.data.root={out}", "--config.data.dataset_json=dataset_mine.json",
          "--config.data.att_dir=att", "--config.data.fc_dir=fc", "--config.data.box_dir=",
          "--config.data.grid=True", "--config.data.max_regions=4", "--config.data.min_word_count=1",
          "--config.num_train_steps=2", "--config.eval_every_steps=2",
          "--config.checkpoint_every_steps=2", "--config.log_every_steps=1", "--config.batch_size=4",
          "--config.eval_batch_size=4", "--config.warmup_steps=1", "--config.model.dim=32",
          "--config.model.ff_dim=64", "--config.model.num_layers=1",
          "--config.model.num_dec_layers=1", "--workdir", str(workdir)]
  # One CPU device: the batch of 4 need not split over the suite's 8.
  env = dict(one_device_env(), JAX_PLATFORMS="cpu")  # and the suite's fast-compile flags
  return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
  """One extraction (with captions) shared by the tests: ``(images, out, stdout, stderr)``."""
  return extract_folder(tmp_path_factory.mktemp("extract"))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_layout_and_shapes(extracted):
  _, out, stdout, _ = extracted
  stems = sorted(os.path.splitext(n)[0] for n in GOOD)
  assert sorted(p.stem for p in (out / "fc").iterdir()) == stems
  assert sorted(p.stem for p in (out / "att").iterdir()) == stems
  assert not [p for p in out.rglob("*") if ".tmp" in p.name]  # nothing half-written
  fc = np.load(out / "fc" / "gray.npy")
  att = np.load(out / "att" / "turned.npz")["feat"]
  assert fc.shape == (128,) and fc.dtype == np.float32
  assert att.shape == (4, 128) and att.dtype == np.float32  # 2 x 2 grid flattened
  assert np.all(np.isfinite(att)) and np.abs(att).sum() > 0
  record = json.loads((out / "features.json").read_text())
  assert record["backbone"] == "resnet50" and record["fields"] == {"width": 4, "depths": [1, 1, 1, 1]}
  assert (record["size"], record["att_size"], record["dtype"]) == (32, 2, "float32")
  assert record["weights"] == {"random": True, "seed": 0}
  assert "extracted 7 images" in stdout and "images/s" in stdout


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_corrupt_file_is_reported_and_the_rest_extracted(extracted):
  images, _, _, stderr = extracted
  warnings = [l for l in stderr.splitlines() if l.startswith("warning:")]
  assert len(warnings) == 1 and str(images / "broken.jpg") in warnings[0]
  assert "1 unreadable image(s)" in stderr and "Traceback" not in stderr


def test_a_second_run_extracts_nothing(extracted, capsys):
  images, out, _, _ = extracted
  before = {p: p.stat().st_mtime_ns for p in (out / "fc").iterdir()}
  code, stdout, _ = run_cli(["--images", images, "--out", out, *TINY], capsys)
  assert code == 0 and "extracted 0 images: 7 of the 8 images" in stdout
  assert {p: p.stat().st_mtime_ns for p in (out / "fc").iterdir()} == before


def test_a_resumed_run_removes_the_temporary_files_a_killed_one_left(extracted, capsys):
  """A kill mid-write left att/<id>.npz.<random>.tmp behind for good (write_with's cleanup
  never ran); the next run of the same extraction removes them, and says so."""
  images, out, _, _ = extracted
  left = [out / "att" / "img_000.npz.k3j_x9q2.tmp", out / "fc" / "img_000.npy.a0b1c2d3.tmp"]
  for p in left:
    p.write_bytes(b"half a file")
  (out / "att" / "notes.tmp").write_text("a user's file")  # not write_with's name: kept
  code, _, stderr = run_cli(["--images", images, "--out", out, *TINY], capsys)
  assert code == 0 and "removed 2 temporary file(s) a stopped extraction left (e.g. " in stderr
  assert not any(p.exists() for p in left) and (out / "att" / "notes.tmp").exists()
  (out / "att" / "notes.tmp").unlink()


def test_another_backbone_setting_is_refused_in_the_same_out(extracted, capsys):
  images, out, _, _ = extracted
  argv = [a if a != "32" else "64" for a in TINY]
  code, _, stderr = run_cli(["--images", images, "--out", out, *argv], capsys)
  assert code == 2 and stderr.strip().startswith("error: ") and "size=32" in stderr


@pytest.mark.parametrize("foreign", ["fc-width", "att-grid", "fc-dtype", "not-npy"])
def test_a_resumed_run_refuses_foreign_feature_files(extracted, tmp_path, capsys, monkeypatch, foreign):
  """A resumed run skips the images whose files exist: a file of another width, grid or dtype
  (written by another extractor into the same --out) would be trained on. Refused in one line
  naming the file, before any weights are made and anything is written."""
  import shutil
  from jaxcap.features import registry

  def no_weights(*args, **kwargs):
    raise AssertionError("weights were made before the existing files were checked")

  monkeypatch.setattr(registry, "random_variables", no_weights)
  images, out, _, _ = extracted
  mine = tmp_path / "out"
  shutil.copytree(out, mine)
  bad = {"fc-width": ("fc/gray.npy", lambda f: np.save(f, np.zeros(7, np.float32))),
         "att-grid": ("att/gray.npz", lambda f: np.savez(f, feat=np.zeros((9, 128), np.float32))),
         "fc-dtype": ("fc/gray.npy", lambda f: np.save(f, np.zeros(128, np.float64))),
         "not-npy": ("fc/gray.npy", lambda f: f.write(b"text"))}[foreign]
  with open(mine / bad[0], "wb") as f:
    bad[1](f)
  before = {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()}
  code, stdout, stderr = run_cli(["--images", images, "--out", mine, *TINY], capsys)
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {mine / bad[0]}: "), stderr
  assert "expected" in lines[0] and "already have" not in stdout
  assert {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before
  # The library's own run checks them too.
  record = json.loads((mine / "features.json").read_text())
  with pytest.raises(ValueError, match=str(mine / bad[0])):
    extract.run(str(images), str(mine), None, None, record, 32, progress=False)
  assert {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before


def test_the_karpathy_json(extracted):
  _, out, _, _ = extracted
  data = json.loads((out / "dataset_mine.json").read_text())
  images = data["images"]
  assert data["dataset"] == "mine" and sorted(e["filename"] for e in images) == sorted(GOOD)
  assert sorted(e["split"] for e in images).count("val") == 2
  assert [e["split"] for e in images].count("test") == 1
  first = images[0]["sentences"][0]
  assert first["tokens"] == ["a", "red", "shape", "number", "0"] and first["raw"] == "A Red shape number 0."
  sentids = [s["sentid"] for e in images for s in e["sentences"]]
  assert sentids == list(range(len(sentids)))
  assert all(s["imgid"] == e["imgid"] for e in images for s in e["sentences"])


def test_the_dataset_reads_the_output(extracted):
  from jaxcap.data import karpathy
  import ml_collections
  _, out, _, _ = extracted
  from jaxcap.data import default_data_config
  config = default_data_config("karpathy")
  config.update(ml_collections.ConfigDict(dict(root=str(out), dataset_json="dataset_mine.json",
                                               att_dir="att", fc_dir="fc", box_dir="", grid=True,
                                               max_regions=4, min_word_count=1)))
  splits = karpathy.read_splits(config)
  assert {s: len(d.image_ids) for s, d in splits.items()} == {"train": 4, "val": 2, "test": 1}
  item = splits["train"].features.read(0)
  assert item["feats"].shape == (4, 128) and item["boxes"].shape == (4, 4)
  assert item["global_feat"].shape == (128,)


def test_exif_orientation_and_grayscale_are_read_as_rgb(extracted):
  images, _, _, _ = extracted
  turned = extract.read_image(str(images / "turned.jpg"), 16)
  with Image.open(images / "turned.jpg") as img:
    upright = img.convert("RGB").transpose(Image.Transpose.ROTATE_270).resize((16, 16), Image.BILINEAR)
  assert turned.shape == (16, 16, 3) and turned.dtype == np.uint8
  assert np.array_equal(turned, np.asarray(upright))
  gray = extract.read_image(str(images / "gray.png"), 16)
  assert gray.shape == (16, 16, 3) and np.array_equal(gray[..., 0], gray[..., 2])


@pytest.mark.parametrize("case,argv,needle", [
    ("missing images dir", ["--images", "{tmp}/nowhere", "--out", "{tmp}/o", *TINY], "--images={tmp}/nowhere"),
    ("no weights", ["--images", "{tmp}", "--out", "{tmp}/o", "--backbone", "resnet50"], "--random_weights"),
    ("unknown backbone", ["--images", "{tmp}", "--out", "{tmp}/o", "--backbone", "resnet7",
                          "--random_weights"], "--backbone=resnet7"),
])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bad_input_is_one_line(tmp_path, case, argv, needle):
  proc = run_script([a.replace("{tmp}", str(tmp_path)) for a in argv], tmp_path)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (case, proc.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith("error: ") and "expected" in lines[0], lines
  assert needle.format(tmp=tmp_path) in lines[0], lines[0]
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("files", [{}, {"x.png": b"nope"}, {"notes.txt": b"hi"}])
def test_a_folder_without_a_readable_image_is_one_line_before_any_weights(tmp_path, capsys, monkeypatch, files):
  """Refused before the backbone's weights are made or read (what took a minute)."""
  from jaxcap.features import registry
  (tmp_path / "images").mkdir()
  for name, data in files.items():
    (tmp_path / "images" / name).write_bytes(data)

  def no_weights(*args, **kwargs):
    raise AssertionError("weights were made before the images were checked")

  monkeypatch.setattr(registry, "random_variables", no_weights)
  code, stdout, stderr = run_cli(["--images", tmp_path / "images", "--out", tmp_path / "o", *TINY], capsys)
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: --images={tmp_path / 'images'}: ")
  assert ("none of the 1 images could be read (first, x.png: " if files.get("x.png") else
          "no image files") in lines[0]
  assert not (tmp_path / "o").exists() and stdout == ""


def test_high_depth_images_are_scaled_not_clipped(tmp_path):
  """A 16-bit PNG (Pillow mode I;16) as 8 bits: / 257 (Pillow's own conversion clips at 255, so
  a 16-bit photo read almost white); 32-bit integer and float images in range likewise; other
  ranges refused in one line naming the file."""
  from PIL import Image
  ramp = np.linspace(0, 65535, 16 * 16).reshape(16, 16).round().astype(np.uint16)
  Image.fromarray(ramp).save(tmp_path / "deep.png")  # uint16: mode I;16
  with Image.open(tmp_path / "deep.png") as im:
    assert im.mode.startswith("I;16") or im.mode == "I"
  got = extract.read_image(str(tmp_path / "deep.png"), 16)
  want = np.round(ramp / 257.0).astype(np.uint8)
  np.testing.assert_array_equal(got[..., 0], want)
  assert np.array_equal(got[..., 0], got[..., 2]) and (got == 255).mean() < 0.01
  Image.fromarray(ramp.astype(np.float32) / 65535.0, "F").save(tmp_path / "unit.tiff")
  np.testing.assert_allclose(extract.read_image(str(tmp_path / "unit.tiff"), 16)[..., 1], want, atol=1)
  Image.fromarray(np.full((16, 16), -3.0, np.float32), "F").save(tmp_path / "neg.tiff")
  with pytest.raises(ValueError, match=rf"^{tmp_path / 'neg.tiff'}: a F image with values in \[-3, -3\]; "
                     "expected 8- or 16-bit pixels"):
    extract.read_image(str(tmp_path / "neg.tiff"), 16)


@pytest.mark.slow
def test_train_py_trains_on_the_output(extracted, tmp_path):
  _, out, _, _ = extracted
  proc = train_on(out, tmp_path / "run")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  assert "step 2: val CIDEr-D" in proc.stdout + proc.stderr
  # The run keeps the record of the backbone its features came from.
  assert (json.loads((tmp_path / "run" / "features.json").read_text())
          == json.loads((out / "features.json").read_text()))


def test_the_three_captions_formats_and_their_errors(tmp_path):
  (tmp_path / "a.json").write_text(json.dumps({"x.jpg": ["One.", "Two"], "y.png": "Three"}))
  (tmp_path / "b.json").write_text(json.dumps([{"image": "x.jpg", "caption": "One."},
                                               {"image": "x.jpg", "caption": "Two"},
                                               {"image": "y.png", "caption": "Three"}]))
  (tmp_path / "c.txt").write_text("x.jpg#0\tOne.\nx.jpg#1\tTwo\n\ny.png#0\tThree\n")
  want = {"x.jpg": ["One.", "Two"], "y.png": ["Three"]}
  for name in ("a.json", "b.json", "c.txt"):
    assert karpathy.read_captions(str(tmp_path / name)) == want, name
  (tmp_path / "bad.txt").write_text("x.jpg no tab here\n")
  with pytest.raises(ValueError, match="line 1 has no tab; expected"):
    karpathy.read_captions(str(tmp_path / "bad.txt"))
  (tmp_path / "bad.json").write_text('[{"image": "x.jpg"}]')
  with pytest.raises(ValueError, match=r"item \[0\].*expected"):
    karpathy.read_captions(str(tmp_path / "bad.json"))


def test_the_split_is_seeded_and_all_train_by_default():
  caps = {f"{i}.png": [f"caption {i}"] for i in range(10)}
  names = list(caps)
  assert {e["split"] for e in karpathy.karpathy_json(caps, names, 0, 0, 0, "d")["images"]} == {"train"}
  one = karpathy.karpathy_json(caps, names, 3, 2, 7, "d")
  assert one == karpathy.karpathy_json(caps, names[::-1], 3, 2, 7, "d")  # order of the input: none
  splits = [e["split"] for e in one["images"]]
  assert (splits.count("val"), splits.count("test"), splits.count("train")) == (3, 2, 5)
  with pytest.raises(ValueError, match="--val=8 --test=3"):
    karpathy.karpathy_json(caps, names, 8, 3, 0, "d")


def test_a_captions_list_with_splits_keeps_them(tmp_path):
  items = [{"image": "x.jpg", "caption": "One.", "split": "test"},
           {"image": "y.png", "caption": "Two", "split": "val"},
           {"image": "x.jpg", "caption": "Three", "split": "test"},
           {"image": "z.png", "caption": "Four", "split": "train"}]
  (tmp_path / "s.json").write_text(json.dumps(items))
  captions, splits = karpathy.read_captions_and_splits(str(tmp_path / "s.json"))
  assert captions == {"x.jpg": ["One.", "Three"], "y.png": ["Two"], "z.png": ["Four"]}
  assert splits == {"x.jpg": "test", "y.png": "val", "z.png": "train"}
  data = karpathy.karpathy_json(captions, ["z.png", "x.jpg"], 0, 0, 0, "d", splits)
  assert [(e["filename"], e["split"]) for e in data["images"]] == [("x.jpg", "test"), ("z.png", "train")]
  assert karpathy.read_captions_and_splits(str(tmp_path / "s.json"))[0] == karpathy.read_captions(
      str(tmp_path / "s.json"))
  for bad, needle in (
      ([items[0], {"image": "y.png", "caption": "Two"}], r"item \[1\] has no 'split', item \[0\] one"),
      ([{"image": "y.png", "caption": "Two"}, items[0]], r"item \[1\] has a 'split', item \[0\] none"),
      ([dict(items[0], split="dev")], r"item \[0\] has split 'dev'; expected one of train, val, test"),
      ([items[0], dict(items[2], split="train")], r"item \[1\] puts 'x.jpg' in 'train', an earlier item in 'test'"),
  ):
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=needle):
      karpathy.read_captions_and_splits(str(tmp_path / "bad.json"))


def test_splits_in_the_captions_with_val_or_test_is_one_line(tmp_path, capsys):
  make_images(tmp_path / "images")
  (tmp_path / "s.json").write_text(json.dumps([{"image": "a0.png", "caption": "x", "split": "val"}]))
  code, _, stderr = run_cli(["--images", tmp_path / "images", "--out", tmp_path / "o", *TINY,
                             "--captions", tmp_path / "s.json", "--val", "1"], capsys)
  assert code == 2 and stderr.strip().startswith("error: --val=1 --test=0: ")
  assert "gives every image's split" in stderr and not (tmp_path / "o").exists()


def test_a_tiny_image_is_upscaled_with_a_warning_and_a_directory_is_not_a_file(tmp_path, capsys):
  from jaxcap.features import record as record_lib
  Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(tmp_path / "tiny.png")
  Image.fromarray(np.full((20, 24, 3), 200, np.uint8)).save(tmp_path / "small.png")
  assert extract.read_image(str(tmp_path / "tiny.png"), 32).shape == (32, 32, 3)
  err = capsys.readouterr().err
  assert err == (f"warning: {tmp_path / 'tiny.png'}: 8x8 pixels, upscaled to 32x32 (an image side under "
                 "16 pixels holds little to caption)\n")
  extract.read_image(str(tmp_path / "small.png"), 32)
  extract.image_array(np.zeros((8, 9, 3), np.uint8), 32, what="images[3]")
  assert capsys.readouterr().err.startswith("warning: images[3]: 9x8 pixels, upscaled")
  # Run.caption_images' reader: a folder given where an image file is expected is named as such.
  backbone = record_lib.Backbone.__new__(record_lib.Backbone)
  backbone.size = 32
  with pytest.raises(ValueError, match=rf"^{tmp_path}: a directory; expected an image file \(a folder's "
                     r"images: evaluate.py --images DIR"):
    backbone.pixels([str(tmp_path / "tiny.png"), str(tmp_path)])


def _karpathy_entry(k, filename, split, filepath=None, cocoid=None):
  """One image of Karpathy's dataset JSON (``dataset_coco.json``'s fields; Flickr8k's have no
  ``filepath`` nor ``cocoid``)."""
  sents = [{"tokens": ["a", "red", "shape", f"n{k}"], "raw": f"A red shape n{k}.", "imgid": k,
            "sentid": 2 * k},
           {"tokens": ["noise", f"n{k}"], "raw": f"Noise n{k}", "imgid": k, "sentid": 2 * k + 1}]
  entry = {"filename": filename, "imgid": k, "split": split, "sentences": sents,
           "sentids": [2 * k, 2 * k + 1]}
  if filepath is not None:
    entry.update(filepath=filepath, cocoid=cocoid)
  return entry


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_karpathy_coco_and_flickr8k_jsons_as_captions(tmp_path, capsys):
  """--captions dataset_coco.json: the images under <images>/train2014 and val2014, the features
  named by cocoid (as prepro_feats.py names them), the splits (restval too) and sentences kept,
  and jaxcap.data.karpathy reads the result; dataset_flickr8k.json: the images in the folder
  itself, named by their file-name stems."""
  rng = np.random.default_rng(3)
  pixels = [rng.integers(0, 256, (20 + 2 * k, 24, 3), dtype=np.uint8) for k in range(5)]
  coco = tmp_path / "coco"
  layout = [("train2014", "train"), ("train2014", "train"), ("val2014", "restval"), ("val2014", "val"),
            ("val2014", "test")]
  entries = []
  for k, (folder, split) in enumerate(layout):
    name = f"COCO_{folder}_{k:012d}.png"
    (coco / folder).mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels[k]).save(coco / folder / name)
    entries.append(_karpathy_entry(k, name, split, folder, 1000 + k))
  (coco / "val2014" / "COCO_val2014_broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
  entries.append(_karpathy_entry(5, "COCO_val2014_broken.jpg", "train", "val2014", 1005))
  entries.append(_karpathy_entry(6, "COCO_val2014_gone.jpg", "test", "val2014", 1006))
  (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": entries, "dataset": "coco"}))
  out = tmp_path / "out_coco"
  code, stdout, stderr = run_cli(["--images", coco, "--out", out, *TINY, "--captions",
                                  tmp_path / "dataset_coco.json"], capsys)
  assert code == 0, stderr
  assert "Traceback" not in stderr
  ids = [str(1000 + k) for k in range(5)]
  assert sorted(p.stem for p in (out / "fc").iterdir()) == ids
  assert sorted(p.stem for p in (out / "att").iterdir()) == ids
  assert "COCO_val2014_broken.jpg" in stderr and "1 image(s) of --captions" in stderr
  assert "COCO_val2014_gone.jpg" in stderr
  written = json.loads((out / "dataset_coco.json").read_text())
  assert written["dataset"] == "coco" and written["images"] == entries[:5]  # as they were
  assert f"wrote {out / 'dataset_coco.json'}: 5 images" in stdout
  from tests.data import fakes
  config = fakes.karpathy_config(out, att_dir="att", fc_dir="fc", box_dir="", grid=True)
  dataset = karpathy.load(config)
  assert dataset.image_ids("train") == [1000, 1001, 1002]  # restval joins train
  assert dataset.image_ids("val") == [1003] and dataset.image_ids("test") == [1004]
  assert dataset.references("test")[1004] == ["a red shape n4", "noise n4"]
  assert dataset.split("val")[0]["feats"].shape == (4, 128)

  # Flickr8k: no filepath, no cocoid; two of the same images, which get the same features.
  flickr = tmp_path / "Flicker8k_Dataset"
  flickr.mkdir()
  Image.fromarray(pixels[3]).save(flickr / "1000268201_693b08cb0e.png")
  Image.fromarray(pixels[1]).save(flickr / "997722733_0cb5439472.png")
  entries = [_karpathy_entry(0, "1000268201_693b08cb0e.png", "test"),
             _karpathy_entry(1, "997722733_0cb5439472.png", "train")]
  (tmp_path / "dataset_flickr8k.json").write_text(json.dumps({"images": entries, "dataset": "flickr8k"}))
  code, _, stderr = run_cli(["--images", flickr, "--out", tmp_path / "out_flickr", *TINY,
                             "--captions", tmp_path / "dataset_flickr8k.json"], capsys)
  assert code == 0, stderr
  written = json.loads((tmp_path / "out_flickr" / "dataset_flickr8k.json").read_text())
  assert written == {"images": entries, "dataset": "flickr8k"}
  for stem, cocoid in (("1000268201_693b08cb0e", 1003), ("997722733_0cb5439472", 1001)):
    np.testing.assert_allclose(np.load(tmp_path / "out_flickr" / "fc" / f"{stem}.npy"),
                               np.load(out / "fc" / f"{cocoid}.npy"), rtol=1e-5, atol=1e-6)
  # --val / --test cannot re-split Karpathy's splits.
  code, _, stderr = run_cli(["--images", flickr, "--out", tmp_path / "out_flickr", *TINY, "--val", "1",
                             "--captions", tmp_path / "dataset_flickr8k.json"], capsys)
  assert code == 2 and "gives every image's split" in stderr
