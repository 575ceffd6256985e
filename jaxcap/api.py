"""jaxcap's Python API: load a finished run, caption features, score, ablate.

Dimension legend: B images, N regions per image, F region-feature width, Dg global-feature
width, K beams, T decoding steps (``max_len``).

::

  import jaxcap
  run = jaxcap.load("runs/transformer_synthetic")          # best checkpoint (or step=N)
  captions = run.caption(feats_BxNxF)                       # list of B strings
  captions = run.caption_images(["a.jpg", "b.png"])         # runs on jaxcap-extract's features
  scores = run.evaluate(split="test")                       # needs the run's dataset
  jaxcap.score({1: ["a red cube"]}, {1: "a red cube"})      # pycocoevalcap metrics
  eta_v = run.ablate(force_gate=1.0)                        # same parameters, changed model

A *run* is a workdir written by ``train.py`` (:mod:`jaxcap.run_dir`: ``config.json``,
``vocab.json``, ``info.json``, ``best/`` and ``checkpoints/``). Loading one needs neither the dataset nor a GPU: the model is
rebuilt from ``config.json`` and the dataset's ``info`` (``info.json``, written when training
starts; runs from before it read ``info`` from their dataset, which must then be on disk), and
the parameters are restored onto one local device. Only :meth:`Run.evaluate` /
:meth:`Run.predict` read the dataset.

Functional ablations (:meth:`Run.ablate`) rebuild the model with changed fields over the same
parameters, as the papers' analyses do without retraining; the switches each model documents:

* ``eta``: ``force_gate=c`` replaces the GBC gate by the constant c (1.0: visual pathway only,
  0.0: semantic only); ``variant="stacked_v"`` / ``"stacked_s"`` drops one pathway (no gate
  computed; equal to ``force_gate=1.0`` / ``0.0`` when ``gbc_activation="identity"``), and
  ``variant="transformer_v"`` / ``"transformer_s"`` keeps only the first attention of it.
* ``aat``: ``max_steps`` (M_max), ``min_steps`` (M_min) and ``epsilon`` of the halting rule at
  test time; ``attention="recurrent", steps=M`` runs M fixed steps with the same weights.
* ``image_transformer``: ``graph="all_neighbour"`` replaces the spatial graph of the boxes by
  "every pair of regions is a neighbour".
* ``tpgn``: ``zero_role_cluster=k`` with ``role_centroids=C`` (``[K, d*d]``, e.g. k-means
  centroids of the u_t, :mod:`jaxcap.papers.tpgn.roles`) zeroes u_t whenever it falls in
  role cluster k.

Any other field of the model's dataclass can be changed the same way (``run.model`` lists them);
an unknown field, or a change the parameters do not fit, is a one-line ``ValueError``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap import config_files, run_dir
from jaxcap.data import base as data_base
from jaxcap.data import batch as batch_lib
from jaxcap.data.vocab import Vocab


# ---------------------------------------------------------------------------------------------
# Configs.


def get_config(spec: str = "transformer.py:synthetic", **overrides):
  """A shipped config: ``get_config("eta.py:synthetic,variant=stacked_v", num_train_steps=200)``.

  Args:
    spec: ``<file>[.py][:<arg>]`` of the shipped configs (``"configs/eta.py:synthetic"`` works
      too; :mod:`jaxcap.config_files`), or the path of your own config file.
    **overrides: config fields, nested ones with ``__`` or given as a dict of dotted keys:
      ``get_config("aat:synthetic", model__dim=64, **{"data.num_train": 500})``.

  Returns:
    The ``ml_collections.ConfigDict`` that ``train.py --config <spec> --config.<k>=<v>`` runs.
  """
  config = config_files.load(spec)
  for key, value in overrides.items():
    config_files.set_field(config, key.replace("__", "."), value)
  return config


def train(config, workdir: str, **overrides) -> "Run":
  """Trains (or resumes) like ``train.py`` and returns :func:`load` of the workdir.

  Args:
    config: a ConfigDict (:func:`get_config`) or a spec string for :func:`get_config`.
    workdir: the run directory.
    **overrides: config fields as in :func:`get_config`.
  """
  from jaxcap import cli
  from jaxcap.training import parallel, train_lib
  parallel.maybe_initialize_distributed()  # a multi-host launch (no-op otherwise)
  if isinstance(config, str):
    config = get_config(config, **overrides)
  else:
    config = copy.deepcopy(config)
    for key, value in overrides.items():
      config_files.set_field(config, key.replace("__", "."), value)
  cli.quiet_logs()
  train_lib.train_and_evaluate(config, workdir)
  return load(workdir)


# ---------------------------------------------------------------------------------------------
# Scoring.


def score(references: Mapping[Any, Sequence[str]], predictions, *, metrics: Sequence[str] | None = None,
          spice: bool = False, tokenize: bool = True, log=print) -> dict:
  """Scores captions with pycocoevalcap's metrics (BLEU 1-4, METEOR, ROUGE-L, CIDEr-D).

  Args:
    references: ``{image_id: [reference caption, ...]}``.
    predictions: ``{image_id: caption}``, or a COCO results list
      ``[{"image_id": ..., "caption": ...}]``; exactly these images are scored.
    metrics: groups among ``"Bleu"``, ``"METEOR"``, ``"ROUGE_L"``, ``"CIDEr"`` (default: all
      four; METEOR needs Java and is skipped with one line without it).
    spice: also SPICE (needs its Stanford CoreNLP jars).
    tokenize: PTB-tokenise both sides first, as ``COCOEvalCap`` does.
    log: receives one line per skipped metric.

  Returns:
    ``{"overall": {"Bleu_1", ..., "CIDEr"}, "per_image": {image_id: {...}}}``.
  """
  from jaxcap.evaluation import coco_metrics
  if not isinstance(predictions, Mapping):
    predictions = {p["image_id"]: p["caption"] for p in predictions}
  kwargs = {} if metrics is None else {"metrics": tuple(metrics)}
  return coco_metrics.score(references, predictions, spice=spice, tokenize=tokenize, log=log, **kwargs)


def _slice_batch(batch: dict, start: int, size: int) -> dict:
  """Rows ``start:start+size`` of ``batch``, the missing rows filled with copies of the first
  (so every chunk has the same shapes and the decoder compiles once)."""
  out = {}
  for k, v in batch.items():
    rows = v[start:start + size]
    if len(rows) < size:
      rows = np.concatenate([rows, np.repeat(rows[:1], size - len(rows), axis=0)])
    out[k] = rows
  return out


# ---------------------------------------------------------------------------------------------
# Runs.


class Run:
  """A trained model with everything needed to use it (see the module docstring).

  Attributes:
    config: the run's ``ml_collections.ConfigDict`` (``config.json``; ablated fields updated).
    vocab: the target :class:`jaxcap.data.vocab.Vocab`.
    info: the dataset's ``info`` dict (feature sizes, vocabulary size, ...).
    model: the flax ``CaptionModel``.
    params: the variables dict given to ``model.apply`` (``{"params": ..., ...}``).
    workdir: where it was loaded from (None for a run built in memory).
    step: the checkpoint's training step.
    ablations: the fields changed by :meth:`ablate` so far.
    mesh: the devices :meth:`predict` splits a dataset's batches over (default: all).
  """

  def __init__(self, config, vocab: Vocab, info: dict, model, params, *, workdir: str | None = None,
               step: int | None = None, dataset=None, ablations: dict | None = None, mesh=None):
    self.config, self.vocab, self.info = config, vocab, dict(info)
    self.model, self.params = model, params
    self.workdir, self.step = workdir, step
    self.ablations = dict(ablations or {})
    self._dataset = dataset
    self._mesh = mesh
    self._predict_fns: dict = {}  # compiled split decoders, by decoding options

  def __repr__(self):
    name = getattr(self.model, "registry_name", type(self.model).__name__)
    extra = f", ablations={self.ablations}" if self.ablations else ""
    return f"Run({self.workdir!r}, model={name!r}, step={self.step}{extra})"

  # ---------------------------------------------------------------- data
  @property
  def dataset(self):
    """The run's dataset (built from ``config.data`` on first use; must be on disk)."""
    if self._dataset is None:
      from jaxcap import data as data_lib
      self._dataset = _check_dataset(data_lib.get_dataset(self.config.data), self.vocab, self.workdir)
    return self._dataset

  @property
  def mesh(self):
    """The device mesh of :meth:`predict` (all devices unless the run was loaded with one)."""
    if self._mesh is None:
      from jaxcap.training import parallel
      self._mesh = parallel.make_mesh()
    return self._mesh

  def batch(self, features) -> dict:
    """The batch dict :meth:`caption` decodes for ``features``
    (:func:`jaxcap.data.batch.from_features`)."""
    return batch_lib.from_features(features, self.info, self.model)

  # ---------------------------------------------------------------- decoding
  def decode_config(self, method: str | None = None, beam_size: int | None = None, **options) -> dict:
    """The decoding options: the run's ``config.decode`` with the given ones replacing it."""
    cfg = dict(self.config.decode.to_dict()) if "decode" in self.config else {}
    if method is not None:
      cfg["method"] = method
    if beam_size is not None:
      cfg["beam_size"] = beam_size
    cfg.update(options)
    return cfg

  def decode(self, features, method: str = "beam", beam_size: int = 3, *, batch_size: int = 50,
             seed: int = 0, return_aux: bool = False, **options):
    """Decodes ``features`` in chunks of ``batch_size`` images.

    Args: as :meth:`caption`; ``return_aux`` also returns the model's per-step outputs
      (attention weights, AAT's steps and confidences, ETA's gate, ...).

    Returns:
      :class:`jaxcap.decoding.DecodeOutput` of numpy arrays: ``tokens`` int32 ``[B, T]``
      (greedy) or ``[B, K | n, T]`` (beam search, best first / samples), ``aux`` a dict of
      ``[B, (K | n,) T, ...]`` arrays with ``return_aux``.
    """
    from jaxcap import decoding
    batch = self.batch(features)
    cfg = self.decode_config(method, beam_size, **options)
    bad = decoding.bad_ending_ids(self.vocab)
    b = len(batch["feats"])
    size = max(1, min(int(batch_size), b))
    outs = []
    for k, start in enumerate(range(0, b, size)):
      chunk = jax.tree.map(jnp.asarray, _slice_batch(batch, start, size))
      rng = jax.random.fold_in(jax.random.PRNGKey(seed), k)
      try:
        out = decoding.decode(self.model, self.params, chunk, cfg, rng=rng, bad_endings=bad,
                              return_aux=return_aux)
      except KeyError as e:
        raise ValueError(f"caption: model {self._name()!r} reads batch[{e.args[0]!r}]; give it in the "
                         f"features dict (see docs/DESIGN.md, section 2)") from None
      outs.append(jax.device_get(out))
    n = b
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:n], *outs)

  def caption(self, features, method: str = "beam", beam_size: int = 3, *, batch_size: int = 50,
              seed: int = 0, **options) -> list[str]:
    """Captions images given their features.

    Args:
      features: one of
        * a dict of numpy arrays with the dataset's batch keys (docs/DESIGN.md, section 2):
          ``feats`` float32 ``[B, N, F]`` and/or ``global_feat`` ``[B, Dg]``, optionally
          ``feats_mask`` bool ``[B, N]`` (default all True), ``boxes`` ``[B, N, 4]`` (x1 y1 x2 y2
          in [0, 1]; the Image Transformer needs them), ``attributes`` int32 ``[B, A]`` (ETA),
          ``src`` int32 ``[B, Ls]`` (translation); a batch of the run's dataset works as is;
        * one array: ``[B, N, F]`` region features (all real) or ``[B, Dg]`` global features
          (for models of global-only datasets, e.g. Flickr8k's ``fc`` features, TPGN);
        * a list of B arrays ``[N_i, F]`` (regions, padded here) or ``[Dg]``.
        ``global_feat`` defaults to the mean of the real regions; with global features only,
        ``feats`` is the global feature as one region (the datasets' convention for N = 1).
      method: ``"greedy"``, ``"beam"`` or ``"sample"``.
      beam_size: K for ``"beam"``.
      batch_size: images decoded at once (the last chunk is padded, so one compilation).
      seed: the sampling seed.
      **options: other decoding options of :func:`jaxcap.decoding.default_decode_config`
        (``max_len``, ``length_penalty``, ``alpha``, ``min_len``, ``block_trigrams``,
        ``suppress_unk``, ``temperature``, ``top_k``, ``top_p``, ``remove_bad_endings``, ...);
        unset ones come from the run's ``config.decode``.

    Returns:
      B captions (the best beam, or the first sample), words joined by spaces.

    Raises:
      ValueError: one line naming the argument and what was expected, for features that do
        not fit the run (:func:`jaxcap.data.batch.from_features`): no image, the wrong rank or size, NaN or Inf,
        boxes not ``[B, N, 4]`` in [0, 1] or missing for the Image Transformer, attribute or
        source ids outside the vocabulary or missing for a model that reads them.
    """
    tokens = self.decode(features, method, beam_size, batch_size=batch_size, seed=seed, **options).tokens
    if tokens.ndim == 3:
      tokens = tokens[:, 0]
    return [self.vocab.decode(row) for row in tokens]

  # ---------------------------------------------------------------- image files
  def backbone(self, weights: str | None = None):
    """The extractor the run's features came from (:class:`jaxcap.features.record.Backbone`,
    built once per ``weights``); one line for a run without ``features.json``."""
    from jaxcap.features import record as record_lib
    cached = getattr(self, "_backbone", None)
    if cached is not None and cached[0] == weights:
      return cached[1]
    record = run_dir.read_features_record(self.workdir) if self.workdir else None
    if record is None:
      raise ValueError(f"{self.workdir}: no {run_dir.FEATURES_FILE}; this run was trained on "
                       "features jaxcap-extract did not write, so it cannot caption image files "
                       "(caption feature arrays with Run.caption)")
    where = os.path.join(self.workdir, run_dir.FEATURES_FILE)
    backbone = record_lib.Backbone(record, weights, where)
    self._backbone = (weights, backbone)
    return backbone

  def image_batch(self, images, weights: str | None = None, *, batch_size: int = 16) -> dict:
    """The batch :meth:`caption_images` decodes: the recorded backbone's features of
    ``images``, laid out as the run's dataset reader lays out the extracted files
    (:func:`jaxcap.data.base.image_features_batch`)."""
    fc_BxD, att_BxCxD = self.backbone(weights).features(images, batch_size)
    return data_base.image_features_batch(fc_BxD, att_BxCxD, self.config.data, self.info)

  def caption_images(self, images, weights: str | None = None, *, batch_size: int = 16,
                     **decode_options) -> list[str]:
    """Captions image files and / or pixel arrays with the backbone the run's features came from.

    Args:
      images: one or a list of image file paths (``str`` / ``Path``) and / or uint8 RGB
        ``[H, W, 3]`` arrays; read as ``jaxcap-extract`` reads files (EXIF orientation, RGB,
        resized to the recorded square ``size``).
      weights: the backbone's ``.safetensors`` file, whose sha256 must be the one the run's
        ``features.json`` records; None for a run trained on random-weight features (the
        recorded seed's weights are rebuilt).
      batch_size: images per backbone call.
      **decode_options: as :meth:`caption` (``method``, ``beam_size``, ``max_len``, ...).

    Returns:
      one caption per image, in order.

    Raises:
      ValueError: one line: a run without ``features.json`` (trained on features
        ``jaxcap-extract`` did not write), other weights than the recorded ones, an unreadable
        file or a non-image array.
    """
    batch = self.image_batch(images, weights, batch_size=batch_size)
    return self.caption(batch, **decode_options)

  # ---------------------------------------------------------------- evaluation
  def predict(self, split: str = "test", *, num_images: int = -1, method: str | None = None,
              beam_size: int | None = None, batch_size: int = 50, seed: int = 0,
              all_sequences: bool = False, **options) -> dict:
    """``{image_id: caption}`` for a split of the run's dataset (or its first ``num_images``).

    Decoding defaults to the run's ``config.decode`` (what ``evaluate.py`` uses); batches of
    ``batch_size`` images are split over :attr:`mesh` (and over processes, each decoding its
    shard) by :func:`jaxcap.inference.predict_split`, the loop training validates with.
    ``all_sequences``: ``{image_id: [caption, ...]}``, every beam / sample, best first.
    """
    from jaxcap import inference
    n = -1 if num_images is None else num_images
    cfg = self.decode_config(method, beam_size, **options)
    return inference.predict_split(self.model, self.params, self.dataset, split, cfg, mesh=self.mesh,
                                   batch_size=batch_size, num_images=n, seed=seed,
                                   all_sequences=all_sequences, cache=self._predict_fns)

  def sample_n(self, split: str, n: int, method: str = "sample", *, batch_size: int = 50,
               seed: int = 0, **options) -> dict:
    """``n`` captions per image of a split (self-critical.pytorch's ``sample_n``):
    ``{image_id: [caption, ...]}``.

    Args:
      method: ``"sample"`` (n samples with the decoding options' temperature / top-k / top-p)
        or ``"beam"`` (the n best hypotheses of a beam search of size n).
      **options: decoding options other than ``method``, as :meth:`caption` (default: the
        run's ``config.decode``).
    """
    from jaxcap import inference
    cfg = inference.sample_n_config(self.decode_config(**options), n, method)
    return self.predict(split, batch_size=batch_size, seed=seed, all_sequences=True, **cfg)

  def evaluate(self, split: str = "test", *, num_images: int = -1, metrics: Sequence[str] | None = None,
               method: str | None = None, beam_size: int | None = None, batch_size: int = 50,
               log=print, **options) -> dict:
    """Decodes a split of the run's dataset and scores it against its references.

    Args:
      split: ``"train"``, ``"val"`` or ``"test"``.
      num_images: score only the first images (-1: all).
      metrics: as :func:`score` (default all; ``("Bleu", "CIDEr")`` is fast and needs no Java).
      method, beam_size, **options: decoding (default: the run's ``config.decode``).

    Returns:
      :func:`score`'s ``{"overall": {...}, "per_image": {...}}``, plus ``"predictions"``
      ``{image_id: caption}``. Translation runs (German output) are scored with
      :mod:`jaxcap.evaluation.translation` (sacreBLEU, METEOR ``-l de``, CIDEr-D).
    """
    preds = self.predict(split, num_images=num_images, method=method, beam_size=beam_size,
                         batch_size=batch_size, **options)
    refs = self.dataset.references(split)
    refs = {k: refs[k] for k in preds}
    if self.dataset.src_vocab is not None:
      from jaxcap.evaluation import translation
      scores = translation.score(refs, preds)
    else:
      scores = score(refs, preds, metrics=metrics, log=log)
    return dict(scores, predictions=preds)

  # ---------------------------------------------------------------- figures
  def plot_training_curves(self, out: str | None = None):
    """:func:`jaxcap.analysis.figures.plot_training_curves` of the run's ``metrics.jsonl``."""
    from jaxcap.analysis import figures
    if self.workdir is None:
      raise ValueError("plot_training_curves: this run has no workdir (no metrics.jsonl)")
    return figures.plot_training_curves(figures.load_metrics(self.workdir), out=out)

  def plot_words(self, features, out_prefix: str, *, index: int = 0, columns: int = 6) -> list[str]:
    """The per-word figures of the greedy caption of image ``index`` of ``features``.

    Soft attention over the region boxes (models reporting ``aux["attention"]``, with
    ``boxes`` in the features), ETA's gate, AAT's steps and confidences
    (:func:`jaxcap.analysis.words.plot_word_figures`); returns the PNG paths written.
    """
    from jaxcap.analysis.words import caption_aux, plot_word_figures
    batch = jax.tree.map(jnp.asarray, self.batch(features))
    max_len = int(self.decode_config().get("max_len", 16))
    words, aux = caption_aux(self.model, self.params, batch, self.vocab, max_len, row=index)
    title = " ".join(w for w in words if w != "<eos>")
    written = plot_word_figures(words, aux, jax.device_get(batch), out_prefix, row=index,
                                title=title, columns=columns)
    if not written:
      raise ValueError(f"plot_words: model {self._name()!r} reports no per-word attention, gate or "
                       f"steps (decode aux keys: {sorted(aux)})")
    return written

  # ---------------------------------------------------------------- ablations
  def ablate(self, *, role_centroids=None, **fields) -> "Run":
    """A new run whose model has ``fields`` changed, over the same parameters.

    Args:
      role_centroids: TPGN only: ``[K, d*d]`` role-cluster centroids read with
        ``zero_role_cluster`` (stored as the ``ablation`` variable collection).
      **fields: model dataclass fields (see the module docstring for each model's switches),
        e.g. ``force_gate=1.0`` (ETA), ``max_steps=2, epsilon=0.1`` (AAT),
        ``graph="all_neighbour"`` (Image Transformer).

    Raises:
      ValueError: one line, for a field the model does not have, or a change its parameters
        do not fit (e.g. ``variant="eta"`` on a ``stacked_v`` run, which lacks a pathway).
    """
    from jaxcap import ensemble as ensemble_lib
    if isinstance(self.model, ensemble_lib.Ensemble):
      raise ValueError("ablate: this run is an ensemble; ablate its members, then ensemble them "
                       "with jaxcap.load_ensemble")
    names = sorted(f.name for f in dataclasses.fields(self.model) if f.name not in ("parent", "name"))
    unknown = [k for k in fields if k not in names]
    if unknown:
      raise ValueError(f"ablate: model {self._name()!r} has no field {unknown[0]!r}; its fields are "
                       f"{', '.join(names)}")
    model = self.model.clone(**fields)
    params = self.params
    if role_centroids is not None:
      from jaxcap.papers.tpgn import model as tpgn
      params = tpgn.with_role_centroids(params, jnp.asarray(role_centroids, jnp.float32))
    _check_model_fits(model, params, self.info, what=f"ablate({_fmt(fields)})")
    config = copy.deepcopy(self.config)
    with config.unlocked() if hasattr(config, "unlocked") else contextlib.nullcontext():
      for k, v in fields.items():
        if v is None or isinstance(v, (bool, int, float, str)):
          config.model[k] = v
    return Run(config, self.vocab, self.info, model, params, workdir=self.workdir, step=self.step,
               dataset=self._dataset, ablations={**self.ablations, **fields}, mesh=self._mesh)

  def _name(self) -> str:
    return getattr(self.model, "registry_name", type(self.model).__name__)


def _fmt(fields: dict) -> str:
  return ", ".join(f"{k}={v!r}" for k, v in fields.items())


def _check_model_fits(model, params, info: dict, what: str) -> None:
  """Traces encode + one decode step on a dummy batch (shapes only) so that a model the
  parameters do not fit fails here, in one line, not inside a later decode."""
  batch = batch_lib.dummy(info, 2)

  def probe(params, batch):
    enc = model.apply(params, batch, method="encode")
    cache = model.apply(params, enc, 2, method="init_cache")
    tokens = jnp.full((2,), 1, jnp.int32)
    return model.apply(params, enc, cache, tokens, jnp.int32(0), method="decode_step")[0]

  try:
    jax.eval_shape(probe, params, jax.tree.map(jnp.asarray, batch))
  except Exception as e:  # flax scope errors, shape mismatches, the models' own ValueErrors
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f"{what}: the parameters do not fit the changed model: {first}") from None


# ---------------------------------------------------------------------------------------------
# Loading.


def _check_dataset(dataset, vocab: Vocab, workdir):
  if dataset.vocab != vocab:
    raise ValueError(f"{workdir}: the dataset's vocabulary ({len(dataset.vocab)} words) is not "
                     f"the run's ({len(vocab)} words); is config.data the run's data?")
  return dataset


def load(workdir: str, step: int | None = None, *, dataset=None, mesh=None) -> Run:
  """Loads a run written by ``train.py`` (or :func:`train`).

  Args:
    workdir: the run directory (:mod:`jaxcap.run_dir`).
    step: a checkpoint step (from ``checkpoints/`` or ``best/``); None: the best checkpoint
      by validation metric, else the latest.
    dataset: the run's dataset, already read (default: read from ``config.data`` on first use);
      its vocabulary must be the run's.
    mesh: a device mesh: the parameters are restored replicated over it and :meth:`Run.predict`
      splits batches over it (default: parameters on the first local device, predictions over
      all devices).

  Returns:
    a :class:`Run` with ``config``, ``vocab``, ``info``, ``model`` and ``params``. No dataset is
    read when ``info.json`` exists.
  """
  from jaxcap.models import registry
  config = run_dir.read_config(workdir)
  vocab = run_dir.read_vocab(workdir)
  info = run_dir.load_info(workdir, config)
  cls = registry.get(config.model.name)
  if not getattr(cls, "trainable", True):
    raise ValueError(f"{workdir}: model {config.model.name!r} has no parameters to load; its "
                     "predictions are in the workdir's predictions_<split>.json")
  if dataset is not None:
    _check_dataset(dataset, vocab, workdir)
  model = registry.build(config.model, info)
  sharding = None
  if mesh is not None:
    from jaxcap.training import parallel
    sharding = parallel.replicated(mesh)
  state = run_dir.restore(workdir, config, model, info, step, sharding=sharding)
  return Run(config, vocab, info, model, state.params, workdir=workdir, step=int(state.step),
             dataset=dataset, mesh=mesh)


def load_ensemble(runs: Sequence[Any], weights: Sequence[float] | None = None) -> Run:
  """Several runs decoded as one (:mod:`jaxcap.ensemble`: step probabilities averaged).

  Args:
    runs: workdirs or loaded :class:`Run` objects (each workdir's best checkpoint); any models,
      one vocabulary.
    weights: one non-negative weight per run (default: equal).

  Returns:
    a :class:`Run` whose ``model`` is a :class:`jaxcap.ensemble.Ensemble` and ``params`` the
    members' variables (a tuple): ``caption``, ``decode``, ``predict`` and ``evaluate`` work as
    for one run, with the first run's config, info and data. ``ablate`` is refused (ablate the
    members, then ensemble them).

  Raises:
    ValueError: one line, when the vocabularies differ or no run is given.
  """
  from jaxcap import ensemble as ensemble_lib
  members = [r if isinstance(r, Run) else load(r) for r in runs]
  if not members:
    raise ValueError("load_ensemble: expected at least one run, got none")
  names = [m.workdir or repr(m) for m in members]
  ensemble_lib.check_same_vocab([m.vocab for m in members], names)
  model, params = ensemble_lib.make_ensemble([m.model for m in members],
                                             [m.params for m in members], weights)
  first = members[0]
  return Run(first.config, first.vocab, first.info, model, params, workdir=first.workdir,
             step=first.step, dataset=first._dataset, mesh=first._mesh)
