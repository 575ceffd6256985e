"""The backbone a ``features.json`` record names, rebuilt: module, weights and pixels -> features.

Dimension legend:
  B images, S the square input side (``size``), C = g*g the ``att`` grid cells, D feature width.

``jaxcap-extract`` writes the record (:mod:`jaxcap.features.extract`); a run trained on the
extracted files keeps a copy (:mod:`jaxcap.run_dir`), and :class:`Backbone` rebuilds from it the
exact extractor: the same architecture and field overrides, ``att_size``, compute ``dtype``,
input ``size`` and weights. The weights are the ``.safetensors`` file whose sha256 the record
holds (another file is refused: features of other weights would be captioned as if they were
the training's), or, for a record of random weights, the recorded seed's (no file).

This module imports no other part of jaxcap than :mod:`jaxcap.features` and :mod:`jaxcap.errors`.
"""

from __future__ import annotations

import os

import numpy as np

from jaxcap import images as images_lib
from jaxcap.errors import BadInput
from jaxcap.features import extract, registry
from jaxcap.features import weights as weights_lib


def read(path: str) -> dict:
  """The record at ``path``; one-line ``BadInput`` when unreadable or missing a field."""
  record = extract.read_json(path, "the features.json jaxcap-extract wrote")
  missing = [k for k in ("backbone", "size", "att_size", "dtype", "weights")
             if not isinstance(record, dict) or k not in record]
  if missing:
    raise BadInput(f"{path}: no field {missing[0]!r}; expected the features.json "
                     "jaxcap-extract wrote")
  check(record, path)
  return record


def check(record: dict, where: str) -> None:
  """One-line ``BadInput`` naming ``where`` unless each field is of the kind jaxcap-extract
  writes: a known backbone, its field overrides (an object of valid values), size, att_size,
  dtype, and weights either ``{"random": true, "seed": int}`` or ``{"file", "sha256"}``."""
  def bad(field, expected):
    raise BadInput(f"{where}: field {field!r} = {record.get(field)!r}; expected {expected}")

  if not isinstance(record.get("backbone"), str) or record["backbone"] not in registry.BACKBONES:
    bad("backbone", f"one of {', '.join(registry.names())}")
  fields = record.get("fields")
  if fields is not None and not isinstance(fields, dict):
    bad("fields", "an object of the backbone's field overrides")
  extract.parse_size(record["size"], f"{where}: size")
  att = record["att_size"]
  if att is not None and (not isinstance(att, int) or isinstance(att, bool) or att < 1):
    bad("att_size", "an integer >= 1 or null")
  if record["dtype"] not in registry.DTYPES:
    bad("dtype", f"one of {', '.join(registry.DTYPES)}")
  w = record["weights"]
  if not isinstance(w, dict):
    bad("weights", '{"random": true, "seed": N} or {"file": NAME, "sha256": HEX}')
  if w.get("random"):
    seed = w.get("seed", 0)
    if w["random"] is not True or not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
      bad("weights", '{"random": true, "seed": N} with N an integer >= 0')
  elif not (isinstance(w.get("file"), str) and isinstance(w.get("sha256"), str)
            and len(w["sha256"]) == 64 and all(c in "0123456789abcdef" for c in w["sha256"])):
    bad("weights", '{"file": NAME, "sha256": 64 hex digits} (or {"random": true, "seed": N})')
  try:
    build(record)
  except BadInput as e:
    raise BadInput(f"{where}: {e}") from None


def build(record: dict):
  """The flax module the record's features came from (as ``jaxcap-extract`` builds it)."""
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in (record.get("fields") or {}).items()}
  cls = registry.BACKBONES[record["backbone"]][0] if record["backbone"] in registry.BACKBONES else None
  if cls is not None and "att_size" in cls.__dataclass_fields__:
    fields["att_size"] = record["att_size"]
  fields["dtype"] = record["dtype"]
  return registry.build(record["backbone"], **fields)


def is_random(record: dict) -> bool:
  return bool(record["weights"].get("random"))


def check_weights(record: dict, weights: str | None, where: str = "features.json") -> None:
  """One-line ``BadInput`` unless ``weights`` is what the record needs: None for random
  weights, else a file with the recorded sha256."""
  w = record["weights"]
  if is_random(record):
    if weights is not None:
      raise BadInput(f"{weights}: this run was trained on RANDOM backbone weights (seed "
                       f"{w.get('seed', 0)}, {where}); expected no weights file")
    return
  if weights is None:
    raise BadInput(f"weights: missing; this run was trained on the features of {w['file']} "
                     f"(sha256 {w['sha256'][:12]}..., {where}); expected that .safetensors file")
  if not os.path.isfile(weights):
    raise BadInput(f"{weights}: no such file; expected the backbone weights {w['file']}")
  digest = extract.sha256(weights)
  if digest != w["sha256"]:
    raise BadInput(f"{weights}: sha256 {digest[:12]}... differs from the backbone weights this "
                     f"run was trained on ({w['file']}, sha256 {w['sha256'][:12]}...); expected "
                     "the same file")


class Backbone:
  """The record's extractor: ``features(images) -> (fc [B, D], att [B, C, D])``."""

  def __init__(self, record: dict, weights: str | None = None, where: str = "features.json"):
    check(record, where)
    check_weights(record, weights, where)
    self.record, self.size = record, extract.parse_size(record["size"], f"{where}: size")
    self.module = build(record)
    if is_random(record):
      self.variables = registry.random_variables(  # a ResNet's variables have no image size
          self.module, seed=int(record["weights"].get("seed", 0)),
          size=None if self.size == extract.NATIVE else self.size)
    else:
      self.variables, _ = weights_lib.load(weights, self.module)
    self._extract = registry.make_extract(self.module)

  def pixels(self, images) -> np.ndarray:
    """``[B, S, S, 3]`` uint8 of image file paths and / or uint8 ``[H, W, 3]`` arrays, read as
    ``jaxcap-extract`` reads files; one-line ``BadInput`` naming an unreadable one."""
    return self.read(images)[0]

  def read(self, images, *, skip_unreadable: bool = False):
    """``(pixels [B', S, S, 3] uint8, kept)`` (pixels a list of ``[H, W, 3]`` at ``size``
    native): ``kept`` the indices into ``images`` (one path /
    array or a list) that ``pixels`` holds. An unreadable or missing file is a one-line
    ``BadInput``, or with ``skip_unreadable`` one ``warning:`` line on stderr (as
    ``jaxcap-extract`` reports it) and left out; a directory, a non-image array or no readable
    image at all is always an error (``pixels`` is then never empty)."""
    out, kept = images_lib.read_many(
        images, lambda path: extract.read_image(path, self.size),
        lambda item, i: extract.image_array(item, self.size, what=f"images[{i}]"), skip_unreadable=skip_unreadable)
    # At the native resolution the images keep their sizes: a list, not a batch.
    return (out if self.size == extract.NATIVE else np.stack(out)), kept

  def features(self, images, batch_size: int = 16):
    """``(fc [B, D], att [B, C, D])`` float32, equal to the files ``jaxcap-extract`` writes."""
    pixels = self.pixels(images)
    return self.pixel_features(pixels, max(1, min(int(batch_size), len(pixels))))

  def pixel_features(self, pixels_BxSxSx3: np.ndarray, batch_size: int):
    """:meth:`features` of :meth:`read`'s pixels in calls of exactly ``batch_size`` images (the
    last padded): the backbone compiles once per ``batch_size``."""
    if self.size == extract.NATIVE:  # one image per call, as prepro_feats.py (sizes differ)
      feats = [extract.features_of(self._extract, self.variables, img[None], 1) for img in pixels_BxSxSx3]
      return np.concatenate([f[0] for f in feats]), np.concatenate([f[1] for f in feats])
    return extract.features_of(self._extract, self.variables, pixels_BxSxSx3, int(batch_size))
