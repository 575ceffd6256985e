"""A run directory (workdir): the files ``train.py`` writes and everything that reads them.

A workdir holds ``config.json`` and ``vocab.json`` (written once when training starts, checked on
every resume), ``info.json`` (the dataset's ``info``, so a run loads without its dataset),
``checkpoints/`` (latest k) and ``best/`` (best validation metric, ``config.best_metric``),
``metrics.jsonl`` and ``tensorboard/`` (:mod:`jaxcap.training.writers`), and after testing
``predictions_<split><tag>.json`` and ``scores_<split><tag>.json``. A run trained on features
``jaxcap-extract`` wrote also keeps a copy of their ``features.json`` (the backbone, its
settings and the weights' sha256), which lets :meth:`jaxcap.api.Run.caption_images` rebuild
the same extractor; runs on other features have none.

Training (:mod:`jaxcap.training.train_lib`) writes through this module; loading
(:func:`jaxcap.load`) reads through it. Checkpoints are restored here (:func:`restore`: the best,
the latest or a given step), onto one device or replicated over a mesh.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import jax

from jaxcap import data as data_lib
from jaxcap import images as images_lib
from jaxcap import progress
from jaxcap.atomic import write_json
from jaxcap.data import batch as batch_lib
from jaxcap.data.vocab import Vocab
from jaxcap.errors import BadInput
from jaxcap.evaluation import coco_metrics, files, signature
from jaxcap.evaluation import translation as translation_metrics
from jaxcap.features import extract
from jaxcap.features import record as record_lib
from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.training import checkpoint as ckpt_lib
from jaxcap.training import optim, steps
from jaxcap.training.steps import PRNG_IMPLS

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
INFO_FILE = "info.json"
# What jaxcap-extract writes next to fc/ and att/ (jaxcap.features.extract.RECORD_FILE), and
# the run's copy of it.
FEATURES_FILE = "features.json"

# The config's sections (objects; config_common.base_config's ConfigDicts: a test keeps them equal).
CONFIG_SECTIONS = ("backbone", "data", "decode", "mesh", "model", "scheduled_sampling", "scst")

# Fields that may differ between the config a checkpoint was trained with and a resumed run.
_RESUMABLE_MODEL_FIELDS = ("dropout", "dtype")


# ---------------------------------------------------------------------------------------------
# JSON files.


# ---------------------------------------------------------------------------------------------
# config.json, vocab.json, info.json.


def config_to_dict(config) -> dict:
  return json.loads(config.to_json_best_effort())


# Data fields naming files or folders: resolved against the working directory, or against
# data.root when it is set (jaxcap.data.karpathy, cocotalk, multi30k), else the working directory.
_CWD_PATHS = ("root", "tfds_dir", "vocab_file", "attributes_file")
_ROOT_PATHS = ("dataset_json", "att_dir", "fc_dir", "box_dir", "label_h5", "features_npy",
               "detections_hdf5")


def absolute_data_paths(data: dict) -> dict:
  """``data`` (a config's ``data`` as a dict) with its relative paths made absolute against
  the working directory, as the dataset reads them now: ``config.json`` then names the same
  files from any directory (a notebook's ``jaxcap.load(...).evaluate()``). Paths relative to an
  absolute ``root`` stay relative to it; empty fields stay empty."""
  out = dict(data)
  fields = _CWD_PATHS + (() if out.get("root") else _ROOT_PATHS)
  for key in fields:
    value = out.get(key)
    if isinstance(value, str) and value and not os.path.isabs(value):
      out[key] = os.path.abspath(value)
  return out


def saved_config_dict(config) -> dict:
  """What ``config.json`` holds of ``config``: its data paths absolute (:func:`absolute_data_paths`)."""
  out = config_to_dict(config)
  if isinstance(out.get("data"), dict):
    out["data"] = absolute_data_paths(out["data"])
  return out


def read_saved_config(workdir: str) -> dict:
  """The ``config.json`` a run wrote, checked: one-line ``BadInput`` naming the file when it
  is missing, not JSON, or not a config object with ``model`` and ``data``."""
  cfg_path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(cfg_path):
    raise BadInput(f"{cfg_path}: not found; expected a workdir written by train.py")
  with open(cfg_path) as f:
    try:
      saved = json.load(f)
    except (ValueError, RecursionError):  # RecursionError: arrays nested past the stack
      raise BadInput(f"{cfg_path}: not valid JSON; expected the config of the run in this workdir") from None
  _check_saved_config_shape(cfg_path, saved)
  return saved


def read_config(workdir: str):
  """:func:`read_saved_config` as an ``ml_collections.ConfigDict``."""
  import ml_collections
  return ml_collections.ConfigDict(read_saved_config(workdir))


def _check_saved_config_shape(cfg_path: str, old) -> None:
  """A workdir's config.json must be an object with ``model`` and ``data`` objects."""
  if not isinstance(old, dict):
    raise BadInput(f"{cfg_path}: a JSON {type(old).__name__}, expected the config object of "
                     "the run in this workdir")
  for key in ("model", "data"):
    if not isinstance(old.get(key), dict) or not isinstance(old[key].get("name"), str):
      raise BadInput(f"{cfg_path}: field {key!r} is {old.get(key)!r:.60}, expected an object "
                       f"with a 'name' (the config of the run in this workdir)")
  for key in CONFIG_SECTIONS:  # read as objects by every program that loads the run
    if key in old and not isinstance(old[key], dict):
      raise BadInput(f"{cfg_path}: field {key!r} is {old[key]!r:.60}, expected an object "
                       "(the config of the run in this workdir)")


def read_vocab(workdir: str) -> Vocab:
  """The run's ``vocab.json``; one line when it is missing."""
  path = os.path.join(workdir, VOCAB_FILE)
  if not os.path.exists(path):
    raise BadInput(f"{path}: not found; expected a workdir written by train.py")
  return Vocab.load(path)


def save_info(workdir: str, info: dict) -> None:
  """Writes the dataset's ``info`` to ``<workdir>/info.json`` (atomically)."""
  write_json(os.path.join(workdir, INFO_FILE),
              {k: (v.item() if isinstance(v, np.generic) else v) for k, v in info.items()})


def load_info(workdir: str, config=None) -> dict:
  """``info.json`` of a run, or (runs from before it was written) its dataset's ``info``."""
  path = os.path.join(workdir, INFO_FILE)
  if os.path.exists(path):
    with open(path) as f:
      try:
        info = json.load(f)
      except (ValueError, RecursionError) as e:  # RecursionError: arrays nested past the stack
        raise BadInput(f"{path}: not valid JSON ({e}); expected the dataset sizes train.py "
                         "wrote (delete it to rebuild it from the run's dataset)") from None
    if not isinstance(info, dict) or not {"vocab_size", "feature_dim", "max_len"} <= set(info):
      raise BadInput(f"{path}: not the dataset sizes train.py writes; expected an object with "
                       "vocab_size, feature_dim, max_len, ... (delete it to rebuild it)")
    return info
  try:
    return dict(data_lib.get_dataset(config.data).info)
  except (OSError, BadInput) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise BadInput(f"{path}: not found (a run from before info.json was saved), and its dataset "
                     f"{config.data.name!r} could not be read to rebuild it: {first}") from None


_MISSING = object()


def _model_config_diff(old: dict, new: dict) -> list[str]:
  """Model config keys whose values differ. A key that only one side has (a field added to a
  model after the run started) counts as equal when that side's value is the model's default,
  since the model built from the other side gets that default too."""
  try:
    defaults = {f.name: f.default for f in dataclasses.fields(registry.get(new.get("name")))
                if f.default is not dataclasses.MISSING}
  except (ValueError, TypeError):  # unknown model name / not a dataclass: no key may be missing
    defaults = {}
  diff = []
  for k in sorted(set(old) | set(new)):
    a, b = old.get(k, _MISSING), new.get(k, _MISSING)
    if a == b:
      continue
    if _MISSING in (a, b):
      present = b if a is _MISSING else a
      if k in defaults and defaults[k] == present:
        continue
    diff.append(k)
  return diff


def check_workdir(workdir: str, config, vocab: Vocab, init_from: bool = False) -> None:
  """Refuses a workdir trained with another model/data or another vocabulary; writes nothing.
  ``init_from``: the workdir is the run that ``config.init_from`` names (the messages say so)."""
  fix = ("expected config field init_from to name a run of the same model, data and vocabulary"
         if init_from else "use another --workdir")
  what = "the init_from run" if init_from else "this workdir"
  cfg_path = os.path.join(workdir, CONFIG_FILE)
  if os.path.exists(cfg_path):
    old = read_saved_config(workdir)
    new = saved_config_dict(config)  # as it would be written: data paths resolved
    old_model = {k: v for k, v in old.get("model", {}).items() if k not in _RESUMABLE_MODEL_FIELDS}
    new_model = {k: v for k, v in new["model"].items() if k not in _RESUMABLE_MODEL_FIELDS}
    diff = _model_config_diff(old_model, new_model)
    if diff:
      raise BadInput(f"{cfg_path}: {what} holds checkpoints of another model (model.{diff[0]}: "
                       f"{old_model.get(diff[0], '<absent>')!r} there, "
                       f"{new_model.get(diff[0], '<absent>')!r} now); "
                       + ("expected the same model config, or use another --workdir" if not init_from else fix))
    # A run from pixels: the backbone's architecture is part of the model (its learning rate,
    # freeze and remat are not).
    for field in ("name", "fields"):
      was, now = (c.get("backbone", {}).get(field, "") for c in (old, new))
      if was != now:
        raise BadInput(f"{cfg_path}: {what} holds checkpoints of another model (backbone.{field}: "
                         f"{was!r} there, {now!r} now); {fix}")
    old_impl, new_impl = old.get("prng_impl", PRNG_IMPLS[0]), new.get("prng_impl", PRNG_IMPLS[0])
    if old_impl != new_impl and os.path.isdir(os.path.join(workdir, "checkpoints")) and not init_from:
      raise BadInput(f"{cfg_path}: this workdir's checkpoints were trained with prng_impl="
                       f"{old_impl!r}, not {new_impl!r} (its key has another shape); expected the "
                       "same prng_impl, or use another --workdir")
    if old.get("data", {}).get("name") != new["data"]["name"]:
      raise BadInput(f"{cfg_path}: {what} was trained on data.name="
                       f"{old.get('data', {}).get('name')!r}, not {new['data']['name']!r}; {fix}")
  vocab_path = os.path.join(workdir, VOCAB_FILE)
  if os.path.exists(vocab_path):
    saved = Vocab.load(vocab_path)
    if saved != vocab:
      raise BadInput(f"{vocab_path}: {'the init_from run' if init_from else 'the checkpoint'}'s "
                       f"vocabulary ({len(saved)} words) does not match the data's ({len(vocab)} "
                       f"words); {fix if init_from else 'use the same data and data.min_word_count'}")


def features_record_source(data_config) -> str | None:
  """The ``features.json`` ``jaxcap-extract`` wrote for the run's features: in the folder that
  holds ``att_dir`` (else ``fc_dir``), else in ``data.root``; None when there is none."""
  get = data_config.get
  root = get("root") or ""
  folders = []
  for field in ("att_dir", "fc_dir"):
    d = get(field) or ""
    if d:
      folders.append(os.path.dirname(os.path.normpath(d if os.path.isabs(d) else os.path.join(root, d))))
  if root:
    folders.append(root)
  for folder in folders:
    path = os.path.join(folder, FEATURES_FILE)
    if os.path.isfile(path):
      return path
  return None


def read_features_record(workdir: str) -> dict | None:
  """The run's copy of ``features.json`` (None for a run without one); one line when damaged."""
  path = os.path.join(workdir, FEATURES_FILE)
  if not os.path.exists(path):
    return None
  return record_lib.read(path)


def backbone(workdir: str | None, weights: str | None = None):
  """The extractor the run's features came from (:class:`jaxcap.features.record.Backbone`:
  the recorded architecture with ``weights``, whose sha256 must be the recorded one, or the
  recorded seed's random weights); one line for a run without ``features.json``."""
  record = read_features_record(workdir) if workdir else None
  if record is None:
    raise BadInput(f"{workdir}: no {FEATURES_FILE}; this run was trained on features "
                     "jaxcap-extract did not write, so it cannot caption image files (caption "
                     f"feature arrays with Run.caption); {images_lib.IMAGE_RUNS}")
  return record_lib.Backbone(record, weights, os.path.join(workdir, FEATURES_FILE))


def _read_json_or_fail(path: str):
  return extract.read_json(path, "the features.json jaxcap-extract wrote")


def _check_features_record(workdir: str, config) -> None:
  """A resumed run's features must come from the backbone its copy of features.json names."""
  saved = os.path.join(workdir, FEATURES_FILE)
  source = features_record_source(config.data)
  if source is None or not os.path.exists(saved):
    return
  new, old = _read_json_or_fail(source), _read_json_or_fail(saved)
  if new != old:
    key = sorted(k for k in set(new) | set(old) if new.get(k) != old.get(k))[0]
    raise BadInput(f"{source}: the features have {key}={new.get(key)!r}, this workdir's run was "
                     f"trained on {key}={old.get(key)!r} ({saved}); expected the same features, "
                     "or use another --workdir")


def init_workdir(workdir: str, config, vocab: Vocab, info: dict | None = None) -> None:
  """Writes ``config.json``, ``vocab.json``, the dataset's ``info.json`` (what
  ``jaxcap.load`` rebuilds the model from without the dataset) and the copy of the features'
  ``features.json`` (:func:`features_record_source`) once, atomically."""
  check_workdir(workdir, config, vocab)
  _check_features_record(workdir, config)
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  if not os.path.exists(os.path.join(workdir, CONFIG_FILE)):
    write_json(os.path.join(workdir, CONFIG_FILE), saved_config_dict(config))
  if not os.path.exists(os.path.join(workdir, VOCAB_FILE)):
    vocab.save(os.path.join(workdir, VOCAB_FILE))
  if info is not None and not os.path.exists(os.path.join(workdir, INFO_FILE)):
    save_info(workdir, info)
  source = features_record_source(config.data)
  if source is not None and not os.path.exists(os.path.join(workdir, FEATURES_FILE)):
    write_json(os.path.join(workdir, FEATURES_FILE), _read_json_or_fail(source))


# ---------------------------------------------------------------------------------------------
# Checkpoints.


def best_metric(config) -> str:
  """The validation metric that selects ``best/`` (``CIDEr`` or ``Bleu_4``)."""
  name = config.get("best_metric", "CIDEr")
  if name not in ("CIDEr", "Bleu_4"):
    raise BadInput(f"config field best_metric: expected 'CIDEr' or 'Bleu_4', got {name!r}")
  return name


def checkpoints(workdir: str, config):
  """The checkpoint managers of ``workdir`` (``checkpoints/`` and ``best/``,
  :class:`jaxcap.training.checkpoint.Checkpoints`); close them."""
  return ckpt_lib.Checkpoints(workdir, keep=int(config.get("keep_checkpoints", 3)),
                              best_metric=best_metric(config),
                              asynchronous=bool(config.get("async_checkpoints", True)))


def abstract_state(model, config, info: dict, sharding):
  """The shapes, dtypes and ``sharding`` of the train state (parameters, optimiser state, step,
  RNG) a checkpoint of ``model`` holds, traced on a dummy batch, not computed."""
  import jax.numpy as jnp
  batch = jax.tree.map(jnp.asarray, batch_lib.dummy(info, 2))
  tx, _ = optim.make_optimizer(config, 1, frozen_collections=getattr(model, "frozen_collections", ()))

  def init_state():
    variables = model.init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"]), train=False)
    return steps.create_state(variables, tx, steps.rng_key(0, config))

  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      jax.eval_shape(init_state))


def restore_or_fail(ckpts, abstract, **kwargs):
  """``ckpts.restore(...)`` with a damaged checkpoint as one line naming its directory."""
  try:
    return ckpts.restore(abstract, **kwargs)
  except ckpt_lib.TreeMismatchError:
    raise  # Already one line naming the step directory.
  except Exception as e:  # orbax / tensorstore / json errors of damaged files
    which = kwargs.get("which", "latest")
    step = kwargs.get("step") or (ckpts.latest_step() if which == "latest" else ckpts.best_step())
    path = os.path.join(ckpts.workdir, "checkpoints" if which == "latest" else "best", str(step))
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise BadInput(f"{path}: damaged checkpoint ({type(e).__name__}: {first}); expected an "
                     "intact orbax checkpoint (delete this step directory to resume from an "
                     "earlier one, or use a new --workdir)") from None


def restore(workdir: str, config, model, info: dict, step: int | None = None, *, sharding=None,
            ckpts=None):
  """The train state of ``workdir``'s best checkpoint (else its latest), or of ``step`` (from
  either manager), placed with ``sharding`` (default: the first local device).

  Args:
    ckpts: open managers of ``workdir`` to read (left open); default: opened and closed here.

  Raises:
    BadInput: one line, when there is no checkpoint (at ``step``) or it is damaged.
  """
  if sharding is None:
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = abstract_state(model, config, info, sharding)
  own = ckpts is None
  if own:
    ckpts = checkpoints(workdir, config)
  try:
    if step is not None:
      which = ckpts.find_step(int(step))
      if which is None:
        raise BadInput(f"{workdir}: no checkpoint at step {step}; expected one of latest "
                         f"{list(ckpts.latest.all_steps())} and best {list(ckpts.best.all_steps())}")
    else:
      which = "best" if ckpts.best_step() is not None else "latest"
    state, _ = restore_or_fail(ckpts, abstract, step=step, which=which)
  finally:
    if own:
      ckpts.close()
  if state is None:
    raise BadInput(f"{workdir}: no checkpoint found (expected checkpoints/ or best/)")
  return state


# ---------------------------------------------------------------------------------------------
# Predictions and scores.


def write_scores(workdir, split, preds, refs, spice=False, tag="", translation=False,
                 made_by: dict | None = None, caption_postprocess: str = "none", clip=None):
  """Scores ``preds`` against ``refs`` and writes ``predictions_<split><tag>.json`` and
  ``scores_<split><tag>.json`` to ``workdir``; prints the metric table (x100), the scores'
  signature line and the files' paths. ``translation``: German-output metrics
  (:mod:`jaxcap.evaluation.translation`: sacreBLEU with its signature, METEOR ``-l de``,
  CIDEr-D). ``made_by``: what is known of how the captions were made (the keyword arguments of
  :func:`jaxcap.evaluation.signature.build`: config, vocab, step, decode, ...); the file's
  ``"signature"`` holds them with the metrics' side. ``caption_postprocess``
  (:data:`jaxcap.evaluation.coco_metrics.CAPTION_POSTPROCESS`) is applied to the captions
  before they are scored; the predictions file keeps them as generated. ``clip``: a
  :class:`jaxcap.clip.metrics.Prepared` adding the CLIP scores (of the captions as generated)."""
  if translation:
    if caption_postprocess != "none":
      raise BadInput(f"caption_postprocess={caption_postprocess!r}: translation runs are scored "
                       "as generated; expected 'none'")
    scores = translation_metrics.score(refs, preds)
  else:
    # Said when it takes seconds: METEOR and the PTB tokenizer start a Java process each.
    names = [{"Bleu": "BLEU"}.get(m) or coco_metrics.DISPLAY_NAMES[m] for m in coco_metrics.default_metrics()]
    with progress.phase(f"scoring {len(preds)} captions ({', '.join(names)}"
                        f"{', SPICE' if spice else ''})"):
      scores = coco_metrics.score(refs, preds, spice=spice, caption_postprocess=caption_postprocess)
  if clip is not None:
    clip.add(scores, preds, refs)
  made_by = dict(made_by or {})
  made_by.setdefault("split", split)
  made_by.setdefault("num_images", len(preds))
  scores["signature"] = signature.build(metrics=scores["signature"], **made_by)
  paths = [os.path.join(workdir, f"predictions_{split}{tag}.json"),
           os.path.join(workdir, f"scores_{split}{tag}.json")]
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    write_json(paths[0], [{"image_id": k, "caption": v} for k, v in preds.items()])
    # per_image as [{"image_id": id, ...}]: the ids keep the predictions' type (files.scores_json).
    write_json(paths[1], files.scores_json(scores))
  print_scores(scores, f"{split} ({len(preds)} images)", f"{paths[1]} and {os.path.basename(paths[0])}")
  return scores


def print_scores(scores: dict, title: str, wrote: str) -> None:
  """What every scoring prints (train.py's test, evaluate.py's forms): the metric table, the
  signature line under it, a note per CLIP score that ``max(cos, 0)`` clipped
  (:func:`clip_notes`: a table of CLIP-S 0.00 otherwise reads as broken) and
  the files written."""
  print(format_table(scores["overall"], title=title), flush=True)
  print(f"signature: {signature.line(scores['signature'])}", flush=True)
  for line in clip_notes(scores):
    print(line, flush=True)
  print(f"wrote {wrote}", flush=True)


def clip_notes(scores) -> list[str]:
  """One line per CLIP score that ``max(cos, 0)`` clipped to 0 somewhere (``scores``'
  ``clip_cosines``), saying so: random stand-in weights give cosines <= 0 for most captions,
  and a table of 0.00 then reads as a broken scorer."""
  out = []
  for name, c in (scores.get("clip_cosines") or {}).items():
    if not c.get("clipped"):
      continue
    source = "clipscore.py" if name == "CLIP-S" else "pacscore"
    ref = f" (Ref{name}, their harmonic mean with it, is 0 there too)" if f"Ref{name}" in scores["overall"] else ""
    out.append(f"note: {name}: {c['clipped']} of {c['pairs']} cosines <= 0 were clipped to 0 "
               f"({c['w']:g} * max(cos, 0), {source}'s reading; mean cosine {c['mean_cosine']:.3f})"
               f"{ref}; real CLIP weights rarely give a cosine <= 0, random stand-in weights mostly do")
  return out


def made_by(config, vocab, info, *, split: str, step=None, decode=None, workdir=None,
            dataset=None, members=(), weights=None) -> dict:
  """:func:`write_scores`'s ``made_by`` for a run: its config, vocabulary, dataset info,
  checkpoint ``step``, the ``decode`` options used (a dict or ConfigDict), its ``features.json``
  (in ``workdir``) or else the split's feature file names (from ``dataset``), and an
  ensemble's ``members`` and ``weights``."""
  if decode is not None and hasattr(decode, "to_dict"):
    decode = decode.to_dict()
  names = None
  if dataset is not None and split in getattr(dataset, "splits", ()):
    feats = dataset.split_data(split).features
    names = [feats.name(i) for i in range(len(feats))]
  # The config as config.json holds it (absolute data paths): training's scores and a later
  # evaluation from another directory hash the same config.
  config = saved_config_dict(config) if hasattr(config, "to_json_best_effort") else config
  return dict(config=config, vocab=vocab, info=info, step=step, decode=decode, workdir=workdir,
              feature_names=names, members=members, weights=weights)


def caption_postprocess(config) -> str:
  """The run's ``caption_postprocess`` (``"none"`` for a config made before the field)."""
  return str(config.get("caption_postprocess", "none")) if config is not None else "none"


def format_table(overall: dict, title: str = "") -> str:
  """Every printed table: the scores x100 (sacreBLEU is 0-100 already), named as the papers
  write them (:data:`jaxcap.evaluation.coco_metrics.DISPLAY_NAMES`), its first line saying so
  (with a title or without); the files keep pycocoevalcap's keys and each metric's own scale
  (CIDEr-D 0-10, BLEU / METEOR / ROUGE-L 0-1, ...: the comment above coco_metrics.DISPLAY_NAMES)."""
  names = [k for k in coco_metrics.DISPLAY_NAMES if k in overall]
  head = " | ".join(f"{coco_metrics.DISPLAY_NAMES[n]:>9}" for n in names)
  vals = " | ".join(f"{overall[n] * coco_metrics.display(n)[1]:9.2f}" for n in names)
  scale = coco_metrics.scale_label(names)
  return (f"{title}, {scale}" if title else scale) + "\n" + head + "\n" + vals
