"""The captioning server behind ``jaxcap-serve``: an aiohttp app over a run or an exported artefact.

Endpoints (docs/USAGE.md, "Serving and the web page"):

* ``POST /caption``: one image (``image/png`` / ``image/jpeg`` body, or a multipart form's file;
  runs whose features came from ``jaxcap-extract``'s backbone only), a feature array (``.npy``
  body as ``application/x-npy`` or ``application/octet-stream``, float32 ``[N, F]`` one image or
  ``[B, N, F]``), or ``?example=<i>`` (image ``i`` of the run's synthetic test split). Query:
  ``method=greedy|beam|sample``, ``beam_size``, ``samples`` (sample's n), ``seed``. Answers
  ``{"captions": [{"caption", "words", "tokens", "attention": [T][N] | null, "boxes": [N][4] |
  null, "alternatives": [...]}], "method", "images", "seconds"}`` (one caption per image).
* ``GET /health``, ``GET /metadata``, ``GET /examples``, ``GET /examples/<i>.png``, ``GET /``
  (the page in :mod:`jaxcap.serving` ``static/``).

Concurrent requests are batched (:class:`Batcher`): the first request waits up to
``max_wait_ms`` for others with the same decoding settings until ``max_batch`` images are
queued, then one decode call answers them all. Every decode runs on one worker thread (JAX
calls stay serial; the event loop keeps accepting requests meanwhile). A bad request is a 4xx
with a one-line ``{"error": "..."}`` and changes nothing for the others; any other failure is an
error in jaxcap: a 500 saying so, its traceback on the server's stderr.

Dimension legend: B images, N regions, F region-feature width, T caption words, K beams.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import io
import os
import time
import tokenize
import traceback
from typing import Any

import numpy as np
from aiohttp import http_exceptions, web

from jaxcap.data import batch as batch_lib
from jaxcap.errors import BadInput, bug_words, first_line
from jaxcap.images import IMAGE_RUNS, opened

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
METHODS = ("greedy", "beam", "sample")
NPY_TYPES = ("application/x-npy", "application/npy", "application/octet-stream")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg")
MAX_BODY_BYTES = 16 * 1024 * 1024  # a big photo or a few hundred images' region features
MAX_IMAGES = 64  # per request: one request may not hold the decoder for everyone else
MAX_BEAM, MAX_SAMPLES = 16, 10
EXAMPLE_SIDE = 256  # px of the drawn test images (the page scales them)
# Why a served model takes no image, and which run would (GET /metadata's input.no_images, shown
# by the page in place of its image drop; POST /caption of an image answers it as its 400).
NO_IMAGES_RUN = ("this run has no image backbone (no features.json: it was trained on features "
                 f"jaxcap-extract did not write, such as the synthetic scenes' embedded ones); {IMAGE_RUNS}")
NO_IMAGES_EXPORT = ("this captioner has no image backbone (exported from a run without "
                    f"features.json or with --no_backbone); {IMAGE_RUNS}")


class BadRequest(BadInput):
  """A client error: its one line goes back as ``{"error": ...}`` with ``status``."""

  def __init__(self, msg: str, status: int = 400):
    super().__init__(msg)
    self.status = status


def _feature_images(x: np.ndarray, feature_dim: int) -> np.ndarray:
  """A posted ``[N, F]`` (one image) or ``[B, N, F]`` array as ``[B, N, F]``, at most
  :data:`MAX_IMAGES` images; the backend checks the rest (width, regions, finite values)."""
  if x.ndim == 2:
    x = x[None]
  if x.ndim != 3:
    raise BadRequest(f"features of shape {list(x.shape)}; expected float32 [N, {feature_dim}] "
                     f"(one image) or [B, N, {feature_dim}]")
  if len(x) > MAX_IMAGES:
    raise BadRequest(f"features of shape {list(x.shape)}: {len(x)} images; expected at most "
                     f"{MAX_IMAGES} per request", 413)
  return x


# ---------------------------------------------------------------------------- backends
@dataclasses.dataclass(frozen=True)
class Settings:
  """Decoding settings of a request; requests are batched only with equal settings."""
  method: str = "greedy"
  beam_size: int = 3
  samples: int = 1
  seed: int | None = None


def _words(vocab, row) -> tuple[list[int], list[str]]:
  """The token ids in the exported captioner's convention (:mod:`jaxcap.serving.artefact`:
  without BOS / PAD, ending with EOS when the model emitted it), and the words before EOS."""
  from jaxcap.data.vocab import BOS, EOS, PAD
  ids, words = [], []
  for t in np.asarray(row).tolist():
    if t in (PAD, BOS):
      continue
    ids.append(int(t))
    if t == EOS:
      break
    words.append(vocab.decode([t]))
  return ids, words


def attention_rows(att, length: int, regions: int):
  """``[T][n]`` lists of one sequence's attention (``[T_max, N]``): the caption's ``length``
  words over the image's ``regions`` real regions; None when the model records none or not
  one weight per region (a shape this page cannot draw)."""
  if att is None:
    return None
  a = np.asarray(att, np.float64)  # float64: rounded values print as written (0.15484)
  if a.ndim != 2 or a.shape[1] < regions:
    return None
  return np.round(a[:length, :regions], 5).tolist()


def sequence_results(vocab, tokens, aux, regions: list[int], boxes) -> list[dict]:
  """One dict per image of a decode's output (``tokens`` ``[B, T]`` or ``[B, K, T]``, ``aux``
  with ``"attention"`` ``[B, (K,) T, N]`` where the model has it): the best sequence's caption,
  words, tokens (ending with EOS when emitted, as the exported captioner's), attention over the
  image's real regions and their boxes, and the other beams / samples as ``alternatives``. A
  model without attention gets no boxes either: they only place the attention on the image."""
  tokens = np.asarray(tokens)
  att = None if not aux else aux.get("attention")
  att = None if att is None else np.asarray(att)
  if att is None:
    boxes = None
  out = []
  for b in range(len(regions)):
    rows = tokens[b] if tokens.ndim == 3 else tokens[b][None]
    atts = None if att is None else (att[b] if tokens.ndim == 3 else att[b][None])
    seqs = []
    for k, row in enumerate(rows):
      ids, words = _words(vocab, row)
      seqs.append({"caption": " ".join(words), "words": words, "tokens": ids,
                   "attention": None if atts is None else attention_rows(atts[k], len(words), regions[b])})
    first = dict(seqs[0])
    first["boxes"] = None if boxes is None else np.round(np.asarray(boxes[b][:regions[b]], np.float64), 5).tolist()
    first["alternatives"] = seqs[1:]
    out.append(first)
  return out


def _bucket(n: int, limit: int) -> int:
  """The rows of one decode call for ``n`` images (:func:`jaxcap.data.batch.bucket`, at most
  ``limit``): a few shapes compiled whatever the traffic, at most 12.5 % padding."""
  return batch_lib.bucket(n, max(1, int(limit)))


class RunBackend:
  """Serves a :class:`jaxcap.api.Run` (``jaxcap.load(workdir)``).

  Requests become rows of the run's batch dict (:meth:`features_rows`, :meth:`image_rows`,
  :meth:`example_rows`) at their own number of regions; a decode call pads them to a bucket of
  its longest request's regions, so every call has a shape ``[bucket(B), bucket(N), F]``
  (:func:`jaxcap.data.batch.bucket`) and each bucket's program stays compiled.
  """

  methods = METHODS

  def __init__(self, run, max_batch: int = 8, weights: str | None = None, detector: dict | None = None):
    self.run, self.max_batch, self.weights, self.detector = run, int(max_batch), weights, dict(detector or {})
    self.info = run.info
    self.max_regions = int(run.info["max_regions"])
    self.feature_dim = int(run.info["feature_dim"])
    self._backbone = None
    # A run on jaxcap-extract's features (its features.json), from pixels (its trained backbone),
    # or on region features with the region detector's weights (Run.regions_from).
    self.has_backbone = getattr(run, "from_pixels", False) or (
        bool(run.workdir) and os.path.exists(os.path.join(run.workdir, "features.json"))) or (
        weights is not None and run.regions_from(weights))
    if weights is not None:
      self.backbone()  # the weights' one-line refusal before the server starts
    self._scenes = None
    self._png: dict[int, bytes] = {}
    self.examples = self._examples_split()

  # ---------------------------------------------------------------- identity
  def metadata(self) -> dict:
    run = self.run
    decode = {k: v for k, v in run.decode_config().items() if isinstance(v, (int, float, str, bool))}
    return {
        "model": run._name(), "vocab_size": len(run.vocab), "decoding": decode,
        "run": {"workdir": run.workdir, "step": run.step, "data": str(run.config.data.get("name", "")),
                "grid": bool(run.config.data.get("grid", False))},
        "input": {"feature_dim": self.feature_dim, "max_regions": self.max_regions,
                  "global_dim": int(run.info["global_dim"]), "dtype": "float32",
                  "features": "[N, F] or [B, N, F] .npy (application/x-npy or application/octet-stream)",
                  "images": self.has_backbone, "examples": self.examples is not None,
                  "no_images": None if self.has_backbone else NO_IMAGES_RUN,
                  "num_examples": 0 if self.examples is None else len(self.examples)},
    }

  def check(self, settings: "Settings") -> None:
    """Every method and size of :func:`settings_from` decodes a run."""

  # ---------------------------------------------------------------- inputs
  def _rows(self, batch: dict) -> dict:
    """The request's rows (feats, feats_mask, boxes, global_feat) at its own number of regions,
    at most ``max_regions``; :meth:`decode` pads a call's requests to one bucket of regions."""
    n = batch["feats"].shape[1]
    if n > self.max_regions:
      raise BadRequest(f"features of shape {list(batch['feats'].shape)}: {n} regions; expected at "
                       f"most {self.max_regions} per image (this run's max_regions)")
    b = len(batch["feats"])
    out = {"feats": np.asarray(batch["feats"], np.float32), "feats_mask": np.asarray(batch["feats_mask"], bool),
           "global_feat": np.asarray(batch["global_feat"], np.float32)}
    if batch.get("boxes") is not None:
      out["boxes"] = np.asarray(batch["boxes"], np.float32)
    else:  # drawn as whole-image boxes: the model reads none (from_features checked that)
      out["boxes"] = np.broadcast_to(np.float32([0.0, 0.0, 1.0, 1.0]), (b, n, 4))
    out["has_boxes"] = np.full((b,), batch.get("boxes") is not None)
    return out

  def features_rows(self, x: np.ndarray) -> dict:
    """Rows for a ``[N, F]`` or ``[B, N, F]`` float32 array (checked by the run's
    :func:`jaxcap.data.batch.from_features`: one line for a wrong width or non-finite values)."""
    x = _feature_images(x, self.feature_dim)
    try:
      batch = self.run.batch(x)
    except BadInput as e:
      raise BadRequest(str(e).splitlines()[0]) from None
    return self._rows(batch)

  def example_rows(self, i: int) -> dict:
    source = self.examples
    example = source[i]
    batch = {"feats": example["feats"][None], "feats_mask": np.ones((1, len(example["feats"])), bool),
             "boxes": example["boxes"][None], "global_feat": example["global_feat"][None]}
    return self._rows(batch)

  def image_pixels(self, data: bytes) -> np.ndarray:
    """The image bytes read as the backbone reads files (one line for a non-image)."""
    if not self.has_backbone:
      raise BadRequest(NO_IMAGES_RUN + "; expected a .npy feature array or ?example=<i>")
    pixels = decode_image(data)
    try:
      read, _ = self.backbone().read([pixels])
    except BadInput as e:
      raise BadRequest(str(e).splitlines()[0]) from None
    return list(read)

  def backbone(self):
    if self._backbone is None:
      self._backbone = self.run.backbone(self.weights, **self.detector)
    return self._backbone

  # ---------------------------------------------------------------- the synthetic test split
  def _examples_split(self):
    """The test split of a ``synthetic_scenes`` run (drawn by :mod:`jaxcap.data.render`), else None."""
    if str(self.run.config.data.get("name", "")) != "synthetic_scenes":
      return None
    dataset = self.run.dataset
    reader = dataset.split_data("test").features
    self._scenes = getattr(reader, "scenes", None)
    return dataset.split("test") if self._scenes is not None else None

  def example_list(self) -> list[dict]:
    if self.examples is None:
      raise BadRequest("this run has no drawable test split (examples need a synthetic_scenes "
                       "run); expected an image or a .npy feature array", 404)
    refs = self.examples.dataset.split_data("test").refs
    return [{"index": i, "image": f"examples/{i}.png", "references": [" ".join(r) for r in refs[i]]}
            for i in range(len(self.examples))]

  def example_png(self, i: int) -> bytes:
    if i not in self._png:
      from PIL import Image
      from jaxcap.data import render
      pixels = render.render_scene(self._scenes.scene("test", i), EXAMPLE_SIDE)
      buf = io.BytesIO()
      Image.fromarray(pixels, "RGB").save(buf, format="PNG")
      self._png[i] = buf.getvalue()
    return self._png[i]

  def check_example(self, text: str, status: int = 404) -> int:
    """The index ``text`` names: a 404 for a test image that is not there; ``status`` for text
    that is no integer (400 for the query argument, 404 for a path)."""
    if self.examples is None:
      raise BadRequest(f"example={text!r}: this run has no drawable test split; expected an "
                       "image or a .npy feature array", 404)
    try:
      i = int(text)
    except ValueError:
      raise BadRequest(f"example={text!r}: expected an integer index in [0, {len(self.examples)})",
                       status) from None
    if not 0 <= i < len(self.examples):
      raise BadRequest(f"example={text!r}: expected an index in [0, {len(self.examples)})", 404)
    return i

  # ---------------------------------------------------------------- decoding (worker thread)
  def decode(self, settings: Settings, items: list[tuple[str, Any]]) -> list[list[dict]]:
    """One decode call for the queued requests' rows; a list of results per request."""
    pixels = [p for kind, value in items if kind == "pixels" for p in value]
    image_rows = self._image_rows(pixels) if pixels else None
    rows, used = [], 0
    for kind, value in items:
      if kind == "pixels":  # this request's share of the one backbone call
        rows.append({k: v[used:used + len(value)] for k, v in image_rows.items()})
        used += len(value)
      else:
        rows.append(value)
    keys = ("feats", "feats_mask", "boxes", "global_feat")
    counts = [len(r["feats"]) for r in rows]
    # The region axis at a bucket of the call's longest request (zeros / False after each).
    n = batch_lib.bucket(max(r["feats"].shape[1] for r in rows), self.max_regions)

    def padded(x, key):
      if key == "global_feat":
        return x
      return np.pad(x, ((0, 0), (0, n - x.shape[1])) + ((0, 0),) * (x.ndim - 2))

    batch = {k: np.concatenate([padded(r[k], k) for r in rows]) for k in keys}
    has_boxes = np.concatenate([r["has_boxes"] for r in rows])
    total = len(batch["feats"])
    size = _bucket(total, self.max_batch)
    if total % size:  # the last call's rows padded with copies: its shape is the bucket's
      pad = size - total % size
      batch = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in batch.items()}
    options = {"num_samples": settings.samples} if settings.method == "sample" else {}
    seed = settings.seed if settings.seed is not None else time.time_ns() % (2 ** 31)
    # Only the attention the page shows: a model's other per-step outputs (M2's cross-attention
    # of every layer and head) would be carried through every step of the search.
    out = self.run.decode(batch, settings.method, settings.beam_size, batch_size=size, seed=seed,
                          return_aux=("attention",), **options)
    aux = out.aux if isinstance(out.aux, dict) else None
    regions = batch["feats_mask"][:total].sum(1).astype(int).tolist()
    results = sequence_results(self.run.vocab, out.tokens[:total],
                               None if aux is None else {k: v[:total] for k, v in aux.items()},
                               regions, batch["boxes"][:total])
    for r, boxed in zip(results, has_boxes.tolist()):
      if not boxed:
        r["boxes"] = None
    split, start = [], 0
    for c in counts:
      split.append(results[start:start + c])
      start += c
    return split

  def _image_rows(self, pixels: list) -> dict:
    """Rows of images read by :meth:`image_pixels`: one backbone call for all of them."""
    from jaxcap.data import base as data_base
    if hasattr(self.backbone(), "batch"):  # the region detector: its regions, their boxes
      return self._rows(self.backbone().batch(pixels, self.run.feature_info))
    size = _bucket(len(pixels), self.max_batch)
    stacked = pixels if self.backbone().size == "native" else np.stack(pixels)
    fc, att = self.backbone().pixel_features(stacked, size)
    batch = data_base.image_features_batch(fc[:len(pixels)], att[:len(pixels)], self.run.image_layout,
                                             self.run.feature_info)
    return self._rows(batch)


class ArtefactBackend:
  """Serves a :func:`jaxcap.serving.load` captioner (``.metadata``, ``.caption(features,
  method=...)``, ``.caption_images(images, method=...)``): greedy and beam at the exported beam
  size only, no examples (no dataset), no boxes (the artefact returns none)."""

  methods = ("greedy", "beam")

  def __init__(self, captioner, path: str, max_batch: int = 8):
    self.captioner, self.path, self.max_batch = captioner, path, int(max_batch)
    self.meta = dict(captioner.metadata)
    inputs = self.meta.get("inputs", {})
    self.feature_dim, self.max_regions = int(inputs.get("feature_dim", 0)), int(inputs.get("max_regions", 0))
    self.has_backbone = bool(getattr(captioner, "has_backbone", False))
    self.decoding = dict(self.meta.get("decode", {}))
    self.examples = None

  def metadata(self) -> dict:
    run = self.meta.get("run", {})
    inputs = self.meta.get("inputs", {})
    return {"model": self.meta.get("model"), "vocab_size": len(self.meta.get("vocab", ())),
            "decoding": self.decoding,
            "run": {"artefact": self.path, **{k: v for k, v in run.items() if isinstance(v, (str, int, float))}},
            "input": {"feature_dim": self.feature_dim, "max_regions": self.max_regions,
                      "global_dim": int(inputs.get("global_dim", 0)), "dtype": "float32",
                      "features": "[N, F] or [B, N, F] .npy (application/x-npy or application/octet-stream)",
                      "images": self.has_backbone, "examples": False, "num_examples": 0,
                      "no_images": None if self.has_backbone else NO_IMAGES_EXPORT}}

  def check(self, settings: "Settings") -> None:
    if settings.method not in self.methods:
      raise BadRequest(f"method={settings.method!r}: expected one of {', '.join(self.methods)} "
                       "(an exported captioner decodes these only)")
    exported = int(self.decoding.get("beam_size", settings.beam_size))
    if settings.method == "beam" and settings.beam_size != exported:
      raise BadRequest(f"beam_size={settings.beam_size}: expected {exported}, the exported beam size")

  def check_example(self, text: str, status: int = 404) -> int:
    raise BadRequest(f"example={text!r}: an exported captioner has no dataset; expected an image "
                     "or a .npy feature array", 404)

  def example_list(self):
    raise BadRequest("/examples: an exported captioner has no dataset (no test images); expected "
                     "POST /caption of an image or a .npy feature array", 404)

  def features_rows(self, x: np.ndarray) -> dict:
    x = _feature_images(x, self.feature_dim)
    try:
      self.captioner.batch(x)  # the artefact's own checks (width, regions, finite), one line
    except BadInput as e:
      raise BadRequest(str(e).splitlines()[0]) from None
    return {"feats": list(x)}

  def image_pixels(self, data: bytes) -> list:
    if not self.has_backbone:
      raise BadRequest(NO_IMAGES_EXPORT + "; expected a .npy feature array")
    return [decode_image(data)]

  def decode(self, settings: "Settings", items) -> list[list[dict]]:
    feats = [a for kind, v in items if kind != "pixels" for a in v["feats"]]
    pixels = [p for kind, v in items if kind == "pixels" for p in v]
    by_features = iter(self.captioner.caption(feats, method=settings.method) if feats else [])
    by_images = iter(self.captioner.caption_images(pixels, method=settings.method) if pixels else [])
    regions = iter([len(a) for a in feats])
    out = []
    for kind, v in items:
      if kind == "pixels":
        out.append([_artefact_result(next(by_images), None) for _ in v])
      else:
        out.append([_artefact_result(next(by_features), next(regions)) for _ in v["feats"]])
    return out


def _artefact_result(r: dict, regions: int | None) -> dict:
  """A captioner's result in the server's form: its tokens as they are (ending with EOS when
  emitted, as :func:`sequence_results`' are), attention over the image's own regions (a batch of
  several requests is padded to its largest), no boxes."""
  words = list(r.get("words", []))
  att = r.get("attention")
  if att is not None:
    att = np.asarray(att, np.float64)
    att = np.round(att[:, :regions] if regions is not None and att.ndim == 2 else att, 5).tolist()
  return {"caption": r.get("caption", " ".join(words)), "words": words,
          "tokens": [int(t) for t in r.get("tokens", [])], "attention": att,
          "boxes": None, "alternatives": []}


def decode_image(data: bytes) -> np.ndarray:
  """``[H, W, 3]`` uint8 RGB of PNG / JPEG bytes (EXIF orientation applied); one line otherwise."""
  from PIL import ImageOps, UnidentifiedImageError
  try:
    try:
      img = opened(io.BytesIO(data), "the image")
    except BadInput as e:  # more pixels than Pillow's limit, refused from the header
      raise BadRequest(first_line(e), 413) from None
    with img:
      if img.format not in ("PNG", "JPEG"):
        raise BadRequest(f"an image in {img.format} format; expected PNG or JPEG", 415)
      img = ImageOps.exif_transpose(img)
      return np.asarray(img.convert("RGB"), np.uint8)
  except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
    if isinstance(e, BadRequest):
      raise
    raise BadRequest("the body is not a readable image; expected PNG or JPEG bytes") from None


def _check_npy_size(data: bytes) -> None:
  """Refuses a ``.npy`` whose header declares more bytes than the body holds, before ``np.load``
  allocates what the header says (a shape of 10^5 x 10^5 in a 200-byte body: 37 GiB)."""
  f = io.BytesIO(data)
  version = np.lib.format.read_magic(f)
  read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
  shape, _, dtype = read_header(f)
  declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
  if declared > len(data) - f.tell():
    raise BadRequest(f"the .npy body declares a {dtype} array of shape {list(shape)} ({declared:,} "
                     f"bytes) in {len(data) - f.tell():,} bytes of data; expected np.save's bytes "
                     "of a float32 array")


def read_npy(data: bytes) -> np.ndarray:
  """A ``.npy`` body as a float32 array (no pickles); one line for anything else."""
  if not data.startswith(b"\x93NUMPY"):
    raise BadRequest("the body is not a .npy file (no \\x93NUMPY header); expected np.save's bytes "
                     "of a float32 [N, F] or [B, N, F] array")
  try:
    _check_npy_size(data)
    x = np.load(io.BytesIO(data), allow_pickle=False)
  except BadRequest:
    raise
  except (ValueError, OSError, EOFError, tokenize.TokenError, SyntaxError) as e:
    # TokenError, IndentationError: numpy's parse of a damaged header (its filter of Python 2 headers)
    raise BadRequest(f"the .npy body could not be read ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                     "expected np.save's bytes of a float32 array") from None
  if not isinstance(x, np.ndarray) or x.dtype != np.float32:
    raise BadRequest(f"features of dtype {getattr(x, 'dtype', type(x).__name__)}; expected float32 "
                     "(np.asarray(x, np.float32))")
  return x


# ---------------------------------------------------------------------------- batching
@dataclasses.dataclass
class _Item:
  settings: Settings
  kind: str  # "rows" (a backend's rows) or "pixels" (images for the backbone)
  value: Any
  images: int
  future: asyncio.Future


class Batcher:
  """Collects queued requests for up to ``max_wait_ms`` or ``max_batch`` images, then decodes
  each group of equal settings in one call on the single worker thread.

  Attributes:
    calls: decode calls made so far; images: images decoded (``/health`` and the tests read them).
  """

  def __init__(self, backend, max_batch: int = 8, max_wait_ms: float = 10.0):
    self.backend, self.max_batch, self.max_wait = backend, max(1, int(max_batch)), max(0.0, max_wait_ms) / 1000
    self.calls = self.images = 0
    self.queue: asyncio.Queue | None = None
    self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxcap-decode")
    self._task = None

  def start(self):
    self.queue = asyncio.Queue()
    self._task = asyncio.get_running_loop().create_task(self._loop())

  async def stop(self):
    if self._task is not None:
      self._task.cancel()
      try:
        await self._task
      except asyncio.CancelledError:
        pass
    self.worker.shutdown(wait=True, cancel_futures=True)

  async def submit(self, settings: Settings, kind: str, value, images: int) -> list[dict]:
    future = asyncio.get_running_loop().create_future()
    await self.queue.put(_Item(settings, kind, value, images, future))
    return await future

  async def _loop(self):
    loop = asyncio.get_running_loop()
    while True:
      items = [await self.queue.get()]
      count, deadline = items[0].images, loop.time() + self.max_wait
      while count < self.max_batch:
        left = deadline - loop.time()
        try:
          item = self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left)
        except (asyncio.TimeoutError, asyncio.QueueEmpty):
          break
        items.append(item)
        count += item.images
      groups: dict[Settings, list[_Item]] = {}
      for item in items:
        groups.setdefault(item.settings, []).append(item)
      for settings, group in groups.items():
        live = [i for i in group if not i.future.done()]  # a client that went away is not decoded
        if not live:
          continue
        try:
          results = await loop.run_in_executor(
              self.worker, self.backend.decode, settings, [(i.kind, i.value) for i in live])
          self.calls += 1
          self.images += sum(i.images for i in live)
        except Exception as e:  # noqa: BLE001 - answered as a 500 to the requests of this call only
          for i in live:
            if not i.future.done():
              i.future.set_exception(e)
          continue
        for i, r in zip(live, results):
          if not i.future.done():
            i.future.set_result(r)


# ---------------------------------------------------------------------------- the app
BACKEND = web.AppKey("backend", object)
BATCHER = web.AppKey("batcher", Batcher)
METADATA = web.AppKey("metadata", dict)
MAX_BODY = web.AppKey("max_body", int)
DECODING = web.AppKey("decoding", dict)

# A 500's line after the exception's: whose error it is (jaxcap.errors.bug_words).
_BUG = bug_words("the request", "the traceback in the server's log")


def _error(status: int, msg: str) -> web.Response:
  line = " ".join(str(msg).split()) or "error"
  return web.json_response({"error": line}, status=status)


@web.middleware
async def _errors(request, handler):
  """Every failure is one JSON line: 4xx for the client's, 500 for ours (the server goes on;
  its traceback goes to stderr)."""
  try:
    return await handler(request)
  except BadRequest as e:
    return _error(e.status, str(e))
  except BadInput as e:  # jaxcap's checks of what the request holds
    return _error(400, first_line(e))
  except web.HTTPRequestEntityTooLarge:
    return _error(413, f"the body is larger than the limit of {request.app[MAX_BODY]} bytes; "
                       "expected a smaller image or feature array")
  except web.HTTPException as e:
    if e.status < 400:
      raise
    return _error(e.status, f"{request.method} {request.path}: {e.reason}")
  except asyncio.CancelledError:
    raise
  except Exception as e:  # noqa: BLE001
    traceback.print_exc()
    return _error(500, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'internal error'} "
                       f"-- {_BUG}")


def _int_param(query, name: str, default: int, low: int, high: int) -> int:
  text = query.get(name)
  if text is None:
    return default
  try:
    value = int(text)
  except ValueError:
    value = low - 1
  if not low <= value <= high:
    raise BadRequest(f"{name}={text!r}: expected an integer in [{low}, {high}]")
  return value


def settings_from(query, decoding: dict) -> Settings:
  method = query.get("method", decoding.get("method", "greedy"))
  if method not in METHODS:
    raise BadRequest(f"method={method!r}: expected one of {', '.join(METHODS)}")
  beam = _int_param(query, "beam_size", int(decoding.get("beam_size", 3)), 1, MAX_BEAM)
  samples = _int_param(query, "samples", 1, 1, MAX_SAMPLES)
  seed = query.get("seed")
  seed = None if seed is None else _int_param(query, "seed", 0, 0, 2 ** 31 - 1)
  # Fields a method does not read are fixed, so that they do not split batches.
  return Settings(method, beam if method == "beam" else 1, samples if method == "sample" else 1,
                  seed if method == "sample" else 0)


async def _multipart_file(request) -> bytes:
  """The bytes of a multipart form's first file (or its field 'image', 'features' or 'file')."""
  reader = await request.multipart()
  async for part in reader:
    if part.filename is None and part.name not in ("image", "features", "file"):
      continue
    data = await part.read(decode=False)
    if len(data) > request.app[MAX_BODY]:
      raise web.HTTPRequestEntityTooLarge(max_size=request.app[MAX_BODY], actual_size=len(data))
    return bytes(data)
  raise BadRequest("the multipart form has no file; expected a field 'image' (PNG / JPEG) or "
                   "'features' (.npy)")


async def _read_body(request) -> tuple[str, bytes]:
  """``(kind, bytes)``: kind ``"image"`` or ``"npy"`` from the content type (a multipart form's
  first file: by its bytes)."""
  ctype = request.content_type
  if ctype.startswith("multipart/"):
    try:
      data = await _multipart_file(request)
    except (BadRequest, web.HTTPException):
      raise
    except (ValueError, LookupError, AssertionError, http_exceptions.HttpProcessingError) as e:
      # aiohttp's multipart parser refuses the client's bytes with these (a missing or too long
      # boundary, a part's invalid header, a bad transfer encoding; tests/test_fuzz_readers.py)
      raise BadRequest(f"the multipart form could not be read ({type(e).__name__}: "
                       f"{str(e).splitlines()[0][:200] if str(e) else 'malformed'}); expected "
                       "multipart/form-data with a boundary and a field 'image' or 'features'") from None
    return ("npy" if data.startswith(b"\x93NUMPY") else "image"), data
  if ctype in IMAGE_TYPES or ctype.startswith("image/"):
    return "image", await request.read()
  if ctype in NPY_TYPES:
    return "npy", await request.read()
  raise BadRequest(f"content type {ctype!r}: expected image/png, image/jpeg, application/x-npy, "
                   "application/octet-stream (.npy) or multipart/form-data", 415)


async def caption(request):
  app = request.app
  backend = app[BACKEND]
  settings = settings_from(request.query, app[DECODING])
  backend.check(settings)
  loop = asyncio.get_running_loop()
  if "example" in request.query:  # an argument: text that is no index is a 400
    i = backend.check_example(request.query["example"], 400)
    kind, value, images = "rows", await loop.run_in_executor(None, backend.example_rows, i), 1
  else:
    body_kind, data = await _read_body(request)
    if not data:
      raise BadRequest("empty body; expected an image (PNG / JPEG), a .npy feature array or ?example=<i>")
    if body_kind == "image":
      kind, value, images = "pixels", await loop.run_in_executor(None, backend.image_pixels, data), 1
    else:
      x = read_npy(data)
      value = await loop.run_in_executor(None, backend.features_rows, x)
      kind, images = "rows", len(value["feats"])
  started = time.perf_counter()
  results = await app[BATCHER].submit(settings, kind, value, images)
  return web.json_response({
      "captions": results, "method": settings.method,
      **({"beam_size": settings.beam_size} if settings.method == "beam" else {}),
      **({"samples": settings.samples} if settings.method == "sample" else {}),
      "images": images, "seconds": round(time.perf_counter() - started, 4),
      **({"example": int(request.query["example"])} if "example" in request.query else {})})


async def health(request):
  b = request.app[BATCHER]
  return web.json_response({"status": "ok", "decode_calls": b.calls, "images": b.images,
                            "queued": 0 if b.queue is None else b.queue.qsize()})


async def metadata(request):
  return web.json_response(request.app[METADATA])


async def examples(request):
  return web.json_response({"examples": request.app[BACKEND].example_list()})


async def example_png(request):
  backend = request.app[BACKEND]
  name = request.match_info["name"]
  if not name.endswith(".png"):
    raise BadRequest(f"/examples/{name}: expected /examples/<i>.png", 404)
  i = backend.check_example(name[:-4])
  png = await asyncio.get_running_loop().run_in_executor(None, backend.example_png, i)
  return web.Response(body=png, content_type="image/png", headers={"Cache-Control": "max-age=3600"})


async def index(request):
  return web.FileResponse(os.path.join(STATIC, "index.html"))


def make_app(backend, *, max_batch: int = 8, max_wait_ms: float = 10.0,
             max_body: int = MAX_BODY_BYTES, name: str = "") -> web.Application:
  """The aiohttp application over ``backend`` (:class:`RunBackend` / :class:`ArtefactBackend`)."""
  app = web.Application(client_max_size=max_body, middlewares=[_errors])
  batcher = Batcher(backend, max_batch, max_wait_ms)
  meta = backend.metadata()
  meta["serving"] = {"name": name, "max_batch": batcher.max_batch, "max_wait_ms": max_wait_ms,
                     "max_body_bytes": max_body, "max_images_per_request": MAX_IMAGES,
                     "methods": list(backend.methods), "max_beam_size": MAX_BEAM, "max_samples": MAX_SAMPLES}
  app[BACKEND], app[BATCHER], app[METADATA] = backend, batcher, meta
  app[MAX_BODY], app[DECODING] = max_body, meta.get("decoding") or {}

  async def on_startup(app):
    batcher.start()

  async def on_cleanup(app):
    await batcher.stop()

  app.on_startup.append(on_startup)
  app.on_cleanup.append(on_cleanup)
  app.router.add_get("/", index)
  app.router.add_static("/static/", STATIC)
  app.router.add_post("/caption", caption)
  app.router.add_get("/health", health)
  app.router.add_get("/metadata", metadata)
  app.router.add_get("/examples", examples)
  app.router.add_get("/examples/{name}", example_png)
  return app
