"""A full disk and a read-only place: one line naming the file or flag, exit 2, and nothing good
lost (training's checkpoints, extraction's features, evaluation's earlier scores).

The disks are real: a small tmpfs mounted for the test (filled with a file until only a few
KiB are left) and one remounted read-only, so the errors are the kernel's (``ENOSPC``,
``EROFS``), not simulated. Mounting needs root; elsewhere the tests skip with one line.
Mutants tried (each made a test here fail, then was restored): ``atomic.write_with`` without
naming the file of a failed write (the extraction line names no file); ``Checkpoints`` without
its settling event loops (``RuntimeError: Event loop is closed`` tracebacks on stderr);
evaluate without its up-front ``check_writable`` (the read-only run decodes the whole split
first).
"""

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.programs import Programs, one_device_env

TINY = ["--config=configs/transformer.py:synthetic,tiny", "--config.checkpoint_every_steps=2"]
EXTRACT = ["scripts/extract_features.py", "--backbone", "resnet50", "--fields",
           '{"width": 4, "depths": [1, 1, 1, 1]}', "--size", "32", "--att_size", "2",
           "--batch_size", "4", "--random_weights", "--no_progress"]


@pytest.fixture(scope="module")
def programs():
  with Programs(one_device_env()) as p:  # the sizes below are for one device
    yield p


@contextlib.contextmanager
def tmpfs(path: Path, size_kib: int):
  path.mkdir(parents=True, exist_ok=True)
  if not shutil.which("mount"):
    pytest.skip("no mount command: cannot make a small disk for the test")
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
                     capture_output=True, text=True)
  if r.returncode:
    pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()[:100]}")
  try:
    yield path
  finally:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk: Path, leave_kib: int) -> Path:
  """Fills ``disk`` with one file until ``leave_kib`` KiB are free."""
  st = os.statvfs(disk)
  filler = disk / "filler"
  with open(filler, "wb") as f:
    f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave_kib * 1024))
  return filler


def one_line(code, err, *needles):
  """Exit 2 and one ``error:`` line, the last on stderr (progress bars and the tokenizer's
  notes may come before it), naming each of ``needles``."""
  assert code == 2, (code, err[-3000:])
  lines = [l for l in err.replace("\r", "\n").splitlines() if l.strip()]
  errors = [l for l in lines if l.startswith("error: ")]
  assert "Traceback" not in err and len(errors) == 1 and lines[-1] == errors[0], err[-3000:]
  for n in needles:
    assert n in errors[0], (n, errors[0])


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_keeps_the_last_one_and_it_resumes(programs, tmp_path):
  with tmpfs(tmp_path / "disk", 8 * 1024) as disk:
    wd = disk / "run"
    code, _, err = programs.run(["train.py", *TINY, f"--workdir={wd}", "--config.num_train_steps=4",
                                 "--config.test_after_training=False"], cwd=tmp_path)
    assert code == 0, err[-3000:]
    filler = fill(disk, 200)  # the logs fit, a checkpoint (0.3 MiB) does not
    code, out, err = programs.run(["train.py", *TINY, f"--workdir={wd}", "--config.num_train_steps=8",
                                   "--config.test_after_training=False"], cwd=tmp_path)
    one_line(code, err, f"{wd}/", "No space left on device to save step 6",
             f"the latest intact checkpoint is {wd}/checkpoints/4")
    assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4"]  # no temporary folder left
    filler.unlink()
    code, out, err = programs.run(["train.py", *TINY, f"--workdir={wd}", "--config.num_train_steps=8",
                                   "--config.test_after_training=False"], cwd=tmp_path)
    assert code == 0 and f"Resumed from {wd}/checkpoints at step 4." in out, err[-3000:]
    assert sorted(os.listdir(wd / "checkpoints")) == ["4", "6", "8"]


def _images(folder: Path, n: int) -> None:
  folder.mkdir()
  rng = np.random.default_rng(0)
  for i in range(n):
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"i{i:02d}.png")


@pytest.mark.slow
def test_a_full_disk_during_extraction_names_the_file_and_keeps_the_features(programs, tmp_path):
  _images(tmp_path / "images", 40)
  with tmpfs(tmp_path / "disk", 1024) as disk:
    out = disk / "feats"
    filler = fill(disk, 40)
    code, _, err = programs.run([*EXTRACT, "--images", tmp_path / "images", "--out", out], cwd=tmp_path)
    one_line(code, err, f"{out}/", "No space left on device; expected a writable folder")
    written = sorted(os.listdir(out / "fc"))
    assert 0 < len(written) < 40 and not any(n.endswith(".tmp") for d in ("fc", "att")
                                             for n in os.listdir(out / d))
    first = np.load(out / "fc" / written[0])
    filler.unlink()
    code, stdout, err = programs.run([*EXTRACT, "--images", tmp_path / "images", "--out", out], cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert len(os.listdir(out / "fc")) == 40 and f"done before" in stdout
    np.testing.assert_array_equal(np.load(out / "fc" / written[0]), first)


@pytest.mark.slow
def test_a_full_disk_during_evaluation_keeps_the_earlier_scores(programs, tmp_path):
  with tmpfs(tmp_path / "disk", 8 * 1024) as disk:
    wd = disk / "run"
    code, _, err = programs.run(["train.py", *TINY, f"--workdir={wd}", "--config.num_train_steps=2"],
                                cwd=tmp_path)
    assert code == 0, err[-3000:]
    before = {n: (wd / n).read_bytes() for n in ("predictions_test.json", "scores_test.json")}
    fill(disk, 0)
    # --tag= (empty): the same file names as training's, which the full disk must leave intact.
    code, _, err = programs.run(["evaluate.py", f"--workdir={wd}", "--beam_size=2", "--tag="], cwd=tmp_path)
    one_line(code, err, f"{wd}/predictions_test.json: No space left on device")
    assert {n: (wd / n).read_bytes() for n in before} == before
    assert not [n for n in os.listdir(wd) if n.endswith(".tmp")]


@pytest.mark.slow
def test_read_only_outputs_are_refused_before_any_work(programs, tmp_path):
  """evaluate.py (a run on a read-only disk, and --out there), jaxcap-extract --out there: one
  line naming the flag, before a checkpoint is restored or a backbone built."""
  _images(tmp_path / "images", 2)
  refs = {"annotations": [{"image_id": 1, "caption": "a dog"}], "images": [{"id": 1}]}
  (tmp_path / "refs.json").write_text(json.dumps(refs))
  (tmp_path / "preds.json").write_text(json.dumps([{"image_id": 1, "caption": "a dog"}]))
  with tmpfs(tmp_path / "disk", 8 * 1024) as disk:
    wd = disk / "run"
    code, _, err = programs.run(["train.py", *TINY, f"--workdir={wd}", "--config.num_train_steps=2",
                                 "--config.test_after_training=False"], cwd=tmp_path)
    assert code == 0, err[-3000:]
    r = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cases = [
        (["evaluate.py", f"--workdir={wd}"], f"--workdir={wd}: {wd} is not writable (a read-only place)"),
        (["evaluate.py", "--predictions", tmp_path / "preds.json", "--references", tmp_path / "refs.json",
          "--out", disk / "s.json"], f"--out={disk}/s.json: {disk} is not writable"),
        ([*EXTRACT, "--images", tmp_path / "images", "--out", disk / "feats"],
         f"--out={disk}/feats: {disk} is not writable"),
    ]
    for argv, needle in cases:
      code, out, err = programs.run(argv, cwd=tmp_path)
      one_line(code, err, needle)
      assert "Evaluating step" not in out and "RANDOM weights" not in out  # refused up front
