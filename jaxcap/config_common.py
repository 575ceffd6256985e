"""Shared pieces of the config files (ml_collections, big_vision style).

Every config file defines ``get_config(arg)`` where ``arg`` is the text after the colon in
``--config configs/<model>.py:<arg>``: a comma-separated list whose first bare word is the
dataset (``synthetic`` | ``flickr8k`` | ``coco`` | ``cocotalk`` | ``multi30k``) and whose ``key=value`` items
select a paper ablation, e.g. ``configs/eta.py:synthetic,variant=stacked_v,gbc=tanh``.
Any field can then be overridden on the command line: ``--config.model.num_heads=4``.

Every config has the top-level keys ``model.name``, ``data.name``, ``batch_size``,
``num_train_steps``, ``eval_every_steps``, ``learning_rate`` and ``seed``.

Every config also takes the bare word ``tiny`` (``configs/eta.py:synthetic,tiny``): the same
config at the smallest sizes that still run every path (:func:`tiny`: 4 steps of 8 images,
96 / 16 / 16 synthetic images, one 32-wide layer), for tests, smoke runs of the benchmarks and
the README runner. :func:`jaxcap.config_files.load` applies it after ``get_config``.
"""

from __future__ import annotations

import contextlib
import os

import ml_collections

from jaxcap.config_literal import literal
from jaxcap.errors import BadInput


# ``coco``: Karpathy's dataset_coco.json + bottom-up features; ``cocotalk``: the same features with
# self-critical.pytorch's cocotalk.json + cocotalk_label.h5 (its vocabulary: min_word_count 1).
DATASETS = ("synthetic", "flickr8k", "coco", "cocotalk", "multi30k")
COCO_LIKE = ("coco", "cocotalk")  # the paper-sized datasets: model files give them one setting

# ../shared/data beside the repository (the project's small real data set), unless overridden.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (jaxcap/..)
SHARED_DATA = os.environ.get("JAXCAP_SHARED_DATA", os.path.join(os.path.dirname(_REPO), "shared", "data"))


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses ``"synthetic,variant=stacked_v,steps=4"`` into a ConfigDict.

  The first bare word is ``dataset``; ``key=value`` values are converted to int, float or
  bool when they look like one. Unknown keys are an error so that typos do not pass silently.
  """
  out = dict(defaults)
  out.setdefault("dataset", "synthetic")
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      out["dataset"] = item
      continue
    key, value = item.split("=", 1)
    if key not in out:
      raise BadInput(f"config argument {key!r}: unknown; expected one of {sorted(out)}")
    out[key] = literal(value)
  if out["dataset"] not in DATASETS:
    raise BadInput(f"config argument dataset: expected one of {DATASETS}, got {out['dataset']!r}")
  return ml_collections.ConfigDict(out)


# The sizes of ``tiny`` (the module docstring): the run and the synthetic data; the model's
# own come from its class (``CaptionModel.tiny_sizes``).
TINY_RUN = {"num_train_steps": 4, "eval_every_steps": 4, "checkpoint_every_steps": 4,
            "log_every_steps": 2, "batch_size": 8, "eval_batch_size": 8, "eval_num_images": 16,
            "warmup_steps": 10}
TINY_DATA = {"num_train": 96, "num_val": 16, "num_test": 16}
TINY_DETECTOR = {"num_steps": 4, "hidden": 16, "batch_size": 8}
# A run from pixels (config.backbone): its backbone's tiny fields, at 32 px (data.image_size).
TINY_BACKBONES = {"vit": {"image_size": 32, "patch": 8, "dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64},
                  "resnet": {"width": 4, "depths": [1, 1, 1, 1], "att_size": 2}}
TINY_IMAGE_SIZE = 32


def tiny(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``c`` at :data:`TINY_RUN` / :data:`TINY_DATA` sizes and its model's own tiny sizes (the
  registered class's ``tiny_sizes``), for the fields it has (a method without training, the
  nearest neighbour, keeps its 0 steps)."""
  from jaxcap.models import registry  # the models only when a config is shrunk
  model_sizes = registry.get(c.model.name).tiny_sizes(c.model)
  with c.unlocked() if hasattr(c, "unlocked") else contextlib.nullcontext():
    for section, values in ((c, TINY_RUN), (c.data, TINY_DATA), (c.model, model_sizes),
                            (c.get("detector"), TINY_DETECTOR)):
      for k, v in values.items() if section is not None else ():
        if k in section and not (k == "num_train_steps" and not c.num_train_steps):
          section[k] = v
    backbone = c.get("backbone")
    if backbone is not None and backbone.get("name"):
      import json
      kind = "vit" if backbone.name.startswith("vit") else "resnet"
      backbone.fields = json.dumps(TINY_BACKBONES[kind])
      backbone.freeze_steps = min(int(backbone.freeze_steps), 2)  # both phases within the 4 steps
      c.data.image_size = TINY_IMAGE_SIZE
  return c


def data_config(dataset: str) -> ml_collections.ConfigDict:
  """The data section for one of the known datasets (fields: ``jaxcap.data.get_dataset``)."""
  from jaxcap.data import default_data_config
  if dataset == "synthetic":
    d = default_data_config("synthetic_scenes")
  elif dataset == "flickr8k":
    d = default_data_config("karpathy")
    d.root = os.path.join(SHARED_DATA, "flickr8k_xception")
    d.dataset_json = "dataset_flickr8k.json"
    d.fc_dir = "fc"
    d.max_regions = 1
  elif dataset in COCO_LIKE:
    if dataset == "coco":
      d = default_data_config("karpathy")
      d.dataset_json = "dataset_coco.json"
    else:  # cocotalk.json, cocotalk_label.h5 and min_word_count = 1 (already thresholded)
      d = default_data_config("cocotalk")
    d.root = "data/coco"
    d.att_dir = "cocobu_att"
    d.fc_dir = "cocobu_fc"
    d.box_dir = "cocobu_box"
    d.max_regions = 100
  elif dataset == "multi30k":
    d = default_data_config("multi30k")
    d.root = os.path.join(SHARED_DATA, "multi30k")
  else:
    raise BadInput(f"config argument dataset: expected one of {DATASETS}, got {dataset!r}")
  d.attributes = "none"  # models that read attributes (ETA) set their own mode
  return d


def decode_config() -> ml_collections.ConfigDict:
  """The ``decode`` section: the decoding options with their defaults (one definition:
  :func:`jaxcap.decoding.default_decode_config`)."""
  from jaxcap import decoding
  return decoding.default_decode_config()


def model_config(name: str, dtype=None, **overrides) -> ml_collections.ConfigDict:
  """The ``model`` section: every field of the registered model with the module's default
  (the module is the schema: :mod:`jaxcap.models.fields`), so that each can be overridden on
  the command line, then ``overrides``. ``dtype``: a reference to the config's top-level
  ``dtype`` (for models that have a compute dtype)."""
  from jaxcap.models import fields, registry
  m = ml_collections.ConfigDict({"name": name, **fields.config_defaults(registry.get(name))})
  if dtype is not None and "dtype" in m:
    m.dtype = dtype
  m.update(overrides)
  return m


def model_defaults(name: str, *fields: str) -> dict:
  """``{field: the module's default}`` for ``fields`` of the registered model ``name``: the
  defaults of the config arguments that set them, so that each is written once, in the module."""
  from jaxcap.models import fields as model_fields, registry
  defaults = model_fields.config_defaults(registry.get(name))
  return {f: defaults[f] for f in fields}


def base_config(dataset: str = "synthetic", model: str = "transformer") -> ml_collections.ConfigDict:
  """Training defaults shared by every model, with ``model``'s defaults as its section; model
  files override what their paper and dataset say."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.batch_size = 50  # images per step (each with data.seq_per_img captions), global over hosts
  c.num_train_steps = 30000
  c.eval_every_steps = 1000
  c.log_every_steps = 50
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  c.async_checkpoints = True  # written by a thread while training goes on (orbax async)
  c.eval_batch_size = 100
  c.eval_num_images = -1  # -1: the whole validation split
  c.test_after_training = True
  c.test_split = "test"
  c.learning_rate = 5e-4
  c.schedule = "noam"  # "noam" | "step" | "constant"
  c.warmup_steps = 20000
  c.decay_every_epochs = 3
  c.decay_rate = 0.8
  c.adam_b1 = 0.9
  c.adam_b2 = 0.98
  c.adam_eps = 1e-9
  c.weight_decay = 0.0
  c.l2 = 0.0  # lambda of an L2 term lambda * sum(w^2) on the cost (coupled; unlike weight_decay)
  c.best_metric = "CIDEr"  # validation metric that selects best/: "CIDEr" | "Bleu_4"
  c.early_stopping_patience = 0  # stop after this many evaluations without improvement (0: never)
  # A non-finite loss or gradient norm (jaxcap/training/guard.py): "stop" the run (exit code
  # 3, one line with the step, loss, gradient norm and the batch's image ids; nothing is saved,
  # the previous checkpoint stays latest and best) | "skip" the update (parameters and
  # optimiser state unchanged; counted as train/skipped in metrics.jsonl).
  c.nonfinite = "stop"
  c.grad_clip_norm = 0.0  # 0 disables global-norm clipping
  c.grad_clip_value = 0.1  # self-critical.pytorch clips each gradient entry to [-0.1, 0.1]; 0 disables
  c.label_smoothing = 0.0
  c.dtype = "float32"  # compute dtype ("bfloat16" keeps float32 parameters)
  # The device mesh (big_vision's config.mesh): mesh.data devices split the batch (-1: every
  # device); mesh.model must be 1 (no rule splits a parameter over a model axis yet).
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.model = 1
  # How the parameters and the optimiser state lie on the mesh (jaxcap/training/sharding.py):
  # "replicated" (whole on every device) | "fsdp" (each large array and its Adam moments split
  # over the data axis, big_vision's fsdp; the same numbers, about 1 / mesh.data of the memory).
  # Not part of what a checkpoint is: a run saved under one mesh and rule resumes under another.
  c.sharding = "replicated"
  # The random-bit generator of dropout masks and SCST samples: "threefry2x32" (JAX's default)
  # | "rbg" | "unsafe_rbg" (the accelerator's bit generator: cheaper masks on GPUs and TPUs, other
  # numbers). Fixed for a run at its start: the state's key has the generator's shape.
  c.prng_impl = "threefry2x32"
  # Random bits per dropout-mask element: 32 (flax's masks) | 16 | 8 (32 / k elements per 32-bit
  # draw; keep probability rounded to a multiple of 2**-k: jaxcap.training.dropout).
  c.dropout_bits = 32
  c.spice = False
  # What is done to the captions before they are scored (validation, test, evaluate.py):
  # "none" | "dedupe_repeats" (repeated consecutive words kept once, as the M² authors' scoring
  # does; jaxcap/evaluation/coco_metrics.py CAPTION_POSTPROCESS). Recorded in the signature.
  c.caption_postprocess = "none"
  # Start from the parameters of another run's checkpoint (its workdir; best, else latest),
  # e.g. self-critical training from a cross-entropy run: --config.init_from=runs/xe
  # --config.scst.start_step=0. The optimiser state and the step start afresh.
  c.init_from = ""
  c.data = data_config(dataset)
  c.model = model_config(model, dtype=c.get_ref("dtype"))
  # From pixels, trained end to end (jaxcap/models/pixels.py): with data.images_dir and
  # data.image_size, the backbone ``name`` (a jaxcap-extract backbone: vit_b16, resnet50, ...;
  # "" reads feature files) with its field overrides ``fields`` (JSON, as jaxcap-extract
  # --fields) and initial ``weights`` (.safetensors; "" random) turns each image into the
  # captioner's regions (its grid cells). Its own Adam at the constant ``learning_rate``, held
  # still for the first ``freeze_steps`` updates (ExpansionNet v2's phases: features, then
  # joint; its backward pass skipped meanwhile); ``remat`` recomputes its activations in the
  # backward pass; it computes in ``dtype`` (the run's by default).
  c.backbone = ml_collections.ConfigDict()
  c.backbone.name = ""
  c.backbone.fields = ""
  c.backbone.weights = ""
  c.backbone.learning_rate = 3e-5
  c.backbone.freeze_steps = 0
  c.backbone.remat = False
  c.backbone.dtype = c.get_ref("dtype")
  c.decode = decode_config()
  c.decode.max_len = c.data.max_len
  # Self-critical sequence training (Rennie et al.) after cross-entropy.
  c.scst = ml_collections.ConfigDict()
  c.scst.start_step = -1  # -1: never; otherwise the step at which SCST replaces cross-entropy
  c.scst.start_epoch = -1  # the same in epochs of the training split (-1: use start_step)
  c.scst.learning_rate = 2e-5
  c.scst.num_samples = 5
  # "greedy" (Rennie et al.) | "mean" (mean of the other samples) | "mean_all" (mean of all the
  # image's candidates, its own included: the M² authors')
  c.scst.baseline = "greedy"
  # The candidates rewarded: "sample" (scst.num_samples samples) | "beam" (the scst.num_samples
  # beams of a beam search in decode.beam_mode, as the M² authors' SCST; jaxcap/training/scst.py).
  c.scst.candidates = "sample"
  # The loss's denominator: "tokens" (the candidates' tokens, self-critical.pytorch) | "steps"
  # (per candidate the T decoding steps, then the mean over candidates: the M² authors').
  c.scst.loss_norm = "tokens"
  c.scst.bleu_weight = 0.0
  c.scst.cider_weight = 1.0
  # CLIP-S reward (jaxcap/clip/reward.py; CLIP-Caption-Reward: clip_weight 2.0, cider_weight 0):
  # reward += clip_weight * CLIP-S(caption, image) with the CLIP weights file clip_model and the
  # training images clip_images (a folder searched by image id, or {image_id: path} JSON).
  c.scst.clip_weight = 0.0
  c.scst.clip_model = ""
  c.scst.clip_images = ""
  # + grammar_weight * P(grammatical) from CLIP-Caption-Reward's grammar head (grammar_head: a
  # file with its grammar_score_head.{0,2}.weight) on clip_model's text tower.
  c.scst.grammar_weight = 0.0
  c.scst.grammar_head = ""
  # CIDEr-D reward: "jaxcap" (df on references truncated to max_len, every reference ends with
  # EOS) | "self_critical" (self-critical.pytorch's CiderD exactly: df on full captions, no EOS
  # after a reference at the length limit). See jaxcap/evaluation/cider.py.
  c.scst.cider_compat = "jaxcap"
  # Where the reward is computed: "device" (default: CIDEr-D in jax.numpy inside one jitted
  # step, no host round trip; equals the host reward to ~1e-6, jaxcap/evaluation/cider_device.py)
  # | "host" (NumPy CIDEr-D between two jitted halves: the checking option, and the one that
  # supports bleu_weight > 0).
  c.scst.reward = "device"
  # False: the gradient pass runs without dropout, like sampling (on-policy; see
  # jaxcap/training/scst.py). True: fresh dropout masks in the gradient pass (off-policy).
  c.scst.dropout = False
  # True: the n samples and the greedy baseline are decoded together, one encoder pass over the
  # batch and one loop over n + 1 rows per image (the same tokens as False, which encodes and
  # loops twice; jaxcap/decoding.py sample_and_greedy).
  c.scst.fused_decode = False
  # Scheduled sampling (Bengio et al.): probability of feeding back a sampled word.
  c.scheduled_sampling = ml_collections.ConfigDict()
  c.scheduled_sampling.start_epoch = -1  # -1 disables
  c.scheduled_sampling.increase_every_epochs = 3
  c.scheduled_sampling.increase_prob = 0.05
  c.scheduled_sampling.max_prob = 0.25
  return c


def cpu_sized(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks the schedule for a ~5 minute run on a 2-core CPU (the synthetic default):
  cross-entropy only (no SCST, no scheduled sampling). The decoding stays as the config set
  it (a config that wants greedy decoding at CPU sizes says so after this call)."""
  c.batch_size = 50
  c = run_length(c, 1000, 500)  # 5 epochs of synthetic_scenes; val CIDEr-D is near its plateau
  c.eval_num_images = 250
  c.warmup_steps = 300
  c.scst.start_step = c.scst.start_epoch = -1
  c.scheduled_sampling.start_epoch = -1
  return c


def run_length(c: ml_collections.ConfigDict, num_train_steps: int,
               eval_every_steps: int) -> ml_collections.ConfigDict:
  """``num_train_steps``, validating and checkpointing every ``eval_every_steps``."""
  c.num_train_steps = num_train_steps
  c.eval_every_steps = c.checkpoint_every_steps = eval_every_steps
  return c


def flickr8k_sized(c: ml_collections.ConfigDict, num_train_steps: int = 1200,
                   eval_every_steps: int = 200, dropout: float | None = 0.3):
  """Flickr8k's 700 training images at 25 per step (28 steps an epoch), words seen fewer than 3
  times as UNK; ``dropout`` (None: the model's own) against the tiny split's overfitting."""
  run_length(c, num_train_steps, eval_every_steps)
  c.batch_size = 25
  c.data.min_word_count = 3
  if dropout is not None:
    c.model.dropout = dropout
  return c


def flickr8k_step_decay(c: ml_collections.ConfigDict, dropout: float | None = 0.3,
                        learning_rate: float = 1e-3) -> ml_collections.ConfigDict:
  """:func:`flickr8k_sized` for 1,800 steps with Adam ``learning_rate`` x 0.8 every 10 epochs: the
  Flickr8k schedule of AoANet, ETA and AAT, and (with the dropout and rate chosen on validation)
  of the Transformer and the Image Transformer."""
  return step_decay(flickr8k_sized(c, num_train_steps=1800, dropout=dropout), learning_rate,
                    decay_every_epochs=10)


def step_decay(c: ml_collections.ConfigDict, learning_rate: float, decay_every_epochs: int = 3,
               decay_rate: float = 0.8) -> ml_collections.ConfigDict:
  """Adam at ``learning_rate`` x ``decay_rate`` every ``decay_every_epochs`` epochs, no
  warm-up (self-critical.pytorch's cross-entropy schedule)."""
  c.update(schedule="step", learning_rate=learning_rate, decay_every_epochs=decay_every_epochs,
           decay_rate=decay_rate, warmup_steps=0)
  return c


# Karpathy COCO's training split (with restval): a paper's epochs are counted over it.
COCO_TRAIN_IMAGES = 113287


def coco_steps(epochs: int, batch_size: int) -> int:
  """``epochs`` of Karpathy COCO's training split at ``batch_size`` images per step."""
  return epochs * -(-COCO_TRAIN_IMAGES // batch_size)


def coco_step_schedule(c: ml_collections.ConfigDict, batch_size: int, learning_rate: float,
                       epochs: int, decay_every_epochs: int = 3,
                       beam_size: int = 3) -> ml_collections.ConfigDict:
  """A paper's COCO run with PyTorch's Adam (beta2 0.999, eps 1e-8) and :func:`step_decay`:
  ``epochs`` epochs of ``batch_size`` images, validation and checkpoints every 3,000 steps,
  beam search of ``beam_size``."""
  step_decay(c, learning_rate, decay_every_epochs)
  c.batch_size = batch_size
  c.adam_b2, c.adam_eps = 0.999, 1e-8
  run_length(c, coco_steps(epochs, batch_size), 3000)
  c.decode.method = "beam"
  c.decode.beam_size = beam_size
  return c


def small_sized(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The schedule for a small data set of real images (a few hundred to a few thousand), e.g.
  ``configs/transformer.py:coco,size=small`` on your own bottom-up features.

  A run's length is counted in epochs: ``steps_per_epoch = num_train_images / batch_size``.
  Here batch 16 (a multiple of 8 devices) and 2,000 steps are ~32 epochs of 1,000 images (~100
  of 300); the Noam warm-up is 300 steps (a few epochs: the paper's 20,000 would not end within
  the run); validation and checkpoints every 250 steps on at most 500 images; words seen fewer
  than 2 times are UNK (cocotalk keeps its own vocabulary, min_word_count 1).
  """
  c.batch_size = 16
  c = run_length(c, 2000, 250)
  c.warmup_steps = 300
  c.log_every_steps = 25
  c.eval_num_images = 500
  c.eval_batch_size = 48
  if c.data.name != "cocotalk":
    c.data.min_word_count = 2
  return c
