"""Two scorings of the same images compared: the settings they differ in, and each metric's
difference with a paired bootstrap interval and a paired permutation test.

Where two runs caption the same images, the per-image scores are paired: the image-to-image
spread (some images are hard for every model) cancels in the per-image differences, so a small
but consistent difference is told apart from noise far better than by comparing two seed
standard deviations. For each metric in both files' ``per_image``:

* ``overall_a``, ``overall_b``: each file's own ``overall`` score, the one its table printed;
* ``a``, ``b``, ``delta``: the means of the per-image scores over the images both scored and
  ``mean_i (b_i - a_i)``. For CIDEr-D, ROUGE-L and SPICE the overall score is the mean of the
  per-image scores, so over the same images this is the overall scores' difference. BLEU-1..4
  and METEOR (and sacreBLEU) are corpus-level: pycocoevalcap's BLEU comes from the n-gram counts
  and lengths summed over all images, METEOR 1.5 from the alignment statistics summed over all
  images; the mean of their per-image scores is another number (BLEU-4 21.79 where the table
  says 31.52) and the scores files hold no per-image statistics to resample the corpus score
  from. Their rows keep the paired statistics of the per-image means, labelled as such
  (``over``), beside the run's own corpus scores;
* ``ci``: the paired bootstrap's percentile 95 % interval of that mean (images resampled with
  replacement, the same resample for both runs; Koehn 2004, Efron & Tibshirani 1993);
* ``p``: a paired permutation test's two-sided p-value (each image's pair swapped at random,
  i.e. its difference's sign flipped; ``(1 + #{|mean| >= |observed|}) / (1 + R)``).

Both use a fixed seed, so a comparison prints the same numbers every time.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping

import numpy as np

from jaxcap.errors import BadInput
from jaxcap.evaluation import coco_metrics, files, signature

METRIC_ORDER = tuple(coco_metrics.DISPLAY_NAMES)

# Metrics whose overall score is not the mean of their per-image scores (see the docstring).
CORPUS_METRICS = frozenset({"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "sacreBLEU"})
PER_IMAGE_MEAN = "mean of per-image scores"
NOT_CORPUS = "mean of per-image scores, not the corpus score"


def display_name(metric: str) -> str:
  return coco_metrics.DISPLAY_NAMES.get(metric, metric)


def paired_bootstrap(a_N, b_N, *, resamples: int = 10000, seed: int = 0, level: float = 0.95,
                     chunk: int = 2000) -> tuple[float, float]:
  """The percentile interval of ``mean(b - a)`` over ``resamples`` paired resamples."""
  d_N = np.asarray(b_N, np.float64) - np.asarray(a_N, np.float64)
  n = d_N.shape[0]
  rng = np.random.default_rng(seed)
  means = []
  for start in range(0, resamples, chunk):
    idx_RxN = rng.integers(0, n, size=(min(chunk, resamples - start), n))
    means.append(d_N[idx_RxN].mean(axis=1))
  means_R = np.concatenate(means)
  tail = (1.0 - level) / 2.0
  lo, hi = np.quantile(means_R, [tail, 1.0 - tail])
  return float(lo), float(hi)


def paired_permutation_p(a_N, b_N, *, permutations: int = 10000, seed: int = 0,
                         chunk: int = 2000) -> float:
  """Two-sided p-value of ``mean(b - a) = 0`` by random sign flips of the per-image differences."""
  d_N = np.asarray(b_N, np.float64) - np.asarray(a_N, np.float64)
  observed = abs(d_N.mean())
  rng = np.random.default_rng(seed)
  at_least = 0
  for start in range(0, permutations, chunk):
    signs_RxN = rng.choice(np.array([-1.0, 1.0]), size=(min(chunk, permutations - start), d_N.shape[0]))
    # A tolerance for the equal-magnitude cases (all differences 0 gives p = 1).
    at_least += int(np.sum(np.abs((signs_RxN * d_N).mean(axis=1)) >= observed - 1e-12))
  return (1 + at_least) / (1 + permutations)


def load(path: str, split: str = "test", tag: str = "") -> tuple[dict, str]:
  """A scores file, or a run directory's ``scores_<split><tag>.json``; returns it (as
  :func:`jaxcap.evaluation.files.load_scores` reads it, with ``"signature"`` when it has one)
  and the file's path."""
  if os.path.isdir(path):
    file = os.path.join(path, f"scores_{split}{tag}.json")
    if not os.path.exists(file):
      found = sorted(n for n in os.listdir(path) if n.startswith("scores_") and n.endswith(".json"))
      raise BadInput(f"{path}: no scores_{split}{tag}.json; expected a run directory that was "
                     f"tested (found {', '.join(found) if found else 'no scores files'}; "
                     "--split / --tag choose another)")
    path = file
  return files.load_scores(path), path


def run_config(scores_path: str) -> dict | None:
  """The ``config.json`` of the run directory a scores file sits in, or None when there is none
  (a scores file copied elsewhere, ``evaluate.py --out``) or it is not a JSON object."""
  path = os.path.join(os.path.dirname(os.path.abspath(scores_path)), "config.json")
  try:
    with open(path) as f:
      config = json.load(f)
  except (OSError, ValueError, RecursionError):
    return None
  return config if isinstance(config, dict) else None


def compare(a: Mapping, b: Mapping, *, intersection: bool = False, names=("A", "B"),
            resamples: int = 10000, seed: int = 0, configs=None) -> dict:
  """``a`` and ``b``: scores as :func:`load` returns them; ``configs``: the two runs'
  ``config.json`` (:func:`run_config`; None where not found), read when the signatures' config
  hashes differ. Returns ``{"images", "settings", "config_found", "metrics": {metric: {"a",
  "b", "delta", "ci", "p", "overall_a", "overall_b", "over"}}}``: ``settings`` lists the
  signatures' differences and, when the config hashes differ and both configs are given, the
  config fields that differ (``config.<field>``; ``config_found`` False when they are not);
  raises a one-line ``BadInput`` when the image sets differ (unless ``intersection``) or no
  image or metric is shared."""
  pa, pb = a.get("per_image") or {}, b.get("per_image") or {}
  keys_a, keys_b = set(map(str, pa)), set(map(str, pb))
  shared = sorted(keys_a & keys_b)
  if not shared:
    raise BadInput(f"{names[0]} and {names[1]} score no image in common; expected scores of the "
                   "same images")
  if keys_a != keys_b and not intersection:
    raise BadInput(f"{names[0]} scores {len(keys_a)} images, {names[1]} {len(keys_b)}, "
                   f"{len(shared)} in both; expected the same images (--intersection compares "
                   "the shared ones)")
  by_a, by_b = {str(k): v for k, v in pa.items()}, {str(k): v for k, v in pb.items()}
  metrics = [m for m in METRIC_ORDER if all(m in by_a[k] and m in by_b[k] for k in shared)]
  metrics += sorted({m for k in shared for m in by_a[k]} & {m for k in shared for m in by_b[k]}
                    - set(metrics) - {"image_id"})
  sig_a, sig_b = a.get("signature") or {}, b.get("signature") or {}
  settings = signature.differences(sig_a, sig_b)
  config_found, missing = None, []
  if any(k == "config" for k, _, _ in settings):
    # The signature holds the config's hash only: the fields come from the runs' config.json.
    ca, cb = configs or (None, None)
    config_found = ca is not None and cb is not None
    missing = [n for n, c in zip(("A", "B"), (ca, cb)) if c is None]
    if config_found:  # listed right under the hash they explain
      at = [k for k, _, _ in settings].index("config") + 1
      settings[at:at] = [("config." + k, va, vb) for k, va, vb in signature.config_differences(ca, cb)]
  methods = [(s.get("decode") or {}).get("method") for s in (sig_a, sig_b)]
  out = {"images": len(shared), "images_a": len(keys_a), "images_b": len(keys_b),
         "settings": settings, "config_found": config_found, "config_missing": missing,
         # A change of decoding method lists no option of either side: the two methods in short.
         "decode": ([signature._decode_short(sig_a.get("decode") or {}),
                     signature._decode_short(sig_b.get("decode") or {})]
                    if methods[0] != methods[1] else None),
         "resamples": resamples, "seed": seed, "metrics": {}}
  overall_a, overall_b = a.get("overall") or {}, b.get("overall") or {}
  for m in metrics:
    va = np.array([_num(by_a[k].get(m), (names[0], k, m)) for k in shared])
    vb = np.array([_num(by_b[k].get(m), (names[1], k, m)) for k in shared])
    ok = np.isfinite(va) & np.isfinite(vb)  # SPICE can be NaN for an image
    if not ok.any():
      continue
    va, vb = va[ok], vb[ok]
    out["metrics"][m] = {"a": float(va.mean()), "b": float(vb.mean()),
                         "delta": float((vb - va).mean()), "images": int(ok.sum()),
                         "ci": paired_bootstrap(va, vb, resamples=resamples, seed=seed),
                         "p": paired_permutation_p(va, vb, permutations=resamples, seed=seed),
                         "overall_a": _num_or_none(overall_a.get(m), (names[0], m)),
                         "overall_b": _num_or_none(overall_b.get(m), (names[1], m)),
                         "over": NOT_CORPUS if m in CORPUS_METRICS else PER_IMAGE_MEAN}
  if not out["metrics"]:
    raise BadInput(f"{names[0]} and {names[1]} share no per-image metric; expected scores "
                   "files with 'per_image'")
  return out


def _num(v, where=None) -> float:
  """``v`` as a float (NaN for None); ``where``: ``(file, image_id, metric)`` of a scores
  file's value, named in the one line a non-number gets."""
  if v is None:
    return float("nan")
  try:
    return float(v)
  except (TypeError, ValueError):
    if where is None:
      raise
    raise BadInput(f"{where[0]}: per_image {where[1]!r} has {where[2]}={v!r}; expected a number "
                   "or null") from None


def _num_or_none(v, where=None):
  """``v`` as a float (None for None); ``where``: ``(file, metric)`` of a scores file's overall
  value, named in the one line a non-number gets."""
  if v is None:
    return None
  try:
    return float(v)
  except (TypeError, ValueError):
    if where is None:
      raise
    raise BadInput(f"{where[0]}: overall {where[1]}={v!r:.60}; expected a number or null") from None


def format_comparison(result: Mapping, names=("A", "B"), scale: float = 100.0) -> str:
  """The comparison as text: the differing settings, then one row per metric (x``scale``): each
  file's overall score, the per-image means, their paired difference with its interval and p,
  and what the interval is over."""
  lines = []
  settings = result["settings"]
  if settings:
    lines.append(f"settings that differ ({len(settings)}):")
    for k, va, vb in settings:
      if k == "config":
        where = " and ".join(f"{n}'s" for n in result.get("config_missing") or ()) or "a"
        why = (f"; config.json not found (beside {where} scores file), so the fields that differ "
               "are unknown" if result.get("config_found") is False else
               "" if any(s.startswith("config.") for s, _, _ in settings) else
               "; the runs' config.json files differ in no field that changes a score")
        lines.append(f"  config differs (hash {va} -> {vb}){why}")
      elif k == "decode.method" and result.get("decode"):
        lines.append(f"  {k}: {va!r} -> {vb!r} ({result['decode'][0]} -> {result['decode'][1]})")
      else:
        lines.append(f"  {k}: {va!r} -> {vb!r}")
  else:
    lines.append("settings: the same (or not recorded)")
  rows = result["metrics"]
  lines.append(f"{result['images']} images scored by both, {coco_metrics.scale_label(rows, scale)}. "
               "'overall': each file's own score, as its table printed it; 'mean': the mean of "
               "the per-image scores\n"
               f"over these images; delta: {names[1][:40]} - {names[0][:40]} of the means, with "
               f"the paired bootstrap ({result['resamples']} resamples) 95% interval and the "
               "paired permutation p:")
  lines.append(f"{'metric':>9} | {'A overall':>9} | {'B overall':>9} | {'A mean':>7} | "
               f"{'B mean':>7} | {'delta':>7} | {'95% interval':>17} | {'p':>7} | interval of")
  for m, r in rows.items():
    lo, hi = r["ci"]
    k = 1.0 if m == "sacreBLEU" else scale  # sacreBLEU is 0-100 already
    oa, ob = (f"{v * k:9.2f}" if v is not None else f"{'-':>9}"
              for v in (r.get("overall_a"), r.get("overall_b")))
    lines.append(f"{display_name(m):>9} | {oa} | {ob} | {r['a'] * k:7.2f} | {r['b'] * k:7.2f} | "
                 f"{r['delta'] * k:+7.2f} | [{lo * k:+7.2f}, {hi * k:+7.2f}] | {_p(r['p']):>7} | "
                 f"{r.get('over', PER_IMAGE_MEAN)}")
  corpus = [display_name(m) for m in rows if m in CORPUS_METRICS]
  if corpus:
    lines.append(f"{', '.join(corpus)}: corpus-level scores (n-gram or alignment statistics "
                 "summed over all images), so 'overall' is not 'mean'\nand the interval is of the "
                 "mean of per-image scores, not of the corpus score; the other metrics' overall "
                 "is their per-image mean.")
  return "\n".join(lines)


def _p(p: float) -> str:
  return f"{p:.4f}" if p >= 1e-4 else f"<{1e-4:g}"


def seed_paired(rows: Mapping[str, list[Mapping]], baseline: str, *, resamples: int = 10000,
                seed: int = 0) -> dict:
  """For an experiment's table: each row's seeds' per-image scores averaged per image, then
  paired with the ``baseline`` row's (:func:`compare` on the averages). ``rows``: row name ->
  the seeds' scores (each ``{"per_image": ...}``). Returns row -> :func:`compare`'s result."""
  def averaged(scores_list):
    by_id = [{str(i): v for i, v in s["per_image"].items()} for s in scores_list]
    keys = set.intersection(*(set(d) for d in by_id))
    per = {}
    for k in keys:
      entries = [d[k] for d in by_id]
      ms = set.intersection(*(set(e) for e in entries))
      per[k] = {m: float(np.mean([_num(e[m]) for e in entries])) for m in ms}
    return {"per_image": per}
  base = averaged(rows[baseline])
  return {name: compare(base, averaged(scores), names=(baseline, name), resamples=resamples, seed=seed)
          for name, scores in rows.items() if name != baseline}


def interval_text(r: Mapping, metric: str = "CIDEr", scale: float = 100.0) -> str:
  """``+1.23 [+0.40, +2.05]`` for a table cell."""
  m = r["metrics"].get(metric)
  if m is None or not all(math.isfinite(x) for x in m["ci"]):
    return "n/a"
  lo, hi = m["ci"]
  return f"{m['delta'] * scale:+.2f} [{lo * scale:+.2f}, {hi * scale:+.2f}]"
