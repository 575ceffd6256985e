"""Captioning image files with a run trained on ``jaxcap-extract``'s features:
``Run.caption_images`` and ``evaluate.py --images``.

One tiny extraction (test_extract's folder: random PNGs / JPEGs, a grayscale PNG, an EXIF-turned
JPEG and a corrupt ``.jpg``; a tiny ResNet with random weights at 32 px) and one 2-step training
on it, shared by the module.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import jaxcap
from jaxcap import run_dir
from tests.features.test_extract import GOOD, REPO, extract_folder, train_on
from tests.programs import one_device_env

# The tests of the shared fixture are slow: it extracts and trains (about a minute on busy CPUs).
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """``(images, out, workdir)``: the extracted folder and a run trained on it."""
  root = tmp_path_factory.mktemp("caption_images")
  images, out, _, _ = extract_folder(root)
  proc = train_on(out, root / "run")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return images, out, root / "run"


@pytest.fixture(scope="module")
def run(trained):
  return jaxcap.load(str(trained[2]))


def _evaluate(argv, cwd):
  env = dict(one_device_env(), JAX_PLATFORMS="cpu")  # and the suite's fast-compile flags
  return subprocess.run([sys.executable, str(REPO / "evaluate.py"), *map(str, argv)],
                        capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


@slow
def test_the_run_keeps_the_features_record(trained):
  _, out, workdir = trained
  assert (json.loads((workdir / run_dir.FEATURES_FILE).read_text())
          == json.loads((out / "features.json").read_text()))


@slow
def test_one_caption_per_file(trained, run):
  images, _, _ = trained
  paths = [images / n for n in GOOD[:3]]
  captions = run.caption_images(paths, method="greedy", max_len=5)
  assert len(captions) == 3 and all(isinstance(c, str) for c in captions)
  # A path as str and the same file's pixels give the same caption.
  from jaxcap.features import extract
  pixels = extract.read_image(str(paths[1]), 32)
  assert run.caption_images([str(paths[1]), pixels], method="greedy", max_len=5) == [captions[1]] * 2


@slow
def test_the_features_are_the_extracted_files_as_training_read_them(trained, run):
  """What caption_images decodes equals what training saw: the dataset's reader on the files
  jaxcap-extract wrote, collated as a training batch."""
  images, out, _ = trained
  names = ["gray.png", "turned.jpg", "a1.jpg"]
  batch = run.image_batch([images / n for n in names], batch_size=4)  # the extraction's batch
  for k, name in enumerate(names):
    stem = os.path.splitext(name)[0]
    att = np.load(out / "att" / f"{stem}.npz")["feat"]
    fc = np.load(out / "fc" / f"{stem}.npy")
    np.testing.assert_allclose(batch["feats"][k, :4], att, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch["global_feat"][k], fc, rtol=1e-5, atol=1e-6)
  dataset = run.dataset
  for split in ("train", "val", "test"):
    source = dataset.split(split)
    for i, image_id in enumerate(source.data.image_ids):
      if image_id in [os.path.splitext(n)[0] for n in names]:
        k = [os.path.splitext(n)[0] for n in names].index(image_id)
        want = source.collate([source[i]], np.random.default_rng(0))
        for key in ("feats", "feats_mask", "boxes", "global_feat"):
          np.testing.assert_allclose(batch[key][k], want[key][0], rtol=1e-5, atol=1e-6,
                                     err_msg=f"{image_id} {key}")


@slow
def test_weights_other_than_the_recorded_ones_are_refused(trained, tmp_path):
  from safetensors.numpy import save_file
  from jaxcap.features import extract, record
  from tests.features.conftest import random_state_dict
  images, _, workdir = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  rec = json.loads((copy / "features.json").read_text())
  module = record.build(rec)
  save_file(random_state_dict(module, seed=1), str(tmp_path / "right.safetensors"))
  save_file(random_state_dict(module, seed=2), str(tmp_path / "wrong.safetensors"))
  rec["weights"] = {"file": "right.safetensors", "sha256": extract.sha256(str(tmp_path / "right.safetensors"))}
  (copy / "features.json").write_text(json.dumps(rec))
  real = jaxcap.load(str(copy))
  with pytest.raises(ValueError) as e:
    real.caption_images([images / "a0.png"], str(tmp_path / "wrong.safetensors"))
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(str(tmp_path / "wrong.safetensors"))
  assert "differs from the backbone weights this run was trained on (right.safetensors" in msg
  with pytest.raises(ValueError, match="weights: missing; .*right.safetensors"):
    real.caption_images([images / "a0.png"])
  # The recorded file loads and captions.
  caps = real.caption_images([images / "a0.png"], str(tmp_path / "right.safetensors"),
                             method="greedy", max_len=4)
  assert len(caps) == 1 and isinstance(caps[0], str)


@slow
def test_a_run_without_features_json_is_refused(trained, tmp_path, run):
  images, _, workdir = trained
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  (copy / "features.json").unlink()
  with pytest.raises(ValueError) as e:
    jaxcap.load(str(copy)).caption_images([images / "a0.png"])
  from jaxcap.images import IMAGE_RUNS
  assert str(e.value) == (f"{copy}: no features.json; this run was trained on features "
                          "jaxcap-extract did not write, so it cannot caption image files "
                          f"(caption feature arrays with Run.caption); {IMAGE_RUNS}")
  assert "configs/pixels.py:synthetic" in str(e.value)  # the runs that can are named
  with pytest.raises(ValueError, match=r"^images\[0\]: expected a uint8 RGB array"):
    run.caption_images([np.zeros((4, 4), np.uint8)])
  with pytest.raises(ValueError, match=r"none of the 1 image files could be read \(first, .*broken.jpg\)"):
    run.caption_images([images / "broken.jpg"])  # skipped, and nothing else to caption
  with pytest.raises(ValueError, match="RANDOM backbone weights"):
    run.caption_images([images / "a0.png"], str(images / "a0.png"))


@slow
def test_evaluate_images_writes_the_captions_and_reports_the_corrupt_file(trained, tmp_path):
  images, _, workdir = trained
  out = tmp_path / "captions.json"
  proc = _evaluate(["--workdir", workdir, "--images", images, "--out", out, "--beam-size", "2",
                    "--max-len", "5"], tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  data = json.loads(out.read_text())
  assert [d["image"] for d in data] == sorted(GOOD)
  assert all(isinstance(d["caption"], str) and set(d) == {"image", "caption"} for d in data)
  warnings = [l for l in proc.stderr.splitlines() if l.startswith("warning:")]
  assert len(warnings) == 1 and "broken.jpg" in warnings[0]
  assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


@slow
@pytest.mark.parametrize("case,argv,needle", [
    ("missing dir", ["--images", "{tmp}/nowhere", "--out", "{tmp}/c.json"], "--images={tmp}/nowhere"),
    ("with --ensemble", ["--images", "{images}", "--out", "{tmp}/c.json", "--ensemble", "{run}"],
     "--images with --ensemble"),
    ("with --predictions", ["--images", "{images}", "--out", "{tmp}/c.json", "--predictions",
                            "{tmp}/p.json"], "--images with --predictions"),
    ("no features.json", ["--images", "{images}", "--out", "{tmp}/c.json", "--workdir", "{bare}"],
     "no features.json"),
    ("weights for a random run", ["--images", "{images}", "--out", "{tmp}/c.json", "--weights",
                                  "{images}/a0.png"], "RANDOM backbone weights"),
])
def test_evaluate_images_bad_input_is_one_line(trained, tmp_path, case, argv, needle):
  images, _, workdir = trained
  bare = tmp_path / "bare"
  shutil.copytree(workdir, bare, ignore=shutil.ignore_patterns("checkpoints", "best", "tensorboard"))
  (bare / "features.json").unlink()
  fill = dict(tmp=tmp_path, images=images, run=workdir, bare=bare)
  argv = [a.format(**fill) for a in argv]
  if "--workdir" not in argv:
    argv = ["--workdir", str(workdir), *argv]
  proc = _evaluate(argv, tmp_path)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (case, proc.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith(("error: ", "FATAL")), (case, lines)
  assert needle.format(**fill) in lines[0], lines[0]
  assert not (tmp_path / "c.json").exists()


def test_init_workdir_copies_the_features_record_and_refuses_other_features(tmp_path):
  import ml_collections
  from jaxcap.data.vocab import Vocab
  feats = tmp_path / "feats"
  (feats / "att").mkdir(parents=True)
  record = {"backbone": "resnet50", "size": 32, "att_size": 2, "dtype": "float32",
            "weights": {"random": True, "seed": 0}}
  (feats / "features.json").write_text(json.dumps(record))
  config = ml_collections.ConfigDict({"model": {"name": "transformer"}, "data": {
      "name": "karpathy", "root": str(tmp_path), "att_dir": str(feats / "att"), "fc_dir": ""}})
  assert run_dir.features_record_source(config.data) == str(feats / "features.json")
  vocab = Vocab(["a", "b"])
  run_dir.init_workdir(str(tmp_path / "run"), config, vocab)
  assert run_dir.read_features_record(str(tmp_path / "run")) == record
  (feats / "features.json").write_text(json.dumps(dict(record, size=64)))
  with pytest.raises(ValueError, match=r"features have size=64, this workdir's run was trained on size=32"):
    run_dir.init_workdir(str(tmp_path / "run"), config, vocab)
  config.data.att_dir = ""
  assert run_dir.features_record_source(config.data) is None  # none in data.root
  assert run_dir.read_features_record(str(tmp_path)) is None


# ---------------------------------------------------------------- fast: a run built in memory
# An untrained tiny transformer over test_extract's tiny ResNet (D = 128, a 2 x 2 grid): no
# extraction, no training step; what is tested is which images are captioned and how often the
# backbone and the decoder compile, not what the captions say.


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """``(run, images folder)``: a run with the tiny ResNet's features.json, and test_extract's
  folder of images (``broken.jpg`` among them)."""
  from jaxcap.training import train_lib
  from tests.data.fakes import karpathy_config, write_karpathy
  from tests.features.test_extract import make_images
  root = tmp_path_factory.mktemp("tiny_run")
  write_karpathy(root, counts=(4, 1, 1), dim=128, fc_dim=128, regions=(4, 4))
  config = jaxcap.get_config("transformer.py:synthetic", test_after_training=False)
  config.model.update(dim=32, ff_dim=64, num_layers=1, num_dec_layers=1)
  config.decode.max_len = 4
  config.data = karpathy_config(root, box_dir="", grid=True)
  trainer = train_lib.Trainer(config, str(root / "run"))
  (root / "run").mkdir()
  (root / "run" / run_dir.FEATURES_FILE).write_text(json.dumps({  # as jaxcap-extract writes it
      "backbone": "resnet50", "fields": {"width": 4, "depths": [1, 1, 1, 1]}, "size": 32,
      "att_size": 2, "dtype": "float32", "feature_dim": 128, "weights": {"random": True, "seed": 0}}))
  run = jaxcap.Run(config, trainer.dataset.vocab, trainer.info, trainer.model,
                   trainer.initial_state().params, workdir=str(root / "run"))
  make_images(root / "images")
  return run, root / "images"


@pytest.mark.slow
def test_an_unreadable_file_is_skipped_with_a_warning_and_has_no_caption(tiny_run, tmp_path, capfd):
  run, images = tiny_run
  (tmp_path / "notes.jpg").write_text("a text file named .jpg")
  truncated = tmp_path / "truncated.jpg"
  full = (images / "a1.jpg").read_bytes()
  truncated.write_bytes(full[:len(full) // 3])
  paths = [images / "a0.png", images / "broken.jpg", tmp_path / "notes.jpg", images / "a1.jpg",
           truncated, tmp_path / "missing.png", images / "gray.png"]
  captions = run.caption_images(paths, method="greedy")
  assert len(captions) == len(paths)
  assert [c is None for c in captions] == [False, True, True, False, True, True, False]
  assert all(isinstance(c, str) for c in captions if c is not None)
  # The readable images get the captions they get alone (the mapping is by position).
  assert run.caption_images([paths[3], paths[0]], method="greedy") == [captions[3], captions[0]]
  err = capfd.readouterr().err
  assert "Traceback" not in err
  warnings = [l for l in err.splitlines() if l.startswith("warning:")]
  assert len(warnings) == 4, warnings
  for path, line in zip([paths[1], paths[2], paths[4], paths[5]], warnings):
    assert line.startswith(f"warning: {path}: ") and line.endswith("; skipped"), line
  # None readable: one line.
  with pytest.raises(ValueError, match=r"^images: none of the 2 image files could be read \(first, "):
    run.caption_images([images / "broken.jpg", tmp_path / "notes.jpg"])


@pytest.mark.slow
def test_image_counts_compile_only_their_power_of_two_bucket(tiny_run):
  """Captioning 3, then 5, then 6 images compiles for 4 and 8 only: the 6 (and 7, 8) reuse
  the 8's programs. Counted by jax's lowering events (one per program compiled, whether or not
  a persistent cache then has the binary)."""
  import jax
  run, _ = tiny_run
  # A fresh backbone and a decoding length of its own: nothing compiled by the other tests.
  run = jaxcap.Run(run.config, run.vocab, run.info, run.model, run.params, workdir=run.workdir)
  pixels = list(np.random.default_rng(1).integers(0, 256, (9, 32, 32, 3), dtype=np.uint8))
  lowered = []

  def listen(event, *_, **__):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
      lowered.append(event)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    counts = {}
    for n in (3, 5, 6, 7, 8, 4, 2):
      lowered.clear()
      assert len(run.caption_images(pixels[:n], method="greedy", batch_size=8, max_len=3)) == n
      counts[n] = len(lowered)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert counts[3] > 0 and counts[5] > 0  # the first call of a bucket compiles
  assert counts[6] == counts[7] == counts[8] == counts[4] == 0, counts
  assert counts[2] > 0  # a new bucket (2)
  # Beyond batch_size: chunks of 8, so 9 images compile nothing new either.
  lowered.clear()
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    assert len(run.caption_images(pixels[:9], method="greedy", batch_size=8, max_len=3)) == 9
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert not lowered


@slow
def test_clip_scores_find_the_extracted_images_through_features_json(trained, tmp_path):
  """A run on jaxcap-extract's features needs no --clip_images: features.json names the folder
  the images were read from (and an extraction resumed from another path is still the same)."""
  from tests.clip import helpers
  images, out, workdir = trained
  record = json.loads((workdir / run_dir.FEATURES_FILE).read_text())
  assert record["images"] == os.path.abspath(images)
  weights = helpers.random_weights(tmp_path)
  proc = _evaluate(["--workdir", workdir, "--tag", "_clip", "--clip_weights", weights], tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  scores = json.loads((workdir / "scores_test_clip.json").read_text())
  assert scores["per_image"] and all("CLIP-S" in r and "RefCLIP-S" in r for r in scores["per_image"])
  from jaxcap.features import extract
  moved = dict(record, images="/elsewhere")
  extract.check_record(str(out), moved)  # provenance, not a setting: no error
