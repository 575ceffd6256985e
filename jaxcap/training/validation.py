"""Checks before the first training step: config values, workdir, splits, feature headers, boxes.

Everything a run will need is checked up front, so bad input is a one-line ``BadInput``
(``train.py``: ``error: ...`` and exit code 2) before anything is written or compiled, instead
of a traceback or a late failure at the batch that reads a bad file or after training:

- :func:`check_config`: the one pass over the built config: the types and ranges of every
  section's fields (:data:`CHECKS`: training, data, decoding, self-critical training; the
  model's against its dataclass), and the relations between them;
- :func:`check_workdir_writable`: the workdir is a directory (or can be created) and writable;
- :func:`check_data`: every split the run uses exists (train, val, and ``test_split`` when
  ``test_after_training``), and each image's feature files of those splits agree with the
  dataset (rank, float dtype, feature sizes, at most ``data.max_regions`` regions unless
  ``data.truncate_regions``, not truncated) — read from the ``.npy`` / ``.npz`` headers, not
  the arrays — and its boxes are valid (:func:`jaxcap.data.batch.check_boxes`; zero-area boxes
  are an error unless ``data.degenerate_boxes="allow"``). ``data.validate_features`` is
  ``"all"`` (default), ``"sample"`` (``data.validate_sample`` images per split, evenly spread:
  for datasets too large to scan) or ``"off"``; the time the check took is printed in one line;
- :func:`check_model_inputs`: the data has what the model reads (image features, region boxes,
  attribute words, a translation source), and the files it reads when it starts (TPGN's GloVe).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import time

import numpy as np
import jax

from jaxcap import atomic, decoding, progress
from jaxcap.data import base, complete_data_config
from jaxcap.data import batch as batch_lib
from jaxcap.data import readers as data_readers
from jaxcap.errors import BadInput
from jaxcap.evaluation import coco_metrics
from jaxcap.models import fields, registry
from jaxcap.training import scst as scst_lib
from jaxcap.training import sharding as sharding_lib
from jaxcap.features import registry as feature_registry
from jaxcap.training.dropout import DROPOUT_BITS
from jaxcap.training.steps import PRNG_IMPLS

_MISSING = object()
# Loader processes: beyond a few per core they only compete for the cores.
MAX_WORKERS = 4 * (os.cpu_count() or 1)
_STEP_OR_NEVER = fields.Check(lambda v: fields.is_int(v) and (v == -1 or v >= 0),
                              "-1 (never) or an int >= 0")

# The config's fields and what each must hold, one table for every section (the model's own
# fields are its dataclass's: jaxcap.models.fields). A field a config does not have is skipped.
CHECKS = {
    # training
    "seed": fields.INT, "batch_size": fields.POSITIVE, "eval_batch_size": fields.POSITIVE,
    "num_train_steps": fields.at_least(0), "eval_every_steps": fields.POSITIVE,
    "log_every_steps": fields.POSITIVE, "checkpoint_every_steps": fields.POSITIVE,
    "keep_checkpoints": fields.POSITIVE, "async_checkpoints": fields.BOOL,
    "warmup_steps": fields.at_least(0),
    "early_stopping_patience": fields.at_least(0),
    "eval_num_images": fields.Check(lambda v: fields.is_int(v) and (v >= 1 or v == -1),
                                    "-1 (the whole split) or an int >= 1"),
    "learning_rate": fields.finite(0.0), "decay_every_epochs": fields.finite(0.0, strict=True),
    "decay_rate": fields.finite(0.0, strict=True), "adam_b1": fields.RATE, "adam_b2": fields.RATE,
    "adam_eps": fields.finite(0.0), "weight_decay": fields.finite(0.0), "l2": fields.finite(0.0),
    "grad_clip_norm": fields.finite(0.0), "grad_clip_value": fields.finite(0.0),
    "label_smoothing": fields.finite(0.0),
    "schedule": fields.one_of(("noam", "step", "constant")),
    "best_metric": fields.one_of(("CIDEr", "Bleu_4")), "test_split": fields.one_of(base.SPLITS),
    "nonfinite": fields.one_of(("stop", "skip")), "prng_impl": fields.one_of(PRNG_IMPLS),
    "dropout_bits": fields.one_of(DROPOUT_BITS),
    "sharding": fields.one_of(sharding_lib.RULES),
    "mesh.data": fields.Check(lambda v: fields.is_int(v) and (v == -1 or v >= 1),
                              "-1 (every device) or an int >= 1"),
    "mesh.model": fields.Check(lambda v: fields.is_int(v) and v == 1,
                               "1 (no sharding rule splits over a model axis yet)"),
    "test_after_training": fields.BOOL, "spice": fields.BOOL, "init_from": fields.STRING,
    "caption_postprocess": fields.one_of(coco_metrics.CAPTION_POSTPROCESS),
    # from pixels
    "backbone.name": fields.Check(lambda v: v == "" or v in feature_registry.BACKBONES,
                                  "'' (feature files) or a backbone: " + ", ".join(sorted(feature_registry.BACKBONES))),
    "backbone.fields": fields.STRING, "backbone.weights": fields.STRING,
    "backbone.learning_rate": fields.finite(0.0), "backbone.freeze_steps": fields.at_least(0),
    "backbone.remat": fields.BOOL, "backbone.dtype": fields.one_of(("float32", "bfloat16")),
    "data.images_dir": fields.STRING, "data.image_size": fields.at_least(0),
    # data
    "data.name": fields.one_of(data_readers.NAMES), "data.max_len": fields.POSITIVE,
    "data.seq_per_img": fields.POSITIVE, "data.max_regions": fields.POSITIVE,
    "data.validate_sample": fields.POSITIVE, "data.truncate_regions": fields.BOOL,
    "data.grid": fields.BOOL,
    "data.validate_features": fields.one_of(("all", "sample", "off")),
    "data.degenerate_boxes": fields.one_of(("error", "allow")),
    "data.missing_boxes": fields.one_of(("error", "whole_image")),
    "data.task": fields.one_of(("caption", "translate")),
    "data.num_workers": fields.Check(lambda v: fields.is_int(v) and -1 <= v <= MAX_WORKERS,
                                     f"an int in [-1, {MAX_WORKERS}] (0: read in the training "
                                     f"process; -1: chosen from the host's cores; at most 4 per "
                                     f"core of this host's {MAX_WORKERS // 4})"),
    # decoding
    "decode.method": fields.one_of(decoding.METHODS), "decode.beam_size": fields.POSITIVE,
    "decode.beam_mode": fields.one_of(decoding.BEAM_MODES), "decode.max_len": fields.POSITIVE,
    "decode.length_penalty": fields.one_of(decoding.LENGTH_PENALTIES),
    "decode.min_len": fields.at_least(0), "decode.top_k": fields.at_least(0),
    "decode.temperature": fields.finite(0.0, strict=True),
    "decode.top_p": fields.in_interval(0.0, 1.0, closed_high=True),
    "decode.beam_groups": fields.POSITIVE, "decode.num_samples": fields.POSITIVE,
    "decode.block_trigrams": fields.BOOL, "decode.suppress_unk": fields.BOOL,
    "decode.beam_suppress_unk": fields.BOOL,
    "decode.remove_bad_endings": fields.BOOL,
    # self-critical training
    "scst.learning_rate": fields.finite(0.0), "scst.num_samples": fields.POSITIVE,
    "scst.reward": fields.one_of(("device", "host")),
    "scst.baseline": fields.one_of(("greedy", "mean", "mean_all")),
    "scst.candidates": fields.one_of(("sample", "beam")),
    "scst.loss_norm": fields.one_of(("tokens", "steps")),
    "scst.cider_compat": fields.one_of(("jaxcap", "self_critical")), "scst.dropout": fields.BOOL,
    "scst.fused_decode": fields.BOOL,
    "scst.bleu_weight": fields.finite(0.0), "scst.cider_weight": fields.finite(0.0),
    "scst.clip_weight": fields.finite(0.0), "scst.grammar_weight": fields.finite(0.0),
    "scst.start_step": _STEP_OR_NEVER, "scst.start_epoch": _STEP_OR_NEVER,
}


def _get(config, path: str):
  node = config
  for p in path.split("."):
    try:
      if p not in node:
        return _MISSING
      node = node[p]
    except TypeError:
      return _MISSING
  return node


def check_config(config, trainable: bool | None = None) -> None:
  """The one validation pass over a built config, before anything is written or compiled:
  every field of :data:`CHECKS` the config has, the relations between fields, and the model's
  section against the model's dataclass (:func:`jaxcap.models.fields.validate`). The first
  violation is one ``BadInput``: ``config field <path>: expected ..., got ...``.
  ``trainable``: the model trains (``num_train_steps >= 1``); default: asked of the model."""
  model_name = _get(config, "model.name")
  if model_name is not _MISSING:
    cls = registry.get(model_name)
    values = fields.validate(cls, config.model)
    # The retrieval model (nearest_neighbour) is no CaptionModel: no tables, no hook.
    longest = getattr(cls, "longest_sequence", None)
    _check_lengths(config, longest(values) if longest else None)
    trainable = getattr(cls, "trainable", True) if trainable is None else trainable
  for path, check in CHECKS.items():
    v = _get(config, path)
    if v is not _MISSING and not check.test(v):
      raise BadInput(f"config field {path}: expected {check.expected}, got {v!r}")
  steps = _get(config, "num_train_steps")
  if trainable is not False and steps is not _MISSING and steps < 1:
    raise BadInput(f"config field num_train_steps: expected an int >= 1, got {steps}")
  bleu = _get(config, "scst.bleu_weight")
  if _get(config, "scst.reward") == "device" and bleu is not _MISSING and bleu > 0:
    raise BadInput(f"config field scst.reward: 'device' computes CIDEr-D only; "
                     f"scst.bleu_weight={bleu} needs scst.reward='host'; expected "
                     f"scst.reward='host', or scst.bleu_weight=0")
  scst_runs = any(_get(config, f"scst.{k}") not in (_MISSING, -1) for k in ("start_step", "start_epoch"))
  clip_weight = _get(config, "scst.clip_weight")
  grammar_weight = _get(config, "scst.grammar_weight")
  if grammar_weight not in (_MISSING, 0, 0.0):
    for name, what in (("grammar_head", "the grammar head's weights file"),
                       ("clip_model", "the CLIP weights whose text tower it reads")):
      if not _get(config, f"scst.{name}"):
        raise BadInput(f"config field scst.{name}: scst.grammar_weight={grammar_weight} needs "
                         f"{what}; got {_get(config, f'scst.{name}')!r}")
  if clip_weight not in (_MISSING, 0, 0.0):
    # Named here; the files are read (and a missing one named) when the SCST step is built, at
    # the start of the run, before anything is written.
    for name, what in (("clip_model", "a CLIP weights file (jaxcap/clip/weights.py)"),
                       ("clip_images", "the training images: a folder or {image_id: path} JSON")):
      value = _get(config, f"scst.{name}")
      if not value:
        raise BadInput(f"config field scst.{name}: scst.clip_weight={clip_weight} needs {what}; "
                         f"got {value!r}")
  start = _get(config, "scst.start_step")
  if (scst_runs and trainable is not False and start not in (_MISSING, -1) and steps is not _MISSING
      and _get(config, "scst.start_epoch") in (_MISSING, -1) and start >= steps):
    # SCST would never start: the run trains with cross-entropy only, and says nothing.
    raise BadInput(f"config field scst.start_step: {start} is not before config field "
                     f"num_train_steps ({steps}), so no step would be self-critical; expected "
                     f"scst.start_step < num_train_steps, or -1 (no SCST)")
  samples = _get(config, "scst.num_samples")
  if _get(config, "scst.candidates") == "beam":
    # Said here too, before a run trains its cross-entropy stage for hours.
    scst_lib.check_candidates("beam", _get(config, "scst.baseline"),
                              _get(config, "scst.fused_decode") is True)
  if scst_runs and _get(config, "scst.baseline") in ("mean", "mean_all") and samples is not _MISSING and samples < 2:
    raise BadInput(f"config field scst.num_samples: scst.baseline={_get(config, 'scst.baseline')!r} "
                     f"compares each candidate with the mean of the image's candidates; expected "
                     f"at least 2, got {samples}")
  if _get(config, "decode.beam_mode") == "in_slots":
    # Refused by decoding.beam_search too; said here before a run trains for hours.
    groups, penalty = _get(config, "decode.beam_groups"), _get(config, "decode.length_penalty")
    if groups not in (_MISSING, 1):
      raise BadInput(f"config field decode.beam_groups: decode.beam_mode='in_slots' has no "
                       f"diverse groups; expected 1, got {groups}")
    if penalty not in (_MISSING, "none"):
      raise BadInput(f"config field decode.length_penalty: decode.beam_mode='in_slots' has "
                       f"no length penalty; expected 'none', got {penalty!r}")
  if _get(config, "model.attention_impl") == "cudnn":
    platforms = sorted({d.platform for d in jax.devices()})
    if platforms != ["gpu"]:
      raise BadInput(f"config field model.attention_impl: 'cudnn' runs on an NVIDIA GPU with "
                       f"cuDNN, and this host's devices are {', '.join(platforms)}; expected "
                       "'xla' or 'einsum' here")


def _check_lengths(config, longest: int | None) -> None:
  """``data.max_len + 1`` (teacher forcing's positions) and ``decode.max_len`` within the
  model's tables (``CaptionModel.longest_sequence``)."""
  if longest is None:
    return
  for path, extra in (("decode.max_len", 0), ("data.max_len", 1)):
    v = _get(config, path)
    if v is not _MISSING and isinstance(v, int) and v + extra > longest:
      more = " (+ 1 for the BOS input)" if extra else ""
      raise BadInput(f"config field {path}: the model's position table covers {longest} "
                       f"positions; expected at most {longest - extra}{more}, got {v}")


# The files a training run rewrites in its workdir (written after config.json, so a run
# directory has it before any of these): their names in a folder without one are another's.
# checkpoints/ and best/ are not among them: a run resumes from them (or sets a damaged step
# aside), it does not write over them.
_RUN_OUTPUTS = re.compile(r"^(metrics\.jsonl|tensorboard|(predictions|scores)_.+\.json)$")


def check_workdir_writable(workdir: str, overwrite: bool = False) -> None:
  """The workdir is a writable directory, or one can be created there (nothing is written);
  a folder without ``config.json`` (no run directory) that holds a file of the names training
  rewrites (``metrics.jsonl``, ``tensorboard/``, ``scores_<split>.json``, ...) is another
  program's: refused unless ``overwrite`` (``train.py --overwrite``)."""
  atomic.check_writable(workdir, f"--workdir={workdir}")
  if overwrite or not os.path.isdir(workdir) or any(
      os.path.isfile(os.path.join(workdir, n)) for n in ("config.json", atomic.FOLDER_MARKER)):
    return
  theirs = sorted(n for n in os.listdir(workdir) if _RUN_OUTPUTS.match(n))
  if theirs:
    raise BadInput(f"--workdir={workdir}: holds {theirs[0]} but no config.json: files jaxcap did "
                   "not write; expected a new or empty folder or a run directory to resume "
                   f"({atomic.OVERWRITE_FLAG} writes into it anyway)")


def splits_in_use(config) -> list[str]:
  """The splits a training run reads: train, val (validation) and the test split if tested."""
  out = ["train", "val"]
  if _get(config, "test_after_training") is True:
    test = _get(config, "test_split")
    test = "test" if test is _MISSING else test
    if test not in out:
      out.append(test)
  return out


def _indices(n: int, mode: str, sample: int) -> range | np.ndarray:
  if mode == "all" or n <= sample:
    return range(n)
  return np.unique(np.linspace(0, n - 1, sample).round().astype(int))


def check_data(dataset, config, splits=None, log=print, model=None, workdir=None) -> dict:
  """Checks the splits the run uses and their feature headers and boxes (see module doc);
  given the ``model``, also that the data has what it reads (:func:`check_model_inputs`) and,
  when the run starts from scratch in ``workdir``, the files its ``prepare_variables`` reads
  (its ``check_prepare(dataset)``, e.g. TPGN's GloVe file).

  Returns:
    ``{"images": number of images whose headers were read, "seconds": time taken}``.
  """
  data = complete_data_config(config.data)
  splits = list(splits or splits_in_use(config))
  have = tuple(dataset.splits)
  for split in splits:
    if split not in have:
      field = "test_split" if split == _get(config, "test_split") and split != "val" else "data"
      raise BadInput(f"{dataset.name}: no split {split!r} (config field {field}; the data has "
                       f"{', '.join(have)}), expected train, val and the test split "
                       "(or set test_after_training=False)")
  check_beam_size(config, len(dataset.vocab), dataset.name)
  if model is not None:
    check_model_inputs(model, dataset, config, splits, log=log)
    prepare = getattr(model, "check_prepare", None)
    if prepare is not None and _starts_fresh(workdir, config):
      prepare(dataset)
  mode = str(data.validate_features)
  if mode == "off":
    return {"images": 0, "seconds": 0.0}
  sample = int(data.validate_sample)
  truncate = bool(data.truncate_regions)
  allow_degenerate = str(data.degenerate_boxes) == "allow"
  info = dataset.info
  t0 = time.time()
  count, kinds = 0, set()
  for split in splits:
    reader = dataset.split_data(split).features
    check_file = getattr(reader, "check_file", None)
    indices = _indices(len(reader), mode, sample)
    if check_file is not None:  # image files (a run from pixels): there, and decoding whole
      kinds.add("image files")
      # Decoded on threads (Pillow's decoders release the GIL); the first damaged file, in
      # order, is the one-line refusal. A bar once the check has run for seconds (COCO's
      # 123,287 files).
      with concurrent.futures.ThreadPoolExecutor(min(32, (os.cpu_count() or 1) + 4)) as pool:
        try:
          for _ in progress.bar(pool.map(check_file, (int(i) for i in indices)),
                                f"decoding the {split} image files", total=len(indices), unit="file"):
            count += 1
        except BaseException:
          pool.shutdown(cancel_futures=True)  # not the other 100,000 decodes before the refusal
          raise
      continue
    header = getattr(reader, "header", None)
    if header is None:
      continue  # generated in memory (synthetic scenes): checked when read
    for i in progress.bar(indices, f"checking the {split} feature headers", unit="file"):
      head = header(int(i))
      if head is None:
        break  # generated in memory: checked when read
      kinds.add("feature headers and boxes")
      count += 1
      _check_header(head, info, dataset.max_regions, truncate, allow_degenerate)
  dt = time.time() - t0
  if count:
    what = " and ".join(sorted(kinds))  # what was checked: image files are not feature headers
    log(f"Checked the {what} of {count} images ({', '.join(splits)}; "
        f"data.validate_features={mode}) in {dt:.2f} s.")
  return {"images": count, "seconds": dt}


def check_beam_size(config, vocab_size: int, where: str) -> None:
  """A beam search keeps no more hypotheses than the vocabulary has words: a wider beam decodes
  for minutes and scores zeros (``where``: whose vocabulary, for the message)."""
  beam = _get(config, "decode.beam_size")
  if _get(config, "decode.method") == "beam" and fields.is_int(beam) and beam > vocab_size:
    raise BadInput(f"config field decode.beam_size: {beam} is wider than the vocabulary of "
                     f"{where} ({vocab_size} words); expected at most {vocab_size}")


def _check_header(head: dict, info: dict, max_regions: int, truncate: bool,
                  allow_degenerate: bool) -> None:
  shape, dtype, name = head["feats"]
  if len(shape) != 2:
    raise BadInput(f"{name}: features have shape {list(shape)}, expected [regions, "
                     f"{info['feature_dim']}]")
  _check_dtype(dtype, name)
  n, d = shape
  if n < 1:
    raise BadInput(f"{name}: features have zero regions, expected at least one")
  if d != info["feature_dim"]:
    raise BadInput(f"{name}: features have dimension {d}, expected {info['feature_dim']} "
                     "(the first training image's, or data.feature_dim)")
  if n > max_regions and not truncate:
    raise BadInput(f"{name}: {n} regions but config field data.max_regions is {max_regions}; "
                     f"expected max_regions >= every image's regions (or set "
                     "data.truncate_regions=True to keep the first max_regions)")
  glob = head.get("global_feat")
  if glob is not None:
    gshape, gdtype, gname = glob
    if len(gshape) != 1 or gshape[0] != info["global_dim"]:
      raise BadInput(f"{gname}: global feature has shape {list(gshape)}, expected "
                       f"[{info['global_dim']}]")
    _check_dtype(gdtype, gname)
  boxes = head.get("boxes")
  if boxes is not None:
    b, bname = boxes
    if b.shape != (n, 4):
      raise BadInput(f"{bname}: boxes have shape {list(b.shape)}, expected [{n}, 4] to match "
                       f"{name}")
    batch_lib.check_boxes(b, bname, allow_degenerate=allow_degenerate)


def _check_dtype(dtype, name: str) -> None:
  if not np.issubdtype(dtype, np.floating):
    raise BadInput(f"{name}: features have dtype {dtype}, expected floating-point "
                     "(float16 / float32 / float64)")


def _starts_fresh(workdir: str | None, config) -> bool:
  """True when a run in ``workdir`` will call the model's ``prepare_variables`` (no checkpoint
  to resume from, no ``init_from``)."""
  if config.init_from:
    return False
  if workdir is None:
    return True
  ckpt_dir = os.path.join(workdir, "checkpoints")
  return not (os.path.isdir(ckpt_dir) and any(p.isdigit() for p in os.listdir(ckpt_dir)))


def model_label(model, model_config) -> str:
  """``model 'mnmt' (variant 'mnmt7')``: how the errors about a model's inputs name it."""
  name = getattr(model, "registry_name", None) or _get(model_config, "name")
  variant = _get(model_config, "variant") if model_config is not None else _MISSING
  return f"model {name!r}" + ("" if variant in (_MISSING, None, "") else f" (variant {variant!r})")


def check_model_inputs(model, dataset, config, splits=None, log=print, model_config=None) -> None:
  """Refuses data that lacks what ``model`` reads (its ``required_inputs()``, see
  :meth:`jaxcap.models.base.CaptionModel.required_inputs`), with one line naming the config
  field: image features (text-only data, ``data.text_only``), region boxes (region features
  without ``data.box_dir``: every region would get the whole-image box), attribute words
  (``data.attributes`` / ``data.test_attributes`` 'none'), a translation source
  (``data.task``). Missing boxes are accepted only with ``data.missing_boxes='whole_image'``,
  which says once (``log``) what it substitutes.

  Args:
    model: the built model (unbound is enough).
    dataset: the run's dataset.
    config: the run's config (its ``data`` section; its ``model`` unless ``model_config``).
    splits: the splits read (default: :func:`splits_in_use`).
    model_config: the model's config, when it is not ``config.model`` (ensemble members).
  """
  needs = tuple(getattr(model, "required_inputs", lambda: ("image",))())
  data = complete_data_config(config.data)
  model_config = config.get("model") if model_config is None else model_config
  who = model_label(model, model_config)
  splits = list(splits or splits_in_use(config))
  if "src" in needs and dataset.src_vocab is None:
    raise BadInput(f"config field data.task: {who} translates a source sentence, but "
                     f"{dataset.name} has none; expected task='translate' (a dataset with "
                     "source sentences)")
  for split in splits:
    reader = dataset.split_data(split).features
    if "image" in needs and getattr(reader, "has_image", True) is False:
      instead = getattr(model, "text_only_setting", "")  # the nearest neighbour: no hooks
      alt = f" or {instead}" if instead else ""
      raise BadInput(f"config field data.text_only: {who} reads image features, but "
                       f"{dataset.name} is text-only (one all-zero region per sentence); "
                       f"expected image features (data.features_npy with "
                       f"data.text_only=False){alt}")
    if "attributes" in needs and dataset.attribute_mode(split) == "none":
      field = ("data.test_attributes" if split == "test" and str(data.test_attributes)
               else "data.attributes")
      raise BadInput(f"config field {field}: {who} attends to attribute words, but the "
                       f"{split} split reads none ({field.split('.')[1]}='none'); expected "
                       "'oracle', 'noisy' (synthetic_scenes) or 'detected' (with "
                       "data.attributes_file), or a model that reads no attributes")
  if "boxes" not in needs or dataset.max_regions <= 1:
    return  # one region per image: its box relates it to nothing
  missing = [s for s in splits
             if getattr(dataset.split_data(s).features, "has_boxes", None) is False]
  if not missing:
    return
  if str(data.missing_boxes) == "whole_image":
    log(f"warning: data.missing_boxes='whole_image': {dataset.name} has no region boxes "
        f"({', '.join(missing)}); every region gets the whole-image box [0, 0, 1, 1], so in the "
        f"spatial graph of {who} every region is every other's neighbour (no spatial "
        "information)")
    return
  field = ("data.box_dir is empty" if data.name in ("karpathy", "cocotalk")
           and data.format != "tfds" else "data (no boxes)")
  raise BadInput(f"config field {field}: {who} builds its spatial graph from region boxes, "
                   f"but {dataset.name} has none for split {missing[0]!r} (every region would "
                   "get the whole-image box: all neighbours, a graph that carries nothing); "
                   "expected data.box_dir with a [regions, 4] box file per image (or "
                   "data.missing_boxes='whole_image' to run so anyway, or "
                   "model.graph='all_neighbour')")
