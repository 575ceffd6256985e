"""The training loop: config -> data -> jitted data-parallel steps -> validation -> checkpoints.

``train_and_evaluate(config, workdir)`` is what ``train.py`` runs. The workdir's files (config,
vocabulary, info, checkpoints, predictions and scores) are written and read through
:mod:`jaxcap.run_dir`; loading a finished run is :func:`jaxcap.load`'s.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time

import jax
import jax.numpy as jnp

from jaxcap import atomic
from jaxcap import data as data_lib
from jaxcap import flops as flops_lib
from jaxcap import inference
from jaxcap import progress
from jaxcap import run_dir
from jaxcap.data import pipeline
from jaxcap.data.vocab import Vocab
from jaxcap.errors import BadInput
from jaxcap.evaluation import coco_metrics
from jaxcap.models import registry
from jaxcap.models import base
from jaxcap.models import pixels
from jaxcap.models.base import shift_right
from jaxcap.training import checkpoint as ckpt_lib
from jaxcap.training import dropout as dropout_lib
from jaxcap.training import memory, preemption
from jaxcap.training import guard as guard_lib
from jaxcap.training import optim, parallel, steps, validation
from jaxcap.training import scst
from jaxcap.training import sharding as sharding_lib
from jaxcap.training import writers as writer_lib
from jaxcap.training.writers import MetricWriter

def sample_batch(dataset, split: str, batch_size: int) -> dict:
  """A deterministic batch for shape inference (model init)."""
  return next(iter(pipeline.eval_batches(dataset.split(split), batch_size, num_threads=0)))


def init_params(model, batch: dict, seed: int, mesh, out_shardings=None):
  """The model's variables initialised on ``batch``'s shapes, placed with ``out_shardings``
  (default: replicated over ``mesh``)."""
  batch = jax.tree.map(jnp.asarray, batch)
  tokens = shift_right(jnp.asarray(batch["captions"]))
  init = jax.jit(functools.partial(model.init, train=False),
                 out_shardings=parallel.replicated(mesh) if out_shardings is None else out_shardings)
  return init(jax.random.PRNGKey(seed), batch, tokens)


class Trainer:
  """Holds the jitted functions of one run; ``fit`` runs the loop."""

  def __init__(self, config, workdir: str, dataset=None, devices=None):
    """``devices``: the mesh's devices (default: every device, as ``train.py`` runs)."""
    self.config = config
    self.workdir = workdir
    self.dataset = dataset if dataset is not None else data_lib.get_dataset(config.data)
    # From pixels (config.backbone): the backbone wrapped around the captioner, and the info
    # carrying the backbone's feature sizes.
    self.model, self.info = pixels.build_for_run(config, dict(self.dataset.info))
    mesh = config.get("mesh") or {}  # absent from configs saved before it existed
    self.mesh = sharding_lib.make_mesh(data=int(mesh.get("data", -1)), model=int(mesh.get("model", 1)),
                                       devices=devices)
    self.sharding_rule = str(config.get("sharding", "replicated"))
    n_dev = self.mesh.devices.size
    self.eval_batch_size = int(math.ceil(config.eval_batch_size / n_dev) * n_dev)
    self.num_train = len(self.dataset.split("train"))
    self.steps_per_epoch = max(1, self.num_train // config.batch_size)
    self.tx, self.schedule = optim.make_optimizer(
        config, self.steps_per_epoch, frozen_collections=self.model.frozen_collections)
    self._decode_fns: dict = {}

  # ---------------------------------------------------------------- state
  def initial_state(self):
    """A fresh run's train state, placed by :attr:`state_shardings` (the parameters are
    initialised straight into their shards: a model too large for one device never is whole)."""
    shardings = self.state_shardings
    params = init_params(self.model, self._init_batch, self.config.seed, self.mesh, shardings.params)
    rng = steps.rng_key(self.config.seed + 1, self.config)
    return jax.jit(lambda p, r: steps.create_state(p, self.tx, r),
                   out_shardings=shardings, donate_argnums=0)(params, rng)

  @functools.cached_property
  def state_shardings(self):
    """The train state's ``NamedSharding`` tree under ``config.sharding`` on :attr:`mesh`
    (:func:`jaxcap.training.sharding.shardings`): every jitted step takes and returns the state
    so, checkpoints restore into it."""
    shapes = jax.eval_shape(lambda: steps.create_state(
        init_params(self.model, self._init_batch, self.config.seed, self.mesh), self.tx,
        steps.rng_key(self.config.seed + 1, self.config)))
    return sharding_lib.shardings(shapes, self.mesh, self.sharding_rule)

  @functools.cached_property
  def _init_batch(self) -> dict:
    """The batch the variables are initialised on (its shapes; read once)."""
    return sample_batch(self.dataset, "train", min(2, self.num_train))

  # ---------------------------------------------------------------- jitted steps
  @functools.cached_property
  def _xe_step(self):
    return self._make_xe_step(self.model)

  @functools.cached_property
  def _xe_step_frozen(self):
    """The cross-entropy step of the backbone's frozen phase: the gradient stopped at its output,
    so the program has no backward pass through it (its optimiser holds it still as well)."""
    return self._make_xe_step(self.model.clone(freeze_backbone=True))

  @property
  def freeze_steps(self) -> int:
    section = pixels.backbone_config(self.config)
    return int(section.freeze_steps) if section is not None else 0

  def _make_xe_step(self, model):
    fn = guard_lib.guarded(functools.partial(steps.train_step, model=model,
                                             label_smoothing=self.config.label_smoothing))
    fn = dropout_lib.with_dropout_bits(fn, self.dropout_bits)
    repl, data = parallel.replicated(self.mesh), parallel.batch_sharding(self.mesh)
    state = self.state_shardings
    if self.config.scheduled_sampling.start_epoch >= 0:
      return jax.jit(lambda s, b, p: fn(s, b, ss_prob=p), in_shardings=(state, data, repl),
                     out_shardings=(state, repl), donate_argnums=0)
    return jax.jit(lambda s, b, p: fn(s, b), in_shardings=(state, data, repl),
                   out_shardings=(state, repl), donate_argnums=0)

  @functools.cached_property
  def _scst_step(self):  # built at the first SCST step: the reward reads the training references
    # Its jitted functions are traced at their first call, inside this wrapper.
    return dropout_lib.with_dropout_bits(scst.make_scst_step(self), self.dropout_bits)

  @property
  def dropout_bits(self) -> int:
    return self.config.get("dropout_bits", 32)  # absent from configs saved before it existed

  def train_step(self, state, batch, step: int):
    """One jitted step of the run's phase at ``step``: self-critical from
    ``optim.scst_start_step`` on, cross-entropy (with scheduled sampling) before."""
    scst_start = optim.scst_start_step(self.config, self.steps_per_epoch)
    if 0 <= scst_start <= step:
      return self._scst_step(state, batch, step)
    xe = self._xe_step_frozen if step < self.freeze_steps else self._xe_step
    return xe(state, batch, jnp.float32(self.ss_prob(step)))

  def ss_prob(self, step: int) -> float:
    ss = self.config.scheduled_sampling
    if ss.start_epoch < 0:
      return 0.0
    epoch = step // self.steps_per_epoch
    if epoch < ss.start_epoch:
      return 0.0
    k = (epoch - ss.start_epoch) // max(1, ss.increase_every_epochs)
    return float(min(ss.increase_prob * k, ss.max_prob))

  # ---------------------------------------------------------------- will it fit?
  def abstract_batch(self) -> dict:
    """The global training batch's shapes, dtypes and sharding (one image read for its keys)."""
    one = sample_batch(self.dataset, "train", 1)
    sharding = parallel.batch_sharding(self.mesh)
    return {k: jax.ShapeDtypeStruct((int(self.config.batch_size),) + v.shape[1:], v.dtype,
                                    sharding=sharding) for k, v in one.items()}

  def phases(self) -> list[str]:
    """The steps this run takes: ``"train"`` (cross-entropy) and / or ``"scst"``."""
    start = optim.scst_start_step(self.config, self.steps_per_epoch)
    end = int(self.config.num_train_steps)
    scst_runs = 0 <= start < end
    xe = ["train"] if not (scst_runs and start == 0) else []
    if xe and self.freeze_steps > 0:  # the backbone's frozen phase first: another program
      xe = ["train_frozen"] + (["train"] if self.freeze_steps < min(end, start if scst_runs else end) else [])
    return xe + (["scst"] if scst_runs else [])

  def compile_steps(self, state, log=None) -> dict:
    """Compiles the run's steps (:meth:`phases`) at the configured batch on this run's devices:
    ``{phase: {"flops": matmul FLOPs per step (from the jaxpr), "memory": StepMemory per
    device, "compile_s": seconds}}``. ``state`` may be abstract (``jax.eval_shape``); the
    compiled programs are the ones the loop then runs (jit's cache: no second compile)."""
    batch, out = self.abstract_batch(), {}
    phases = self.phases()
    for k, phase in enumerate(phases, 1):
      start = time.perf_counter()
      what = f"compiling the {phase} step (batch {self.config.batch_size}"
      what += f"; {k} of {len(phases)})" if len(phases) > 1 else ")"
      if log:
        log(f"{what} ...")
      # Without a log (train.py's start), said only when it takes seconds (a backbone's step
      # compiles for minutes on a CPU).
      with contextlib.nullcontext() if log else progress.phase(what):
        if phase in ("train", "train_frozen"):
          xe = self._xe_step if phase == "train" else self._xe_step_frozen
          traced = [xe.trace(state, batch, jax.ShapeDtypeStruct((), jnp.float32))]
        else:
          traced = self._scst_step.trace(state, batch)
        parts = [memory.step_memory(t.lower().compile()) for t in traced]
      flops = sum(flops_lib.jaxpr_matmul_flops(t.jaxpr) for t in traced)
      mem = None if None in parts else max(parts, key=lambda m: m.total)  # the parts run in turn
      out[phase] = {"flops": flops, "memory": mem, "compile_s": time.perf_counter() - start}
    return out

  def check_memory(self, compiled: dict) -> None:
    """One line naming ``batch_size`` (SCST: ``scst.num_samples`` too) when a step of
    :meth:`compile_steps` needs more memory than a device has."""
    bs = self.config.batch_size
    for phase, c in compiled.items():
      if phase == "scst":
        memory.check_fits("SCST", c["memory"], "scst.num_samples / batch_size",
                          f"{self.config.scst.num_samples} / {bs}")
      else:
        memory.check_fits("training", c["memory"], "batch_size", str(bs))

  # ---------------------------------------------------------------- evaluation
  def predict(self, params, split: str, decode_config=None, num_images: int = -1, seed: int = 0):
    """Decodes a split (or its first ``num_images``): ``{image_id: caption}``
    (:func:`jaxcap.inference.predict_split`, the loop ``jaxcap.load``'s runs decode with)."""
    return inference.predict_split(self.model, params, self.dataset, split,
                                   decode_config or self.config.decode, mesh=self.mesh,
                                   batch_size=self.eval_batch_size, num_images=num_images,
                                   seed=seed, cache=self._decode_fns)

  def references(self, split: str, image_ids) -> dict:
    refs = self.dataset.references(split)
    return {i: refs[i] for i in image_ids}

  def validate(self, params, step: int) -> dict:
    preds = self.predict(params, "val", num_images=self.config.eval_num_images)
    refs = self.references("val", preds.keys())
    scores = coco_metrics.score(refs, preds, metrics=("Bleu", "CIDEr"), tokenize=False, log=lambda *_: None,
                                caption_postprocess=run_dir.caption_postprocess(self.config))
    return {"CIDEr": scores["overall"]["CIDEr"], "Bleu_4": scores["overall"]["Bleu_4"]}

  # ---------------------------------------------------------------- loop
  def fit(self):
    """Trains from the newest intact checkpoint (or afresh) to ``config.num_train_steps``: each
    step is dispatched, then the actions that are due run: the non-finite guard's check (before
    anything is logged, validated or saved), the log line, validation (with the best checkpoint
    and early stopping) and the latest checkpoint."""
    config, end = self.config, self.config.num_train_steps
    state, it, start = self._start()
    due = lambda done, every: done % every == 0 or done == end
    it = parallel.DevicePrefetch(it, self.mesh)  # the next batches read and copied on another thread
    with contextlib.closing(it), contextlib.closing(_TrainLog(self.workdir, end, start, config.batch_size)) as log, \
        preemption.Watch() as watch:
      monitor = guard_lib.Monitor(config.nonfinite, self.dataset.image_ids("train"),
                                  log.writer)
      stopper = _EarlyStopping(int(config.early_stopping_patience),
                               run_dir.best_metric(config))
      for step in range(start, end):
        host_batch, batch = next(it)
        state, metrics = self.train_step(state, batch, step)
        metrics, flags = guard_lib.split_metrics(metrics)
        done = step + 1
        monitor.add(done, flags, host_batch)
        log.add(metrics)
        if any(due(done, n) for n in (config.log_every_steps, config.eval_every_steps,
                                      config.checkpoint_every_steps)):
          log.skipped += monitor.check(self.ckpts.latest_step())  # raises in "stop" mode
        if due(done, config.log_every_steps):
          log.write(done, lr=float(self.schedule(step)), epoch=done / self.steps_per_epoch,
                    skipped_total=monitor.skipped_total)
        else:
          log.refresh()
        log.advance()
        if due(done, config.eval_every_steps) and stopper.update(self._validate_and_keep_best(
            state, done, it.get_state(), log)):
          self.ckpts.save_latest(done, state, it.get_state())
          log.print(stopper.message(done))
          break
        if due(done, config.checkpoint_every_steps):
          self.ckpts.save_latest(done, state, it.get_state())
        if done < end and watch.reached(done):  # SIGTERM / SIGINT: save this step and stop
          log.skipped += monitor.check(self.ckpts.latest_step())  # never save a non-finite state
          self.ckpts.save_latest(done, state, it.get_state())
          self.ckpts.wait()
          raise preemption.Preempted(done, self.workdir, watch.signame)
    self.ckpts.wait()  # the last background write: its error is fit's
    return state

  def _start(self):
    """Checks the data, writes the workdir and opens its checkpoints (``self.ckpts``); returns
    ``(state, train iterator, first step)`` of the newest intact checkpoint, else of a fresh run
    (``init_from``, :meth:`prepare_variables`)."""
    config, workdir = self.config, self.workdir
    if config.init_from:  # Checked before anything is written.
      _check_init_from(config.init_from, config, self.dataset.vocab)
    # Splits, feature headers, boxes, the model's inputs and files: before writing.
    validation.check_data(self.dataset, config, model=self.model, workdir=workdir)
    # The workdir's config.json / vocab.json against this run now, not after the steps compile
    # (init_workdir checks again before it writes): another run's workdir is refused at once.
    run_dir.check_workdir(workdir, config, self.dataset.vocab)
    local_bs = parallel.local_batch_size(config.batch_size, self.mesh)
    with progress.phase(f"initialising the {config.model.name} model's parameters"):
      state = self.initial_state()
    self.check_memory(self.compile_steps(state))  # does each step fit? (before writing)
    # Said once every check has passed: a refusal is the only thing a user reads.
    print(f"workdir: {workdir}", flush=True)
    run_dir.init_workdir(workdir, config, self.dataset.vocab, self.info)
    self.ckpts = run_dir.checkpoints(workdir, config)  # for load(); close() closes it, also when fit raises
    it = pipeline.make_train_iterator(self.dataset.split("train"), local_bs, seed=config.seed,
                                      num_workers=config.data.num_workers)
    # The newest intact step (a damaged one is reported and set aside), then metrics.jsonl
    # without the lines a killed run wrote past it (before the writer opens the file).
    restored, data_state, _ = self.ckpts.resume(ckpt_lib.abstract(state))
    start = 0
    if restored is not None:
      state = jax.device_put(restored, self.state_shardings)  # restored into them already
      it.set_state(data_state)
      start = int(state.step)
      print(f"Resumed from {workdir}/checkpoints at step {start}.", flush=True)
    writer_lib.drop_lines_after(workdir, start)
    if jax.process_index() == 0:
      # The temporary files of a killed run's last writes (metrics, scores); an evaluation may
      # be writing beside this run, so only those a minute old.
      left = atomic.remove_leftovers(workdir, older_than_s=60)
      if left:
        print(f"Removed {len(left)} temporary file(s) a stopped run left (e.g. {left[0]}).", flush=True)
    if restored is None and config.init_from:
      state = self.init_from(state, config.init_from)
    elif restored is None:
      state = self.prepare_variables(state)
    return state, it, start

  def _validate_and_keep_best(self, state, done: int, data_state: dict, log) -> bool:
    """Validates, logs the scores and saves ``best/`` when they improve; returns whether they did."""
    val = self.validate(state.params, done)
    log.writer.write(done, val, prefix="val/")
    improved = self.ckpts.save_best_if_improved(done, state, data_state, val)
    log.show_val(val, f"step {done}: val CIDEr-D {100 * val['CIDEr']:.2f} BLEU-4 {100 * val['Bleu_4']:.2f} (x100)"
                 + (" (best)" if improved else ""))
    return improved

  def prepare_variables(self, state):
    """A fresh run's state with the model's data-derived constants filled in (once).

    A model that overrides ``CaptionModel.prepare_variables`` (TPGN: the mean training
    feature v̄ of its eq. 9) computes them here, before the first step; from then on they are
    part of the checkpointed state, so resuming, ``init_from`` and evaluation never recompute them.
    """
    if type(self.model).prepare_variables is base.CaptionModel.prepare_variables:
      return state  # the default has nothing to fill in: no round trip through the host
    params = jax.device_put(self.model.prepare_variables(jax.device_get(state.params), self.dataset),
                            self.state_shardings.params)
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
      raise BadInput(f"{source_workdir}: config field init_from names a workdir with no "
                       "checkpoint (expected checkpoints/ or best/)")
    print(f"Initialised from {source_workdir} ({which} checkpoint, step {int(restored.step)}).",
          flush=True)
    params = jax.device_put(restored.params, self.state_shardings.params)
    return state.replace(params=params)

  # ---------------------------------------------------------------- test
  def load(self, step: int | None = None):
    """The train state of the best checkpoint (or ``step``, from either manager), replicated
    over the mesh (:func:`jaxcap.run_dir.restore`, as ``jaxcap.load`` restores)."""
    return run_dir.restore(self.workdir, self.config, self.model, self.info, step,
                           sharding=parallel.replicated(self.mesh),
                           ckpts=getattr(self, "ckpts", None))  # fit's, closed by close()

  def close(self, quiet: bool = False):
    """Closes the checkpoint managers that :meth:`fit` left open for :meth:`load` (``quiet``:
    see :meth:`jaxcap.training.checkpoint.Checkpoints.close`)."""
    ckpts, self.ckpts = getattr(self, "ckpts", None), None
    if ckpts is not None:
      ckpts.close(quiet=quiet)

  def test(self, params, split: str = "test", decode_config=None, spice: bool = False, tag: str = "",
           step: int | None = None) -> dict:
    """Decodes ``split``, scores it and writes its predictions and scores (with their signature:
    ``step`` is the checkpoint's) to the workdir."""
    decode = decode_config or self.config.decode
    preds = self.predict(params, split, decode)
    made_by = run_dir.made_by(self.config, self.dataset.vocab, self.info, split=split, step=step,
                              decode=decode, workdir=self.workdir, dataset=self.dataset)
    return run_dir.write_scores(self.workdir, split, preds, self.references(split, preds.keys()), spice, tag,
                                translation=self.dataset.src_vocab is not None, made_by=made_by,
                                caption_postprocess=run_dir.caption_postprocess(self.config))


def _check_init_from(source_workdir: str, config, vocab: Vocab) -> None:
  if not os.path.isdir(source_workdir):
    raise BadInput(f"{source_workdir}: config field init_from is not a directory; expected "
                     "the workdir of a finished run")
  if not os.path.exists(os.path.join(source_workdir, "config.json")):
    raise BadInput(f"{source_workdir}/config.json: not found; config field init_from expects "
                     "a workdir written by train.py")
  run_dir.check_workdir(source_workdir, config, vocab, init_from=True)


class _EarlyStopping:
  """Stops after ``patience`` validations without a new best (0: never)."""

  def __init__(self, patience: int, metric: str):
    self.patience, self.metric, self.stale = patience, metric, 0

  def update(self, improved: bool) -> bool:
    self.stale = 0 if improved else self.stale + 1
    return bool(self.patience) and self.stale >= self.patience

  def message(self, done: int) -> str:
    return f"step {done}: early stop, no {self.metric} improvement in {self.patience} evaluations"


class _TrainLog:
  """The training metrics between two log lines, and where they go.

  Owns the window's running sums (device arrays, summed without a host sync), the metric
  writer (``metrics.jsonl``, TensorBoard) and the progress bar. The bar's loss / reward between
  logs is the window's running mean, fetched at most once per refresh interval (one device
  sync); validation scores stay on it until the next ones.
  """

  def __init__(self, workdir: str, total: int, initial: int, batch_size: int):
    self.writer = MetricWriter(workdir)
    self.bar = _progress(total, initial)
    self.batch_size = batch_size
    self.postfix, self.t_postfix = {}, 0.0
    self._advanced = False
    self._reset()

  def _reset(self):
    self.sums, self.t_start, self.n, self.skipped = None, time.time(), 0, 0.0

  def add(self, metrics: dict) -> None:
    """Adds one step's metric sums (a key missing from a step keeps its sum)."""
    sums = self.sums
    self.sums = dict(metrics) if sums is None else (
        {k: sums.get(k, 0.0) + v for k, v in metrics.items()} | {k: v for k, v in sums.items() if k not in metrics})
    self.n += 1

  def write(self, done: int, *, lr: float, epoch: float, skipped_total: int) -> None:
    """Writes the window's means (and the guard's skipped steps, once any were) and starts a new window."""
    dt = time.time() - self.t_start
    summary = _summarise(jax.device_get(self.sums))
    summary.update(lr=lr, images_per_sec=self.n * self.batch_size / max(dt, 1e-9), epoch=epoch)
    if skipped_total:
      summary.update(skipped=self.skipped, skipped_total=skipped_total)
    self.writer.write(done, summary, prefix="train/")
    if self.bar is not None:
      self._set_postfix(summary)
      self.t_postfix = time.time()
    self._reset()

  def refresh(self) -> None:
    """The bar's running means, when its refresh interval has passed."""
    if self.bar is not None and time.time() - self.t_postfix >= self.bar.mininterval:
      self._set_postfix(_summarise(jax.device_get(self.sums)))
      self.t_postfix = time.time()

  def show_val(self, val: dict, message: str) -> None:
    if self.bar is not None:
      self._set_postfix({f"val_{k}": v for k, v in val.items()})
    self.print(message)

  def _set_postfix(self, summary: dict) -> None:
    self.postfix = _postfix(self.postfix, summary)
    self.bar.set_postfix(self.postfix, refresh=False)

  def advance(self) -> None:
    if self.bar is not None:
      if not self._advanced:
        # The first step's time is mostly its compilation (a minute or more on a large model):
        # the bar's clock starts after it, so its rate and remaining time are the steps'.
        self.bar.unpause()
        self._advanced = True
      self.bar.update(1)

  def print(self, message: str) -> None:
    (self.bar.write if self.bar is not None else print)(message)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
    self.writer.close()


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
  (``val_CIDEr-D_x100``, ``val_BLEU-4_x100``: the bar says the scale its numbers are at). Fields
  not in ``summary`` keep their last value."""
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
  for k, v in summary.items():  # validation scores as the tables print them: named, x100
    if k.startswith("val_"):
      name, scale = coco_metrics.display(k[len("val_"):])
      out[f"val_{name}" + (f"_x{scale:g}" if scale != 1 else "")] = f"{scale * v:.2f}"
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


def dry_run(config, workdir: str = "", log=print) -> dict:
  """Will it fit? Checks the config and data, builds the model, compiles its training (and SCST)
  step at the configured batch on this process's devices, prints the parameters, the FLOPs per
  step and the memory per device, and stops; nothing is written (``train.py --dry_run``,
  ``jaxcap.dry_run``).

  Returns:
    ``{"parameters", "state_bytes", "devices", "device_limit_bytes", "device", "steps": {phase:
    {"gflop", "memory": {...} per device in bytes, "compile_s"}}}``.

  Raises:
    BadInput: a bad config or data (one line), or a step that needs more memory than a device
      has (naming ``batch_size`` / ``scst.num_samples``).
  """
  validation.check_config(config)
  if not getattr(registry.get(config.model.name), "trainable", True):
    raise BadInput(f"config field model.name: {config.model.name!r} has no training step to "
                     "compile; expected a trainable model")
  trainer = Trainer(config, workdir)
  trainer.write_caches = False  # the SCST reward's table is counted, not cached
  validation.check_data(trainer.dataset, config, model=trainer.model, log=lambda *a, **k: None)
  parallel.local_batch_size(config.batch_size, trainer.mesh)  # splits over the devices
  specs = trainer.state_shardings
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       jax.eval_shape(trainer.initial_state), specs)
  compiled = trainer.compile_steps(state, log=log)
  params = sum(x.size for x in jax.tree.leaves(state.params))
  state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)
                    if hasattr(x.dtype, "itemsize"))
  # What one device holds of them under config.sharding (the largest shard of each array).
  held = {k: sharding_lib.per_device_bytes(getattr(state, k), getattr(specs, k))
          for k in ("params", "opt_state")}
  # How many parameter arrays the rule splits: at tiny sizes fsdp splits none (every array is under
  # sharding.MIN_ELEMENTS), which the held bytes alone would not say.
  param_specs = jax.tree.leaves(specs.params, is_leaf=lambda x: hasattr(x, "spec"))
  split = sum(any(axis is not None for axis in s.spec) for s in param_specs)
  limit, what = memory.device_limit()
  n_dev = trainer.mesh.devices.size
  section = pixels.backbone_config(config)
  source = (f" from pixels ({section.name}, {trainer.info['image_size']} px)" if section is not None else "")
  log(f"model {config.model.name}{source}: {params:,} parameters; train state {memory.gib(state_bytes)} "
      f"(parameters, optimiser state)")
  log(f"sharding {trainer.sharding_rule!r} over mesh data={trainer.mesh.shape['data']}, "
      f"model={trainer.mesh.shape['model']}: a device holds parameters "
      f"{memory.gib(held['params'])}, optimiser state {memory.gib(held['opt_state'])}"
      + (f"; {split} of {len(param_specs)} parameter arrays split (arrays under "
         f"{sharding_lib.MIN_ELEMENTS:,} elements, or with no dimension the devices divide, stay whole)"
         if trainer.sharding_rule == "fsdp" else ""))
  log(f"batch {config.batch_size} images over {n_dev} {jax.devices()[0].platform} device(s)"
      + (f"; a device has {memory.gib(limit)} ({what})" if limit else f"; {what}"))
  report = {"parameters": int(params), "state_bytes": int(state_bytes), "devices": n_dev,
            "device": what, "device_limit_bytes": limit, "batch_size": int(config.batch_size),
            "sharding": trainer.sharding_rule, "mesh": dict(trainer.mesh.shape),
            "params_bytes_per_device": int(held["params"]),
            "opt_state_bytes_per_device": int(held["opt_state"]),
            "arrays_split": [int(split), len(param_specs)], "steps": {}}
  for phase, c in compiled.items():
    m = c["memory"]
    report["steps"][phase] = {"gflop": c["flops"] / 1e9, "compile_s": c["compile_s"],
                              "memory": None if m is None else dict(m._asdict(), total=m.total)}
    per_device = ("per-device memory unknown (no memory analysis on this backend)" if m is None else
                  f"{memory.gib(m.total)} per device (arguments {memory.gib(m.arguments)}, "
                  f"outputs {memory.gib(m.outputs)}, temporaries {memory.gib(m.temporaries)}, "
                  f"donated {memory.gib(m.aliased)})")
    log(f"{phase} step: {c['flops'] / 1e9:,.2f} GFLOP per step (matrix multiplies, all devices); "
        f"{per_device}; compiled in {c['compile_s']:.1f} s")
  trainer.check_memory(compiled)
  log("it fits: nothing written (dry run)")
  return report


def train_and_evaluate(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains (or resumes) and, when ``config.test_after_training``, tests the best checkpoint.
  ``overwrite``: write into a folder that holds files of the names training writes but is no
  run directory (:func:`jaxcap.training.validation.check_workdir_writable`; else refused).

  Returns:
    ``{"overall": {...}, "per_image": {...}}`` of the test split (``{}`` when not tested).
  """
  model_cls = registry.get(config.model.name)
  validation.check_config(config)
  validation.check_workdir_writable(workdir, overwrite)
  if not getattr(model_cls, "trainable", True):
    return fit_non_trainable(config, workdir)
  trainer = Trainer(config, workdir)
  try:
    trainer.fit()
    state = trainer.load() if config.test_after_training else None
  except BaseException:
    trainer.close(quiet=True)  # the error being raised is the one to report
    raise
  trainer.close()  # orbax's managers finish their writes before the interpreter exits
  if state is None:
    return {}
  print(f"Testing the best checkpoint (step {int(state.step)}) on split {config.test_split!r}.", flush=True)
  return trainer.test(state.params, config.test_split, spice=config.spice, step=int(state.step))


def fit_non_trainable(config, workdir: str) -> dict:
  """Baselines without parameters (nearest neighbour): fit on train, score the test split."""
  dataset = data_lib.get_dataset(config.data)
  model = registry.build(config.model, dict(dataset.info))
  validation.check_data(dataset, config, splits=["train", config.test_split], model=model)
  print(f"workdir: {workdir}", flush=True)  # after the checks, as Trainer's
  run_dir.init_workdir(workdir, config, dataset.vocab, dict(dataset.info))
  model.fit(dataset)
  preds = model.predict(dataset, config.test_split)
  refs = dataset.references(config.test_split)
  made_by = run_dir.made_by(config, dataset.vocab, dict(dataset.info), split=config.test_split,
                            decode={"method": config.model.name}, workdir=workdir, dataset=dataset)
  return run_dir.write_scores(workdir, config.test_split, preds, {k: refs[k] for k in preds}, config.spice,
                              made_by=made_by, caption_postprocess=run_dir.caption_postprocess(config))
