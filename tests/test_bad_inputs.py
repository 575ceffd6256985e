"""The bad-input corpus: every bad input is one line on stderr, exit code 2, the workdir untouched.

Each case runs ``train.py`` or ``evaluate.py`` as a user would and asserts: exactly one line of
error output (``error: ...``) that names the file or config field at fault (the case's
``needle``) and says what was expected; exit code 2; and the workdir (the case's whole
temporary directory: data, workdir, predictions) unchanged — a snapshot of every path and
its content hash before and after, so no file is added, changed or deleted.

Every case runs the program in a process of its own (tests/programs.py: a server that has
imported JAX forks one child per case, so the corpus stays fast); ``test_real_process`` runs a
handful as plain subprocesses too. Fixtures build their workdirs through the library
(``config_of``: ``jaxcap.get_config`` with the case's overrides).

Classes of the corpus (``CASES``):

- config: the command line and config values — unknown and misspelt keys (top level and
  nested), a missing config file, bad ``file.py:arg`` arguments, values of the wrong type, an
  unknown flag, a stray argument, sizes and every interval at 0 or negative, a negative or
  infinite learning rate, ``keep_checkpoints=0``, unknown enum values (schedule, best metric,
  test split, ``nonfinite``, ``validate_features``, ``degenerate_boxes``, ``missing_boxes``), a
  batch that does not split over the 8 devices, an unknown model or dataset, ``max_regions``
  smaller than the data's region count. Each with every spelling of the config: ``--config=X``,
  ``--config X`` and no ``--config`` (train.py's default config); a case that names its own
  config file with ``--config=X`` and ``--config X``;
- data (a Karpathy-layout dataset written by the test): tokens given as a string, sentences
  not a list, unknown split names (``dev``, ``Train``), a missing test or val split,
  int64 / wrong-rank / wrong-size features, a wrong-size global feature, NaN / inverted /
  negative / zero-area / outside-image boxes, boxes of the wrong shape or count, a missing
  feature file, truncated ``.npy`` and ``.npz`` files, a file that is not numpy at all, a
  missing dataset JSON or root;
- workdir: the workdir is a file, its parent is a file, it is read-only, the disk is full
  while resuming (``test_full_disk_while_resuming``), its ``config.json``
  is valid JSON of the wrong shape (a list, ``model`` a string, no ``data``) or not JSON,
  it holds another model's run;
- checkpoints: corrupted arrays with no intact step to fall back to (resume and evaluate), a
  checkpoint of an older parameter tree (resume and evaluate: refused, nothing moved),
  a ``--step`` that does not exist;
- evaluate.py: predictions covering 3 of 10 images, a predictions file that is not JSON, a
  JSON object instead of a list, an entry without a caption, an image id not among the
  references, a missing references file, ``--predictions`` without ``--references``, an
  unknown split, a missing workdir, no ``--workdir``, ``--step`` of the wrong type, an unknown
  flag, a ``config.json`` of the wrong shape; ``--ensemble-weights`` NaN, infinite, negative,
  all zero, not numbers, empty, of the wrong count, or without ``--ensemble``;
- model, a class per model, each with its own config: the sizes, rates and enum fields each
  checks, and the inputs it needs — the Image Transformer on region features without boxes
  (``data.box_dir``; ``data.missing_boxes='whole_image'`` runs it and says so once,
  ``test_missing_boxes_switch_says_once_what_it_substitutes``), a multimodal MNMT variant or
  the nearest neighbour on text-only Multi30k, MNMT without a source, TPGN's GloVe file
  (missing, a directory, empty, of the wrong width, not numbers, NaN, no vocabulary word), ETA
  with ``attributes`` / ``test_attributes`` 'none' (training and ``evaluate.py --attributes``)
  or a missing attributes file;
- the Python API (``test_api_bad_features``): ``Run.caption`` of an empty list or array,
  ``None``, strings, the wrong rank or feature size, NaN / Inf region or global features, an
  unknown key, a bad ``feats_mask``, ragged lists of mixed sizes, Image Transformer boxes
  missing, in pixels, ``[B, N, 3]``, NaN or inverted, MNMT source ids missing, beyond the
  vocabulary, negative, floats, 1-D or padding only, ETA attributes missing or beyond the
  vocabulary: one ``ValueError`` line naming the argument and what was expected; good features
  of every form pass; ensemble weights through the API.

228 parametrised command-line cases (config 46 x 3 spellings = 135, data 23, workdir 7 + the
read-only test, checkpoints 5, evaluate.py 22, model 36), 4 real processes and 43 API cases;
about 65 s on the project's 2-core machine.

Mutants tried (each made cases fail, then was restored): no shape check of a workdir's
``config.json`` (workdir-config-json-list / -model-string end in a traceback); the Karpathy
reader without its box check (box-negative and box-outside-image are accepted, training starts
and the workdir changes; box-inverted is still caught by the check before training);
``validation.check_model_inputs`` returning at once (the Image Transformer without boxes, MNMT7,
IMGTXT and the nearest neighbour on text-only Multi30k and ETA without attributes train with
exit 0; the switch test fails; evaluate.py --attributes=none is still refused by its own check).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from jaxcap.data import batch as batch_lib
from jaxcap import cli, config_files
from tests.data import fakes
from tests.programs import Programs

from tests.bad_inputs_lib import (CONFIG, CONFIG_FILE, REPO, NO_TEST as _NO_TEST, SPELLINGS, TINY, C,
                                   config_of, init_workdir as _init_workdir, models as _models,
                                   multi30k as _multi30k, paper_cases as _paper_cases,
                                   write as _write)

# Per model key: its config at the tiny sizes (the shared models here, each paper's from its
# tests/papers/<paper>/shared_cases.py BAD_INPUT_MODELS).
MODELS = _models()

KARPATHY = ["--config.data.name=karpathy", "--config.data.root={tmp}/data",
            "--config.data.dataset_json=dataset_coco.json", "--config.data.att_dir=att",
            "--config.data.fc_dir=fc", "--config.data.box_dir=box", "--config.data.min_word_count=1",
            "--config.data.max_regions=5", "--config.data.feature_dim=0",
            "--config.test_after_training=True"]


# --------------------------------------------------------------------------- mutations
def _json(path: Path, fn):
  obj = json.loads(path.read_text())
  fn(obj)
  path.write_text(json.dumps(obj))


def _images(fn):
  return lambda tmp: _json(tmp / "data" / "dataset_coco.json", lambda d: fn(d["images"]))


def _first(split):
  def key(tmp):
    images = json.loads((tmp / "data" / "dataset_coco.json").read_text())["images"]
    return next(e["cocoid"] for e in images if e["split"] == split)
  return key


def _set_box(split, row, value):
  def mutate(tmp):
    path = tmp / "data" / "box" / f"{_first(split)(tmp)}.npy"
    boxes = np.load(path)
    boxes[row] = value
    np.save(path, boxes)
  return mutate


def _box_path(split):
  return lambda tmp: f"box/{_first(split)(tmp)}.npy"


def _save_att(split, fn):
  def mutate(tmp):
    path = tmp / "data" / "att" / f"{_first(split)(tmp)}.npz"
    feat = np.load(path)["feat"]
    np.savez(path, feat=fn(feat))
  return mutate


def _truncate(rel):
  def mutate(tmp):
    path = tmp / "data" / rel(tmp)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 12])
  return mutate


def _write_workdir_config(obj):
  def mutate(tmp):
    (tmp / "wd").mkdir()
    (tmp / "wd" / "config.json").write_text(obj if isinstance(obj, str) else json.dumps(obj))
  return mutate


def _needs_trained(mutate):
  """Marks a mutation that starts from the module's trained workdir (``trained_workdir``)."""
  mutate.needs_trained = True
  return mutate


@_needs_trained
def _trained(tmp):
  shutil.copytree(_TRAINED["dir"], tmp / "wd")


def _corrupt_arrays(which):
  @_needs_trained
  def mutate(tmp):
    _trained(tmp)
    step_dir = tmp / "wd" / which
    step = sorted(p for p in step_dir.iterdir() if p.name.isdigit())[-1]
    hit = 0
    for p in (step / "state").rglob("*"):
      if p.is_file() and not p.name.endswith(".json") and p.name != "_METADATA":
        p.write_bytes(b"\x00garbage" * max(1, p.stat().st_size // 8))
        hit += 1
    assert hit
  return mutate


def _older_tree(which):
  """The step rewritten as an older version of the model wrote it: one parameter more (the
  attention key bias that was later removed), everything else as saved."""
  @_needs_trained
  def mutate(tmp):
    import orbax.checkpoint as ocp
    _trained(tmp)
    step_dir = tmp / "wd" / which
    step = sorted(p for p in step_dir.iterdir() if p.name.isdigit())[-1]
    with ocp.StandardCheckpointer() as ckptr:
      tree = ckptr.restore(step / "state")
      tree["params"]["key_bias"] = np.zeros((4,), np.float32)
      shutil.rmtree(step / "state")
      ckptr.save(step / "state", tree)
  return mutate


def _refs_and_preds(n_refs, preds):
  def mutate(tmp):
    anns = [{"image_id": i, "id": i, "caption": f"a dog number {i}"} for i in range(n_refs)]
    (tmp / "refs.json").write_text(json.dumps({"images": [{"id": i} for i in range(n_refs)],
                                               "annotations": anns}))
    (tmp / "preds.json").write_text(preds if isinstance(preds, str) else json.dumps(preds))
  return mutate


def _both(*fns):
  def mutate(tmp):
    for fn in fns:
      fn(tmp)
  return mutate


PREDS3 = [{"image_id": i, "caption": "a dog"} for i in range(3)]
EVAL_P = ["--predictions={tmp}/preds.json", "--references={tmp}/refs.json", "--out={tmp}/s.json"]
ENSEMBLE = ["--ensemble={tmp}/wd,{tmp}/wd"]


def _spelled(cases):
  """Each config case with every spelling of ``--config``: ``--config=X``, ``--config X`` and
  none (the default config); a case that names its own config file with both of its spellings."""
  out = []
  for case in cases:
    script, args, needle, data, mutate, model, _ = case.values
    if args and args[0].startswith("--config="):
      value = args[0].split("=", 1)[1]
      out.append(C(f"{case.id}-config-eq", args, needle, data=data, mutate=mutate, spell="own"))
      out.append(C(f"{case.id}-config-space", ["--config", value, *args[1:]], needle, data=data,
                   mutate=mutate, spell="own"))
    else:
      for spell in SPELLINGS:
        out.append(C(f"{case.id}-{spell}", args, needle, data=data, mutate=mutate, spell=spell))
  return out


CONFIG_CASES = [
    # ---- config: the command line
    C("config-unknown-key", ["--config.model.no_such_field=3"], "model.no_such_field"),
    C("config-misspelt-key", ["--config.batch_sze=8"], "batch_size?"),
    C("config-misspelt-nested-key", ["--config.data.max_lenn=8"], "data.max_len?"),
    C("config-unknown-section", ["--config.modle.dim=8"], "modle"),
    C("config-missing-file", ["--config=configs/no_such_config.py"], "no_such_config.py"),
    C("config-bad-dataset-arg", [f"--config={REPO}/configs/transformer.py:imagenet"], "imagenet"),
    C("config-unknown-arg-key", [f"--config={REPO}/configs/transformer.py:synthetic,heads=2"], "'heads'"),
    C("config-int-given-text", ["--config.batch_size=abc"], "batch_size"),
    C("config-int-given-float", ["--config.num_train_steps=1.5"], "num_train_steps"),
    C("config-float-given-text", ["--config.learning_rate=fast"], "learning_rate"),
    C("config-bool-given-text", ["--config.test_after_training=maybe"], "test_after_training"),
    C("config-section-given-value", ["--config.decode=3"], "config field decode"),
    C("config-section-after-its-field", ["--config.data=3"], "config.data.num_train"),
    C("config-unknown-flag", ["--num_steps=3"], "--num_steps"),
    C("config-stray-argument", ["extra"], "extra"),
    # ---- config: values
    C("batch-size-0", ["--config.batch_size=0"], "batch_size"),
    C("batch-size-negative", ["--config.batch_size=-8"], "batch_size"),
    C("batch-size-not-divisible", ["--config.batch_size=12"], "batch_size"),
    C("eval-batch-size-0", ["--config.eval_batch_size=0"], "eval_batch_size"),
    C("num-train-steps-0", ["--config.num_train_steps=0"], "num_train_steps"),
    C("eval-every-0", ["--config.eval_every_steps=0"], "eval_every_steps"),
    C("log-every-0", ["--config.log_every_steps=0"], "log_every_steps"),
    C("checkpoint-every-0", ["--config.checkpoint_every_steps=0"], "checkpoint_every_steps"),
    C("keep-checkpoints-0", ["--config.keep_checkpoints=0"], "keep_checkpoints"),
    C("learning-rate-negative", ["--config.learning_rate=-0.001"], "learning_rate"),
    C("learning-rate-inf", ["--config.learning_rate=inf"], "learning_rate"),
    C("scst-learning-rate-negative", ["--config.scst.learning_rate=-1.0"], "scst.learning_rate"),
    C("warmup-negative", ["--config.warmup_steps=-1"], "warmup_steps"),
    C("decay-rate-0", ["--config.decay_rate=0.0"], "decay_rate"),
    C("adam-b2-1.5", ["--config.adam_b2=1.5"], "adam_b2"),
    C("grad-clip-negative", ["--config.grad_clip_norm=-1.0"], "grad_clip_norm"),
    C("eval-num-images-0", ["--config.eval_num_images=0"], "eval_num_images"),
    C("max-len-0", ["--config.data.max_len=0"], "data.max_len"),
    C("seq-per-img-0", ["--config.data.seq_per_img=0"], "data.seq_per_img"),
    C("max-regions-0", ["--config.data.max_regions=0"], "data.max_regions"),
    C("beam-size-0", ["--config.decode.beam_size=0"], "decode.beam_size"),
    C("schedule-unknown", ["--config.schedule=cosine"], "schedule"),
    C("best-metric-unknown", ["--config.best_metric=METEOR"], "best_metric"),
    C("test-split-dev", ["--config.test_split=dev"], "test_split"),
    C("nonfinite-unknown", ["--config.nonfinite=ignore"], "nonfinite"),
    C("validate-features-unknown", ["--config.data.validate_features=some"], "validate_features"),
    C("degenerate-boxes-unknown", ["--config.data.degenerate_boxes=clip"], "degenerate_boxes"),
    C("unknown-model", ["--config.model.name=resnet_lstm"], "resnet_lstm"),
    C("unknown-dataset", ["--config.data.name=imagenet"], "imagenet"),
    C("max-regions-below-data", ["--config.data.max_regions=1"], "max_regions", data="karpathy"),
    C("missing-boxes-unknown", ["--config.data.missing_boxes=zeros"], "data.missing_boxes"),
    C("scst-start-step-negative", ["--config.scst.start_step=-7"], "scst.start_step"),
    C("scst-start-epoch-negative", ["--config.scst.start_epoch=-2"], "scst.start_epoch"),
    C("scst-mean-baseline-one-sample", ["--config.scst.start_step=0", "--config.scst.baseline=mean",
                                        "--config.scst.num_samples=1"], "scst.num_samples"),
    C("scst-beams-with-greedy-baseline", ["--config.scst.candidates=beam", "--config.scst.baseline=greedy"],
      "scst.baseline"),
    C("scst-candidates-unknown", ["--config.scst.candidates=beams"], "scst.candidates"),
    C("caption-postprocess-unknown", ["--config.caption_postprocess=dedup"], "caption_postprocess"),
    C("detections-hdf5-beside-att-dir", ["--config.data.detections_hdf5=coco_detections.hdf5"],
      "detections_hdf5", data="karpathy"),
    C("num-workers-negative", ["--config.data.num_workers=-3"], "data.num_workers"),
    C("num-workers-huge", ["--config.data.num_workers=100000"], "data.num_workers"),
    C("cudnn-attention-without-gpu", ["--config.model.attention_impl=cudnn", "--config.dtype=bfloat16"],
      "model.attention_impl"),
    C("async-checkpoints-not-bool", ["--config.async_checkpoints=later"], "async_checkpoints"),
]

def _run_at(name, *extra):
  """Another run's workdir ``tmp/<name>`` as train.py leaves it when it starts, on the
  synthetic data (an ``init_from`` source)."""
  def mutate(tmp):
    from jaxcap import run_dir
    from jaxcap.training import train_lib
    config = config_of([*MODELS["transformer"], *extra])
    trainer = train_lib.Trainer(config, str(tmp / name))
    run_dir.init_workdir(str(tmp / name), config, trainer.dataset.vocab, trainer.info)
  return mutate


CASES = _spelled(CONFIG_CASES) + [
    C("init-from-a-run-on-other-data", ["--config.init_from={tmp}/other"], "config field init_from",
      data="karpathy", mutate=_run_at("other")),
    # ---- data (Karpathy layout)
    C("tokens-as-string", [], "tokens", data="karpathy",
      mutate=_images(lambda im: im[0]["sentences"][0].update(tokens="a dog runs"))),
    C("sentences-not-list", [], "sentences", data="karpathy",
      mutate=_images(lambda im: im[1].update(sentences="a dog runs"))),
    C("split-dev", [], "'dev'", data="karpathy",
      mutate=_images(lambda im: [e.update(split="dev") for e in im if e["split"] == "val"])),
    C("split-capitalised", [], "'Train'", data="karpathy",
      mutate=_images(lambda im: im[0].update(split="Train"))),
    C("missing-test-split", [], "'test'", data="karpathy",
      mutate=_images(lambda im: im.__setitem__(slice(None), [e for e in im if e["split"] != "test"]))),
    C("missing-val-split", [], "'val'", data="karpathy",
      mutate=_images(lambda im: im.__setitem__(slice(None), [e for e in im if e["split"] != "val"]))),
    C("features-int64", [], ".npz", data="karpathy",
      mutate=_save_att("test", lambda f: (f * 10).astype(np.int64))),
    C("features-wrong-rank", [], ".npz", data="karpathy",
      mutate=_save_att("test", lambda f: f[:, :, None])),
    C("features-wrong-size", [], ".npz", data="karpathy",
      mutate=_save_att("val", lambda f: f[:, :5])),
    C("global-feature-wrong-size", [], "fc/", data="karpathy",
      mutate=lambda tmp: np.save(tmp / "data" / "fc" / f"{_first('test')(tmp)}.npy",
                                 np.zeros((7,), np.float32))),
    C("box-nan", [], "box/", data="karpathy", mutate=_set_box("test", 0, [np.nan, 1, 5, 5])),
    C("box-inverted", [], "box/", data="karpathy", mutate=_set_box("val", 0, [50, 10, 20, 30])),
    C("box-negative", [], "box/", data="karpathy", mutate=_set_box("test", 1, [-20, 10, 30, 40])),
    C("box-zero-area", [], "box/", data="karpathy", mutate=_set_box("train", 0, [20, 10, 20, 40])),
    C("box-outside-image", [], "box/", data="karpathy", mutate=_set_box("test", 0, [10, 10, 5000, 40])),
    C("box-wrong-shape", [], "box/", data="karpathy",
      mutate=lambda tmp: np.save(tmp / "data" / _box_path("val")(tmp), np.ones((3, 3), np.float32))),
    C("box-count-mismatch", [], "box/", data="karpathy",
      mutate=lambda tmp: np.save(tmp / "data" / _box_path("test")(tmp),
                                 np.tile(np.float32([[1, 1, 5, 5]]), (9, 1)))),
    C("feature-file-missing", [], "att/", data="karpathy",
      mutate=lambda tmp: (tmp / "data" / "att" / f"{_first('test')(tmp)}.npz").unlink()),
    C("feature-npz-truncated", [], "att/", data="karpathy",
      mutate=_truncate(lambda tmp: f"att/{_first('test')(tmp)}.npz")),
    C("feature-npy-truncated", [], "fc/", data="karpathy",
      mutate=_truncate(lambda tmp: f"fc/{_first('test')(tmp)}.npy")),
    C("feature-not-numpy", [], "fc/", data="karpathy",
      mutate=lambda tmp: (tmp / "data" / "fc" / f"{_first('val')(tmp)}.npy").write_text("hello")),
    C("dataset-json-missing", ["--config.data.dataset_json=dataset_flickr8k.json"],
      "dataset_flickr8k.json", data="karpathy"),
    C("data-root-missing", ["--config.data.root={tmp}/nowhere"], "nowhere", data="karpathy"),
    # ---- workdir
    C("workdir-is-a-file", [], "wd", mutate=lambda tmp: (tmp / "wd").write_text("x")),
    C("workdir-parent-is-a-file", ["--workdir={tmp}/f/wd"], "f/wd",
      mutate=lambda tmp: (tmp / "f").write_text("x")),
    C("workdir-config-json-list", [], "config.json", mutate=_write_workdir_config([1, 2])),
    C("workdir-config-json-model-string", [], "config.json",
      mutate=_write_workdir_config({"model": "transformer", "data": {"name": "synthetic_scenes"}})),
    C("workdir-config-json-no-data", [], "config.json",
      mutate=_write_workdir_config({"model": {"name": "transformer"}})),
    C("workdir-config-json-not-json", [], "config.json", mutate=_write_workdir_config("{model")),
    C("workdir-of-another-model", ["--config.model.num_heads=2"], "another model", mutate=_trained),
    # ---- checkpoints
    C("checkpoint-arrays-corrupted-resume", ["--config.num_train_steps=8"], "checkpoints/4",
      mutate=_corrupt_arrays("checkpoints")),
    C("checkpoint-arrays-corrupted-evaluate", ["--workdir={tmp}/wd", "--split=val"], "best/4",
      script="evaluate", mutate=_corrupt_arrays("best")),
    C("checkpoint-older-tree-resume", ["--config.num_train_steps=8"],
      "checkpoints/4: checkpoint of a different parameter tree (1 not in this model, e.g. "
      "params/key_bias)",
      mutate=_older_tree("checkpoints")),
    C("checkpoint-older-tree-evaluate", ["--workdir={tmp}/wd", "--split=val"],
      "best/4: checkpoint of a different parameter tree (1 not in this model, e.g. "
      "params/key_bias)",
      script="evaluate", mutate=_older_tree("best")),
    C("evaluate-step-missing", ["--workdir={tmp}/wd", "--step=99"], "step 99", script="evaluate",
      mutate=_trained),
    # ---- evaluate.py
    C("caption-postprocess-with-images", ["--workdir={tmp}/wd", "--images={tmp}", "--out={tmp}/c.json",
                                          "--caption-postprocess=dedupe_repeats"],
      "--caption-postprocess=dedupe_repeats with --images", script="evaluate"),
    C("predictions-3-of-10", EVAL_P, "3 of the 10", script="evaluate",
      mutate=_refs_and_preds(10, PREDS3)),
    C("predictions-not-json", EVAL_P, "preds.json", script="evaluate",
      mutate=_refs_and_preds(3, "[{\"image_id\": 1,")),
    C("predictions-object", EVAL_P, "preds.json", script="evaluate",
      mutate=_refs_and_preds(3, {"0": "a dog"})),
    C("predictions-entry-no-caption", EVAL_P, "entry 1", script="evaluate",
      mutate=_refs_and_preds(3, [{"image_id": 0, "caption": "a"}, {"image_id": 1}])),
    C("predictions-unknown-image", EVAL_P, "image_id 7", script="evaluate",
      mutate=_refs_and_preds(3, PREDS3 + [{"image_id": 7, "caption": "a"}])),
    C("references-missing", ["--predictions={tmp}/preds.json", "--references={tmp}/nope.json",
                             "--out={tmp}/s.json"], "nope.json", script="evaluate",
      mutate=_refs_and_preds(3, PREDS3)),
    C("predictions-without-references", ["--predictions={tmp}/preds.json"], "--references",
      script="evaluate", mutate=_refs_and_preds(3, PREDS3)),
    C("evaluate-unknown-split", ["--workdir={tmp}/wd", "--split=dev"], "--split=dev",
      script="evaluate", mutate=_trained),
    C("evaluate-missing-workdir", ["--workdir={tmp}/nowhere"], "nowhere", script="evaluate"),
    C("evaluate-no-workdir", [], "--workdir", script="evaluate"),
    C("evaluate-step-not-int", ["--workdir={tmp}/wd", "--step=last"], "--step", script="evaluate",
      mutate=_trained),
    C("evaluate-unknown-flag", ["--workdir={tmp}/wd", "--beam_sise=3"], "--beam_sise",
      script="evaluate", mutate=_trained),
    C("evaluate-batch-size-0", ["--workdir={tmp}/wd", "--batch_size=0"], "--batch_size",
      script="evaluate", mutate=_trained),
    C("evaluate-config-json-list", ["--workdir={tmp}/wd"], "config.json", script="evaluate",
      mutate=_write_workdir_config([1, 2])),
    # ---- evaluate.py --ensemble: the weights are checked before any run is read
    C("ensemble-weights-nan", [*ENSEMBLE, "--ensemble-weights=nan,1"], "--ensemble-weights=nan,1",
      script="evaluate", mutate=_trained),
    C("ensemble-weights-inf", [*ENSEMBLE, "--ensemble-weights=1,inf"], "weight 2 is inf",
      script="evaluate", mutate=_trained),
    C("ensemble-weights-negative", [*ENSEMBLE, "--ensemble-weights=2,-1"], "weight 2 is -1.0",
      script="evaluate", mutate=_trained),
    C("ensemble-weights-all-zero", [*ENSEMBLE, "--ensemble-weights=0,0"], "every weight is 0",
      script="evaluate", mutate=_trained),
    C("ensemble-weights-wrong-count", [*ENSEMBLE, "--ensemble-weights=1,1,1"], "expected 2 numbers",
      script="evaluate", mutate=_trained),
    C("ensemble-weights-not-a-number", [*ENSEMBLE, "--ensemble-weights=1,heavy"], "'heavy'",
      script="evaluate", mutate=_trained),
    C("ensemble-weights-empty", [*ENSEMBLE, "--ensemble-weights="], "got 0",
      script="evaluate", mutate=_trained),
    C("ensemble-weights-without-ensemble", ["--workdir={tmp}/wd", "--ensemble-weights=1,1"],
      "--ensemble-weights=1,1", script="evaluate", mutate=_trained),
    # ---- model: Transformer
    C("transformer-heads-not-dividing-dim", ["--config.model.num_heads=5"], "model.num_heads"),
    C("transformer-dim-0", ["--config.model.dim=0"], "model.dim"),
    C("transformer-dropout-1", ["--config.model.dropout=1.0"], "model.dropout"),
    # ---- model: LSTM
    C("lstm-dropout-1", ["--config.model.dropout=1.0"], "model.dropout", model="lstm"),
    C("lstm-hidden-dim-0", ["--config.model.hidden_dim=0"], "model.hidden_dim", model="lstm"),
    # ---- model: self-critical.pytorch's newfc, aoa and updown (for imported checkpoints)
    C("newfc-hidden-dim-0", ["--config.model.hidden_dim=0"], "model.hidden_dim", model="newfc"),
    C("aoa-heads-do-not-divide", ["--config.model.dim=10", "--config.model.num_heads=3"],
      "model.num_heads", model="aoa"),
    C("updown-att-dim-0", ["--config.model.att_dim=0"], "model.att_dim", model="updown"),
    # ---- model: nearest neighbour (no parameters; compares global image features)
    C("nearest-neighbour-chunk-0", ["--config.model.chunk=0"], "model.chunk",
      model="nearest_neighbour"),
    C("nearest-neighbour-on-text-only-multi30k", [], "config field data.text_only",
      model="nearest_neighbour_multi30k", mutate=_multi30k),
] + _paper_cases()

_TRAINED: dict = {}


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory):
  """A workdir as a tiny run leaves it (config.json, vocab.json, a checkpoint and best at step
  4), written through the training library without training (the cases need only its files)."""
  from jaxcap import run_dir
  from jaxcap.data import pipeline
  from jaxcap.training import checkpoint as ckpt_lib
  from jaxcap.training import train_lib
  wd = tmp_path_factory.mktemp("trained") / "wd"
  config = config_of([CONFIG, *TINY])
  trainer = train_lib.Trainer(config, str(wd))
  run_dir.init_workdir(str(wd), config, trainer.dataset.vocab, trainer.info)
  state = trainer.initial_state().replace(step=4)
  it = pipeline.make_train_iterator(trainer.dataset.split("train"), 8, seed=0)
  ckpts = ckpt_lib.Checkpoints(str(wd), keep=config.keep_checkpoints)
  ckpts.save_latest(4, state, it.get_state())
  assert ckpts.save_best_if_improved(4, state, it.get_state(), {"CIDEr": 0.5, "Bleu_4": 0.1})
  ckpts.close()
  _TRAINED["dir"] = wd
  yield


@pytest.fixture(scope="module")
def karpathy_data(tmp_path_factory):
  root = tmp_path_factory.mktemp("karpathy")
  fakes.write_karpathy(root, counts=(16, 8, 8), dim=8, fc_dim=6, regions=(2, 5))
  return root


@pytest.fixture(scope="module")
def programs():
  with Programs() as server:
    yield server


def _cli(programs, script, argv, cwd):
  """``script`` (train / evaluate) run as a user runs it (its own process): (exit code, stderr)."""
  code, _, err = programs.run([f"{script}.py", *argv], cwd)
  return code, err


def _snapshot(root: Path) -> dict:
  snap = {}
  for p in sorted(root.rglob("*")):
    rel = str(p.relative_to(root))
    snap[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
  return snap


def _argv(script, args, data, tmp, model="transformer", spell="config-eq"):
  args = [a.format(tmp=tmp) for a in args]
  if script == "evaluate":
    return args
  config, *rest = [a.format(tmp=tmp) for a in MODELS[model]]
  if spell == "own":  # the case's args start with its --config, which goes first as a user's
    n = 2 if args[0] == "--config" else 1
    named, args = args[:n], args[n:]
  else:
    named = [config] if spell == "config-eq" else SPELLINGS[spell]
  base = [*named, *rest, f"--workdir={tmp}/wd"]
  if data == "karpathy":
    base += [a.format(tmp=tmp) for a in KARPATHY]
  return base + args


def _assert_one_line(code, err, needle):
  lines = [l for l in err.splitlines() if l.strip()]
  assert code == 2, (code, err[-3000:])
  assert len(lines) == 1, err[-3000:]
  assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
  assert "expected" in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("script,args,needle,data,mutate,model,spell", CASES)
def test_bad_input(request, programs, tmp_path, karpathy_data, script, args, needle, data, mutate,
                   model, spell):
  if getattr(mutate, "needs_trained", False):
    request.getfixturevalue("trained_workdir")
  if data == "karpathy":
    shutil.copytree(karpathy_data, tmp_path / "data")
  if mutate is not None:
    mutate(tmp_path)
  before = _snapshot(tmp_path)
  code, err = _cli(programs, script, _argv(script, args, data, tmp_path, model, spell), tmp_path)
  _assert_one_line(code, err, needle.format(tmp=tmp_path))
  assert _snapshot(tmp_path) == before


@pytest.mark.paper_gate
def test_corpus_size():
  assert len(CASES) >= 60
  # Every model has its class of cases.
  from jaxcap.models import registry
  def model_name(key):
    spec = next(a.split("=", 1)[1] for a in MODELS[key] if a.startswith("--config="))
    return config_files.load(spec).model.name
  covered = {model_name(p.values[5]) for p in CASES}
  assert set(registry.names()) <= covered, set(registry.names()) - covered


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_read_only_workdir(programs, tmp_path):
  """Root ignores file modes, so as root the run is a real process as user nobody."""
  base = Path(tempfile.mkdtemp(prefix="jaxcap_ro_"))
  try:
    os.chmod(base, 0o755)
    wd = base / "wd"
    wd.mkdir()
    (wd / "notes.txt").write_text("keep")
    os.chmod(wd, 0o555)
    before = _snapshot(base)
    argv = [CONFIG, *TINY, f"--workdir={wd}"]
    if os.geteuid() == 0:
      if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: a read-only directory is writable")
      r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, str(REPO / "train.py"), *argv], cwd=base,
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, HOME=str(base)))
      code, err = r.returncode, r.stderr
    else:
      code, err = _cli(programs, "train", argv, base)
    _assert_one_line(code, err, "not writable")
    assert _snapshot(base) == before
  finally:
    os.chmod(base / "wd", 0o755)
    shutil.rmtree(base)


@pytest.mark.parametrize("script,args,needle", [
    ("train", [CONFIG, "--config.batch_sze=8"], "batch_size?"),
    ("train", ["--config.no_such_key=3"], "no_such_key"),  # no --config: the default config
    ("train", [CONFIG, *TINY, "--config.eval_every_steps=0", "--workdir={tmp}/wd"], "eval_every_steps"),
    ("evaluate", ["--predictions={tmp}/preds.json", "--references={tmp}/refs.json",
                  "--out={tmp}/s.json"], "3 of the 10"),
])
@pytest.mark.slow
def test_real_process(tmp_path, script, args, needle):
  """The real exit code, and no traceback on stderr, for a few cases."""
  _refs_and_preds(10, PREDS3)(tmp_path)
  before = _snapshot(tmp_path)
  r = subprocess.run([sys.executable, str(REPO / f"{script}.py"), *[a.format(tmp=tmp_path) for a in args]],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert "Traceback" not in r.stderr
  _assert_one_line(r.returncode, r.stderr, needle)
  assert _snapshot(tmp_path) == before


@pytest.mark.slow
def test_full_disk_while_resuming(request, tmp_path, monkeypatch):
  """ENOSPC when the resumed run opens its metrics: one line naming the path, exit 2."""
  import errno
  from jaxcap.training import train_lib
  request.getfixturevalue("trained_workdir")
  _trained(tmp_path)

  def full(self, workdir, enabled=None):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(workdir, "metrics.jsonl"))

  monkeypatch.setattr(train_lib.MetricWriter, "__init__", full)
  before = _snapshot(tmp_path)
  config = config_of([CONFIG, *TINY, "--config.num_train_steps=8"])
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    with pytest.raises(SystemExit) as e:  # the library's entry point under the programs' contract
      cli.run_main(lambda: train_lib.train_and_evaluate(config, f"{tmp_path}/wd"))
  code, err = e.value.code, err.getvalue()
  _assert_one_line(code, err, "metrics.jsonl: No space left on device")
  assert _snapshot(tmp_path) == before


def test_missing_boxes_switch_says_once_what_it_substitutes(tmp_path, karpathy_data):
  """data.missing_boxes='whole_image' runs the Image Transformer on region features without
  boxes, and says so in one line, once, whatever the number of splits."""
  import ml_collections
  from jaxcap import data as data_lib
  from jaxcap.models import registry
  from jaxcap.training import validation
  from jaxcap.papers.image_transformer.configs import image_transformer
  config = image_transformer.get_config("synthetic")
  config.data = fakes.karpathy_config(karpathy_data, box_dir="", max_regions=5, feature_dim=0)
  config.data.missing_boxes = "whole_image"
  dataset = data_lib.get_dataset(config.data)
  model = registry.build(ml_collections.ConfigDict(dict(config.model, dim=32, num_heads=4)),
                         dataset.info)
  lines = []
  validation.check_model_inputs(model, dataset, config, ["train", "val", "test"], log=lines.append)
  assert len(lines) == 1 and "whole-image box" in lines[0] and "missing_boxes" in lines[0], lines
  # The graph ablated (no boxes read), or the data with its boxes: nothing to say.
  lines.clear()
  validation.check_model_inputs(model.clone(graph="all_neighbour"), dataset, config,
                                log=lines.append)
  config.data.box_dir = "box"
  validation.check_model_inputs(model, data_lib.get_dataset(config.data), config, log=lines.append)
  assert not lines


# ------------------------------------------------------------------------------- Python API
# Runs built in memory (no checkpoint): batch.from_features refuses bad features before anything is
# decoded, so no parameters are needed.
_INFO = {"feature_dim": 6, "global_dim": 6, "max_regions": 3, "max_len": 8, "vocab_size": 20,
         "src_vocab_size": 15, "num_attributes": 10, "grid": False, "seq_per_img": 1,
         "max_attributes": 4, "src_max_len": 6}
_API_MODELS = {
    "transformer": {"name": "transformer", "dim": 8, "num_layers": 1, "num_heads": 2, "ff_dim": 8},
    "image_transformer": {"name": "image_transformer", "dim": 8, "num_heads": 2, "num_layers": 1,
                          "ff_dim": 8},
    "mnmt": {"name": "mnmt", "variant": "mnmt7", "embed_dim": 4, "hidden_dim": 4},
    "eta": {"name": "eta", "dim": 8, "num_layers": 1, "num_heads": 2, "ff_dim": 8},
    "tpgn": {"name": "tpgn", "d": 2},
}


def _api_run(model: str):
  import ml_collections
  from jaxcap import api
  from jaxcap.data.vocab import Vocab
  from jaxcap.models import registry
  config = ml_collections.ConfigDict({"model": _API_MODELS[model]})
  info = dict(_INFO, max_regions=1) if model == "tpgn" else _INFO
  return api.Run(config, Vocab.build([["a", "dog"]], min_count=1), info,
                 registry.build(config.model, info), None)


_RNG = np.random.default_rng(0)
_FEATS = _RNG.random((2, 3, 6)).astype(np.float32)
_BOXES = np.tile(np.float32([0.1, 0.1, 0.5, 0.6]), (2, 3, 1))
_SRC = np.int32([[4, 5, 2, 0], [6, 2, 0, 0]])
_ATTRS = np.int32([[4, 5], [6, 0]])


def _with(**kw):
  return {"feats": _FEATS, **kw}


def _nan(x, *index):
  x = np.array(x)
  x[index] = np.nan
  return x


API_CASES = [
    # (id, model, features, needle)
    ("empty-list", "transformer", [], "empty list"),
    ("empty-array", "transformer", np.zeros((0, 3, 6), np.float32), "hold no image"),
    ("none", "transformer", None, "features is None"),
    ("strings", "transformer", [["a", "b"]], "features[0] is not a numeric array"),
    ("rank-4", "transformer", _FEATS[None], "[B, Dg] (global) or [B, N, F]"),
    ("wrong-feature-size", "transformer", _FEATS[..., :5], "[B, N, 6]"),
    ("nan-features", "transformer", _nan(_FEATS, 1, 2, 0), "NaN or Inf values (image 1)"),
    ("nan-features-dict", "transformer", {"feats": _nan(_FEATS, 0, 0, 3)}, "features['feats']"),
    ("inf-global-feature", "transformer",
     {"feats": _FEATS, "global_feat": np.where(np.eye(2, 6, 1) > 0, np.inf, _FEATS[:, 0])},
     "features['global_feat']"),
    ("unknown-key", "transformer", _with(box=_BOXES), "'box'"),
    ("mask-wrong-shape", "transformer", _with(feats_mask=np.ones((2, 2), bool)), "feats_mask"),
    ("mask-no-real-region", "transformer", _with(feats_mask=np.bool_([[1, 0, 0], [0, 0, 0]])),
     "no region of image 1"),
    ("ragged-list-mixed-widths", "transformer", [np.ones((2, 6)), np.ones((3, 5))], "[N_i, 6]"),
    ("image-transformer-no-boxes", "image_transformer", _FEATS, "features['boxes'] [B, N, 4]"),
    ("image-transformer-boxes-in-pixels", "image_transformer", _with(boxes=_BOXES * 300),
     "outside [0, 1]"),
    ("image-transformer-boxes-3-coordinates", "image_transformer", _with(boxes=_BOXES[..., :3]),
     "features['boxes'] has shape (2, 3, 3)"),
    ("image-transformer-boxes-nan", "image_transformer", _with(boxes=_nan(_BOXES, 0, 1, 2)),
     "NaN or Inf"),
    ("image-transformer-boxes-inverted", "image_transformer",
     _with(boxes=_BOXES[..., [2, 3, 0, 1]]), "x1 > x2"),
    ("mnmt-no-source", "mnmt", _FEATS, "features['src']"),
    ("mnmt-source-beyond-vocabulary", "mnmt", _with(src=_SRC + 12), "holds id 16"),
    ("mnmt-source-negative", "mnmt", _with(src=_SRC - 3), "holds id -"),
    ("mnmt-source-floats", "mnmt", _with(src=_SRC.astype(np.float32)), "integer source word ids"),
    ("mnmt-source-1d", "mnmt", _with(src=_SRC[0]), "features['src'] has shape"),
    ("mnmt-source-padding-only", "mnmt", _with(src=np.zeros((2, 4), np.int32)), "padding only"),
    ("eta-no-attributes", "eta", _FEATS, "features['attributes']"),
    ("eta-attributes-beyond-vocabulary", "eta", _with(attributes=_ATTRS + 20), "holds id 24"),
    ("tpgn-nan-global", "tpgn", _nan(_FEATS[:, 0], 0, 4), "NaN or Inf"),
    ("tpgn-global-wrong-size", "tpgn", _FEATS[:, 0, :4], "[B, 6]"),
    ("tpgn-global-list-mixed-sizes", "tpgn", [np.ones(6), np.ones(5)], "sizes [5, 6]"),
    ("list-mixed-ranks", "transformer", [np.ones(6), np.ones((2, 6))], "[Dg] global or [N_i, F]"),
]


@pytest.mark.parametrize("model,features,needle",
                         [pytest.param(*c[1:], id=c[0]) for c in API_CASES])
def test_api_bad_features(model, features, needle):
  """Run.caption: one ValueError naming the argument and what was expected (never an error
  inside NumPy or JAX, never empty captions)."""
  run = _api_run(model)
  with pytest.raises(ValueError) as e:
    run.caption(features)
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith("caption: ") and needle in msg, msg
  assert "expected" in msg, msg


@pytest.mark.parametrize("model,features", [
    ("transformer", _FEATS), ("transformer", [_FEATS[0], _FEATS[1, :2]]),
    ("transformer", {"feats": _FEATS, "feats_mask": np.bool_([[1, 1, 0], [1, 0, 0]])}),
    ("image_transformer", _with(boxes=_BOXES)), ("mnmt", _with(src=_SRC)),
    ("eta", _with(attributes=_ATTRS)), ("tpgn", _FEATS[:, 0]), ("tpgn", list(_FEATS[:, 0])),
])
def test_api_good_features_pass_the_checks(model, features):
  from jaxcap import api
  run = _api_run(model)
  batch = batch_lib.from_features(features, run.info, run.model)
  assert batch["feats"].shape[0] == 2 and np.isfinite(batch["feats"]).all()


@pytest.mark.parametrize("weights,needle", [
    ((float("nan"), 1.0), "weight 1 is nan"), ((1.0, -1.0), "weight 2 is -1.0"),
    ((0, 0), "every weight is 0"), ((1.0,), "expected 2 numbers"), (("x", 1), "weight 1 is 'x'"),
])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_api_ensemble_weights(weights, needle):
  from jaxcap import ensemble
  with pytest.raises(ValueError, match="ensemble weights") as e:
    ensemble.Ensemble((object(), object()), weights)
  assert needle in str(e.value) and "expected" in str(e.value)
