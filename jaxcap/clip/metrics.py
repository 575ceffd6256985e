"""The CLIP scores of a scoring (``evaluate.py --clip_weights / --pac_weights``, ``Run.evaluate``):
which weights, where the images are, and how they join a scores dict.

Images: ``--clip_images`` is a folder (searched with its subfolders, as COCO's ``train2014/`` /
``val2014/``) or a JSON file ``{image_id: path}``. In a folder (its files with an extension of
:data:`IMAGE_EXTENSIONS`, any case) an image id finds the file whose
name without extension is the id (``123.jpg``, ``test_00012.png``), else the one whose name ends
in ``_<id>`` with the id's digits zero-padded or not (``COCO_val2014_000000391895.jpg``), else
the one whose whole stem is the id zero-padded (``000000391895.jpg``, COCO 2017); two files for
one id, or none, is one line naming the id. Everything (weights, every scored image's file) is
checked by :meth:`Request.prepare`, before anything is decoded or written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Iterable, Mapping

from jaxcap.clip import score as score_lib
from jaxcap.errors import BadInput
from jaxcap.features.extract import IMAGE_EXTENSIONS  # the files jaxcap-extract reads


@dataclasses.dataclass
class Request:
  """What a command line asked for; :meth:`prepare` turns it into :class:`Prepared`."""
  clip_weights: str | None = None
  pac_weights: str | None = None
  images: str | Mapping | None = None  # a folder, a JSON file, or {image_id: path} (the API's)
  refclip_variant: str = "clipscore"
  batch_size: int = 64

  def __bool__(self) -> bool:
    return bool(self.clip_weights or self.pac_weights)

  def with_default_images(self, workdir: str | None) -> "Request":
    """``images`` from the run's ``features.json`` (the folder ``jaxcap-extract`` read) when none
    was given."""
    if self and not self.images and workdir:
      from jaxcap import run_dir
      if os.path.isfile(os.path.join(workdir, run_dir.FEATURES_FILE)):
        record = run_dir.read_features_record(workdir) or {}
        if record.get("images"):
          return dataclasses.replace(self, images=record["images"])
    return self

  def check(self) -> None:
    """The flags' combinations (no file read)."""
    if not self:
      stray = [f"--{n}" for n, v in (("clip_images", self.images),) if v]
      if stray or self.refclip_variant != "clipscore":
        raise BadInput(f"{(stray or ['--refclip_variant=' + self.refclip_variant])[0]} without "
                         "--clip_weights or --pac_weights; expected a CLIP weights file to score with")
      return
    if not self.images:
      raise BadInput("--clip_weights / --pac_weights without --clip_images; expected the folder "
                       "(or {image_id: path} JSON) of the scored images (a run on jaxcap-extract's "
                       "features finds them in its features.json)")
    if self.refclip_variant not in score_lib.REFCLIP_VARIANTS:
      raise BadInput(f"--refclip_variant={self.refclip_variant}: expected one of "
                       f"{', '.join(score_lib.REFCLIP_VARIANTS)}")
    if self.batch_size < 1:
      raise BadInput(f"--clip_batch_size={self.batch_size}: expected an int >= 1")

  def prepare(self, keys: Iterable) -> "Prepared | None":
    """Weights loaded and every key's image file found; None when no CLIP score was asked."""
    self.check()
    if not self:
      return None
    files = image_files(self.images, list(keys))
    scorers = [(kind, score_lib.Scorer(path, self.batch_size))
               for kind, path in (("clip", self.clip_weights), ("pac", self.pac_weights)) if path]
    return Prepared(scorers, files, self.refclip_variant)


@dataclasses.dataclass
class Prepared:
  scorers: list
  files: dict
  refclip_variant: str

  def add(self, scores: dict, predictions: Mapping, references: Mapping | None, log=None) -> dict:
    """Adds the CLIP scores of ``predictions`` to ``scores`` (``overall``, ``per_image``, the
    metrics signature's ``computed`` / ``clip``, and ``clip_cosines``: per score how many
    cosines ``max(cos, 0)`` clipped, :func:`jaxcap.clip.score.clipped`); returns it. ``log``
    (when given) receives :func:`notes`' lines."""
    for kind, scorer in self.scorers:
      out = scorer.score(dict(predictions), self.files, references, kind=kind,
                         refclip_variant=self.refclip_variant)
      scores["overall"].update(out["overall"])
      # Not in the signature: how the scores came out, not how they were made (jaxcap-compare
      # lists the signatures' differences).
      scores.setdefault("clip_cosines", {}).update(out["cosines"])
      for key, values in out["per_image"].items():
        scores["per_image"].setdefault(key, {}).update(values)
      sig = scores.setdefault("signature", {})
      sig.setdefault("computed", []).extend(out["overall"])
      sig.setdefault("clip", {})["CLIP-S" if kind == "clip" else "PAC-S"] = \
          scorer.signature(kind, self.refclip_variant)
    if log is not None:
      for line in notes(scores):
        log(line)
    return scores


def notes(scores: Mapping) -> list[str]:
  """One line per CLIP score that ``max(cos, 0)`` clipped to 0 somewhere
  (:func:`jaxcap.run_dir.clip_notes`, which printing the scores uses)."""
  from jaxcap import run_dir  # run_dir prints them; it imports no CLIP code (no cycle)
  return run_dir.clip_notes(scores)


def _index(folder: str) -> dict[str, list[str]]:
  out: dict[str, list[str]] = {}
  for dirpath, dirnames, filenames in os.walk(folder):
    dirnames.sort()
    for name in sorted(filenames):
      stem, ext = os.path.splitext(name)
      if ext.lower() in IMAGE_EXTENSIONS:
        out.setdefault(stem, []).append(os.path.join(dirpath, name))
  return out


def image_files(source, keys: list) -> dict:
  """``{key: image path}`` for every key (module docstring); ``source`` a folder, a JSON file or
  already a ``{key: path}`` mapping."""
  if isinstance(source, Mapping):
    missing = [k for k in keys if k not in source]
    if missing:
      raise BadInput(f"images: no image file for image_id {missing[0]!r}; expected one per scored image")
    bad = [k for k in keys if not isinstance(source[k], (str, os.PathLike))]
    if bad:
      raise BadInput(f"images: image_id {bad[0]!r} maps to {source[bad[0]]!r:.60}; expected an "
                     "image file's path")
    return {k: source[k] for k in keys}
  if os.path.isfile(source):
    try:
      with open(source, encoding="utf-8") as f:
        table = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
      raise BadInput(f"--clip_images={source}: not a JSON file ({type(e).__name__}); expected a "
                       "folder of images or {image_id: path}") from None
    if not isinstance(table, dict):
      raise BadInput(f"--clip_images={source}: a JSON {type(table).__name__}; expected {{image_id: path}}")
    base = os.path.dirname(os.path.abspath(source))
    out = {}
    for k in keys:
      path = table.get(str(k), table.get(k))
      if path is None:
        raise BadInput(f"--clip_images={source}: no image for image_id {k!r}; expected one per scored image")
      if not isinstance(path, str) or not path:
        raise BadInput(f"--clip_images={source}: image_id {k!r} maps to {path!r:.60}; expected an "
                       "image file's path (a string)")
      out[k] = path if os.path.isabs(path) else os.path.join(base, path)
    return out
  if not os.path.isdir(source):
    raise BadInput(f"--clip_images={source}: no such folder or file; expected a folder of images "
                     "or {image_id: path} JSON")
  index = _index(source)
  by_suffix: dict[str, list[str]] = {}
  for stem, paths in index.items():
    m = re.search(r"(?:^|_)0*(\d+)$", stem)
    if m:
      by_suffix.setdefault(m.group(1), []).extend(paths)
  out = {}
  for k in keys:
    paths = index.get(str(k))
    if not paths and re.fullmatch(r"\d+", str(k)):
      paths = by_suffix.get(str(int(str(k))))
    if not paths:
      raise BadInput(f"--clip_images={source}: no image file for image_id {k!r} (expected "
                       f"{k}<ext> or a COCO name ending in _{k} / zero-padded, <ext> one of "
                       f"{' '.join(IMAGE_EXTENSIONS)}, any case)")
    if len(paths) > 1:
      raise BadInput(f"--clip_images={source}: {len(paths)} image files for image_id {k!r} "
                       f"({paths[0]}, {paths[1]}); expected one")
    out[k] = paths[0]
  return out
