"""Scores for translation runs whose output is German (multimodal NMT, Multi30k).

* **BLEU**: sacrebleu's corpus BLEU (``tokenize="none"``: hypotheses and references are
  already jaxcap-tokenised, lowercase, punctuation removed, as in the paper's preprocessing),
  all references of an image together; reported as ``sacreBLEU`` (0-100) with its signature.
* **METEOR**: the METEOR 1.5 jar that pycocoevalcap ships, run with ``-l de -norm`` and the
  modules it supports offline for German: ``exact`` and ``stem`` (Snowball German stemmer in
  the jar). ``synonym`` (WordNet, English only) and ``paraphrase`` (the jar ships only
  ``paraphrase-en.gz``) are not available. Reported as ``METEOR`` (0-1).
* **CIDEr-D** and pycocoevalcap's ``Bleu_1..4``: :func:`jaxcap.evaluation.coco_metrics.score`
  on the same tokens (no PTB tokenisation).

A metric that cannot run is reported in one line and the others are still returned.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Callable, Hashable, Mapping, Sequence
from jaxcap.evaluation import coco_metrics, signature

METEOR_MODULES = ("exact", "stem")


def sacrebleu_score(references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str]):
  """``(BLEU 0-100, signature string)``; images may have different numbers of references."""
  import sacrebleu  # lazy: optional dependency
  ids = list(predictions)
  n = max(len(references[i]) for i in ids)
  streams = [[references[i][k] if k < len(references[i]) else None for i in ids] for k in range(n)]
  bleu = sacrebleu.metrics.BLEU(tokenize="none")
  result = bleu.corpus_score([predictions[i] for i in ids], streams)
  return float(result.score), str(bleu.get_signature())


def meteor_jar() -> str:
  import pycocoevalcap.meteor.meteor as m  # lazy: optional dependency
  return os.path.join(os.path.dirname(m.__file__), "meteor-1.5.jar")


def meteor_de(references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str],
              lang: str = "de") -> float:
  """Corpus METEOR of the jar with ``-l de -norm -m "exact stem"`` (multi-reference)."""
  if shutil.which("java") is None:
    raise RuntimeError("no 'java' on PATH")
  ids = list(predictions)
  n = max(len(references[i]) for i in ids)
  with tempfile.TemporaryDirectory() as d:
    hyp, ref = os.path.join(d, "hyp.txt"), os.path.join(d, "ref.txt")
    with open(hyp, "w", encoding="utf-8") as f:
      f.writelines((predictions[i] or "") + "\n" for i in ids)
    with open(ref, "w", encoding="utf-8") as f:
      for i in ids:  # -r n: n consecutive lines per segment (missing ones repeat the first)
        refs = list(references[i])
        f.writelines(r + "\n" for r in (refs + [refs[0]] * (n - len(refs))))
    out = subprocess.run(["java", "-Xmx2G", "-jar", meteor_jar(), hyp, ref, "-l", lang, "-norm",
                          "-r", str(n), "-m", " ".join(METEOR_MODULES)],
                         capture_output=True, text=True, timeout=600)
  found = re.search(r"Final score:\s*([0-9.]+)", out.stdout)
  if not found:
    raise RuntimeError(f"METEOR jar gave no score: {out.stderr.strip()[-200:]}")
  return float(found.group(1))


def score(references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str], *,
          log: Callable[[str], None] = print, meteor: bool | None = None) -> dict:
  """``{"overall": {...}, "per_image": {...}, "sacrebleu_signature": str}`` for German output.

  ``overall`` has ``sacreBLEU`` (0-100), ``METEOR`` (German, 0-1), ``CIDEr`` (CIDEr-D) and
  pycocoevalcap's ``Bleu_1..4`` and ``ROUGE_L``; ``per_image`` is pycocoevalcap's. ``meteor``:
  None computes it unless ``JAXCAP_SKIP_METRICS`` names METEOR (said in ``log``).
  """
  if meteor is None:
    meteor = "METEOR" not in coco_metrics.skipped_metrics()
    if not meteor:
      log(coco_metrics.skip_note())
  refs = {i: list(references[i]) for i in predictions}
  out = coco_metrics.score(refs, predictions, metrics=("Bleu", "ROUGE_L", "CIDEr"), tokenize=False, log=log)
  out["sacrebleu_signature"] = ""
  try:
    out["overall"]["sacreBLEU"], out["sacrebleu_signature"] = sacrebleu_score(refs, predictions)
  except Exception as e:  # noqa: BLE001 - report and keep the other metrics
    log(f"translation: sacreBLEU skipped ({type(e).__name__}: {e})")
  if meteor:
    try:
      out["overall"]["METEOR"] = meteor_de(refs, predictions)
    except Exception as e:  # noqa: BLE001
      log(f"translation: METEOR (-l de) skipped ({type(e).__name__}: {e})")
  out["signature"] = signature.metrics_part("none", list(out["overall"]), translation=True,
                                            sacrebleu_signature=out["sacrebleu_signature"])
  return out
