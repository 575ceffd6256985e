"""coco_metrics.score against pycocoevalcap's scorers called directly, and its fallbacks."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from jaxcap.evaluation import coco_metrics

# These tests read METEOR: the suite leaves it out elsewhere (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("with_meteor")

pytest.importorskip("pycocoevalcap")

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
COCO = DATA / "coco_karpathy_test" / "captions_karpathy_test2014.json"
needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")


def _human_baseline(num_images: int):
  """COCO Karpathy test: first caption as the prediction, the other four as references."""
  if not COCO.exists():
    pytest.skip(f"real data absent: {COCO}")
  with open(COCO) as f:
    data = json.load(f)
  by_image = collections.defaultdict(list)
  for ann in data["annotations"]:
    by_image[ann["image_id"]].append(ann["caption"])
  ids = sorted(by_image)[:num_images]
  return {i: by_image[i][1:] for i in ids}, {i: by_image[i][0] for i in ids}


def _direct(refs, preds, scorers):
  """What COCOEvalCap.evaluate() computes, one scorer at a time, without jaxcap."""
  from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

  ids = list(preds)
  tok = PTBTokenizer()
  gts = tok.tokenize({i: [{"caption": c} for c in refs[i]] for i in ids})
  res = tok.tokenize({i: [{"caption": preds[i]}] for i in ids})
  overall, per_image = {}, collections.defaultdict(dict)
  for scorer, names in scorers:
    score, scores = scorer.compute_score(gts, res)
    if isinstance(names, str):
      score, scores, names = [score], [scores], [names]
    for s, ss, name in zip(score, scores, names):
      overall[name] = s
      for i, v in zip(gts.keys(), ss):
        per_image[i][name] = v
  return overall, per_image


def _assert_same(result, overall, per_image, names):
  for name in names:
    assert result["overall"][name] == pytest.approx(overall[name], abs=1e-12), name
    got = np.array([result["per_image"][i][name] for i in per_image])
    want = np.array([per_image[i][name] for i in per_image])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=name)


@needs_java
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bleu_rouge_cider_match_pycocoevalcap_on_coco():
  from pycocoevalcap.bleu.bleu import Bleu
  from pycocoevalcap.cider.cider import Cider
  from pycocoevalcap.rouge.rouge import Rouge

  refs, preds = _human_baseline(1000)
  lines = []
  result = coco_metrics.score(refs, preds, metrics=("Bleu", "ROUGE_L", "CIDEr"), log=lines.append)
  overall, per_image = _direct(refs, preds, [
      (Bleu(4), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]), (Rouge(), "ROUGE_L"),
      (Cider(), "CIDEr")])
  names = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
  assert sorted(result["overall"]) == sorted(names)
  assert list(result["per_image"]) == list(preds)
  _assert_same(result, overall, per_image, names)
  assert not lines


@pytest.mark.slow
@needs_java
def test_meteor_matches_pycocoevalcap_on_coco(monkeypatch):
  # One METEOR process serves both sides: its Java start-up (~10-25 s) dominates otherwise.
  from pycocoevalcap.meteor.meteor import Meteor

  refs, preds = _human_baseline(50)
  meteor = Meteor()
  overall, per_image = _direct(refs, preds, [(meteor, "METEOR")])
  real = coco_metrics._make_scorer
  monkeypatch.setattr(coco_metrics, "_make_scorer",
                      lambda name: meteor if name == "METEOR" else real(name))
  result = coco_metrics.score(refs, preds, metrics=("METEOR",), log=lambda s: None)
  _assert_same(result, overall, per_image, ["METEOR"])
  assert len(set(np.round(list(per_image[i]["METEOR"] for i in per_image), 6))) > 10


@pytest.mark.slow
@needs_java
def test_all_metrics_match_pycocoevalcap_on_coco_500():
  from pycocoevalcap.bleu.bleu import Bleu
  from pycocoevalcap.cider.cider import Cider
  from pycocoevalcap.meteor.meteor import Meteor
  from pycocoevalcap.rouge.rouge import Rouge

  refs, preds = _human_baseline(500)
  result = coco_metrics.score(refs, preds, log=lambda s: None)
  overall, per_image = _direct(refs, preds, [
      (Bleu(4), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]), (Meteor(), "METEOR"),
      (Rouge(), "ROUGE_L"), (Cider(), "CIDEr")])
  _assert_same(result, overall, per_image, list(overall))


def test_without_java_skips_meteor_and_tokenises_in_python(monkeypatch):
  from pycocoevalcap.bleu.bleu import Bleu
  from pycocoevalcap.cider.cider import Cider

  refs = {1: ["A dog runs on the grass.", "A brown dog running."], 2: ["Two cats (asleep)."],
          3: ["A man's hat, red.", "A red hat"]}
  preds = {1: "A dog is running on grass.", 2: "Two cats sleeping.", 3: "A red hat."}
  monkeypatch.setattr(coco_metrics.shutil, "which", lambda name: None)
  lines = []
  result = coco_metrics.score(refs, preds, log=lines.append)
  assert sum("METEOR skipped" in s for s in lines) == 1
  assert sum("pure-Python" in s for s in lines) == 1
  assert len(lines) == 2
  assert "METEOR" not in result["overall"]
  gts = {i: [coco_metrics.python_ptb_tokenize(c) for c in refs[i]] for i in preds}
  res = {i: [coco_metrics.python_ptb_tokenize(preds[i])] for i in preds}
  bleu, bleu_per = Bleu(4).compute_score(gts, res, verbose=0)
  cid, cid_per = Cider().compute_score(gts, res)
  assert result["overall"]["Bleu_4"] == pytest.approx(bleu[3], abs=1e-12)
  assert result["overall"]["CIDEr"] == pytest.approx(cid, abs=1e-12)
  assert [result["per_image"][i]["CIDEr"] for i in preds] == pytest.approx(list(cid_per))
  assert [result["per_image"][i]["Bleu_1"] for i in preds] == pytest.approx(bleu_per[0])


def test_jaxcap_skip_metrics_leaves_a_default_metric_out_and_says_so(monkeypatch):
  refs = {1: ["a dog runs on the grass", "a brown dog"], 2: ["two cats asleep"]}
  preds = {1: "a dog on grass", 2: "two cats"}
  made = []
  real = coco_metrics._make_scorer
  monkeypatch.setattr(coco_metrics, "_make_scorer", lambda name: made.append(name) or real(name))
  monkeypatch.setenv(coco_metrics.SKIP_ENV, "METEOR, ROUGE_L")
  lines = []
  result = coco_metrics.score(refs, preds, tokenize=False, log=lines.append)
  assert lines == ["coco_metrics: METEOR, ROUGE_L not computed (JAXCAP_SKIP_METRICS=METEOR, ROUGE_L)"]
  assert "METEOR" not in made and "ROUGE_L" not in made  # not started, not only dropped
  assert set(result["overall"]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}
  # Named metrics are computed whatever the variable says.
  assert "ROUGE_L" in coco_metrics.score(refs, preds, metrics=("ROUGE_L",), tokenize=False)["overall"]
  monkeypatch.setenv(coco_metrics.SKIP_ENV, "Meteor")
  with pytest.raises(ValueError, match=r"JAXCAP_SKIP_METRICS='Meteor': unknown metric group\(s\) \['Meteor'\]"):
    coco_metrics.score(refs, preds, tokenize=False)
  # Every program checks it first: one line, exit 2, its body (which would train) never run.
  from jaxcap import cli
  ran = []
  with pytest.raises(SystemExit) as exit_info:
    cli.run_main(lambda: ran.append(1), setup=False)
  assert exit_info.value.code == 2 and not ran


def test_a_failing_scorer_does_not_stop_the_others(monkeypatch):
  real = coco_metrics._make_scorer

  def broken(name):
    if name == "ROUGE_L":
      raise RuntimeError("boom")
    return real(name)

  monkeypatch.setattr(coco_metrics, "_make_scorer", broken)
  lines = []
  result = coco_metrics.score({1: ["a dog runs"], 2: ["a cat sits"]}, {1: "a dog", 2: "a cat"},
                              metrics=("Bleu", "ROUGE_L", "CIDEr"), tokenize=False,
                              log=lines.append)
  assert len(lines) == 1 and "ROUGE_L failed" in lines[0] and "boom" in lines[0]
  assert "ROUGE_L" not in result["overall"]
  assert {"Bleu_4", "CIDEr"} <= set(result["overall"])
  assert set(result["per_image"][1]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}


def test_spice_without_jars_is_skipped_with_one_line(monkeypatch):
  ok, _ = coco_metrics.spice_available()
  if ok:
    pytest.skip("SPICE jars are installed here")
  lines = []
  result = coco_metrics.score({1: ["a dog runs"]}, {1: "a dog"}, metrics=("CIDEr",), spice=True,
                              tokenize=False, log=lines.append)
  assert len(lines) == 1 and lines[0].startswith("coco_metrics: SPICE skipped")
  assert set(result["overall"]) == {"CIDEr"}


def test_bad_arguments_raise_clear_errors():
  with pytest.raises(ValueError, match="unknown metric"):
    coco_metrics.score({1: ["a"]}, {1: "a"}, metrics=("BLEU",))
  with pytest.raises(ValueError, match="image_id 7 has no references"):
    coco_metrics.score({1: ["a"]}, {7: "a"})
  with pytest.raises(ValueError, match="empty"):
    coco_metrics.score({1: ["a"]}, {})
  with pytest.raises(ValueError, match="non-empty list"):
    coco_metrics.score({1: "a dog"}, {1: "a"})


@needs_java
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_python_tokenizer_agrees_with_ptbtokenizer_on_coco():
  if not COCO.exists():
    pytest.skip(f"real data absent: {COCO}")
  with open(COCO) as f:
    captions = {a["id"]: [a["caption"]] for a in json.load(f)["annotations"]}
  java = coco_metrics._ptb_tokenize(captions)
  same = sum(java[k][0] == coco_metrics.python_ptb_tokenize(v[0]) for k, v in captions.items())
  assert same / len(captions) > 0.999


@needs_java
def test_python_tokenizer_on_hard_cases_agrees_with_java():
  cases = ["A man's hat (red) sits on a table.", "I cannot see the t.v. in Washington D.C.",
           "Dogs' toys, balls; and sticks: 3:30 pm!", "A \"quoted\" word -- and more...",
           "Front Ave. and Seventh St.", "It is 1,000 feet high?"]
  java = coco_metrics._ptb_tokenize({i: [c] for i, c in enumerate(cases)})
  assert [coco_metrics.python_ptb_tokenize(c) for c in cases] == [java[i][0] for i in
                                                                  range(len(cases))]


def test_importing_evaluation_does_not_import_pycocoevalcap():
  # The GPU hosts have no pycocoevalcap: importing jaxcap.evaluation must not need it.
  import subprocess
  import sys

  code = ("import sys; import jaxcap.evaluation.coco_metrics, jaxcap.evaluation.files, "
          "jaxcap.evaluation.cider; print(any(m.startswith('pycocoevalcap') for m in sys.modules))")
  root = Path(__file__).resolve().parents[2]
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "False"


@needs_java
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_tokenizer_equals_pycocoevalcaps_and_prints_nothing(capfd):
  from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
  caps = {1: ["A man's dog, running -- fast!", "Two (big) cats; \"quoted\" text..."],
          "x": ["Hello\nworld?", "ÉLAN café naïve  spaces  "], 3: ["Front Ave. and Seventh St."]}
  if COCO.exists():
    with open(COCO) as f:
      caps.update({a["id"]: [a["caption"]] for a in json.load(f)["annotations"][:2000]})
  theirs = PTBTokenizer().tokenize({k: [{"caption": c} for c in v] for k, v in caps.items()})
  capfd.readouterr()
  assert coco_metrics._ptb_tokenize(caps) == {k: theirs[k] for k in caps}
  coco_metrics.score({1: ["a dog runs", "a dog"]}, {1: "a dog"}, metrics=("Bleu", "CIDEr"))
  # pycocoevalcap's own call prints "PTBTokenizer tokenized N tokens ..." on every score.
  assert capfd.readouterr() == ("", "")
