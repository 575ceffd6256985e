"""Runs a captioner ``jaxcap-export`` wrote, with jax and numpy only (no flax, no jaxcap model).

::

  from jaxcap import serving
  captioner = serving.load("captioner.jaxcap")
  captioner.metadata["decode"]                      # the exported decoding settings
  captioner.caption(feats_BxNxF)                    # or a dict: feats, feats_mask, global_feat, boxes, ...
  captioner.caption(features, method="greedy")      # "greedy" | "beam" (default: the exported one)
  captioner.caption_images(["a.jpg", pixels_HxWx3]) # when the run has a backbone (features.json)

Each result is ``{"caption": str, "tokens": [int], "words": [str], "attention": [[float]] | None}``:
``tokens`` the decoded ids without BOS, ending with EOS when the model emitted it (the words,
then EOS: PAD dropped); ``words`` the vocabulary's strings of the tokens before EOS
(``caption`` is them joined by spaces, what :meth:`jaxcap.api.Run.caption` returns);
``attention`` one row per word (``[len(words)][N]``: the model's ``aux["attention"]`` at the
step that emitted the word, over the N regions given, or the image's regions), or None when the
model's decode step returns no attention.

The file (:data:`FORMAT`, written by :mod:`jaxcap.export`) is a zip of ``metadata.json``,
``params.npz`` / ``backbone.npz`` (the variables, as arguments of the programs) and
``greedy`` / ``beam`` / ``features`` ``.jaxexport`` (``jax.export``'s serialized StableHLO,
batch size symbolic). Features are checked as :func:`jaxcap.data.batch.from_features` checks
them, one ``BadInput`` line naming the argument and what was expected; the regions are padded
(mask False) to a bucket of their own number (:func:`jaxcap.data.batch.bucket`: 36 stay 36, 50
become 52; a version-1 file's programs take its ``max_regions``), and the images likewise (copies
of the first), so a server compiles a few shapes only and a request pays at most 12.5 % padding.

This module imports the standard library, numpy and jax, and of jaxcap only the numpy-only
:mod:`jaxcap.images` (Pillow when reading images), :mod:`jaxcap.data.batch` (the feature
checks every reader shares) and :mod:`jaxcap.errors` (standard library only): no flax, no model code (tests/test_export.py runs it in a process
without flax).
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from typing import Mapping

import numpy as np
import jax
import jax.numpy as jnp

# Both import numpy only (no flax, no model code): the checks and pixels every reader shares.
from jaxcap import images, xla_options  # xla_options: jax and numpy only
from jaxcap.data import batch as batch_lib
from jaxcap.errors import BadInput, first_line

FORMAT = "jaxcap-captioner"
FORMAT_VERSION = 2
# Version 1 (before 2026-12-07) took every request at max_regions regions; version 2's programs take
# any number (metadata inputs.symbolic_regions). Both are read.
READS_VERSIONS = (1, 2)
METHODS = ("greedy", "beam")
PAD, BOS, EOS = 0, 1, 2  # jaxcap.data.vocab's fixed special ids (docs/DESIGN.md, section 1)
# The batch keys of jaxcap.data.batch.KEYS: the others (captions, labels, ...) are training's and
# are ignored here, as the model's encoder ignores them.
_BATCH_KEYS = ("image_index", "valid", "feats", "feats_mask", "boxes", "global_feat", "captions",
               "attributes", "attr_labels", "src")


def load(path: str) -> "Captioner":
  """The captioner in ``path``; one-line ``BadInput`` for a file that is not one."""
  return Captioner(path)


class Captioner:
  """An exported captioner (see the module docstring).

  Attributes:
    metadata: the file's ``metadata.json`` (vocabulary, decoding settings, the run's identity,
      input spec, backbone, platforms).
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    try:
      with zipfile.ZipFile(self.path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    except (OSError, zipfile.BadZipFile) as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise BadInput(f"{self.path}: unreadable ({first}); expected a file jaxcap-export wrote") from None
    try:
      self.metadata = json.loads(members["metadata.json"])
      if not isinstance(self.metadata, dict):
        raise ValueError("not a JSON object")
    except (KeyError, ValueError, RecursionError):
      raise BadInput(f"{self.path}: no readable metadata.json; expected a file jaxcap-export wrote") from None
    if self.metadata.get("format") != FORMAT or self.metadata.get("format_version") not in READS_VERSIONS:
      raise BadInput(f"{self.path}: format {self.metadata.get('format')!r} version "
                     f"{self.metadata.get('format_version')!r}; expected {FORMAT!r} version "
                     f"{' or '.join(map(str, READS_VERSIONS))}")
    try:  # a member or a metadata field missing or damaged: the file's, not jaxcap's
      self._exported = {}
      for name in METHODS + ("features",):
        if f"{name}.jaxexport" in members:
          self._exported[name] = _deserialize(members[f"{name}.jaxexport"], f"{self.path}: {name}.jaxexport")
      missing = [f"{name}.jaxexport" for name in METHODS if name not in self._exported]
      if missing:  # jaxcap-export writes both
        raise KeyError(missing[0])
      options = xla_options.decode_compiler_options()
      self._call = {name: jax.jit(exp.call, compiler_options=options) for name, exp in self._exported.items()}
      self._params = _leaves(members["params.npz"], _arguments(self._exported["greedy"])[0])
      self._backbone = (_leaves(members["backbone.npz"], _arguments(self._exported["features"])[0])
                        if "features" in self._exported else None)
      self.vocab = list(self.metadata["vocab"])
      inputs = self.metadata["inputs"]
      self.reads = tuple(inputs["reads"])
      self.max_regions, self.feature_dim = int(inputs["max_regions"]), int(inputs["feature_dim"])
      self.global_dim = int(inputs["global_dim"])
      _check_metadata(self.metadata, self._exported)
    except (KeyError, TypeError, ValueError, EOFError, zipfile.BadZipFile) as e:  # EOFError: np.load of an empty member
      raise BadInput(f"{self.path}: damaged or incomplete ({type(e).__name__}: {first_line(e)}); "
                     "expected a file jaxcap-export wrote") from None

  def __repr__(self):
    return (f"Captioner({self.path!r}, model={self.metadata.get('model')!r}, "
            f"step={self.metadata['run'].get('step')})")

  @property
  def has_backbone(self) -> bool:
    return self._backbone is not None

  # ---------------------------------------------------------------- features
  def caption(self, features, method: str | None = None) -> list[dict]:
    """Captions images given their features: a dict of numpy arrays with the batch keys
    (``feats`` [B, N, F], ``feats_mask`` [B, N], ``global_feat`` [B, Dg], ``boxes`` [B, N, 4],
    ``attributes`` / ``src`` [B, L]: what the model reads, ``metadata["inputs"]``), one array
    ``[B, N, F]`` (regions) or ``[B, Dg]`` (global), or a list of ``[N_i, F]`` / ``[Dg]``
    arrays. ``method``: ``"greedy"`` or ``"beam"`` (None: ``metadata["decode"]["method"]``).
    One result dict per image (module docstring)."""
    method = self._method(method)
    batch, n = self.batch(features)
    return self._decode(batch, method, n)

  def batch(self, features) -> tuple[dict, int]:
    """``(batch, N)``: the arrays the exported programs take (the keys the model reads,
    regions padded to a bucket of their number, or a version-1 file's ``max_regions``) and the
    number of regions given."""
    return _prepare(features, self.metadata["inputs"], self.metadata.get("required", ()))

  # ---------------------------------------------------------------- image files
  def caption_images(self, images, method: str | None = None) -> list[dict]:
    """Captions image files and / or uint8 RGB ``[H, W, 3]`` arrays with the exported backbone
    (read as ``jaxcap-extract`` reads files: EXIF orientation, RGB, bilinear resize to the
    recorded square side). One-line ``BadInput`` for an export without a backbone, an
    unreadable file or a non-image array."""
    method = self._method(method)
    if self._backbone is None:
      raise BadInput(f"{self.path}: no image backbone in this export (the run has no features.json, "
                     "or was exported with --no_backbone / at native size); expected "
                     f"caption(features); {images.IMAGE_RUNS}")
    if isinstance(images, (str, os.PathLike)) or (isinstance(images, np.ndarray) and images.ndim == 3):
      images = [images]
    size = int(self.metadata["backbone"]["size"])
    pixels = [read_image(os.fspath(x), size) if isinstance(x, (str, os.PathLike))
              else image_array(x, size, f"images[{i}]") for i, x in enumerate(images)]
    if not pixels:
      raise BadInput("images: empty; expected at least one image path or array")
    b = len(pixels)
    batch = self._call["features"](self._backbone, jnp.asarray(_pad_rows(np.stack(pixels), _bucket(b))))
    n_regions = int(np.asarray(batch["feats_mask"][0]).sum()) if "feats_mask" in batch else None
    return self._decode(batch, method, n_regions, rows=b)

  # ---------------------------------------------------------------- decoding
  def _method(self, method):
    method = method or self.metadata["decode"]["method"]
    if method not in METHODS:
      raise BadInput(f"method={method!r}: expected one of {', '.join(METHODS)}")
    return method

  def _decode(self, batch, method, n_regions, rows=None) -> list[dict]:
    b = rows if rows is not None else len(next(iter(batch.values())))
    padded_regions = batch["feats"].shape[1] if "feats" in batch else self.max_regions
    if rows is None:
      batch = {k: _pad_rows(v, _bucket(b)) for k, v in batch.items()}  # NumPy: the jitted call puts it on the device
    out = jax.device_get(self._call[method](self._params, batch))
    tokens = np.asarray(out["tokens"])[:b]
    att = np.asarray(out["attention"])[:b] if "attention" in out else None
    results = []
    for i in range(b):
      row = [int(t) for t in tokens[i] if t != PAD]
      words = []
      for t in row:
        if t == EOS:
          break
        if t != BOS:
          words.append(self.vocab[t] if 0 <= t < len(self.vocab) else self.vocab[3])  # UNK
      per_word = None
      if att is not None:
        a = att[i, :len(words)]
        if n_regions is not None and a.ndim >= 2 and a.shape[-1] == padded_regions:
          a = a[..., :n_regions]  # the padding regions (weight 0) are not the caller's
        per_word = a.tolist()
      results.append({"caption": " ".join(words), "tokens": row, "words": words, "attention": per_word})
    return results


# -------------------------------------------------------------------------------------------
# Features: checked and padded as jaxcap.data.batch.from_features does (without importing it).


def _array(x, what: str, kinds: str = "biuf") -> np.ndarray:
  try:
    a = np.asarray(x)
  except (TypeError, ValueError) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise BadInput(f"caption: {what} is not a numeric array ({first}); expected numbers") from None
  if a.dtype.kind not in kinds:
    expected = {"biuf": "real numbers", "biu": "integer ids", "bfiu": "booleans (or 0 / 1)"}.get(kinds, kinds)
    raise BadInput(f"caption: {what} has dtype {a.dtype}; expected {expected}")
  return a


def _prepare(features, inputs: Mapping, required=()) -> tuple[dict, int]:
  arrays, reads = inputs["arrays"], set(inputs["reads"])
  n_max, f, dg = int(inputs["max_regions"]), int(inputs["feature_dim"]), int(inputs["global_dim"])
  if features is None:
    raise BadInput("caption: features is None; expected region features [B, N, F], global "
                   "features [B, Dg], a list of per-image arrays or a dict of batch arrays")
  if isinstance(features, Mapping):
    unknown = [k for k in features if k not in _BATCH_KEYS]
    if unknown:
      raise BadInput(f"caption: unknown features key {unknown[0]!r}; expected keys among "
                     f"{', '.join(_BATCH_KEYS)}")
    batch = {k: _array(v, f"features[{k!r}]", "biu" if k in ("attributes", "src") else
                       "bfiu" if k in ("feats_mask", "valid") else "biuf")
             for k, v in features.items() if k in ("feats", "feats_mask", "boxes", "global_feat",
                                                   "attributes", "src")}
  elif isinstance(features, (list, tuple)):
    if not len(features):
      raise BadInput(f"caption: features is an empty {type(features).__name__}; expected at "
                     "least one image ([N_i, F] region or [Dg] global arrays)")
    batch = batch_lib._stack_ragged([_array(x, f"features[{i}]") for i, x in enumerate(features)],
                                    {"feature_dim": f, "global_dim": dg})
  else:
    x = _array(features, "features")
    if x.ndim == 2:
      batch = {"global_feat": x}
    elif x.ndim == 3:
      batch = {"feats": x}
    else:
      raise BadInput(f"caption: expected features [B, Dg] (global) or [B, N, F] (regions), got shape {x.shape}")
  if "feats" not in batch and "global_feat" not in batch:
    raise BadInput(f"caption: the features dict needs 'feats' [B, N, F] or 'global_feat' [B, Dg]; "
                   f"got keys {sorted(batch)}")
  if "global_feat" in batch:
    g = batch["global_feat"] = batch["global_feat"].astype(np.float32)
    if g.ndim != 2 or g.shape[1] != dg:
      raise BadInput(f"caption: expected global features [B, {dg}], got shape {g.shape}")
  if "feats" not in batch:
    if "feats" in reads and n_max != 1:
      raise BadInput(f"caption: this model reads region features 'feats' [B, N, {f}] (its dataset "
                     f"has up to {n_max} regions per image); give them, not only the global feature")
    g = batch["global_feat"]
    batch["feats"] = g[:, None, :] if "feats" in reads else np.zeros((len(g), 1, f), np.float32)
  feats = batch["feats"] = batch["feats"].astype(np.float32)
  if feats.ndim != 3 or feats.shape[-1] != f:
    raise BadInput(f"caption: expected region features [B, N, {f}], got shape {feats.shape}")
  b, n = feats.shape[:2]
  if b == 0 or n == 0:
    raise BadInput(f"caption: region features of shape {feats.shape} hold no "
                   f"{'image' if b == 0 else 'region'}; expected at least one image with at least one region")
  if n > n_max:
    raise BadInput(f"caption: region features have {n} regions per image; expected at most "
                   f"{n_max} (the exported max_regions)")
  mask = batch["feats_mask"] = batch.get("feats_mask", np.ones((b, n), bool)).astype(bool)
  if mask.shape != (b, n):
    raise BadInput(f"caption: features['feats_mask'] has shape {mask.shape}, expected [B, N] = "
                   f"[{b}, {n}] like the region features")
  if not mask.any(1).all():
    raise BadInput(f"caption: features['feats_mask'] marks no region of image "
                   f"{int(np.argmax(~mask.any(1)))} as real; expected at least one True per image")
  batch_lib._check_finite(feats, "features['feats']" if isinstance(features, Mapping) else "features")
  if "global_feat" not in batch:
    if "global_feat" in reads:
      w = mask[..., None].astype(np.float32)
      batch["global_feat"] = (feats * w).sum(1) / np.maximum(w.sum(1), 1.0)  # mean of the real regions
    else:  # never read: zeros of the run's width (its regions may be of another, as from_features)
      batch["global_feat"] = np.zeros((b, dg), np.float32)
  if batch["global_feat"].shape != (b, dg):
    raise BadInput(f"caption: expected global features [{b}, {dg}], got shape {batch['global_feat'].shape}")
  batch_lib._check_finite(batch["global_feat"], "features['global_feat']")
  if "boxes" in batch:
    boxes = batch["boxes"] = batch["boxes"].astype(np.float32)
    if boxes.shape != (b, n, 4):
      raise BadInput(f"caption: features['boxes'] has shape {boxes.shape}; expected [B, N, 4] = "
                     f"[{b}, {n}, 4] (x1, y1, x2, y2 normalised to [0, 1])")
    batch_lib.check_boxes(boxes, "caption", mask=mask)
  elif "boxes" in reads:
    if n > 1 and "boxes" in required:
      raise BadInput("caption: this model builds its spatial graph from region boxes; expected "
                     "features['boxes'] [B, N, 4] (x1, y1, x2, y2 normalised to [0, 1]) with the region features")
    batch["boxes"] = np.tile(np.float32([0.0, 0.0, 1.0, 1.0]), (b, n, 1))  # one region: the whole image
  # A version-2 program takes any number of regions: the request's own, bucketed (a few compiled
  # sizes); a version-1 program takes max_regions.
  padded = batch_lib.bucket(n, n_max) if inputs.get("symbolic_regions") else n_max
  out = {}
  for key in sorted(reads):
    shape = arrays[key]["shape"]
    if key in ("attributes", "src"):
      if key not in batch:
        raise BadInput(f"caption: this model reads {key!r}; expected features[{key!r}] int [B, L] "
                       f"(ids of the run's {'source ' if key == 'src' else ''}vocabulary, 0-padded)")
      ids = batch[key]
      size = int(inputs["src_vocab_size" if key == "src" else "vocab_size"])
      if ids.ndim != 2 or len(ids) != b or ids.shape[1] > int(shape[1]):
        raise BadInput(f"caption: features[{key!r}] has shape {ids.shape}; expected [B, L] = [{b}, L] "
                       f"with L <= {shape[1]}")
      if ((ids < 0) | (ids >= size)).any():
        raise BadInput(f"caption: features[{key!r}] holds id {int(ids[(ids < 0) | (ids >= size)][0])}; "
                       f"expected ids in [0, {size})")
      if key == "src" and not (ids != 0).any(1).all():
        raise BadInput("caption: features['src'] has a row of padding only; expected at least one "
                       "source word id per image")
      out[key] = np.pad(ids.astype(np.int32), ((0, 0), (0, int(shape[1]) - ids.shape[1])))  # PAD = 0
    elif key in ("feats", "feats_mask", "boxes"):
      x = batch[key]
      out[key] = np.pad(x, ((0, 0), (0, padded - n)) + ((0, 0),) * (x.ndim - 2))  # zeros / False
    else:
      out[key] = batch[key]
  return out, n


def _bucket(n: int) -> int:
  """The rows a call of ``n`` images runs at (:func:`jaxcap.data.batch.bucket`: at most 12.5 %
  padding, eight compiled sizes per doubling)."""
  return batch_lib.bucket(n)


def _pad_rows(x, size: int):
  x = np.asarray(x)
  return x if len(x) == size else np.concatenate([x, np.repeat(x[:1], size - len(x), axis=0)])


def _deserialize(blob: bytes, what: str):
  """``jax.export.deserialize`` of a member; one line naming it when its bytes are damaged
  (flatbuffers follows whatever offsets they hold: ``struct.error`` past the end, an
  ``AttributeError`` on a field that reads as absent, its generated code's ``assert``, ...)."""
  try:
    return jax.export.deserialize(bytearray(blob))
  except (struct.error, AttributeError, AssertionError, IndexError, TypeError, ValueError) as e:
    raise BadInput(f"{what}: damaged ({type(e).__name__}: {first_line(e)}); expected a file "
                   "jaxcap-export wrote") from None


def _arguments(exp) -> tuple[list, object]:
  """``(parameter avals, second argument's avals)`` of an exported program ``f(params, x)``."""
  (params, x), _ = jax.tree_util.tree_unflatten(exp.in_tree, exp.in_avals)
  return jax.tree_util.tree_leaves(params), x


def _check_metadata(meta: dict, exported: dict) -> None:
  """The metadata fields a caption reads are the ones jaxcap-export writes and agree with the
  programs (a damaged metadata.json would pad features to sizes the program does not take, or to
  billions of regions); ``ValueError`` / ``TypeError`` / ``KeyError`` otherwise."""
  vocab = meta["vocab"]
  if not (isinstance(vocab, list) and len(vocab) > EOS + 1 and all(isinstance(w, str) for w in vocab)):
    raise ValueError("'vocab' is not a list of words (the specials first)")
  decode = meta["decode"]
  if not isinstance(decode, dict) or decode.get("method") not in METHODS:
    raise ValueError(f"'decode' is not an object whose method is one of {', '.join(METHODS)}")
  int(decode.get("beam_size", 1))
  if not isinstance(meta.get("run", {}), dict):
    raise ValueError("'run' is not an object")
  inputs = meta["inputs"]
  batch = _arguments(exported["greedy"])[1]
  if not isinstance(batch, dict) or sorted(inputs["reads"]) != sorted(batch):
    raise ValueError(f"inputs.reads {inputs['reads']!r:.60} are not the program's")
  symbolic = inputs.get("symbolic_regions", False)
  if not isinstance(symbolic, bool):
    raise ValueError("inputs.symbolic_regions is not true or false")
  for key, aval in batch.items():
    shape = inputs["arrays"][key]["shape"]
    if [str(d) for d in shape[1:]] != [str(d) for d in aval.shape[1:]]:
      raise ValueError(f"inputs.arrays.{key}.shape {shape!r:.60} is not the program's "
                       f"[b, {', '.join(map(str, aval.shape[1:]))}]")
  if "feats" in batch:
    regions = "n" if symbolic else int(inputs["max_regions"])
    if [str(regions), str(int(inputs["feature_dim"]))] != [str(d) for d in batch["feats"].shape[1:]]:
      raise ValueError("inputs.max_regions / symbolic_regions / feature_dim are not the program's "
                       f"{[str(d) for d in batch['feats'].shape[1:]]}")
  int(inputs["max_regions"])
  if "global_feat" in batch and int(inputs["global_dim"]) != batch["global_feat"].shape[1]:
    raise ValueError(f"inputs.global_dim is not the program's {batch['global_feat'].shape[1]}")
  size = int(inputs.get("vocab_size", 0))
  int(inputs.get("src_vocab_size", 0))
  if size and len(vocab) != size:  # a word id past the list would read as UNK, silently
    raise ValueError(f"'vocab' holds {len(vocab)} words for the program's {size} output ids "
                     "(inputs.vocab_size)")
  if "features" in exported:
    int(meta["backbone"]["size"])


def _leaves(blob: bytes, avals) -> list:
  """The arrays of an ``.npz`` member, in order, with the dtypes the program takes (raw-byte
  arrays of bfloat16 and friends viewed back), on the default device; ``ValueError`` unless they
  are the program's parameters (their number and shapes)."""
  with np.load(io.BytesIO(blob)) as z:
    arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
  if len(arrays) != len(avals):
    raise ValueError(f"{len(arrays)} parameter arrays for the program's {len(avals)}")
  out = []
  for a, aval in zip(arrays, avals):
    dtype = np.dtype(aval.dtype)
    a = a if a.dtype == dtype else a.view(dtype)
    if a.shape != tuple(aval.shape):
      raise ValueError(f"a parameter of shape {list(a.shape)} for the program's {list(aval.shape)}")
    out.append(a)
  return tuple(jax.device_put(out))


def read_image(path: str, size: int) -> np.ndarray:
  """``[S, S, 3]`` uint8 RGB of an image file (:func:`jaxcap.images.read_image`); one-line
  ``BadInput`` naming a missing, directory or unreadable file."""
  if os.path.isdir(path):
    raise BadInput(f"{path}: a directory; expected an image file")
  if not os.path.isfile(path):
    raise BadInput(f"{path}: no such file; expected an image file")
  try:
    return images.read_image(path, size)
  except ValueError as e:
    if str(e).startswith(path):
      raise
    raise BadInput(f"{path}: unreadable image ({images.unreadable_reason(e)}); expected an image file "
                   "Pillow can open") from None
  except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
    raise BadInput(f"{path}: unreadable image ({images.unreadable_reason(e)}); expected an image file "
                   "Pillow can open") from None


image_array = images.image_array
