"""Scoring's caption postprocessing (config field ``caption_postprocess``, evaluate.py
``--caption-postprocess``): ``dedupe_repeats`` keeps a run of one word once before the metrics,
as the M² authors' test.py does; it is recorded in the signature and jaxcap-compare names it;
``none`` (the default) leaves scores and signatures as they were."""

import itertools
import json

import ml_collections
import pytest

from jaxcap.evaluation import coco_metrics, compare, files, signature
from jaxcap.training import validation

pytest.importorskip("pycocoevalcap")

REFS = {1: ["a dog runs on the grass", "a brown dog on a lawn"],
        2: ["a man rides a red bike", "a person on a bicycle"],
        3: ["two cats sleep on a sofa", "cats asleep on a couch"],
        4: ["a plate of food on a table", "food on a white plate"]}
# Images 2 and 4 have runs of one word; 1 and 3 repeat words, but never one after the other.
PREDS = {1: "a dog on a grass", 2: "a man man rides a a red bike", 3: "two cats on a sofa cats",
         4: "a plate plate plate of food"}
WITH_RUNS = {2, 4}


def _score(kind):
  # tokenize=False: the strings as given (no Java), so the only change is the postprocessing.
  return coco_metrics.score(REFS, PREDS, metrics=("Bleu", "CIDEr"), tokenize=False,
                            log=lambda *_: None, caption_postprocess=kind)


def test_dedupe_changes_exactly_the_captions_with_repeated_words():
  out = coco_metrics.postprocess_captions(PREDS, "dedupe_repeats")
  changed = {i for i in PREDS if out[i] != PREDS[i]}
  assert changed == WITH_RUNS
  for i, c in out.items():
    words = c.split()
    assert all(a != b for a, b in zip(words, words[1:])), c
    # Their test.py's expression on the word list.
    assert c == " ".join(k for k, _ in itertools.groupby(PREDS[i].split()))
  assert coco_metrics.postprocess_captions(PREDS, "none") == PREDS
  with pytest.raises(ValueError, match="caption_postprocess: expected one of none, dedupe_repeats"):
    coco_metrics.postprocess_captions(PREDS, "dedupe")


def test_scores_change_only_for_the_deduped_captions_and_the_signature_says_so():
  plain, deduped = _score("none"), _score("dedupe_repeats")
  direct = coco_metrics.score(REFS, coco_metrics.postprocess_captions(PREDS, "dedupe_repeats"),
                              metrics=("Bleu", "CIDEr"), tokenize=False, log=lambda *_: None)
  # Scoring with the option is scoring the deduped strings (the df of the references is the same).
  assert deduped["per_image"] == direct["per_image"] and deduped["overall"] == direct["overall"]
  for i in PREDS:
    same = plain["per_image"][i] == deduped["per_image"][i]
    assert same == (i not in WITH_RUNS), (i, plain["per_image"][i], deduped["per_image"][i])
  # Off: the signature has no trace of the option (the existing signatures are unchanged).
  assert plain["signature"] == signature.metrics_part("none", list(plain["overall"]))
  assert "caption_postprocess" not in plain["signature"]
  assert deduped["signature"]["caption_postprocess"] == "dedupe_repeats"
  line = signature.line(signature.build(metrics=deduped["signature"]))
  assert ",captions=dedupe_repeats" in line
  assert "captions=" not in signature.line(signature.build(metrics=plain["signature"]))


def test_compare_names_the_postprocessing_two_scorings_differ_in():
  plain, deduped = _score("none"), _score("dedupe_repeats")
  for s in (plain, deduped):
    s["signature"] = signature.build(metrics=s["signature"], split="test", num_images=len(PREDS))
  r = compare.compare(plain, deduped, resamples=50)
  assert ("metrics.caption_postprocess", None, "dedupe_repeats") in r["settings"]
  assert "metrics.caption_postprocess: None -> 'dedupe_repeats'" in compare.format_comparison(r)
  assert not compare.compare(deduped, deduped, resamples=50)["settings"]


def test_a_predictions_file_is_scored_with_the_option(tmp_path):
  preds = tmp_path / "preds.json"
  preds.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in PREDS.items()]))
  refs = tmp_path / "refs.json"
  refs.write_text(json.dumps({"images": [{"id": i} for i in REFS], "annotations": [
      {"image_id": i, "id": 10 * i + k, "caption": c} for i, cs in REFS.items() for k, c in enumerate(cs)]}))
  out = files.score_files(str(preds), str(refs), str(tmp_path / "s.json"), metrics=("Bleu",),
                          log=lambda *_: None, caption_postprocess="dedupe_repeats")
  written = json.loads((tmp_path / "s.json").read_text())
  assert written["signature"]["metrics"]["caption_postprocess"] == "dedupe_repeats"
  assert out["signature"]["metrics"]["caption_postprocess"] == "dedupe_repeats"


def test_the_config_field_is_checked_in_one_line():
  validation.check_config(ml_collections.ConfigDict({"caption_postprocess": "dedupe_repeats"}))
  with pytest.raises(ValueError, match=r"^config field caption_postprocess: expected one of .*got 'dedup'$"):
    validation.check_config(ml_collections.ConfigDict({"caption_postprocess": "dedup"}))
