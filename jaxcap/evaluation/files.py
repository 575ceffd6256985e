"""Caption files in, score files out: COCO annotations, COCO results, scores JSON.

Backs ``evaluate.py --predictions P.json --references R.json --out S.json`` through
:func:`score_files`.

Scores files (``scores_<split><tag>.json`` of a workdir, ``--out`` of ``evaluate.py``) are
``{"overall": {metric: value}, "per_image": [{"image_id": id, metric: value, ...}, ...]}``: the
per-image scores are a list in prediction order whose ``image_id`` has the type it has in
``predictions_<split>.json`` (an int for COCO and the synthetic scenes, a string for Flickr file
stems), so the two files join on ``image_id`` as they are. Files written before this layout
(``per_image`` an object keyed by the id as a string) are read by :func:`load_scores` too. Every malformed input raises a one-line ``BadInput`` naming the file and,
where there is one, the entry at fault.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Hashable, Mapping

from jaxcap import atomic
from jaxcap.atomic import write_json
from jaxcap.errors import BadInput, first_line
from jaxcap.evaluation import coco_metrics, signature


def read_json(path: str, what: str):
  try:
    with open(path) as f:
      return json.load(f)
  except OSError as e:
    raise BadInput(f"{path}: cannot read {what} ({e.strerror or e}); expected an existing, "
                   "readable file") from None
  except json.JSONDecodeError as e:
    raise BadInput(
        f"{path}: not valid JSON ({e.msg} at line {e.lineno}); expected {what}") from None
  except UnicodeDecodeError as e:  # a binary file (an .npz, an image) given as JSON
    raise BadInput(f"{path}: not a text file ({e.reason} at byte {e.start}); "
                   f"expected {what}") from None
  except (ValueError, RecursionError) as e:  # an int of over 4300 digits; arrays nested past the stack
    raise BadInput(f"{path}: not valid JSON ({type(e).__name__}: {first_line(e)}); expected {what}") from None


def _image_id(value, path: str, where: str):
  # COCO ids are ints; Flickr/Karpathy-style ids may be strings. Anything else is a mistake.
  if isinstance(value, bool) or not isinstance(value, (int, str)):
    raise BadInput(f"{path}: {where} 'image_id' must be an int or a string, got "
                   f"{type(value).__name__}")
  return value


def _caption_entry(item, path: str, where: str, expected: str) -> tuple[Hashable, str]:
  """``(image_id, caption)`` of one ``{"image_id", "caption"}`` object of a COCO file (an
  annotation or a result); ``where`` names it and ``expected`` the file kind in errors."""
  if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
    raise BadInput(f"{path}: {where} must be an object with 'image_id' and 'caption' "
                   f"(expected {expected})")
  if not isinstance(item["caption"], str):
    raise BadInput(f"{path}: {where} 'caption' must be a string, got "
                   f"{type(item['caption']).__name__}")
  return _image_id(item["image_id"], path, where), item["caption"]


def load_coco_references(path: str) -> dict[Hashable, list[str]]:
  """Reads a COCO annotation file (``{"annotations": [{"image_id", "caption"}, ...]}``).

  Args:
    path: e.g. ``captions_karpathy_test2014.json``.

  Returns:
    ``{image_id: [caption, ...]}`` in file order; every image has at least one caption.

  Raises:
    BadInput: naming the file (and annotation index) when the layout is not COCO's.
  """
  data = read_json(path, "a COCO annotation file with an 'annotations' list")
  if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
    raise BadInput(f"{path}: expected a COCO annotation file: a JSON object with an "
                   "'annotations' list of {'image_id', 'caption'}")
  refs: dict[Hashable, list[str]] = {}
  for k, ann in enumerate(data["annotations"]):
    image_id, caption = _caption_entry(ann, path, f"annotations[{k}]", "COCO annotations")
    refs.setdefault(image_id, []).append(caption)
  if not refs:
    raise BadInput(f"{path}: 'annotations' is empty, expected reference captions")
  return refs


def load_predictions(path: str, references: Mapping | None = None) -> dict[Hashable, str]:
  """Reads a COCO results file (``[{"image_id", "caption"}, ...]``).

  Args:
    path: the predictions JSON.
    references: when given, every predicted ``image_id`` must be one of its keys.

  Returns:
    ``{image_id: caption}`` in file order.

  Raises:
    BadInput: naming the file and entry index for a malformed entry, a repeated image id, or
      an image id absent from ``references``.
  """
  data = read_json(path, "a COCO results list of {'image_id', 'caption'}")
  if not isinstance(data, list):
    raise BadInput(f"{path}: expected a COCO results file: a JSON list of "
                   f"{{'image_id', 'caption'}}, got a {type(data).__name__}")
  preds: dict[Hashable, str] = {}
  for k, entry in enumerate(data):
    image_id, caption = _caption_entry(entry, path, f"entry {k}", "a COCO results list")
    if image_id in preds:
      raise BadInput(f"{path}: entry {k} repeats image_id {image_id!r}; expected one caption "
                     "per image")
    if references is not None and image_id not in references:
      raise BadInput(f"{path}: entry {k} has image_id {image_id!r}, which is not among the "
                     "references; expected only the references' image ids")
    preds[image_id] = caption
  if not preds:
    raise BadInput(f"{path}: no predictions, expected at least one {{'image_id', 'caption'}}")
  return preds


def _finite_or_none(x):
  return x if not isinstance(x, float) or math.isfinite(x) else None


def scores_json(result: Mapping) -> dict:
  """The JSON layout of a scores dict (see the module docstring): ``per_image`` becomes a list
  of ``{"image_id": id, metric: value}`` with the ids as they are, non-finite values null; other
  top-level keys (e.g. ``sacrebleu_signature``) are kept."""
  out = {"overall": {k: _finite_or_none(v) for k, v in result["overall"].items()},
         "per_image": [{"image_id": i, **{k: _finite_or_none(v) for k, v in m.items()}}
                       for i, m in result.get("per_image", {}).items()]}
  out.update({k: v for k, v in result.items() if k not in out})
  return out


def load_scores(path: str, image_ids=None) -> dict:
  """Reads a scores file as ``{"overall": {...}, "per_image": {image_id: {metric: value}}}``,
  the layout :func:`jaxcap.evaluation.coco_metrics.score` returns.

  Args:
    path: ``scores_<split><tag>.json`` (either layout) or ``evaluate.py --out``'s file.
    image_ids: for the old layout (ids as object keys, hence strings): the ids to map them back
      to. Default: the ids of ``predictions_<split><tag>.json`` beside the file when it exists,
      otherwise digit-only keys become ints.
  """
  data = read_json(path, "a scores file with 'overall' and 'per_image'")
  if not isinstance(data, dict) or not isinstance(data.get("overall"), dict):
    raise BadInput(f"{path}: expected a scores file: a JSON object with 'overall' and 'per_image'")
  sig = data.get("signature")
  if sig is not None and not isinstance(sig, dict):  # jaxcap-compare reads its fields
    raise BadInput(f"{path}: 'signature' must be an object (the one scoring wrote) or null, got "
                   f"{type(sig).__name__}")
  if sig is not None and not isinstance(sig.get("decode"), (dict, type(None))):
    raise BadInput(f"{path}: 'signature.decode' must be an object (the decoding settings) or null, "
                   f"got {type(sig['decode']).__name__}")
  per = data.get("per_image", [])
  out = dict(data)
  if isinstance(per, list):
    result = {}
    for k, entry in enumerate(per):
      if not isinstance(entry, dict) or "image_id" not in entry:
        raise BadInput(f"{path}: per_image[{k}] must be an object with 'image_id'")
      entry = dict(entry)
      result[_image_id(entry.pop("image_id"), path, f"per_image[{k}]")] = entry
    out["per_image"] = result
    return out
  if not isinstance(per, dict):
    raise BadInput(f"{path}: 'per_image' must be a list of {{'image_id', ...}}, got "
                   f"{type(per).__name__}")
  bad = next((k for k, v in per.items() if not isinstance(v, dict)), None)
  if bad is not None:  # the old layout: {image_id: {metric: value}}
    raise BadInput(f"{path}: per_image[{bad!r}] must be an object of metric values, got "
                   f"{type(per[bad]).__name__}")
  if image_ids is None:  # the old layout: recover the ids' type from the predictions beside it
    base = os.path.basename(path)
    sibling = os.path.join(os.path.dirname(path), "predictions_" + base[len("scores_"):])
    if base.startswith("scores_") and os.path.exists(sibling):
      image_ids = list(load_predictions(sibling))
  if image_ids is not None:
    by_text = {str(i): i for i in image_ids}
    key = lambda k: by_text.get(k, k)
  else:
    key = lambda k: int(k) if k.isdigit() else k
  out["per_image"] = {key(k): v for k, v in per.items()}
  return out


def is_scores_file(path: str) -> bool:
  """``path`` is a scores file jaxcap wrote: a JSON object whose ``signature`` records jaxcap's
  version (:func:`jaxcap.evaluation.signature.build`)."""
  obj = atomic.read_json(path)
  return (isinstance(obj, dict) and isinstance(obj.get("signature"), dict)
          and "jaxcap" in obj["signature"])


def score_files(predictions_path: str, references_path: str, out_path: str, spice: bool = False,
                *, metrics=None,
                log: Callable[[str], None] = print, caption_postprocess: str = "none", clip=None) -> dict:
  """Scores a COCO results file against a COCO annotation file and writes the scores.

  Args:
    predictions_path: ``[{"image_id", "caption"}]``.
    references_path: COCO annotations (``{"annotations": [{"image_id", "caption"}]}``).
    out_path: where ``{"overall": {...}, "per_image": [{"image_id": id, ...}]}`` is written
      (atomically; :func:`scores_json`; a metric that is NaN for an image, as SPICE can be, is
      written as null).
    spice: also compute SPICE when it can run.
    metrics: metric groups, as in :func:`jaxcap.evaluation.coco_metrics.score` (None: its default).
    log: one line per skipped or failed metric.
    caption_postprocess: applied to the captions before they are scored
      (:data:`jaxcap.evaluation.coco_metrics.CAPTION_POSTPROCESS`).
    clip: a :class:`jaxcap.clip.metrics.Request` (CLIP weights and images), prepared (every
      file checked) before anything is scored.

  Returns:
    The result of :func:`jaxcap.evaluation.coco_metrics.score` (with the original image ids).
  """
  atomic.check_writable(out_path, f"--out={out_path}", file=True)
  references = load_coco_references(references_path)
  predictions = load_predictions(predictions_path, references)
  missing = [i for i in references if i not in predictions]
  if missing:  # A score over a subset of the images is not the split's score.
    raise BadInput(f"{predictions_path}: captions for {len(predictions)} of the "
                   f"{len(references)} images in {references_path} (first missing image_id "
                   f"{missing[0]!r}); expected one caption for every reference image")
  prepared = clip.prepare(list(predictions)) if clip else None
  result = coco_metrics.score(references, predictions, metrics=metrics, spice=spice, log=log,
                              caption_postprocess=caption_postprocess)
  if prepared is not None:
    prepared.add(result, predictions, references)
  # A predictions file says nothing of the model or its decoding: the signature records the
  # two files (their sha256) and the metrics' side.
  with open(predictions_path, "rb") as f:
    pred_hash = signature.short_hash(f.read())
  with open(references_path, "rb") as f:
    ref_hash = signature.short_hash(f.read())
  result["signature"] = signature.build(
      metrics=result["signature"], split=os.path.basename(references_path), num_images=len(predictions),
      extra={"files": {"predictions": os.path.basename(predictions_path), "predictions_sha256": pred_hash,
                       "references": os.path.basename(references_path), "references_sha256": ref_hash}})
  write_json(out_path, scores_json(result))
  return result
