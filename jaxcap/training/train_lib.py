"""The training loop: config -> data -> jitted data-parallel steps -> validation -> checkpoints.

``train_and_evaluate(config, workdir)`` is what ``train.py`` runs. A workdir holds
``config.json`` and ``vocab.json`` (written once, checked on every resume), ``info.json`` (the
dataset's ``info``, for ``jaxcap.load``), ``checkpoints/``
(latest k), ``best/`` (best validation CIDEr-D), ``metrics.jsonl`` and ``tensorboard/``, and after
testing ``predictions_<split>.json`` and ``scores_<split>.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
import time
from typing import Any

import numpy as np
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap import data as data_lib
from jaxcap import decoding
from jaxcap.data import pipeline
from jaxcap.data.vocab import Vocab
from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.training import checkpoint as ckpt_lib
from jaxcap.training import guard as guard_lib
from jaxcap.training import optim, parallel, steps, validation
from jaxcap.training import writers as writer_lib
from jaxcap.training.writers import MetricWriter

# Fields that may differ between the config a checkpoint was trained with and a resumed run.
_RESUMABLE_MODEL_FIELDS = ("dropout", "dtype")


def _write_json_atomic(path: str, obj) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


def config_to_dict(config) -> dict:
  return json.loads(config.to_json_best_effort())


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


def read_saved_config(workdir: str) -> dict:
  """The ``config.json`` a run wrote, checked: one-line ``ValueError`` naming the file when it
  is missing, not JSON, or not a config object with ``model`` and ``data``."""
  cfg_path = os.path.join(workdir, "config.json")
  if not os.path.exists(cfg_path):
    raise ValueError(f"{cfg_path}: not found; expected a workdir written by train.py")
  with open(cfg_path) as f:
    try:
      saved = json.load(f)
    except ValueError:
      raise ValueError(f"{cfg_path}: not valid JSON; expected the config of the run in this workdir") from None
  _check_saved_config_shape(cfg_path, saved)
  return saved


def check_workdir(workdir: str, config, vocab: Vocab) -> None:
  """Refuses a workdir trained with another model/data or another vocabulary; writes nothing."""
  cfg_path = os.path.join(workdir, "config.json")
  if os.path.exists(cfg_path):
    old = read_saved_config(workdir)
    new = config_to_dict(config)
    old_model = {k: v for k, v in old.get("model", {}).items() if k not in _RESUMABLE_MODEL_FIELDS}
    new_model = {k: v for k, v in new["model"].items() if k not in _RESUMABLE_MODEL_FIELDS}
    diff = _model_config_diff(old_model, new_model)
    if diff:
      raise ValueError(f"{cfg_path}: this workdir holds checkpoints of another model "
                       f"(model.{diff[0]}: {old_model.get(diff[0], '<absent>')!r} there, "
                       f"{new_model.get(diff[0], '<absent>')!r} now); "
                       "expected the same model config, or use another --workdir")
    if old.get("data", {}).get("name") != new["data"]["name"]:
      raise ValueError(f"{cfg_path}: this workdir was trained on data.name="
                       f"{old.get('data', {}).get('name')!r}, not {new['data']['name']!r}; use another --workdir")
  vocab_path = os.path.join(workdir, "vocab.json")
  if os.path.exists(vocab_path):
    saved = Vocab.load(vocab_path)
    if saved != vocab:
      raise ValueError(f"{vocab_path}: the checkpoint's vocabulary ({len(saved)} words) does not match "
                       f"the data's ({len(vocab)} words); use the same data and data.min_word_count")


def _check_saved_config_shape(cfg_path: str, old) -> None:
  """A workdir's config.json must be an object with ``model`` and ``data`` objects."""
  if not isinstance(old, dict):
    raise ValueError(f"{cfg_path}: a JSON {type(old).__name__}, expected the config object of "
                     "the run in this workdir")
  for key in ("model", "data"):
    if not isinstance(old.get(key), dict) or not isinstance(old[key].get("name"), str):
      raise ValueError(f"{cfg_path}: field {key!r} is {old.get(key)!r:.60}, expected an object "
                       f"with a 'name' (the config of the run in this workdir)")


def init_workdir(workdir: str, config, vocab: Vocab, info: dict | None = None) -> None:
  """Writes ``config.json``, ``vocab.json`` and the dataset's ``info.json`` (what
  ``jaxcap.load`` rebuilds the model from without the dataset) once, atomically."""
  check_workdir(workdir, config, vocab)
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  if not os.path.exists(os.path.join(workdir, "config.json")):
    _write_json_atomic(os.path.join(workdir, "config.json"), config_to_dict(config))
  if not os.path.exists(os.path.join(workdir, "vocab.json")):
    vocab.save(os.path.join(workdir, "vocab.json"))
  if info is not None and not os.path.exists(os.path.join(workdir, "info.json")):
    from jaxcap import api
    api.save_info(workdir, info)


def sample_batch(dataset, split: str, batch_size: int) -> dict:
  """A deterministic batch for shape inference (model init)."""
  return next(iter(pipeline.eval_batches(dataset.split(split), batch_size, num_threads=0)))


def init_params(model, batch: dict, seed: int, mesh):
  batch = jax.tree.map(jnp.asarray, batch)
  tokens = shift_right(jnp.asarray(batch["captions"]))
  init = jax.jit(functools.partial(model.init, train=False), out_shardings=parallel.replicated(mesh))
  return init(jax.random.PRNGKey(seed), batch, tokens)


class Trainer:
  """Holds the jitted functions of one run; ``fit`` runs the loop."""

  def __init__(self, config, workdir: str, dataset=None):
    self.config = config
    self.workdir = workdir
    self.dataset = dataset if dataset is not None else data_lib.get_dataset(config.data)
    self.info = dict(self.dataset.info)
    self.model = registry.build(config.model, self.info)
    self.mesh = parallel.make_mesh()
    n_dev = self.mesh.devices.size
    self.eval_batch_size = int(math.ceil(config.eval_batch_size / n_dev) * n_dev)
    self.num_train = len(self.dataset.split("train"))
    self.steps_per_epoch = max(1, self.num_train // config.batch_size)
    self.tx, self.schedule = optim.make_optimizer(
        config, self.steps_per_epoch, frozen_collections=getattr(self.model, "frozen_collections", ()))
    self._decode_fns: dict = {}

  def with_model(self, model, workdir: str | None = None) -> "Trainer":
    """This trainer's config, data and mesh decoding ``model`` instead (e.g. an ensemble, see
    :mod:`jaxcap.ensemble`) and writing to ``workdir``; its jitted functions are built afresh
    for that model, and this trainer is left as it was."""
    other = copy.copy(self)
    other.model = model
    other.workdir = self.workdir if workdir is None else workdir
    other._decode_fns = {}
    for name, attr in vars(type(self)).items():
      if isinstance(attr, functools.cached_property):
        other.__dict__.pop(name, None)
    return other

  # ---------------------------------------------------------------- state
  def initial_state(self):
    batch = sample_batch(self.dataset, "train", min(2, self.num_train))
    params = init_params(self.model, batch, self.config.seed, self.mesh)
    state = steps.create_state(params, self.tx, jax.random.PRNGKey(self.config.seed + 1))
    return jax.device_put(state, parallel.replicated(self.mesh))

  def abstract_state(self):
    """The shapes, dtypes and shardings of :meth:`initial_state`, traced, not computed: all a
    restore needs (loading a checkpoint compiles no initialisation: seconds sooner)."""
    batch = jax.tree.map(jnp.asarray, sample_batch(self.dataset, "train", min(2, self.num_train)))

    def init():
      params = self.model.init(jax.random.PRNGKey(self.config.seed), batch, shift_right(batch["captions"]),
                               train=False)
      return steps.create_state(params, self.tx, jax.random.PRNGKey(self.config.seed + 1))

    repl = parallel.replicated(self.mesh)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=repl), jax.eval_shape(init))

  # ---------------------------------------------------------------- jitted steps
  @functools.cached_property
  def _train_step(self):
    fn = guard_lib.guarded(functools.partial(steps.train_step, model=self.model, tx=self.tx,
                                             label_smoothing=self.config.label_smoothing))
    repl, data = parallel.replicated(self.mesh), parallel.batch_sharding(self.mesh)
    if self.config.scheduled_sampling.start_epoch >= 0:
      return jax.jit(lambda s, b, p: fn(s, b, ss_prob=p), in_shardings=(repl, data, repl),
                     out_shardings=(repl, repl), donate_argnums=0)
    return jax.jit(lambda s, b, p: fn(s, b), in_shardings=(repl, data, repl),
                   out_shardings=(repl, repl), donate_argnums=0)

  @functools.cached_property
  def _scst_step(self):
    from jaxcap.training import scst
    return scst.make_scst_step(self)

  def ss_prob(self, step: int) -> float:
    ss = self.config.scheduled_sampling
    if ss.start_epoch < 0:
      return 0.0
    epoch = step // self.steps_per_epoch
    if epoch < ss.start_epoch:
      return 0.0
    k = (epoch - ss.start_epoch) // max(1, ss.increase_every_epochs)
    return float(min(ss.increase_prob * k, ss.max_prob))

  def decode_fn(self, decode_config, all_sequences: bool = False):
    key = json.dumps(decode_config.to_dict(), sort_keys=True) + f";all={all_sequences}"
    if key not in self._decode_fns:
      model, cfg = self.model, decode_config
      data = parallel.batch_sharding(self.mesh)
      bad = decoding.bad_ending_ids(self.dataset.vocab)

      def run(params, batch, rng):
        out = decoding.decode(model, params, batch, cfg, rng=rng, bad_endings=bad)
        tokens = out.tokens
        if tokens.ndim == 3 and not all_sequences:  # beams / samples: the best (first) one
          tokens = tokens[:, 0]
        return tokens

      self._decode_fns[key] = jax.jit(run, in_shardings=(parallel.replicated(self.mesh), data, None),
                                      out_shardings=data)
    return self._decode_fns[key]

  # ---------------------------------------------------------------- evaluation
  def predict(self, params, split: str, decode_config=None, num_images: int = -1, seed: int = 0,
              all_sequences: bool = False):
    """Decodes a split (or its first ``num_images``): ``{image_id: caption}``, or with
    ``all_sequences`` ``{image_id: [caption, ...]}`` (every beam / sample, best first)."""
    decode_config = decode_config or self.config.decode
    source = self.dataset.split(split)
    if num_images and 0 < num_images < len(source):
      source = _Prefix(source, num_images)
    ids = self.dataset.image_ids(split)
    fn = self.decode_fn(decode_config, all_sequences)
    local_bs = self.eval_batch_size // jax.process_count()
    preds = {}
    rng = jax.random.PRNGKey(seed)
    for k, batch in enumerate(pipeline.eval_batches(source, local_bs, shard_index=jax.process_index(),
                                                    shard_count=jax.process_count())):
      gbatch = parallel.shard_batch(batch, self.mesh)
      tokens = parallel.to_host(fn(params, gbatch, jax.random.fold_in(rng, k)))
      index = parallel.to_host(gbatch["image_index"])
      valid = parallel.to_host(gbatch["valid"])
      for row, i, ok in zip(tokens, index, valid):
        if ok:
          if all_sequences:
            rows = row.reshape(-1, row.shape[-1])
            preds[ids[int(i)]] = [self.dataset.vocab.decode(r) for r in rows]
          else:
            preds[ids[int(i)]] = self.dataset.vocab.decode(row)
    return preds

  def predict_n(self, params, split: str, n: int, method: str = "sample", decode_config=None,
                seed: int = 0) -> dict:
    """``n`` captions per image (self-critical.pytorch's ``sample_n``): ``{image_id: [...]}``.

    Args:
      method: ``"sample"`` (n samples with the decode config's temperature / top-k / top-p)
        or ``"beam"`` (the n best hypotheses of a beam search of size n).
    """
    if n < 1 or method not in ("sample", "beam"):
      raise ValueError(f"sample_n: expected n >= 1 and method 'sample' or 'beam', got {n}, "
                       f"{method!r}")
    cfg = ml_collections.ConfigDict((decode_config or self.config.decode).to_dict())
    cfg.method = method
    if method == "sample":
      cfg.num_samples = n
    else:
      cfg.beam_size = n
    return self.predict(params, split, cfg, seed=seed, all_sequences=True)

  def references(self, split: str, image_ids) -> dict:
    refs = self.dataset.references(split)
    return {i: refs[i] for i in image_ids}

  def validate(self, params, step: int) -> dict:
    from jaxcap.evaluation import coco_metrics
    preds = self.predict(params, "val", num_images=self.config.eval_num_images)
    refs = self.references("val", preds.keys())
    scores = coco_metrics.score(refs, preds, metrics=("Bleu", "CIDEr"), tokenize=False, log=lambda *_: None)
    return {"CIDEr": scores["overall"]["CIDEr"], "Bleu_4": scores["overall"]["Bleu_4"]}

  # ---------------------------------------------------------------- loop
  def fit(self):
    config, workdir = self.config, self.workdir
    if config.get("init_from", ""):  # Checked before anything is written.
      _check_init_from(config.init_from, config, self.dataset.vocab)
    # Splits, feature headers, boxes, the model's inputs and files: before writing.
    validation.check_data(self.dataset, config, model=self.model, workdir=workdir)
    local_bs = parallel.local_batch_size(config.batch_size, self.mesh)
    init_workdir(workdir, config, self.dataset.vocab, self.info)
    ckpts = ckpt_lib.Checkpoints(workdir, keep=config.keep_checkpoints, best_metric=_best_metric(config))
    self.ckpts = ckpts  # for load(); close() closes it, also when the loop raises
    patience, stale = int(config.get("early_stopping_patience", 0)), 0
    train_source = self.dataset.split("train")
    it = pipeline.make_train_iterator(train_source, local_bs, seed=config.seed,
                                      num_workers=config.data.get("num_workers", 0))
    state = self.initial_state()
    start = 0
    # The newest intact step (a damaged one is reported and set aside), then metrics.jsonl
    # without the lines a killed run wrote past it (before the writer opens the file).
    restored, data_state, _ = ckpts.resume(ckpt_lib.abstract(state))
    if restored is not None:
      state = jax.device_put(restored, parallel.replicated(self.mesh))
      it.set_state(data_state)
      start = int(state.step)
      print(f"Resumed from {workdir}/checkpoints at step {start}.", flush=True)
    writer_lib.drop_lines_after(workdir, start)
    writer = MetricWriter(workdir)  # after the restore: a damaged checkpoint adds no event file
    if restored is None and config.get("init_from", ""):
      state = self.init_from(state, config.init_from)
    elif restored is None:
      state = self.prepare_variables(state)
    scst_start = optim.scst_start_step(config, self.steps_per_epoch)
    monitor = guard_lib.Monitor(config.get("nonfinite", "stop"), self.dataset.image_ids("train"), writer)
    bar = _progress(config.num_train_steps, start)
    window, t_window, n_window = None, time.time(), 0
    # The bar's loss / reward between logs: the window's running mean, fetched at most once per
    # refresh interval (one device sync); validation scores stay in it until the next ones.
    postfix, t_postfix = {}, 0.0
    step = start
    for step in range(start, config.num_train_steps):
      host_batch = next(it)
      batch = parallel.shard_batch(host_batch, self.mesh)
      if 0 <= scst_start <= step:
        state, metrics = self._scst_step(state, batch, step)
      else:
        state, metrics = self._train_step(state, batch, jnp.float32(self.ss_prob(step)))
      metrics, guard = guard_lib.split_metrics(metrics)
      monitor.add(step + 1, guard, host_batch)
      window = dict(metrics) if window is None else {k: window.get(k, 0.0) + v for k, v in metrics.items()} | {
          k: v for k, v in window.items() if k not in metrics}
      n_window += 1
      done = step + 1
      if (done % config.log_every_steps == 0 or done % config.eval_every_steps == 0
          or done % config.checkpoint_every_steps == 0 or done == config.num_train_steps):
        try:  # Before anything is logged, validated or saved (jaxcap/training/guard.py).
          skipped = monitor.check(ckpts.latest_step())
        except guard_lib.NonFiniteError:
          if bar is not None:
            bar.close()
          writer.close()
          raise
        window["skipped"] = window.get("skipped", 0.0) + skipped
      if done % config.log_every_steps == 0 or done == config.num_train_steps:
        skipped = window.pop("skipped", 0.0)
        m = jax.device_get(window)
        dt = time.time() - t_window
        summary = _summarise(m)
        summary.update(lr=float(self.schedule(step)), images_per_sec=n_window * config.batch_size / max(dt, 1e-9),
                       epoch=done / self.steps_per_epoch)
        if monitor.skipped_total:
          summary.update(skipped=skipped, skipped_total=monitor.skipped_total)
        writer.write(done, summary, prefix="train/")
        if bar is not None:
          postfix = _postfix(postfix, summary)
          bar.set_postfix(postfix, refresh=False)
          t_postfix = time.time()
        window, t_window, n_window = None, time.time(), 0
      elif bar is not None and time.time() - t_postfix >= bar.mininterval:
        postfix = _postfix(postfix, _summarise(jax.device_get(window)))
        bar.set_postfix(postfix, refresh=False)
        t_postfix = time.time()
      if bar is not None:
        bar.update(1)
      if done % config.eval_every_steps == 0 or done == config.num_train_steps:
        val = self.validate(state.params, done)
        writer.write(done, val, prefix="val/")
        improved = ckpts.save_best_if_improved(done, state, it.get_state(), val)
        msg = f"step {done}: val CIDEr-D {val['CIDEr']:.4f} BLEU-4 {val['Bleu_4']:.4f}" + (" (best)" if improved else "")
        if bar is not None:
          postfix = _postfix(postfix, {f"val_{k}": v for k, v in val.items()})
          bar.set_postfix(postfix, refresh=False)
        (bar.write if bar is not None else print)(msg)
        stale = 0 if improved else stale + 1
        if patience and stale >= patience:  # early stopping on the best metric
          ckpts.save_latest(done, state, it.get_state())
          (bar.write if bar is not None else print)(
              f"step {done}: early stop, no {_best_metric(config)} improvement in {patience} evaluations")
          break
      if done % config.checkpoint_every_steps == 0 or done == config.num_train_steps:
        ckpts.save_latest(done, state, it.get_state())
    if bar is not None:
      bar.close()
    writer.close()
    return state

  def prepare_variables(self, state):
    """A fresh run's state with the model's data-derived constants filled in (once).

    A model with a ``prepare_variables(variables, dataset)`` method (TPGN: the mean training
    feature v̄ of its eq. 9) computes them here, before the first step; from then on they are
    part of the checkpointed state, so resuming, ``init_from`` and evaluation never recompute them.
    """
    prepare = getattr(self.model, "prepare_variables", None)
    if prepare is None:
      return state
    params = jax.device_put(prepare(jax.device_get(state.params), self.dataset),
                            parallel.replicated(self.mesh))
    return state.replace(params=params)

  def init_from(self, state, source_workdir: str):
    """``state`` with the parameters of another run's best (else latest) checkpoint.

    The source must hold the same model (``config.json``) and vocabulary (``vocab.json``);
    nothing is written to it. The optimiser state and the step stay those of ``state``.
    """
    _check_init_from(source_workdir, self.config, self.dataset.vocab)
    src = ckpt_lib.Checkpoints(source_workdir, keep=self.config.keep_checkpoints)
    try:
      which = "best" if src.best_step() is not None else "latest"
      restored, _ = src.restore(ckpt_lib.abstract(state), which=which)
    finally:
      src.close()
    if restored is None:
      raise ValueError(f"{source_workdir}: config field init_from names a workdir with no "
                       "checkpoint (expected checkpoints/ or best/)")
    print(f"Initialised from {source_workdir} ({which} checkpoint, step {int(restored.step)}).",
          flush=True)
    params = jax.device_put(restored.params, parallel.replicated(self.mesh))
    return state.replace(params=params)

  # ---------------------------------------------------------------- test
  def load(self, step: int | None = None):
    """Parameters of the best checkpoint (or ``step``, from either manager)."""
    own = getattr(self, "ckpts", None) is None  # else fit's, closed by close()
    ckpts = self.ckpts if not own else ckpt_lib.Checkpoints(
        self.workdir, keep=self.config.keep_checkpoints, best_metric=_best_metric(self.config))
    try:
      which = "best"
      if step is not None:
        which = ckpts.find_step(step)
        if which is None:
          raise ValueError(f"{self.workdir}: no checkpoint at step {step}; expected one of latest "
                           f"{list(ckpts.latest.all_steps())} and best {list(ckpts.best.all_steps())}")
      elif ckpts.best_step() is None:
        which = "latest"
      restored, _ = _restore_or_fail(ckpts, self.abstract_state(), step=step, which=which)
    finally:
      if own:
        ckpts.close()
    if restored is None:
      raise ValueError(f"{self.workdir}: no checkpoint found (expected checkpoints/ or best/)")
    return jax.device_put(restored, parallel.replicated(self.mesh))

  def close(self):
    """Closes the checkpoint managers that :meth:`fit` left open for :meth:`load`."""
    ckpts, self.ckpts = getattr(self, "ckpts", None), None
    if ckpts is not None:
      ckpts.close()

  def test(self, params, split: str = "test", decode_config=None, spice: bool = False, tag: str = "") -> dict:
    from jaxcap.evaluation import coco_metrics
    preds = self.predict(params, split, decode_config)
    return write_scores(self.workdir, split, preds, self.references(split, preds.keys()), spice, tag,
                        translation=self.dataset.src_vocab is not None)


def write_json_atomic(path: str, obj) -> None:
  """Writes ``obj`` as JSON to ``path`` (process 0 only), atomically."""
  if jax.process_index() == 0:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    _write_json_atomic(path, obj)


def write_scores(workdir, split, preds, refs, spice=False, tag="", translation=False):
  """Scores and writes predictions; ``translation``: German-output metrics
  (:mod:`jaxcap.evaluation.translation`: sacreBLEU with its signature, METEOR ``-l de``, CIDEr-D)."""
  from jaxcap.evaluation import coco_metrics, files
  if translation:
    from jaxcap.evaluation import translation as translation_metrics
    scores = translation_metrics.score(refs, preds)
    print(f"sacreBLEU signature: {scores['sacrebleu_signature']}", flush=True)
  else:
    scores = coco_metrics.score(refs, preds, spice=spice)
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    _write_json_atomic(os.path.join(workdir, f"predictions_{split}{tag}.json"),
                       [{"image_id": k, "caption": v} for k, v in preds.items()])
    # per_image as [{"image_id": id, ...}]: the ids keep the predictions' type (files.scores_json).
    _write_json_atomic(os.path.join(workdir, f"scores_{split}{tag}.json"), files.scores_json(scores))
  print(format_table(scores["overall"], title=f"{split} ({len(preds)} images)"), flush=True)
  return scores


def format_table(overall: dict, title: str = "") -> str:
  names = [k for k in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE",
                       "sacreBLEU") if k in overall]
  head = " | ".join(f"{n:>8}" for n in names)
  vals = " | ".join(f"{overall[n]:8.4f}" for n in names)
  return (f"{title}\n" if title else "") + head + "\n" + vals


def _check_init_from(source_workdir: str, config, vocab: Vocab) -> None:
  if not os.path.isdir(source_workdir):
    raise ValueError(f"{source_workdir}: config field init_from is not a directory; expected "
                     "the workdir of a finished run")
  if not os.path.exists(os.path.join(source_workdir, "config.json")):
    raise ValueError(f"{source_workdir}/config.json: not found; config field init_from expects "
                     "a workdir written by train.py")
  check_workdir(source_workdir, config, vocab)


class _Prefix:
  """The first ``n`` rows of a split source."""

  def __init__(self, source, n):
    self.source, self.n = source, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    if i >= self.n:
      raise IndexError(i)
    return self.source[i]

  def collate(self, *args, **kwargs):
    return self.source.collate(*args, **kwargs)


def _restore_or_fail(ckpts, abstract_state, **kwargs):
  """``ckpts.restore(...)`` with a damaged checkpoint as one line naming its directory."""
  try:
    return ckpts.restore(abstract_state, **kwargs)
  except ckpt_lib.TreeMismatchError:
    raise  # Already one line naming the step directory.
  except Exception as e:  # orbax / tensorstore / json errors of damaged files
    which = kwargs.get("which", "latest")
    step = kwargs.get("step") or (ckpts.latest_step() if which == "latest" else ckpts.best_step())
    path = os.path.join(ckpts.workdir, "checkpoints" if which == "latest" else "best", str(step))
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise ValueError(f"{path}: damaged checkpoint ({type(e).__name__}: {first}); expected an "
                     "intact orbax checkpoint (delete this step directory to resume from an "
                     "earlier one, or use a new --workdir)") from None


def _best_metric(config) -> str:
  """The validation metric that selects ``best/`` (``CIDEr`` or ``Bleu_4``)."""
  name = config.get("best_metric", "CIDEr")
  if name not in ("CIDEr", "Bleu_4"):
    raise ValueError(f"config field best_metric: expected 'CIDEr' or 'Bleu_4', got {name!r}")
  return name


def _summarise(m: dict) -> dict:
  out = {}
  count = float(m.get("token_count", 0.0))
  if count:
    out["loss"] = float(m["loss_sum"]) / count
    out["extra_loss"] = float(m.get("extra_sum", 0.0)) / count
  n = float(m.get("steps", 1.0)) or 1.0  # 0 when every step of the window was skipped
  for k, v in m.items():
    if k not in ("loss_sum", "token_count", "extra_sum", "steps"):
      out[k] = float(v) / n
  if "loss" not in out and "reward" in out:
    out["loss"] = out.get("scst_loss", 0.0)
  return out


def _postfix(current: dict, summary: dict) -> dict:
  """The progress bar's fields: ``current`` updated from a training summary (loss, and during
  SCST the sample and greedy rewards; lr and images/s when logged) or validation scores
  (``val_CIDEr``, ``val_Bleu_4``). Fields not in ``summary`` keep their last value."""
  out = dict(current)
  if "reward" in summary:  # SCST: the loss is the policy-gradient loss, the reward is the signal
    out["reward"] = f"{summary['reward']:.3f}"
    if "greedy_reward" in summary:
      out["greedy"] = f"{summary['greedy_reward']:.3f}"
  if "loss" in summary:
    out["loss"] = f"{summary['loss']:.3f}"
  if "lr" in summary:
    out["lr"] = f"{summary['lr']:.2e}"
  if "images_per_sec" in summary:
    out["img_s"] = f"{summary['images_per_sec']:.0f}"
  for k, v in summary.items():
    if k.startswith("val_"):
      out[k] = f"{v:.3f}"
  return out


def _progress(total: int, initial: int):
  if jax.process_index() != 0:
    return None
  try:
    from tqdm import tqdm
  except ImportError:  # pragma: no cover
    return None
  import sys
  return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
              mininterval=1.0 if sys.stderr.isatty() else 30.0)


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains (or resumes) and, when ``config.test_after_training``, tests the best checkpoint.

  Returns:
    ``{"overall": {...}, "per_image": {...}}`` of the test split (``{}`` when not tested).
  """
  model_cls = registry.get(config.model.name)
  validation.check_config(config, trainable=getattr(model_cls, "trainable", True))
  validation.check_workdir_writable(workdir)
  if not getattr(model_cls, "trainable", True):
    return fit_non_trainable(config, workdir)
  trainer = Trainer(config, workdir)
  try:
    trainer.fit()
    if not config.test_after_training:
      return {}
    state = trainer.load()
  finally:
    trainer.close()  # orbax's managers finish their writes before the interpreter exits
  print(f"Testing the best checkpoint (step {int(state.step)}) on split {config.test_split!r}.", flush=True)
  return trainer.test(state.params, config.test_split, spice=config.spice)


def fit_non_trainable(config, workdir: str) -> dict:
  """Baselines without parameters (nearest neighbour): fit on train, score the test split."""
  dataset = data_lib.get_dataset(config.data)
  model = registry.build(config.model, dict(dataset.info))
  validation.check_data(dataset, config, splits=["train", config.test_split], model=model)
  init_workdir(workdir, config, dataset.vocab, dict(dataset.info))
  model.fit(dataset)
  preds = model.predict(dataset, config.test_split)
  refs = dataset.references(config.test_split)
  return write_scores(workdir, config.test_split, preds, {k: refs[k] for k in preds}, config.spice)
