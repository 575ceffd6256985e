"""The CLIP scores in evaluate.py: image files found by id (folders, COCO names, JSON), the
flags' combinations, files checked before anything is written, a predictions file and a trained
run scored with CLIP-S / RefCLIP-S / PAC-S in the scores file, its signature and jaxcap-compare."""

import json
import os
import re

import numpy as np
import pytest

from jaxcap.errors import BadInput

from jaxcap.clip import metrics
from jaxcap.evaluation import files
from tests.clip import helpers
from tests.programs import Programs, one_device_env


def test_image_files_by_id(tmp_path):
  names = ["7", "train2014/COCO_train2014_000000000042", "val2014/COCO_val2014_000000391895",
           "000000000555", "test_00012"]
  helpers.images(tmp_path / "imgs", len(names), names)
  found = metrics.image_files(str(tmp_path / "imgs"), [7, 42, 391895, 555, "test_00012", "7"])
  assert found[42].endswith("COCO_train2014_000000000042.png")
  assert found[391895].endswith("COCO_val2014_000000391895.png")
  assert found[555].endswith("000000000555.png") and found["test_00012"].endswith("test_00012.png")
  assert found[7] == found["7"]
  with pytest.raises(ValueError, match=r"no image file for image_id 8 ") as e:
    metrics.image_files(str(tmp_path / "imgs"), [7, 8])
  # The error names every extension the lookup finds (the one constant), not only .jpg / .png.
  from jaxcap.features.extract import IMAGE_EXTENSIONS
  assert " ".join(IMAGE_EXTENSIONS) in str(e.value) and ".webp" in str(e.value)
  from PIL import Image
  for ext in (".GIF", ".webp", ".tiff", ".bmp"):  # each kind the message names is found, any case
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / f"9{ext}")
    assert metrics.image_files(str(tmp_path / "imgs"), [9])[9].endswith(f"9{ext}")
    os.remove(tmp_path / "imgs" / f"9{ext}")
  helpers.images(tmp_path / "imgs" / "dup", 1, ["7"])  # the same name in two subfolders
  with pytest.raises(ValueError, match=r"2 image files for image_id 7 "):
    metrics.image_files(str(tmp_path / "imgs"), [7])
  table = tmp_path / "map.json"
  table.write_text(json.dumps({"1": "imgs/7.png", "2": str(tmp_path / "imgs" / "test_00012.png")}))
  assert metrics.image_files(str(table), [1, 2]) == {1: str(tmp_path / "imgs" / "7.png"),
                                                      2: str(tmp_path / "imgs" / "test_00012.png")}
  with pytest.raises(ValueError, match=r"map\.json: no image for image_id 3"):
    metrics.image_files(str(table), [3])
  with pytest.raises(ValueError, match=r"--clip_images=.*nowhere: no such folder or file"):
    metrics.image_files(str(tmp_path / "nowhere"), [1])
  # A path that is no string (it raised TypeError in os.path.isabs, or later in the image read):
  table.write_text(json.dumps({"1": 7, "2": ["imgs/7.png"]}))
  with pytest.raises(BadInput, match=r"map\.json: image_id 1 maps to 7; expected an image file's path"):
    metrics.image_files(str(table), [1, 2])
  with pytest.raises(BadInput, match=r"^images: image_id 2 maps to \['a.png'\]; expected"):
    metrics.image_files({1: "a.png", 2: ["a.png"]}, [1, 2])


@pytest.mark.parametrize("request_args,match", [
    (dict(images="x"), r"--clip_images without --clip_weights or --pac_weights"),
    (dict(refclip_variant="clip_caption_reward"), r"--refclip_variant=clip_caption_reward without"),
    (dict(clip_weights="w.pt"), r"without --clip_images; expected the folder"),
    (dict(clip_weights="w.pt", images="x", refclip_variant="both"), r"--refclip_variant=both: expected one of"),
    (dict(pac_weights="w.pt", images="x", batch_size=0), r"--clip_batch_size=0: expected an int >= 1"),
])
def test_request_checks(request_args, match):
  with pytest.raises(ValueError, match=match):
    metrics.Request(**request_args).check()


REFS = {"images": [{"id": i} for i in range(3)],
        "annotations": [{"image_id": i, "id": 10 * i + j, "caption": c}
                        for i, caps in enumerate([["a dog runs", "a brown dog"], ["two cats"], ["a red bus", "a bus"]])
                        for j, c in enumerate(caps)]}
PREDS = [{"image_id": 0, "caption": "a dog"}, {"image_id": 1, "caption": "a cat"}, {"image_id": 2, "caption": "a car"}]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_predictions_file_scored_with_clip(tmp_path):
  weights = helpers.random_weights(tmp_path)
  helpers.images(tmp_path / "imgs", 3, ["0", "1", "2"])
  (tmp_path / "r.json").write_text(json.dumps(REFS))
  (tmp_path / "p.json").write_text(json.dumps(PREDS))
  request = metrics.Request(clip_weights=weights, pac_weights=weights, images=str(tmp_path / "imgs"))
  out = files.score_files(str(tmp_path / "p.json"), str(tmp_path / "r.json"), str(tmp_path / "s.json"),
                          metrics=("Bleu",), log=lambda _: None, clip=request)
  written = json.loads((tmp_path / "s.json").read_text())
  assert {"CLIP-S", "RefCLIP-S", "PAC-S", "RefPAC-S", "Bleu_4"} <= set(written["overall"])
  assert [sorted(r) for r in written["per_image"]][0] == sorted(
      ["image_id", "Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CLIP-S", "RefCLIP-S", "PAC-S", "RefPAC-S"])
  assert written["signature"]["metrics"]["clip"]["CLIP-S"]["prompt"] == "A photo depicts "
  assert np.mean([r["CLIP-S"] for r in written["per_image"]]) == pytest.approx(out["overall"]["CLIP-S"])
  # The cosines max(cos, 0) clipped: counted (each a CLIP-S of exactly 0) and kept in the file.
  for name, w in (("CLIP-S", 2.5), ("PAC-S", 2.0)):
    c = written["clip_cosines"][name]
    assert (c["pairs"], c["clipped"], c["w"]) == (3, sum(r[name] == 0 for r in written["per_image"]), w)
    if c["clipped"] < 3:
      assert c["mean_cosine"] > -1 and out["overall"][name] > 0
  assert "clip_cosines" not in json.dumps(written["signature"])  # results, not how they were made
  # An image missing: one line, before anything is scored or written.
  os.remove(tmp_path / "imgs" / "2.png")
  with pytest.raises(ValueError, match=r"no image file for image_id 2"):
    files.score_files(str(tmp_path / "p.json"), str(tmp_path / "r.json"), str(tmp_path / "s2.json"),
                      clip=request)
  assert not (tmp_path / "s2.json").exists()


def test_notes_say_why_clip_scores_are_zero(capsys):
  """A CLIP-S of 0.00 says why: the cosines <= 0 that w * max(cos, 0) clipped, their count and
  mean, printed under the signature line (run_dir.print_scores: every scoring's end)."""
  from jaxcap import run_dir
  from jaxcap.clip import score
  cos = np.array([-0.2, -0.1, 0.0, 0.3], np.float32)
  scores = {"overall": {"CLIP-S": float(np.mean(2.5 * np.clip(cos, 0, None))), "RefCLIP-S": 0.1, "PAC-S": 0.2},
            "clip_cosines": {"CLIP-S": score.clipped(cos, 2.5), "PAC-S": score.clipped(cos[3:], 2.0)},
            "signature": {"metrics": {"implementation": "pycocoevalcap", "version": "1.2"}}}
  assert scores["clip_cosines"]["CLIP-S"] == {"pairs": 4, "clipped": 3, "mean_cosine": pytest.approx(0.0), "w": 2.5}
  lines = metrics.notes(scores)
  assert lines == ["note: CLIP-S: 3 of 4 cosines <= 0 were clipped to 0 (2.5 * max(cos, 0), clipscore.py's "
                   "reading; mean cosine 0.000) (RefCLIP-S, their harmonic mean with it, is 0 there too); real "
                   "CLIP weights rarely give a cosine <= 0, random stand-in weights mostly do"]  # PAC-S: none clipped
  run_dir.print_scores(scores, "test (4 images)", "S.json")
  printed = capsys.readouterr().out.splitlines()
  assert printed[-3].startswith("signature: jaxcap ") and printed[-2] == lines[0] and printed[-1] == "wrote S.json"
  assert any("CLIP-S" in l for l in printed[-6:-3])  # the table right above the signature line


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_evaluate_py_bad_clip_input_is_one_line_exit_2(tmp_path):
  """evaluate.py: a wrong weights file, images missing, a flag without its partner: one line,
  exit 2, nothing written."""
  helpers.images(tmp_path / "imgs", 3, ["0", "1", "2"])
  (tmp_path / "r.json").write_text(json.dumps(REFS))
  (tmp_path / "p.json").write_text(json.dumps(PREDS))
  (tmp_path / "notes.pt").write_text("not weights")
  base = ["evaluate.py", f"--predictions={tmp_path / 'p.json'}", f"--references={tmp_path / 'r.json'}",
          f"--out={tmp_path / 's.json'}"]
  cases = [([f"--clip_weights={tmp_path / 'notes.pt'}", f"--clip_images={tmp_path / 'imgs'}"],
            r"notes\.pt: not a PyTorch checkpoint .*expected CLIP weights"),
           ([f"--pac_weights={tmp_path / 'notes.pt'}"], r"without --clip_images"),
           ([f"--clip_images={tmp_path / 'imgs'}"], r"--clip_images without --clip_weights or --pac_weights")]
  with Programs(one_device_env()) as programs:
    for extra, match in cases:
      code, _, err = programs.run([*base, *extra], tmp_path)
      lines = [l for l in err.splitlines() if l.strip()]
      assert code == 2 and len(lines) == 1 and re.search(match, lines[0]), err
    assert not (tmp_path / "s.json").exists()
    # The same form with good input prints what docs/USAGE.md says: the table, the signature
    # line under it (with the CLIP-S part), the note when a cosine was clipped, the file written.
    weights = helpers.random_weights(tmp_path)
    code, out, err = programs.run([*base, f"--clip_weights={weights}", f"--clip_images={tmp_path / 'imgs'}"], tmp_path)
  assert code == 0, err[-2000:]
  printed = out.splitlines()
  sig = next(i for i, l in enumerate(printed) if l.startswith("signature: "))
  assert any("CLIP-S" in l for l in printed[max(sig - 3, 0):sig]), out  # the table's names, above it
  assert "|CLIP-S ViT-64/16@32,quick_gelu,#" in printed[sig], out
  clipped = json.loads((tmp_path / "s.json").read_text())["clip_cosines"]["CLIP-S"]["clipped"]
  assert [l.startswith("note: CLIP-S: ") for l in printed[sig + 1:-1]] == [True] * bool(clipped), out
  assert printed[-1] == f"wrote {tmp_path / 's.json'}", out


@pytest.mark.slow
def test_evaluate_py_scores_a_run_with_clip_and_compare_pairs_them(tmp_path):
  from tests.data import fakes
  truth = fakes.write_karpathy(tmp_path / "data", counts=(16, 6, 6), dim=8, fc_dim=6, regions=(2, 5))
  test_ids = [k for k, t in truth.items() if t["split"] == "test"]
  helpers.images(tmp_path / "imgs" / "val2014", len(test_ids), [f"COCO_val2014_{k:012d}" for k in test_ids])
  weights = helpers.random_weights(tmp_path)
  fields = dict(name="karpathy", root=str(tmp_path / "data"), dataset_json="dataset_coco.json",
                att_dir="att", fc_dir="fc", box_dir="box", min_word_count=1, max_regions=5, feature_dim=0)
  train = ["train.py", "--config=configs/transformer.py:synthetic,tiny", f"--workdir={tmp_path / 'run'}",
           "--config.num_train_steps=2", "--config.eval_every_steps=2", "--config.checkpoint_every_steps=2",
           *(f"--config.data.{k}={v}" for k, v in fields.items())]
  clip = [f"--clip_weights={weights}", f"--clip_images={tmp_path / 'imgs'}"]
  with Programs(one_device_env()) as programs:
    code, _, err = programs.run(train, tmp_path)
    assert code == 0, err[-2000:]
    # Refused before decoding: an image missing, a form that scores nothing.
    os.rename(tmp_path / "imgs" / "val2014", tmp_path / "hidden")
    code, out, err = programs.run(["evaluate.py", f"--workdir={tmp_path / 'run'}", "--tag=_x", *clip], tmp_path)
    assert code == 2 and "no image file for image_id" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run" / "scores_test_x.json").exists()
    os.rename(tmp_path / "hidden", tmp_path / "imgs" / "val2014")
    code, out, err = programs.run(["evaluate.py", f"--workdir={tmp_path / 'run'}", "--images=x", "--out=o.json", *clip], tmp_path)
    assert code == 2 and "--clip_weights with --images: nothing is scored there" in err
    for decode, tag in (([], "_g"), (["--beam-size=2"], "_b2")):  # the run's own (greedy), beam 2
      code, out, err = programs.run(["evaluate.py", f"--workdir={tmp_path / 'run'}", *decode,
                                     f"--tag={tag}", *clip, "--refclip-variant=clip_caption_reward"], tmp_path)
      assert code == 0, err[-2000:]
      assert "CLIP-S" in out and "RefCLIP-S" in out and "|CLIP-S ViT-64/16@32,quick_gelu,#" in out
    written = json.loads((tmp_path / "run" / "scores_test_g.json").read_text())
    assert len(written["per_image"]) == 6 and all("RefCLIP-S" in r for r in written["per_image"])
    assert written["signature"]["metrics"]["clip"]["CLIP-S"]["ref"] == "clip_caption_reward"
    code, out, err = programs.run(["-m", "jaxcap.commands.compare", str(tmp_path / "run" / "scores_test_g.json"),
                                   str(tmp_path / "run" / "scores_test_b2.json"), "--resamples=200"], tmp_path)
    assert code == 0, err
    assert "CLIP-S" in out and "RefCLIP-S" in out
  # Run.evaluate: the same scores from Python (greedy, the run's decoding).
  import jaxcap
  run = jaxcap.load(str(tmp_path / "run"))
  got = run.evaluate(metrics=("Bleu",), clip_images=str(tmp_path / "imgs"), clip_weights=weights,
                     refclip_variant="clip_caption_reward", log=lambda _: None)
  for r in written["per_image"]:
    assert got["per_image"][r["image_id"]]["CLIP-S"] == pytest.approx(r["CLIP-S"], abs=1e-5)
  assert got["signature"]["metrics"]["clip"]["CLIP-S"]["ref"] == "clip_caption_reward"
  with pytest.raises(ValueError, match="without --clip_weights or --pac_weights"):
    run.evaluate(clip_images=str(tmp_path / "imgs"))
