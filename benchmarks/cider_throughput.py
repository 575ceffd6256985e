"""Reward throughput: jaxcap's vectorised CIDEr-D against pycocoevalcap's Python ``Cider``.

Both score the same 5,000 candidate captions with 5 references each. With the COCO Karpathy
test references present (``../shared/data/coco_karpathy_test``), each image's first caption
is the candidate and its other four plus a duplicate of the second are the references;
otherwise captions are generated from a small random grammar. Captions are lowercased and
split on non-letters (no Java needed), identically for both scorers.

Prints captions/s for pycocoevalcap, jaxcap corpus mode (references prepared in the timed call),
jaxcap with the references prepared once (the SCST case), and the ratios.

  python benchmarks/cider_throughput.py [--images 5000] [--repeats 3]
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxcap.evaluation import cider  # noqa: E402
from jaxcap.cli import positive_int  # noqa: E402  (one-line errors for bad sizes)

COCO = ROOT.parent / "shared" / "data" / "coco_karpathy_test" / "captions_karpathy_test2014.json"


def _norm(text: str) -> str:
  return " ".join(re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split())


def load_captions(num_images: int, seed: int = 0):
  """``(candidates [I], references [I][5], source)``."""
  if COCO.exists():
    with open(COCO) as f:
      data = json.load(f)
    by_image: dict = {}
    for ann in data["annotations"]:
      by_image.setdefault(ann["image_id"], []).append(_norm(ann["caption"]))
    ids = sorted(by_image)[:num_images]
    cands = [by_image[i][0] for i in ids]
    refs = [by_image[i][1:5] + [by_image[i][1]] for i in ids]
    return cands, refs, f"COCO Karpathy test ({len(ids)} images)"
  rng = np.random.default_rng(seed)
  nouns = "man woman dog cat bus train table pizza street field bench kite horse boat".split()
  verbs = "sitting standing riding walking eating holding flying parked lying".split()
  preps = "on in near next to under beside with".split()

  def caption() -> str:
    words = ["a", rng.choice(nouns), "is", rng.choice(verbs), rng.choice(preps), "a",
             rng.choice(nouns)]
    if rng.random() < 0.5:
      words += [rng.choice(preps), "the", rng.choice(nouns)]
    return " ".join(words)

  cands = [caption() for _ in range(num_images)]
  refs = [[caption() for _ in range(5)] for _ in range(num_images)]
  return cands, refs, f"generated captions ({num_images} images)"


def best_time(fn, repeats: int) -> float:
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def main(argv=None) -> None:
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  parser = ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=positive_int, default=5000)
  parser.add_argument("--repeats", type=positive_int, default=3)
  args = parser.parse_args(argv)

  from pycocoevalcap.cider.cider import Cider  # lazy: optional dependency

  cands, refs, source = load_captions(args.images)
  n = len(cands)
  gts = {i: refs[i] for i in range(n)}
  res = {i: [cands[i]] for i in range(n)}
  cand_ids, ref_ids, vocab_size = cider.encode_strings(cands, refs)
  scorer = cider.CiderD(vocab_size)

  ref_score, ref_scores = Cider().compute_score(gts, res)
  mean, ours = scorer.corpus_score(cand_ids, ref_ids)
  err = float(np.abs(np.asarray(ref_scores) - ours).max())

  t_coco = best_time(lambda: Cider().compute_score(gts, res), args.repeats)
  t_corpus = best_time(lambda: scorer.corpus_score(cand_ids, ref_ids), args.repeats)
  prepared = scorer.prepare_refs(ref_ids)
  index = np.arange(n)
  t_prep = best_time(lambda: scorer.prepare_refs(ref_ids), args.repeats)
  t_score = best_time(lambda: scorer.score(cand_ids, index, prepared), args.repeats)

  print(f"data: {source}, 5 references each; vocabulary {vocab_size}")
  print(f"CIDEr-D mean: pycocoevalcap {ref_score:.6f}  jaxcap {mean:.6f}  "
        f"max |per-caption diff| {err:.2e}")
  print(f"pycocoevalcap Cider           : {n / t_coco:12,.0f} captions/s  ({t_coco:.3f} s)")
  print(f"jaxcap corpus_score (refs+cands): {n / t_corpus:10,.0f} captions/s  ({t_corpus:.3f} s)"
        f"  ratio {t_coco / t_corpus:.1f}x")
  print(f"jaxcap score, refs prepared    : {n / t_score:12,.0f} captions/s  ({t_score:.3f} s)"
        f"  ratio {t_coco / t_score:.1f}x  (prepare_refs {t_prep:.3f} s once)")


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
