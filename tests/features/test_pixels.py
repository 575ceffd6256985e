"""From pixels to captions (``experiments/pixels/run.py``) at a tiny size: rendered scenes as PNG
files (plus a corrupt file and a grayscale PNG), ``jaxcap-extract`` with a tiny random ResNet,
train.py unchanged on its output, and ``Run.caption_images`` on the PNG paths.

The slow test runs the script for real (24 / 8 / 8 images of 32 px, 3 training steps); the fast
one fakes finished runs to check the table it writes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jaxcap import atomic
from jaxcap.data import render
from jaxcap.data.synthetic import SyntheticScenes
from tests.features.test_extract import TINY, run_cli
from tests.programs import one_device_env

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "pixels" / "run.py"
TINY_RUN = ["--num_train", "24", "--num_val", "8", "--num_test", "8", "--size", "32", "--att_size", "2",
            "--fields", '{"width": 4, "depths": [1, 1, 1, 1]}', "--steps", "3", "--eval_every", "3",
            "--batch_size", "8", "--seeds", "0", "--override", "model.dim=32", "--override",
            "model.ff_dim=64", "--override", "model.num_layers=1", "--override", "model.num_dec_layers=1"]


def run_script(argv, timeout=600):
  # One CPU device: the batches of 8 need not split over the suite's 8 fake ones.
  env = dict(one_device_env(), JAX_PLATFORMS="cpu")  # and the suite's fast-compile flags
  return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], capture_output=True, text=True,
                        env=env, timeout=timeout, cwd=REPO)


# Heavy (95 s in an earlier .ci/run): the same path (render, jaxcap-extract on the images, train,
# evaluate.py --images) also runs as USAGE's documented commands (tests/test_readme_run_docs.py).
@pytest.mark.slow
@pytest.mark.heavy
def test_rendered_scenes_extract_train_and_caption_images(tmp_path, capsys):
  work = tmp_path / "pixels"
  scenes_dir = work / "scenes"
  # The scenes as the script's own first run left them (it marks its folder first, then renders):
  # without the mark the folder is another program's, refused since the output-folder rule.
  atomic.mark_folder(str(work), "experiments/pixels/run.py")
  render.write_dataset(str(scenes_dir), SyntheticScenes(num_train=24, num_val=8, num_test=8), 32)
  images = scenes_dir / "images"
  # A grayscale PNG among the test images and a corrupt file beside them.
  with Image.open(images / "test_00001.png") as im:
    im.convert("L").save(images / "test_00001.png")
  (images / "stray.png").write_bytes(b"\x89PNG\r\n not really")

  proc = run_script(["--workdir", work, *TINY_RUN, "--no-context"])
  log = proc.stdout + proc.stderr
  assert proc.returncode == 0, log[-4000:]
  assert "Traceback" not in log
  warnings = [l for l in log.splitlines() if l.startswith("warning:")]
  assert len(warnings) == 1 and str(images / "stray.png") in warnings[0], warnings  # one line, the rest go on

  # The layout: 40 images of the folder's 41 files, the rendered splits kept.
  features = work / "features"
  assert len(list((features / "fc").iterdir())) == len(list((features / "att").iterdir())) == 40
  assert np.load(features / "att" / "test_00001.npz")["feat"].shape == (4, 128)
  data = json.loads((features / "dataset_scenes.json").read_text())
  assert {e["filename"]: e["split"] for e in data["images"]} == {
      f"{s}_{i:05d}.png": s for s, n in (("train", 24), ("val", 8), ("test", 8)) for i in range(n)}

  # train.py trained on it (unchanged: the script runs train.py itself), caption_images captioned
  # every test PNG, one caption per file, the same as train.py's own test on the extracted files.
  run = work / "pixels" / "seed0"
  assert json.loads((run / "features.json").read_text()) == json.loads((features / "features.json").read_text())
  captions = json.loads((run / "captions_images.json").read_text())
  assert [c["image"] for c in captions] == [f"test_{i:05d}.png" for i in range(8)]
  assert all(isinstance(c["caption"], str) for c in captions)
  results = json.loads((work / "results.json").read_text())
  seed0 = results["rows"]["pixels"]["seeds"]["0"]
  assert seed0["images"] == 8 and seed0["same_as_train_py"] == 8 and 0 <= seed0["CIDEr"]
  assert "CIDEr" in results["nearest_neighbour"]["nn_pixels"]
  commands = [c["command"] for c in results["commands"]]
  assert any(c.startswith("python scripts/extract_features.py --images") for c in commands)
  assert any(c.startswith("python train.py --config configs/transformer.py:coco,size=small") for c in commands)
  assert any(c.startswith("python train.py --config configs/nearest_neighbour.py:coco") for c in commands)
  assert "| Transformer, ResNet-50 (random) grid of the PNGs, caption_images | 1 |" in (work / "table.md").read_text()

  # A second extraction resumes: nothing extracted again, the corrupt file reported again.
  before = {p.name: p.stat().st_mtime_ns for p in (features / "fc").iterdir()}
  code, stdout, stderr = run_cli(["--images", images, "--out", features, *TINY], capsys)
  assert code == 0 and "extracted 0 images: 40 of the 41 images" in stdout
  assert [l for l in stderr.splitlines() if l.startswith("warning:")] == warnings
  assert {p.name: p.stat().st_mtime_ns for p in (features / "fc").iterdir()} == before

  # caption_images on the PNG paths directly: one caption per file, the grayscale one included.
  import jaxcap
  paths = [images / f"test_{i:05d}.png" for i in range(3)]
  got = jaxcap.load(str(run)).caption_images(paths, method="greedy")
  assert len(got) == 3 and got == [c["caption"] for c in captions[:3]]

  # Run again: everything is read back, nothing is trained.
  again = run_script(["--workdir", work, *TINY_RUN, "--no-context"])
  assert again.returncode == 0, again.stderr[-3000:]
  assert "$ python train.py" not in again.stdout and "$ python scripts" not in again.stdout


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_table_of_finished_runs(tmp_path):
  """Faked finished runs: --report reads them back and writes mean ± std (ddof = 1) x100."""
  def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
  for seed, cider in ((0, 1.0), (1, 1.2), (2, 1.7)):
    write(tmp_path / "pixels" / f"seed{seed}" / "scores_test.json", {"overall": {"CIDEr": cider}})
    write(tmp_path / "pixels" / f"seed{seed}" / "result.json", {"CIDEr": cider, "Bleu_4": 0.2})
  write(tmp_path / "nearest_neighbour" / "scores_test.json", {"overall": {"CIDEr": 0.75, "Bleu_4": 0.15}})
  # What the captions name: seed 0's caption of test image 0 names its pair, that of image 1 nothing.
  sc = SyntheticScenes(num_train=1500, num_val=200, num_test=200).scene("test", 0)
  a, rel, b = sc["primary"]
  A, B = sc["regions"][a], sc["regions"][b]
  rel_word = {"left": "left", "right": "right", "above": "above", "below": "below", "in": "inside"}[rel]
  named = f"a {A['colour']} {A['shape']} {rel_word} a {B['colour']} {B['shape']}"
  write(tmp_path / "pixels" / "seed0" / "captions_images.json",
        [{"image": "test_00000.png", "caption": named}, {"image": "test_00001.png", "caption": "nothing"}])
  write(tmp_path / "nearest_neighbour" / "predictions_test.json",
        [{"image_id": "test_00001", "caption": "nothing at all"}])
  proc = run_script(["--workdir", tmp_path, "--report", "--no-context"], timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  table = (tmp_path / "table.md").read_text()
  assert ("| Transformer, ResNet-50 (random) grid of the PNGs, caption_images | 3 | 130.0 ± 36.1 | 20.0 ± 0.0 "
          "| 50 | 50 | 50 | 50 | 50 |") in table
  assert "| nearest neighbour, ResNet-50 (random) fc of the PNGs | - | 75.0 | 15.0 | 0 | 0 | 0 | 0 | 0 |" in table
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["rows"]["pixels"]["mean"]["CIDEr"] == pytest.approx(1.3)
  assert results["rows"]["pixels"]["std"]["CIDEr"] == pytest.approx(0.13 ** 0.5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bad_flags_are_one_line(tmp_path):
  for argv, needle in ((["--override", "model.dim"], "--override=model.dim: expected KEY=VALUE"),
                       (["--fields", "{width"], "--fields={width: invalid JSON"),
                       (["--seeds", "a"], "--seeds: expected comma-separated integers")):
    proc = run_script(["--workdir", tmp_path / "w", *argv], timeout=120)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], (argv, proc.stderr[-2000:])
    assert not (tmp_path / "w").exists()
