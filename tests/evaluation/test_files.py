"""Reading COCO annotation / results files and writing score files."""

from __future__ import annotations

import json
import os

import pytest

from jaxcap.evaluation import coco_metrics, files


def _write(path, obj):
  with open(path, "w") as f:
    f.write(obj if isinstance(obj, str) else json.dumps(obj))
  return str(path)


REFS = {"images": [{"id": 1}, {"id": 2}],
        "annotations": [{"image_id": 1, "id": 10, "caption": "A dog runs on the grass."},
                        {"image_id": 2, "id": 11, "caption": "Two cats sleep on a sofa."},
                        {"image_id": 1, "id": 12, "caption": "A brown dog running."}]}


def test_load_coco_references_groups_by_image(tmp_path):
  refs = files.load_coco_references(_write(tmp_path / "r.json", REFS))
  assert refs == {1: ["A dog runs on the grass.", "A brown dog running."],
                  2: ["Two cats sleep on a sofa."]}


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON"),
    ([1, 2], "'annotations' list"),
    ({"annotations": [{"image_id": 1}]}, r"annotations\[0\] must be an object"),
    ({"annotations": [{"image_id": 1, "caption": 3}]}, r"annotations\[0\] 'caption' must be"),
    ({"annotations": [{"image_id": [1], "caption": "a"}]}, r"'image_id' must be an int"),
    ({"annotations": []}, "is empty"),
])
def test_load_coco_references_errors_name_the_file(tmp_path, content, message):
  path = _write(tmp_path / "bad.json", content)
  with pytest.raises(ValueError, match=message) as e:
    files.load_coco_references(path)
  assert str(e.value).startswith(path) and "\n" not in str(e.value)


def test_load_coco_references_missing_file(tmp_path):
  with pytest.raises(ValueError, match="cannot read"):
    files.load_coco_references(str(tmp_path / "nope.json"))


@pytest.mark.parametrize("content,message", [
    ({"image_id": 1, "caption": "a"}, "JSON list"),
    ([{"image_id": 1, "caption": "a"}, {"caption": "b"}], "entry 1 must be an object"),
    ([{"image_id": 1, "caption": None}], "entry 0 'caption' must be a string"),
    ([{"image_id": 1, "caption": "a"}, {"image_id": 1, "caption": "b"}],
     "entry 1 repeats image_id 1"),
    ([{"image_id": 1, "caption": "a"}, {"image_id": 99, "caption": "b"}],
     "entry 1 has image_id 99, which is not among the references"),
    ([], "no predictions"),
])
def test_load_predictions_errors_name_file_and_index(tmp_path, content, message):
  path = _write(tmp_path / "p.json", content)
  with pytest.raises(ValueError, match=message) as e:
    files.load_predictions(path, {1: ["x"], 2: ["y"]})
  assert str(e.value).startswith(path)


def test_score_files_writes_scores_atomically(tmp_path):
  refs_path = _write(tmp_path / "r.json", REFS)
  preds_path = _write(tmp_path / "p.json", [{"image_id": 2, "caption": "Two cats on a sofa."},
                                            {"image_id": 1, "caption": "A dog running."}])
  out = tmp_path / "out" / "scores.json"
  metrics = ("Bleu", "ROUGE_L", "CIDEr")
  result = files.score_files(preds_path, refs_path, str(out), metrics=metrics, log=lambda s: None)
  written = json.loads(out.read_text())
  assert written["overall"] == pytest.approx(result["overall"])
  # One id type: per_image is a list in prediction order with the predictions' integer ids.
  assert [e["image_id"] for e in written["per_image"]] == [2, 1]
  assert {k: v for k, v in written["per_image"][1].items() if k != "image_id"} == pytest.approx(
      result["per_image"][1])
  loaded = files.load_scores(str(out))["per_image"]
  assert list(loaded) == [2, 1]
  assert all(loaded[i] == pytest.approx(result["per_image"][i]) for i in (1, 2))
  direct = coco_metrics.score(files.load_coco_references(refs_path),
                              files.load_predictions(preds_path), metrics=metrics,
                              log=lambda s: None)
  assert result["overall"] == pytest.approx(direct["overall"])
  assert os.listdir(out.parent) == ["scores.json"]


def test_load_scores_reads_the_old_layout_with_the_predictions_id_types(tmp_path):
  """Scores files written before the list layout keyed per_image by the id as a string."""
  old = {"overall": {"CIDEr": 0.5}, "per_image": {"391895": {"CIDEr": 0.4}, "1000268201": {"CIDEr": 0.6},
                                                  "abc_1": {"CIDEr": 0.5}}}
  path = _write(tmp_path / "scores_test.json", old)
  # No predictions beside it: digit-only keys become ints (COCO / synthetic ids).
  assert files.load_scores(path)["per_image"] == {391895: {"CIDEr": 0.4}, 1000268201: {"CIDEr": 0.6},
                                                  "abc_1": {"CIDEr": 0.5}}
  # predictions_test.json beside it: its ids' types win (a Flickr stem of digits stays a string).
  _write(tmp_path / "predictions_test.json", [{"image_id": 391895, "caption": "a"},
                                              {"image_id": "1000268201", "caption": "b"},
                                              {"image_id": "abc_1", "caption": "c"}])
  per = files.load_scores(path)["per_image"]
  assert list(per) == [391895, "1000268201", "abc_1"]
  assert files.load_scores(path, image_ids=[1000268201])["per_image"][1000268201] == {"CIDEr": 0.6}


def test_scores_json_keeps_id_types_and_extra_keys(tmp_path):
  result = {"overall": {"BLEU": 1.0, "SPICE": float("nan")}, "sacrebleu_signature": "x",
            "per_image": {7: {"SPICE": float("nan")}, "a.jpg": {"SPICE": 0.2}}}
  out = files.scores_json(result)
  assert out["per_image"] == [{"image_id": 7, "SPICE": None}, {"image_id": "a.jpg", "SPICE": 0.2}]
  assert out["overall"]["SPICE"] is None and out["sacrebleu_signature"] == "x"
  path = tmp_path / "s.json"
  path.write_text(json.dumps(out))
  assert files.load_scores(str(path))["per_image"] == {7: {"SPICE": None}, "a.jpg": {"SPICE": 0.2}}
