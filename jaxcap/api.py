"""jaxcap's Python API: load a finished run, caption, evaluate, ablate.

::

  import jaxcap
  run = jaxcap.load("runs/transformer_synthetic")          # best checkpoint (or step=N)
  captions = run.caption(feats_BxNxF)                       # list of B strings
  captions = run.caption_images(["a.jpg", "b.png"])         # runs on jaxcap-extract's features
  scores = run.evaluate(split="test")                       # needs the run's dataset
  jaxcap.score({1: ["a red cube"]}, {1: "a red cube"})      # pycocoevalcap metrics
  eta_v = run.ablate(force_gate=1.0)                        # same parameters, changed model

A *run* is a workdir written by ``train.py`` (:mod:`jaxcap.run_dir`). Loading one needs neither
the dataset nor a GPU: the model is rebuilt from ``config.json`` and ``info.json`` and the
parameters are restored onto one local device; only :meth:`Run.evaluate` / :meth:`Run.predict`
read the dataset. :class:`Run` holds the run and forwards to the modules that do the work:
:mod:`jaxcap.data.batch` (features to a batch), :mod:`jaxcap.inference` (decoding),
:mod:`jaxcap.run_dir` (the recorded image backbone), :mod:`jaxcap.analysis` (figures),
:mod:`jaxcap.ensemble`. Functional ablations (:meth:`Run.ablate`: each model's switches are
listed in docs/USAGE.md, "Functional ablations") rebuild the model with changed fields over the
same parameters.

Dimension legend: B images, N regions per image, F region-feature width, Dg global-feature
width, K beams, T decoding steps (``max_len``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np

from jaxcap import config_files, ensemble, inference, run_dir
from jaxcap import data as data_lib
from jaxcap.analysis import figures, words
from jaxcap.data import base as data_base
from jaxcap.data import batch as batch_lib
from jaxcap.data.vocab import Vocab
from jaxcap.errors import BadInput, first_line
from jaxcap.evaluation import coco_metrics, signature, translation
from jaxcap.models import pixels, registry
from jaxcap.models.base import check_fits
from jaxcap.training import checkpoint, parallel, train_lib


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
  return _with_overrides(spec, overrides)


def _with_overrides(config, overrides: dict):
  """A copy of ``config`` (or the config of a spec string) with ``overrides`` set."""
  config = config_files.load(config) if isinstance(config, str) else copy.deepcopy(config)
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
  parallel.maybe_initialize_distributed()  # a multi-host launch (no-op otherwise)
  config = _with_overrides(config, overrides)
  checkpoint.quiet_logs()
  train_lib.train_and_evaluate(config, workdir)
  return load(workdir)


def dry_run(config, workdir: str = "", **overrides) -> dict:
  """Will it fit? ``train.py --dry_run`` (:func:`jaxcap.training.train_lib.dry_run`: the figures
  it returns, the one-line errors it raises); ``config`` and ``overrides`` as :func:`train`'s."""
  parallel.maybe_initialize_distributed()
  config = _with_overrides(config, overrides)
  return train_lib.dry_run(config, workdir)


def score(references: Mapping[Any, Sequence[str]], predictions, *, metrics: Sequence[str] | None = None,
          spice: bool = False, tokenize: bool = True, log=print, caption_postprocess: str = "none",
          images: Mapping[Any, str] | None = None, clip_weights: str | None = None,
          pac_weights: str | None = None, refclip_variant: str = "clipscore") -> dict:
  """Scores captions with pycocoevalcap's metrics (BLEU 1-4, METEOR, ROUGE-L, CIDEr-D).

  Args:
    references: ``{image_id: [reference caption, ...]}``.
    predictions: ``{image_id: caption}``, or a COCO results list
      ``[{"image_id": ..., "caption": ...}]``; exactly these images are scored.
    metrics: groups among ``"Bleu"``, ``"METEOR"``, ``"ROUGE_L"``, ``"CIDEr"`` (default: all
      four, less those the environment variable ``JAXCAP_SKIP_METRICS`` names; METEOR needs
      Java and is skipped with one line without it).
    spice: also SPICE (needs its Stanford CoreNLP jars).
    tokenize: PTB-tokenise both sides first, as ``COCOEvalCap`` does.
    log: receives one line per skipped metric, and per CLIP score one note when cosines <= 0
      were clipped to 0 (:func:`jaxcap.clip.metrics.notes`).
    caption_postprocess: ``"none"`` or ``"dedupe_repeats"`` (a run of one word kept once
      before scoring, the M² authors' test.py; named in the signature).
    images: ``{image_id: image file}``, for the CLIP scores.
    clip_weights: a CLIP weights file (OpenAI's ``ViT-B-32.pt``, open_clip's or Hugging Face's
      ``.safetensors``: :mod:`jaxcap.clip.weights`): adds CLIP-S and RefCLIP-S
      (:mod:`jaxcap.clip.score`; the predictions as given, not PTB-tokenised, as clipscore.py).
    pac_weights: PAC-S's checkpoint (``clip_ViT-B-32.pth``): adds PAC-S and RefPAC-S.
    refclip_variant: ``"clipscore"`` (clipscore.py's RefCLIP-S) or ``"clip_caption_reward"``.

  Returns:
    ``{"overall": {"Bleu_1", ..., "CIDEr"}, "per_image": {image_id: {...}}}`` (with CLIP scores
    also ``"clip_cosines"``: per score the cosines clipped to 0, of how many, and their mean),
    each score at its own scale as the scores files keep it (CIDEr-D 0-10, BLEU / METEOR /
    ROUGE-L 0-1, CLIP-S at most 2.5); printed tables show them x100.
  """
  if not isinstance(predictions, Mapping):
    try:
      predictions = {p["image_id"]: p["caption"] for p in predictions}
    except (KeyError, TypeError) as e:
      raise BadInput(f"predictions: {type(e).__name__} {first_line(e)}; expected "
                     "{image_id: caption} or a COCO results list [{\"image_id\": ..., \"caption\": ...}]") from None
  kwargs = {} if metrics is None else {"metrics": tuple(metrics)}
  clip = None
  if clip_weights or pac_weights:  # weights read and checked before the slower metrics run
    from jaxcap.clip import metrics as clip_metrics, score as clip_score
    if images is None:
      raise BadInput("images: the CLIP scores need {image_id: image file}; expected images=...")
    if refclip_variant not in clip_score.REFCLIP_VARIANTS:
      raise BadInput(f"refclip_variant {refclip_variant!r}: expected one of "
                     f"{', '.join(clip_score.REFCLIP_VARIANTS)}")
    clip = clip_metrics.Request(clip_weights, pac_weights, images, refclip_variant).prepare(list(predictions))
  out = coco_metrics.score(references, predictions, spice=spice, tokenize=tokenize, log=log,
                           caption_postprocess=caption_postprocess, **kwargs)
  return clip.add(out, predictions, references, log=log) if clip is not None else out


class Run:
  """A trained model with everything needed to use it (see the module docstring).

  Attributes:
    config: the run's ``ml_collections.ConfigDict`` (``config.json``; ablated fields updated).
    vocab: the target :class:`jaxcap.data.vocab.Vocab`.
    info: the dataset's ``info`` dict (feature sizes, vocabulary size, ...).
    model: the flax ``CaptionModel``.
    params: the variables dict given to ``model.apply`` (``{"params": ..., ...}``).
    feature_model, feature_params, feature_info: what decodes a batch of features
      (:meth:`caption`): the run's model, variables and info, or for a run from pixels
      (``config.backbone``) its captioner, the captioner's variables and the info of its
      features (images go through :meth:`backbone`, the trained one).
    workdir: where it was loaded from (None for a run built in memory).
    step: the checkpoint's training step.
    ablations: the fields changed by :meth:`ablate` so far.
    mesh: the devices :meth:`predict` splits a dataset's batches over (default: all).
  """

  def __init__(self, config, vocab: Vocab, info: dict, model, params, *, workdir: str | None = None,
               step: int | None = None, dataset=None, ablations: dict | None = None, mesh=None):
    self.config, self.vocab, self.info = config, vocab, dict(info)
    self.model, self.params = model, params
    self.feature_model, self.feature_params, self.feature_info = model, params, self.info
    if isinstance(model, pixels.FromPixels):
      self.feature_model, self.feature_params = model.captioner, pixels.split_variables(params)[1]
      self.feature_info = {k: v for k, v in self.info.items() if k != "image_size"}
    self.workdir, self.step = workdir, step
    self.ablations = dict(ablations or {})
    self._dataset, self._mesh = dataset, mesh
    self._predict_fns: dict = {}  # compiled split decoders, by decoding options
    self._backbones: dict = {}  # image backbones, by weights file
    self._checked_decode: set = set()  # decoding option sets already validated

  def __repr__(self):
    extra = f", ablations={self.ablations}" if self.ablations else ""
    return f"Run({self.workdir!r}, model={self._name()!r}, step={self.step}{extra})"

  def _name(self) -> str:
    name = getattr(self.feature_model, "registry_name", type(self.feature_model).__name__)
    return f"{name} from pixels ({self.config.backbone.name})" if self.from_pixels else name

  @property
  def dataset(self):
    """The run's dataset (built from ``config.data`` on first use; must be on disk)."""
    if self._dataset is None:
      self._dataset = _check_dataset(data_lib.get_dataset(self.config.data), self.vocab, self.workdir)
    return self._dataset

  @property
  def mesh(self):
    """The device mesh of :meth:`predict` (all devices unless the run was loaded with one)."""
    if self._mesh is None:
      self._mesh = parallel.make_mesh()
    return self._mesh

  # ---------------------------------------------------------------- decoding
  def batch(self, features) -> dict:
    """The batch dict :meth:`caption` decodes for ``features``
    (:func:`jaxcap.data.batch.from_features`: the forms :meth:`caption` lists, each checked)."""
    return batch_lib.from_features(features, self.feature_info, self.feature_model)

  def decode_config(self, method: str | None = None, beam_size: int | None = None, **options) -> dict:
    """The decoding options: the run's ``config.decode`` with the given ones replacing it."""
    cfg = dict(self.config.decode.to_dict()) if "decode" in self.config else {}
    cfg.update({k: v for k, v in (("method", method), ("beam_size", beam_size)) if v is not None})
    cfg.update(options)
    # Checked once per distinct set of options: building the ConfigDict and validating it
    # took ~1.5 ms of a one-image caption's ~100 ms on a CPU. An unhashable value (a list) is
    # checked every time.
    try:
      key = tuple(sorted(cfg.items()))
      hash(key)
    except TypeError:
      key = None
    if key is None or key not in self._checked_decode:
      self._check_decode(cfg)
      if key is not None:
        self._checked_decode.add(key)
    return cfg

  def _check_decode(self, cfg: dict) -> None:
    """The decoding options as a training run's are checked (values, the model's position
    table, a beam no wider than the vocabulary: a wider one returns empty captions), named as
    the arguments that set them (``decoding option beam_size: ...``)."""
    import ml_collections  # pylint: disable=import-outside-toplevel
    from jaxcap.training import validation  # pylint: disable=import-outside-toplevel
    check = ml_collections.ConfigDict({"model": self.config.model.to_dict(),
                                       "decode": {k: v for k, v in cfg.items() if v is not None}})
    try:
      validation.check_config(check, trainable=False)
      validation.check_beam_size(check, len(self.vocab), self.workdir or "this run")
    except BadInput as e:
      raise BadInput(str(e).replace("config field decode.", "decoding option ")) from None

  def decode(self, features, method: str | None = None, beam_size: int | None = None, *,
             batch_size: int = 50, seed: int = 0, return_aux: bool | Sequence[str] = False, **options):
    """Decodes ``features`` (:func:`jaxcap.inference.decode_features`) in chunks of
    ``batch_size`` images with the run's ``config.decode`` unless told otherwise (:meth:`decode_config`);
    arguments as :meth:`caption`. ``return_aux`` also returns the model's per-step outputs
    (attention weights, AAT's steps, ETA's gate, ...): True for all, or the names of those kept.

    Returns:
      :class:`jaxcap.decoding.DecodeOutput` of numpy arrays: ``tokens`` int32 ``[B, T]``
      (greedy) or ``[B, K | n, T]`` (beams best first / samples), ``aux`` ``[B, (K,) T, ...]``.
    """
    return inference.decode_features(self.feature_model, self.feature_params, self.vocab, self.batch(features),
                                     self.decode_config(method, beam_size, **options),
                                     batch_size=batch_size, seed=seed, return_aux=return_aux)

  def caption(self, features, method: str | None = None, beam_size: int | None = None, *,
              batch_size: int = 50, seed: int = 0, **options) -> list[str]:
    """Captions images given their features, decoded as :meth:`predict`, :meth:`evaluate`,
    ``evaluate.py``, ``jaxcap-serve`` and the exported captioner decode them: with the run's
    ``config.decode`` unless told otherwise (:meth:`decode_config`).

    Args:
      features: one of
        * a dict of numpy arrays with the batch keys (:data:`jaxcap.data.batch.KEYS`): ``feats``
          ``[B, N, F]`` and/or ``global_feat`` ``[B, Dg]``, optionally ``feats_mask`` ``[B, N]``
          (default all True), ``boxes`` ``[B, N, 4]`` in [0, 1] (the Image Transformer),
          ``attributes`` ``[B, A]`` (ETA), ``src`` ``[B, Ls]`` (translation); a batch of the
          run's dataset works as is;
        * one array: ``[B, N, F]`` region features or ``[B, Dg]`` global features;
        * a list of B arrays ``[N_i, F]`` (regions, padded here) or ``[Dg]``.
      method: ``"greedy"``, ``"beam"`` or ``"sample"``; None: the run's ``config.decode.method``
        (greedy for the shipped configs).
      beam_size: K for ``"beam"``; None: the run's ``config.decode.beam_size``.
      batch_size: images decoded at once (the last chunk is padded, so one compilation).
      seed: the sampling seed.
      **options: other decoding options of :func:`jaxcap.decoding.default_decode_config`
        (``max_len``, ``length_penalty``, ``block_trigrams``, ``temperature``, ...); unset ones
        come from the run's ``config.decode``.

    Returns:
      B captions (the best beam, or the first sample), words joined by spaces.

    Raises:
      BadInput: one line naming the argument and what was expected, for features that do
        not fit the run (:func:`jaxcap.data.batch.from_features`).
    """
    tokens = self.decode(features, method, beam_size, batch_size=batch_size, seed=seed, **options).tokens
    return [self.vocab.decode(row) for row in (tokens[:, 0] if tokens.ndim == 3 else tokens)]

  # ---------------------------------------------------------------- image files
  def backbone(self, weights: str | None = None, **detector):
    """The extractor the run's features came from (:func:`jaxcap.run_dir.backbone`), built
    once per ``weights``; for a run from pixels its trained backbone
    (:class:`jaxcap.models.pixels.TrainedBackbone`, no ``weights``: they are the checkpoint's);
    for a run on region features without ``features.json`` given the region detector's
    checkpoint (``pytorch_model.bin`` / ``.pkl``), the detector
    (:class:`jaxcap.detection.backbone.RegionBackbone`; ``detector``: its settings)."""
    if self.from_pixels:
      if weights is not None:
        raise BadInput(f"{weights}: this run trained its backbone ({self.config.backbone.name}); "
                       "expected no weights file (the backbone's weights are the checkpoint's)")
      if detector:
        raise BadInput(f"detector settings {sorted(detector)}: this run trained its backbone; "
                       "expected none")
      if None not in self._backbones:
        self._backbones[None] = pixels.TrainedBackbone(
            self.config.backbone.name, self.model.backbone, pixels.split_variables(self.params)[0],
            self.info["image_size"], self.workdir, self.step)
      return self._backbones[None]
    key = (weights, repr(sorted(detector.items())))  # settings may hold lists (nms_thresholds)
    if key not in self._backbones:
      if self.regions_from(weights):
        from jaxcap.detection import backbone as region_backbone  # noqa: PLC0415
        self._backbones[key] = region_backbone.RegionBackbone(weights, self.info, **detector)
      elif detector:
        raise BadInput(f"detector settings {sorted(detector)}: this run's images go through "
                       f"{'its features.json backbone' if self.workdir else 'no detector'}; expected "
                       "them only with the region detector's weights, for a run on region features")
      else:
        self._backbones[key] = run_dir.backbone(self.workdir, weights)
    return self._backbones[key]

  def regions_from(self, weights) -> bool:
    """Whether ``weights`` puts the region detector in front of this run: a run on region
    features without ``features.json`` (imported from self-critical.pytorch or M², or trained on
    ``jaxcap.detection.extract``'s files) given the detector's checkpoint file."""
    from jaxcap.detection.backbone import is_detector_weights  # noqa: PLC0415 (no jax)
    if self.from_pixels or not is_detector_weights(weights):
      return False
    return not self.workdir or run_dir.read_features_record(self.workdir) is None

  @property
  def from_pixels(self) -> bool:
    """Whether the run reads pixels and trained its backbone (``config.backbone``)."""
    return isinstance(self.model, pixels.FromPixels)

  @property
  def image_layout(self):
    """The data fields :func:`jaxcap.data.base.image_features_batch` lays a backbone's features
    out by: the run's ``config.data``, or for a run from pixels the layout its model gives them
    (:data:`jaxcap.models.pixels.FEATURE_LAYOUT`)."""
    return pixels.FEATURE_LAYOUT if self.from_pixels else self.config.data

  def image_batch(self, images, weights: str | None = None, *, batch_size: int = 16) -> dict:
    """The batch :meth:`caption_images` decodes: the recorded backbone's features of ``images``
    laid out as the run's reader lays out extracted files
    (:func:`jaxcap.data.base.image_features_batch`)."""
    fc_BxD, att_BxCxD = self.backbone(weights).features(images, batch_size)
    return data_base.image_features_batch(fc_BxD, att_BxCxD, self.image_layout, self.feature_info)

  def caption_images(self, images, weights: str | None = None, *, batch_size: int = 16,
                     detector: dict | None = None, **decode_options) -> list[str | None]:
    """Captions image files and / or pixel arrays with the backbone the run's features came from
    (a run from pixels: its trained backbone, :meth:`backbone`).

    A file that cannot be read (missing, truncated, not an image) is skipped with one
    ``warning:`` line on stderr naming it, as ``jaxcap-extract`` skips it, and its caption is
    None; the other images are captioned.

    Args:
      images: one or a list of image file paths and / or uint8 RGB ``[H, W, 3]`` arrays, read
        as ``jaxcap-extract`` reads files (EXIF orientation, RGB, the recorded square ``size``).
      weights: the backbone's ``.safetensors`` file, whose sha256 must be the one the run's
        ``features.json`` records; None for a run on random-weight features or from pixels; for
        a run on bottom-up region features (imported, or on ``jaxcap.detection.extract``'s
        files), the region detector's ``pytorch_model.bin`` / ``faster_rcnn_from_caffe_attr.pkl`` / MILVLG's ``bua-caffe-frcn-r101*.pth``
        (:class:`jaxcap.detection.backbone.RegionBackbone`).
      detector: the region detector's settings (``short``, ``long``, ``min_boxes``, ...;
        defaults: ``python -m jaxcap.detection.extract``'s, the original's 10-100 regions, of
        which the run reads its first ``max_regions`` as it reads a longer file).
      batch_size: images per backbone and decoder call. Fewer images are padded to the next
        power of two (1, 2, 4, ... up to ``batch_size``), more go in chunks of ``batch_size``:
        captioning 3, then 5, then 6 images compiles for 4 and 8 only.
      **decode_options: as :meth:`caption` (``method``, ``beam_size``, ...; unset ones come from
        the run's ``config.decode``).

    Returns:
      One entry per image, in order: its caption, or None for a skipped file.

    Raises:
      BadInput: one line: a run without ``features.json``, other weights than the recorded
        ones, a directory or a non-image array, or no readable image at all.
    """
    backbone = self.backbone(weights, **(detector or {}))
    count = 1 if isinstance(images, (str, os.PathLike)) or getattr(images, "ndim", 0) == 3 else len(images)
    pixels, kept = backbone.read(images, skip_unreadable=True)
    size = _bucket(len(kept), batch_size)
    if hasattr(backbone, "batch"):  # the region detector: regions as the run's reader laid them out
      batch = backbone.batch(pixels, self.feature_info)
    else:
      fc_BxD, att_BxCxD = backbone.pixel_features(pixels, size)
      batch = data_base.image_features_batch(fc_BxD, att_BxCxD, self.image_layout, self.feature_info)
    if len(kept) < size:  # The decoder's shapes are the bucket's too (caption pads only to B).
      batch = {k: v if v is None else np.concatenate([v, np.repeat(v[-1:], size - len(kept), axis=0)])
               for k, v in batch.items()}
    captions = self.caption(batch, batch_size=size, **decode_options)[:len(kept)]
    out: list[str | None] = [None] * count
    for i, caption in zip(kept, captions):
      out[i] = caption
    return out

  # ---------------------------------------------------------------- export
  def export(self, path: str, *, method: str | None = None, beam_size: int | None = None,
             max_len: int | None = None, platforms=("cpu", "cuda"), weights: str | None = None,
             backbone: bool = True) -> dict:
    """Writes the whole captioner (backbone, encoder, greedy and beam search, parameters,
    vocabulary, decoding settings) to one file that :func:`jaxcap.serving.load` runs with jax
    and numpy only (:func:`jaxcap.export.export`); returns its metadata."""
    from jaxcap import export  # jax.export and flatbuffers only when exporting
    return export.export(self, path, method=method, beam_size=beam_size, max_len=max_len,
                         platforms=platforms, weights=weights, backbone=backbone)

  # ---------------------------------------------------------------- a split of the dataset
  def predict(self, split: str = "test", *, num_images: int = -1, method: str | None = None,
              beam_size: int | None = None, batch_size: int = 50, seed: int = 0,
              all_sequences: bool = False, **options) -> dict:
    """``{image_id: caption}`` for a split of the run's dataset (or its first ``num_images``),
    decoded with the run's ``config.decode`` unless told otherwise, split over :attr:`mesh`
    and over processes (:func:`jaxcap.inference.predict_split`, training's validation loop).
    ``all_sequences``: ``{image_id: [caption, ...]}``, every beam / sample, best first.
    """
    cfg = self.decode_config(method, beam_size, **options)
    return inference.predict_split(self.model, self.params, self.dataset, split, cfg, mesh=self.mesh,
                                   batch_size=batch_size, num_images=-1 if num_images is None else num_images,
                                   seed=seed, all_sequences=all_sequences, cache=self._predict_fns)

  def sample_n(self, split: str, n: int, method: str = "sample", *, batch_size: int = 50,
               seed: int = 0, **options) -> dict:
    """``n`` captions per image of a split (self-critical.pytorch's ``sample_n``): ``method``
    ``"sample"`` (the decoding options' temperature / top-k / top-p) or ``"beam"`` (the n best
    of a beam of n); ``{image_id: [caption, ...]}``."""
    cfg = inference.sample_n_config(self.decode_config(**options), n, method)
    return self.predict(split, batch_size=batch_size, seed=seed, all_sequences=True, **cfg)

  def evaluate(self, split: str = "test", *, num_images: int = -1, metrics: Sequence[str] | None = None,
               method: str | None = None, beam_size: int | None = None, batch_size: int = 50,
               log=print, clip_images: str | None = None, clip_weights: str | None = None,
               pac_weights: str | None = None, refclip_variant: str = "clipscore", **options) -> dict:
    """Decodes a split (:meth:`predict`) and scores it against its references.

    Args:
      split: ``"train"``, ``"val"`` or ``"test"``.
      num_images: score only the first images (-1: all).
      metrics: as :func:`score` (default all; ``("Bleu", "CIDEr")`` is fast and needs no Java).
      method, beam_size, **options: decoding (default: the run's ``config.decode``).
      clip_images, clip_weights, pac_weights, refclip_variant: the CLIP scores, as
        ``evaluate.py --clip_images ...`` (:mod:`jaxcap.clip.metrics`; weights and every image
        file checked before decoding).

    Returns:
      :func:`score`'s ``{"overall", "per_image", "signature"}`` (the signature completed with this
      run's decoding, vocabulary, features and step) plus ``"predictions"``; translation runs are
      scored by :mod:`jaxcap.evaluation.translation`.
    """
    clip = None
    if clip_weights or pac_weights or clip_images:
      from jaxcap.clip import metrics as clip_metrics
      if self.dataset.src_vocab is not None:
        raise BadInput("clip_weights / pac_weights: this run translates text; expected a captioning run")
      ids = self.dataset.image_ids(split)
      request = clip_metrics.Request(clip_weights, pac_weights, clip_images, refclip_variant)
      clip = request.with_default_images(self.workdir).prepare(
          ids if num_images is None or num_images < 0 else ids[:num_images])
    preds = self.predict(split, num_images=num_images, method=method, beam_size=beam_size,
                         batch_size=batch_size, **options)
    refs = {k: v for k, v in self.dataset.references(split).items() if k in preds}
    out = dict(translation.score(refs, preds) if self.dataset.src_vocab is not None else
               score(refs, preds, metrics=metrics, log=log,
                     caption_postprocess=run_dir.caption_postprocess(getattr(self, "config", None))),
               predictions=preds)
    if clip is not None:
      clip.add(out, preds, refs, log=log)
    out["signature"] = signature.build(metrics=out["signature"], split=split, num_images=len(preds), **run_dir.made_by(
        self.config, self.vocab, self.info, split=split, step=self.step, workdir=self.workdir,
        decode=self.decode_config(method, beam_size, **options), dataset=self.dataset))
    return out

  # ---------------------------------------------------------------- figures
  def plot_training_curves(self, out: str | None = None):
    """:func:`jaxcap.analysis.figures.plot_training_curves` of the run's ``metrics.jsonl``."""
    if self.workdir is None:
      raise BadInput("plot_training_curves: this run has no workdir (no metrics.jsonl)")
    return figures.plot_training_curves(figures.load_metrics(self.workdir), out=out)

  def plot_words(self, features, out_prefix: str, *, index: int = 0, columns: int = 6) -> list[str]:
    """The per-word figures (attention over the boxes, ETA's gate, AAT's steps) of the greedy
    caption of image ``index`` of ``features`` (:func:`jaxcap.analysis.words.plot_run_words`)."""
    return words.plot_run_words(self.feature_model, self.feature_params, self.vocab, self.batch(features),
                                int(self.decode_config().get("max_len", 16)), out_prefix,
                                index=index, columns=columns)

  # ---------------------------------------------------------------- ablations
  def ablate(self, **fields) -> "Run":
    """A new run whose model has ``fields`` changed, over the same parameters.

    Args:
      **fields: model dataclass fields, e.g. ``force_gate=1.0`` (ETA), ``max_steps=2,
        epsilon=0.1`` (AAT), ``graph="all_neighbour"`` (Image Transformer); and the inputs a
        model's ablations read besides its parameters (its ``ablation_inputs``; TPGN's
        ``role_centroids``: ``[K, d*d]`` role-cluster centroids read with
        ``zero_role_cluster``, or the path of a ``.npy`` file of them).

    Raises:
      BadInput: one line, for a field the model does not have, or a change its parameters
        do not fit (e.g. ``variant="eta"`` on a ``stacked_v`` run, which lacks a pathway).
    """
    if isinstance(self.model, ensemble.Ensemble):
      raise BadInput("ablate: this run is an ensemble; ablate its members, then ensemble them "
                     "with jaxcap.load_ensemble")
    from_pixels = isinstance(self.model, pixels.FromPixels)
    target = self.model.captioner if from_pixels else self.model  # a run from pixels: its captioner's
    names = sorted(f.name for f in dataclasses.fields(target) if f.name not in ("parent", "name"))
    inputs = {k: v for k, v in fields.items()
              if k in getattr(target, "ablation_inputs", ()) and v is not None}
    fields = {k: v for k, v in fields.items() if k not in getattr(target, "ablation_inputs", ())}
    unknown = [k for k in fields if k not in names]
    if unknown:
      raise BadInput(f"ablate: model {self._name()!r} has no field {unknown[0]!r}; its fields are "
                     f"{', '.join(names)}")
    if from_pixels and inputs:
      raise BadInput(f"ablate: {sorted(inputs)[0]} is an input of a feature run's model; this run "
                     "reads pixels (config.backbone); expected model fields only")
    model, params = target.clone(**fields), self.params
    for k, v in inputs.items():
      params = model.with_ablation_input(params, k, v)
    if from_pixels:
      model = self.model.clone(captioner=model)
    check_fits(model, params, self.info, f"ablate({', '.join(f'{k}={v!r}' for k, v in fields.items())})")
    config = copy.deepcopy(self.config)
    with config.unlocked() if hasattr(config, "unlocked") else contextlib.nullcontext():
      for k, v in fields.items():
        if v is None or isinstance(v, (bool, int, float, str)):
          config.model[k] = v
    return Run(config, self.vocab, self.info, model, params, workdir=self.workdir, step=self.step,
               dataset=self._dataset, ablations={**self.ablations, **fields}, mesh=self._mesh)


def _bucket(n: int, batch_size: int) -> int:
  """The images per call for ``n`` images: the next power of two, at most ``batch_size``, so
  that a few shapes are compiled whatever the image counts."""
  batch_size = max(1, int(batch_size))
  return min(batch_size, 1 << max(0, int(n) - 1).bit_length())


def _check_dataset(dataset, vocab: Vocab, workdir):
  if dataset.vocab != vocab:
    raise BadInput(f"{workdir}: the dataset's vocabulary ({len(dataset.vocab)} words) is not "
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
  """
  config = run_dir.read_config(workdir)
  vocab = run_dir.read_vocab(workdir)
  info = run_dir.load_info(workdir, config)
  if not getattr(registry.get(config.model.name), "trainable", True):
    raise BadInput(f"{workdir}: model {config.model.name!r} has no parameters to load; its "
                   "predictions are in the workdir's predictions_<split>.json")
  if dataset is not None:
    _check_dataset(dataset, vocab, workdir)
  model, info = pixels.build_for_run(config, info)  # a run from pixels: its backbone too
  sharding = None if mesh is None else parallel.replicated(mesh)
  state = run_dir.restore(workdir, config, model, info, step, sharding=sharding)
  return Run(config, vocab, info, model, state.params, workdir=workdir, step=int(state.step),
             dataset=dataset, mesh=mesh)


def load_ensemble(runs: Sequence[Any], weights: Sequence[float] | None = None) -> Run:
  """Several runs (workdirs, each at its best checkpoint, or loaded :class:`Run` objects; any
  models, one vocabulary) decoded as one: :class:`jaxcap.ensemble.Ensemble` averages their step
  probabilities with ``weights`` (default equal). ``caption``, ``decode``, ``predict`` and
  ``evaluate`` work as for one run, with the first run's config, info and data; ``ablate`` is
  refused (ablate the members, then ensemble them). One line when the vocabularies differ or
  no run is given."""
  members = [r if isinstance(r, Run) else load(r) for r in runs]
  if not members:
    raise BadInput("load_ensemble: expected at least one run, got none")
  ensemble.check_same_vocab([m.vocab for m in members], [m.workdir or repr(m) for m in members])
  model, params = ensemble.make_ensemble([m.model for m in members], [m.params for m in members], weights)
  first = members[0]
  return Run(first.config, first.vocab, first.info, model, params, workdir=first.workdir,
             step=first.step, dataset=first._dataset, mesh=first._mesh)
