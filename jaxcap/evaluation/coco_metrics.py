"""COCO caption metrics (BLEU 1-4, METEOR, ROUGE-L, CIDEr, SPICE) through pycocoevalcap, robustly.

``COCOEvalCap.evaluate()`` tokenises with the Java PTB tokenizer and then runs every scorer in
one loop, so one failing scorer (typically SPICE without its Stanford CoreNLP jars) loses all of
them. :func:`score` tokenises exactly as ``COCOEvalCap`` does (references and predictions
separately, ``PTBTokenizer``) and then calls each scorer on its own: a metric that cannot run
is reported in one line and the others still come out, with the values pycocoevalcap gives.

Without Java, METEOR and SPICE are skipped and tokenisation falls back to
:func:`python_ptb_tokenize`, a pure-Python approximation of PTBTokenizer followed by the same
punctuation removal (lowercase; split off punctuation, brackets, quotes and the clitics
``'s 're 've 'll 'd 'm n't``; drop the tokens pycocoevalcap drops). It agrees with the Java
tokenizer on plain captions but not on every corner of PTB tokenisation, so scores computed
that way are labelled as such in the log.

pycocoevalcap is imported lazily inside functions: a host without it can still import jaxcap.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from typing import Callable, Hashable, Mapping, Sequence

from jaxcap.errors import BadInput
from jaxcap.evaluation import signature

# One name per metric where people read it (tables, logs, docs); the JSON files keep
# pycocoevalcap's keys ("CIDEr" is CIDEr-D as computed).
# Two scales, one per kind of output (docs/USAGE.md "The run directory" says it for users):
# - what is stored or returned (scores_*.json, metrics.jsonl, jaxcap-compare --json, the Python
#   API's score dicts) keeps each metric's own scale: pycocoevalcap's BLEU, METEOR, ROUGE-L and
#   SPICE in 0-1, its CIDEr-D in 0-10 (not 0-1); sacreBLEU 0-100; CLIP-S and
#   RefCLIP-S at most 2.5, PAC-S and RefPAC-S at most 2 (w * max(cos, 0), jaxcap.clip.score);
# - what people read (printed tables, the validation lines and progress bar, TensorBoard,
#   figures) shows them x100, as papers print them (sacreBLEU as it is); what is printed says so
#   (scale_label, "(x100)", "_x100"), the figures on their axis.
DISPLAY_NAMES = {"Bleu_1": "BLEU-1", "Bleu_2": "BLEU-2", "Bleu_3": "BLEU-3", "Bleu_4": "BLEU-4",
                 "METEOR": "METEOR", "ROUGE_L": "ROUGE-L", "CIDEr": "CIDEr-D", "SPICE": "SPICE",
                 "sacreBLEU": "sacreBLEU",
                 # jaxcap.clip.score's (x100, as papers print them):
                 "CLIP-S": "CLIP-S", "RefCLIP-S": "RefCLIP-S", "PAC-S": "PAC-S", "RefPAC-S": "RefPAC-S"}


def display(key: str) -> tuple[str, float]:
  """``(name, scale)`` of a score key where people read it (tables, logs, figures, TensorBoard):
  its :data:`DISPLAY_NAMES` name and x100 (sacreBLEU is 0-100 already); any other key (a loss,
  a reward) as it is, x1."""
  if key not in DISPLAY_NAMES:
    return key, 1.0
  return DISPLAY_NAMES[key], 1.0 if key == "sacreBLEU" else 100.0


def scale_label(keys, scale: float = 100.0) -> str:
  """How a printed table of the metrics ``keys`` is scaled, for its header: ``"scores x100"``
  (the stored values times 100), naming sacreBLEU's exception when it is among them."""
  label = f"scores x{scale:g}"
  if "sacreBLEU" in keys and scale != 1:
    label += " (sacreBLEU as computed, 0-100)"
  return label


METRIC_NAMES = {
    "Bleu": ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"),
    "METEOR": ("METEOR",),
    "ROUGE_L": ("ROUGE_L",),
    "CIDEr": ("CIDEr",),
    "SPICE": ("SPICE",),
}
DEFAULT_METRICS = ("Bleu", "METEOR", "ROUGE_L", "CIDEr")

# Metric groups left out wherever the metrics are not named (train.py's test scores, evaluate.py,
# jaxcap.score, the table scripts' runs): comma-separated, e.g. ``JAXCAP_SKIP_METRICS=METEOR``.
# METEOR's Java process loads its paraphrase tables for ~13 s of wall and 16 s of CPU at every
# start, most of a smoke run's time; the test suite sets it (tests/conftest.py) except where a
# test reads METEOR. What is skipped is said in one line each time; the scores then lack it.
SKIP_ENV = "JAXCAP_SKIP_METRICS"


def skipped_metrics() -> tuple[str, ...]:
  """The groups :data:`SKIP_ENV` names (none when unset)."""
  raw = os.environ.get(SKIP_ENV, "")
  names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
  unknown = [n for n in names if n not in METRIC_NAMES]
  if unknown:
    raise BadInput(f"{SKIP_ENV}={raw!r}: unknown metric group(s) {unknown}; expected a "
                   f"comma-separated list of some of {list(METRIC_NAMES)}")
  return names


def default_metrics() -> tuple[str, ...]:
  """:data:`DEFAULT_METRICS` without those :data:`SKIP_ENV` names."""
  skip = skipped_metrics()
  return tuple(m for m in DEFAULT_METRICS if m not in skip)


def skip_note() -> str | None:
  """The line said when :data:`SKIP_ENV` leaves a default metric out, else None."""
  skip = skipped_metrics()
  left_out = [m for m in DEFAULT_METRICS if m in skip]
  if not left_out:
    return None
  return f"coco_metrics: {', '.join(left_out)} not computed ({SKIP_ENV}={os.environ[SKIP_ENV]})"

# What may be done to the generated captions before they are scored (config field
# ``caption_postprocess``, ``evaluate.py --caption-postprocess``): "none" (scored as generated) |
# "dedupe_repeats" (a run of the same word kept once: "a a dog" -> "a dog"; the M² authors'
# test.py and train.py score ``' '.join(k for k, _ in itertools.groupby(words))``).
CAPTION_POSTPROCESS = ("none", "dedupe_repeats")


def postprocess_captions(predictions: Mapping[Hashable, str], kind: str = "none") -> dict:
  """``predictions`` with :data:`CAPTION_POSTPROCESS` ``kind`` applied to every caption (words
  are the space-separated tokens jaxcap's captions are made of)."""
  if kind not in CAPTION_POSTPROCESS:
    raise BadInput(f"caption_postprocess: expected one of {', '.join(CAPTION_POSTPROCESS)}, "
                   f"got {kind!r}")
  if kind == "none":
    return dict(predictions)
  # A non-string caption is left as it is: score() refuses it in one line.
  return {i: " ".join(w for w, _ in itertools.groupby(c.split())) if isinstance(c, str) else c
          for i, c in predictions.items()}


# pycocoevalcap.tokenizer.ptbtokenizer.PUNCTUATIONS, repeated here so the fallback needs no import.
PTB_PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?",
                              "!", ",", ":", "-", "--", "...", ";"])
_BRACKET_TOKENS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-",
                   "}": "-rcb-"}
_CLITICS = frozenset(["'s", "'re", "'ve", "'ll", "'d", "'m", "n't"])
_CLITIC = re.compile(r"(?<=\w)('s|'re|'ve|'ll|'d|'m|n't)\b")
_ABBREVIATIONS = frozenset(
    "dr st ave mr mrs ms jr sr vs etc inc co corp ltd mt ft rd blvd hwy no jan feb mar apr aug "
    "sept sep oct nov dec".split())


def _keeps_period(token: str) -> bool:
  """PTB keeps the final period of abbreviations (``dr.``, ``t.v.``, ``b.``)."""
  base = token[:-1]
  return "." in base or (len(base) == 1 and base.isalpha()) or base in _ABBREVIATIONS


def python_ptb_tokenize(text: str) -> str:
  """Pure-Python stand-in for PTBTokenizer (``-lowerCase``) + pycocoevalcap's punctuation removal.

  Mirrors what the Java tokenizer does to captions: brackets become ``-lrb-`` etc. (which
  pycocoevalcap's upper-case list then fails to remove, so they stay), ``, ; :`` split off
  except between digits, a final period splits off except after abbreviations, clitics and
  ``cannot`` split, quotes go. Tokens in pycocoevalcap's punctuation list are dropped.

  Args:
    text: one raw caption.

  Returns:
    Space-joined lowercase tokens.
  """
  text = text.replace("\n", " ").lower()
  text = re.sub(r"\.\.\.|--|[\"!?]", lambda m: f" {m.group()} ", text)
  text = re.sub(r"[()\[\]{}]", lambda m: f" {_BRACKET_TOKENS[m.group()]} ", text)
  text = re.sub(r"(?<!\d)[,;:]|[,;:](?!\d)", lambda m: f" {m.group()} ", text)
  text = re.sub(r"\bcannot\b", "can not", text)
  out = []
  for tok in text.split():
    # A final period (or a run of them) splits off, except after abbreviations.
    if len(tok) > 1 and tok.endswith(".") and (tok.endswith("..") or not _keeps_period(tok)):
      tok = tok.rstrip(".-")
    for part in _CLITIC.sub(r" \1", tok).split():
      if part not in _CLITICS:
        # PTB splits quotes off word edges ("'hello'" -> ` hello '), which are then dropped.
        part = part.strip("'`")
      if part and part not in PTB_PUNCTUATIONS and part != '"':
        out.append(part)
  return " ".join(out)


# What COCOEvalCap's PTBTokenizer removes after tokenising (pycocoevalcap/tokenizer/ptbtokenizer.py).
_PTB_PUNCTUATION = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!",
                              ",", ":", "-", "--", "...", ";"])


def _ptb_tokenize(captions: Mapping[Hashable, Sequence[str]]) -> dict:
  """Stanford's PTBTokenizer on ``{id: [caption]}``, run as ``COCOEvalCap`` runs it (pycocoevalcap's
  stanford-corenlp-3.4.1 jar, ``-preserveLines -lowerCase``, one caption per line, the same
  punctuation removed), with two differences that change no token: the input file goes to a
  temporary folder (pycocoevalcap writes it into its installed package, which may be read-only),
  and the jar's progress line on stderr ("PTBTokenizer tokenized N tokens ...", once per call) is
  kept off the terminal."""
  import subprocess
  import tempfile

  from pycocoevalcap.tokenizer import ptbtokenizer  # lazy: optional dependency

  jar = os.path.join(os.path.dirname(ptbtokenizer.__file__), ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)
  keys = [k for k, v in captions.items() for _ in v]
  text = "\n".join(c.replace("\n", " ") for v in captions.values() for c in v)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "captions.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    r = subprocess.run(["java", "-cp", jar, "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines",
                        "-lowerCase", path], capture_output=True, timeout=600)
  if r.returncode != 0:
    raise RuntimeError(f"PTBTokenizer exited {r.returncode}: {r.stderr.decode(errors='replace').strip()[-200:]}")
  lines = r.stdout.decode("utf-8").split("\n")
  out: dict = {}
  for k, line in zip(keys, lines):
    out.setdefault(k, []).append(" ".join(w for w in line.rstrip().split(" ") if w not in _PTB_PUNCTUATION))
  for k, v in captions.items():
    if len(out.get(k, ())) != len(v):
      raise RuntimeError(f"PTBTokenizer returned {len(out.get(k, ()))} captions for image {k!r}, "
                         f"expected {len(v)}")
  return {k: out[k] for k in captions}


def spice_available() -> tuple[bool, str]:
  """Whether SPICE can run here, and why not when it cannot."""
  if shutil.which("java") is None:
    return False, "no 'java' on PATH"
  try:
    import pycocoevalcap.spice as spice_pkg  # lazy: optional dependency
  except ImportError as e:
    return False, f"pycocoevalcap is not installed ({e})"
  lib = os.path.join(os.path.dirname(spice_pkg.__file__), "lib")
  missing = [j for j in ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
             if not os.path.exists(os.path.join(lib, j))]
  if missing:
    return False, (f"{', '.join(missing)} missing from {lib} (run pycocoevalcap/spice/"
                   "get_stanford_models.py once with network access)")
  return True, ""


def _make_scorer(name: str):
  # Imports stay here so importing this module never needs pycocoevalcap or Java.
  if name == "Bleu":
    from pycocoevalcap.bleu.bleu import Bleu
    return Bleu(4)
  if name == "METEOR":
    from pycocoevalcap.meteor.meteor import Meteor
    return Meteor()
  if name == "ROUGE_L":
    from pycocoevalcap.rouge.rouge import Rouge
    return Rouge()
  if name == "CIDEr":
    from pycocoevalcap.cider.cider import Cider
    return Cider()
  from pycocoevalcap.spice.spice import Spice
  return Spice()


def _run_scorer(name: str, gts: dict, res: dict):
  """``(overall {metric: float}, per-image {metric: [float]})`` of one pycocoevalcap scorer."""
  scorer = _make_scorer(name)
  try:
    if name == "Bleu":
      try:
        overall, per_image = scorer.compute_score(gts, res, verbose=0)
      except TypeError:  # older pycocoevalcap without the verbose argument
        overall, per_image = scorer.compute_score(gts, res)
      keys = METRIC_NAMES["Bleu"]
      return ({k: float(v) for k, v in zip(keys, overall)},
              {k: [float(x) for x in v] for k, v in zip(keys, per_image)})
    overall, per_image = scorer.compute_score(gts, res)
    if name == "SPICE":
      per_image = [float(s["All"]["f"]) for s in per_image]
    return {name: float(overall)}, {name: [float(x) for x in per_image]}
  finally:
    del scorer  # METEOR's __del__ stops its Java process now rather than at exit


def score(references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, str], *,
          metrics: Sequence[str] | None = None, spice: bool = False, tokenize: bool = True,
          log: Callable[[str], None] = print, caption_postprocess: str = "none") -> dict:
  """Scores predicted captions against references with pycocoevalcap's scorers.

  Args:
    references: ``{image_id: [reference caption, ...]}`` raw text (or tokenised, see
      ``tokenize``); may hold more images than ``predictions``.
    predictions: ``{image_id: caption}``; exactly these images are scored (as the usual
      ``cocoEval.params['image_id'] = cocoRes.getImgIds()`` does).
    metrics: groups among ``Bleu``, ``METEOR``, ``ROUGE_L``, ``CIDEr``, ``SPICE``; None:
      :func:`default_metrics` (:data:`DEFAULT_METRICS` less :data:`SKIP_ENV`'s, said in ``log``).
    spice: also compute SPICE (needs Java and the Stanford CoreNLP 3.6.0 jars).
    tokenize: PTB-tokenise first, as ``COCOEvalCap`` does; False scores the strings as given.
    log: receives one line per skipped or failed metric.
    caption_postprocess: :data:`CAPTION_POSTPROCESS`: applied to the predictions before they
      are tokenised and scored; recorded in the signature when not ``"none"``.

  Returns:
    ``{"overall": {metric: float}, "per_image": {image_id: {metric: float}}, "signature":
    {...}}`` with pycocoevalcap's names (``Bleu_1..Bleu_4``, ``METEOR``, ``ROUGE_L``, ``CIDEr``
    -- CIDEr-D as computed --, ``SPICE``), each at pycocoevalcap's scale (CIDEr-D 0-10, the
    others 0-1; printed tables show them x100), and how they were computed
    (:func:`jaxcap.evaluation.signature.metrics_part`: versions, the tokenizer used, CIDEr-D's
    variant).
  """
  if metrics is None:
    metrics, note = default_metrics(), skip_note()
    if note:
      log(note)
  groups = list(dict.fromkeys(list(metrics) + (["SPICE"] if spice else [])))
  unknown = [m for m in groups if m not in METRIC_NAMES]
  if unknown:
    raise BadInput(f"coco_metrics: unknown metric(s) {unknown}, expected some of "
                   f"{list(METRIC_NAMES)}")
  if not predictions:
    raise BadInput("coco_metrics: predictions are empty, expected at least one image")
  ids = list(predictions)
  for i in ids:
    if i not in references:
      raise BadInput(f"coco_metrics: predicted image_id {i!r} has no references")
    refs = references[i]
    if isinstance(refs, str) or not len(refs):
      raise BadInput(f"coco_metrics: references[{i!r}] must be a non-empty list of captions")
    if not isinstance(predictions[i], str):
      raise BadInput(f"coco_metrics: predictions[{i!r}] must be a string, got "
                     f"{type(predictions[i]).__name__}")
  gts = {i: [str(c) for c in references[i]] for i in ids}
  scored = postprocess_captions(predictions, caption_postprocess)
  res = {i: [scored[i]] for i in ids}

  have_java = shutil.which("java") is not None
  tokenizer = "none"
  if tokenize:
    if have_java:
      try:
        gts, res = _ptb_tokenize(gts), _ptb_tokenize(res)
      except Exception as e:  # noqa: BLE001 - any tokenizer failure falls back the same way
        log(f"coco_metrics: PTBTokenizer failed ({type(e).__name__}: {e}); using the "
            "pure-Python approximation instead")
        have_tok = False
      else:
        have_tok = True
    else:
      log("coco_metrics: no 'java' on PATH: tokenising with the pure-Python approximation of "
          "PTBTokenizer (scores may differ slightly from official ones)")
      have_tok = False
    tokenizer = "ptb" if have_tok else "ptb-python"
    if not have_tok:
      gts = {i: [python_ptb_tokenize(c) for c in v] for i, v in gts.items()}
      res = {i: [python_ptb_tokenize(c) for c in v] for i, v in res.items()}

  overall: dict = {}
  per_metric: dict = {}
  for group in groups:
    if group == "METEOR" and not have_java:
      log("coco_metrics: METEOR skipped: no 'java' on PATH")
      continue
    if group == "SPICE":
      ok, why = spice_available()
      if not ok:
        log(f"coco_metrics: SPICE skipped: {why}")
        continue
    try:
      o, p = _run_scorer(group, gts, res)
    except Exception as e:  # noqa: BLE001 - report and keep the other metrics
      log(f"coco_metrics: {group} failed ({type(e).__name__}: {e}); other metrics still reported")
      continue
    overall.update(o)
    per_metric.update(p)
  per_image = {i: {m: v[k] for m, v in per_metric.items()} for k, i in enumerate(ids)}
  return {"overall": overall, "per_image": per_image,
          "signature": signature.metrics_part(tokenizer, list(overall),
                                              caption_postprocess=caption_postprocess)}
