"""Every scores file says how it was made (jaxcap/evaluation/signature.py); jaxcap-compare tells
runs apart from their files alone; the COCO evaluation server's files (jaxcap/evaluation/server.py).

Three tiny runs on a Karpathy-layout dataset written here, trained by train.py as a user runs it:
``a``; ``b`` the same with a vocabulary threshold of 2; ``c`` the same on another feature set
(other files of the same shapes). evaluate.py then decodes ``a`` at two beam sizes.
"""

import json
import shutil

import numpy as np
import pytest

from jaxcap.evaluation import server, signature
from tests.data import fakes
from tests.programs import Programs, one_device_env

REPO_CONFIG = "--config=configs/transformer.py:synthetic,tiny"


def _train_argv(root, workdir, **data):
  fields = dict(name="karpathy", root=str(root), dataset_json="dataset_coco.json", att_dir="att",
                fc_dir="fc", box_dir="box", min_word_count=1, max_regions=5, feature_dim=0)
  fields.update(data)
  return ["train.py", REPO_CONFIG, f"--workdir={workdir}", "--config.num_train_steps=2",
          "--config.eval_every_steps=2", "--config.checkpoint_every_steps=2",
          "--config.test_after_training=True",
          *(f"--config.data.{k}={v}" for k, v in fields.items())]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("signature")
  fakes.write_karpathy(tmp / "data", counts=(16, 6, 6), dim=8, fc_dim=6, regions=(2, 5))
  # Another feature set: the same images, names and shapes, other values.
  other = tmp / "data_other"
  shutil.copytree(tmp / "data", other)
  for p in (other / "att").iterdir():
    feat = np.load(p)["feat"]
    np.savez_compressed(p, feat=feat[::-1] * 0.5)
  out = {}
  with Programs(one_device_env()) as programs:
    for name, root, data in (("a", tmp / "data", {}), ("b", tmp / "data", {"min_word_count": 2}),
                             ("c", other, {})):
      code, stdout, err = programs.run(_train_argv(root, tmp / name, **data), tmp)
      assert code == 0, err[-2000:]
      out[name] = (tmp / name, stdout)
    for beam in (2, 3):
      code, stdout, err = programs.run(["evaluate.py", f"--workdir={tmp / 'a'}", f"--beam-size={beam}",
                                        f"--tag=_beam{beam}"], tmp)
      assert code == 0, err[-2000:]
      out[f"beam{beam}"] = stdout
    yield dict(out, programs=programs, tmp=tmp)


def _sig(path):
  return json.loads(path.read_text())["signature"]


@pytest.mark.slow
def test_train_py_scores_carry_the_signature_and_print_it(runs):
  wd, stdout = runs["a"]
  sig = _sig(wd / "scores_test.json")
  assert sig["split"] == {"name": "test", "images": 6} and sig["checkpoint"] == {"step": 2}
  assert sig["decode"]["method"] == "greedy" and sig["decode"]["max_len"] > 0
  assert sig["vocab"]["min_count"] == 1 and sig["vocab"]["size"] > 4
  assert sig["features"]["source"] == "karpathy" and sig["features"]["regions"] == 5
  assert sig["features"]["hashed"] == "feature file names" and len(sig["features"]["sha256"]) == 8
  m = sig["metrics"]
  assert m["implementation"] == "pycocoevalcap" and m["tokenizer"] in ("ptb", "ptb-python")
  assert m["cider"]["name"] == "CIDEr-D" and m["cider"]["sigma"] == 6.0 and m["cider"]["eos"] is False
  assert sig["model"] == "transformer" and len(sig["config"]) == 8 and sig["jaxcap"]["version"]
  assert f"signature: {signature.line(sig)}" in stdout
  assert "CIDEr-D" in stdout and f"wrote {wd / 'scores_test.json'}" in stdout


def _compare(runs, a, b, *extra):
  return runs["programs"].run(["-m", "jaxcap.commands.compare", str(a), str(b), "--resamples=500", *extra],
                              runs["tmp"])


@pytest.mark.slow
def test_compare_names_the_one_setting_two_score_files_differ_in(runs):
  wd = runs["a"][0]
  code, out, err = _compare(runs, wd / "scores_test_beam2.json", wd / "scores_test_beam3.json")
  assert code == 0, err
  assert "settings that differ (1):\n  decode.beam_size: 2 -> 3" in out
  assert "6 images scored by both" in out and "CIDEr-D" in out and "95% interval" in out
  # The vocabulary threshold, from the run directories' scores_test.json.
  code, out, err = _compare(runs, wd, runs["b"][0])
  assert code == 0, err
  # The config hash and, from the run directories' config.json, the field behind it.
  assert "vocab.min_count: 1 -> 2" in out and "config differs (hash " in out
  assert "config.data.min_word_count: 1 -> 2" in out
  assert "features.fields" not in out
  # The feature set: the same names and shapes in another folder.
  code, out, err = _compare(runs, wd, runs["c"][0], "--json=cmp.json")
  assert code == 0, err
  assert "features.fields.root:" in out and "vocab.min_count" not in out
  saved = json.loads((runs["tmp"] / "cmp.json").read_text())
  assert saved["images"] == 6 and "CIDEr" in saved["metrics"]


@pytest.mark.slow
def test_compare_refuses_two_image_sets_in_one_line(runs, tmp_path):
  wd = runs["a"][0]
  scores = json.loads((wd / "scores_test.json").read_text())
  scores["per_image"] = scores["per_image"][:4]
  (tmp_path / "scores_test.json").write_text(json.dumps(scores))
  code, out, err = _compare(runs, wd, tmp_path)
  assert code == 2 and err.count("\n") == 1 and "6 images" in err and "--intersection" in err
  code, out, err = _compare(runs, wd, tmp_path, "--intersection")
  assert code == 0 and "comparing the 4 both scored" in out


@pytest.mark.slow
def test_the_api_and_a_predictions_file_carry_signatures(runs, tmp_path):
  import jaxcap
  wd = runs["a"][0]
  scores = jaxcap.load(str(wd)).evaluate(metrics=("Bleu", "CIDEr"), beam_size=2, method="beam", log=lambda *_: None)
  sig = scores["signature"]
  assert sig["decode"]["beam_size"] == 2 and sig["checkpoint"]["step"] == 2 and sig["vocab"]["min_count"] == 1
  assert sig["metrics"]["computed"] == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"]
  preds = json.loads((wd / "predictions_test.json").read_text())
  refs = {"images": [{"id": p["image_id"]} for p in preds],
          "annotations": [{"image_id": p["image_id"], "caption": "a dog runs"} for p in preds]}
  (tmp_path / "refs.json").write_text(json.dumps(refs))
  code, out, err = runs["programs"].run(["evaluate.py", f"--predictions={wd / 'predictions_test.json'}",
                                         f"--references={tmp_path / 'refs.json'}",
                                         f"--out={tmp_path / 'scores.json'}"], tmp_path)
  assert code == 0, err
  sig = _sig(tmp_path / "scores.json")
  assert sig["files"]["predictions"] == "predictions_test.json" and sig["split"]["images"] == 6
  assert sig["decode"] == {"method": "unknown (a predictions file)"}


# ------------------------------------------------------------------------- the server's files

def _coco_set(root, ids, dim=8, fc_dim=6, regions=(2, 5), seed=3):
  """A COCO set without references in self-critical's layout (cocotest_bu_att/fc/box) and its
  image_info file, as COCO distributes image_info_test2014.json."""
  rng = np.random.default_rng(seed)
  for d in ("att", "fc", "box"):
    (root / f"cocotest_bu_{d}").mkdir(parents=True)
  for i in ids:
    n = int(rng.integers(regions[0], regions[1] + 1))
    np.savez_compressed(root / "cocotest_bu_att" / f"{i}.npz", feat=rng.standard_normal((n, dim)).astype(np.float32))
    np.save(root / "cocotest_bu_fc" / f"{i}.npy", rng.standard_normal(fc_dim).astype(np.float32))
    x1 = rng.uniform(0, 200, n)
    np.save(root / "cocotest_bu_box" / f"{i}.npy", np.stack([x1, x1, x1 + 50, x1 + 40], -1))
  info = {"info": {}, "images": [{"id": i, "file_name": f"COCO_test2014_{i:012d}.jpg",
                                  "width": 640, "height": 480} for i in ids]}
  (root / "image_info_test2014.json").write_text(json.dumps(info))


def _server_argv(wd, root, *extra):
  return ["evaluate.py", f"--workdir={wd}", "--server=test2014", f"--att_dir={root}/cocotest_bu_att",
          f"--fc_dir={root}/cocotest_bu_fc", f"--box_dir={root}/cocotest_bu_box", "--batch_size=4", *extra]


@pytest.mark.slow
def test_server_results_file_for_a_set_without_references(runs, tmp_path):
  ids = [9, 25, 57, 133, 164, 192, 196, 208, 241]  # more than a batch, a ragged last one
  _coco_set(tmp_path, ids)
  wd = runs["a"][0]
  code, out, err = runs["programs"].run(_server_argv(wd, tmp_path, "--alg=tiny",
                                                     f"--image_info={tmp_path}/image_info_test2014.json"), tmp_path)
  assert code == 0, err
  path = wd / "captions_test2014_tiny_results.json"
  data = json.loads(path.read_text())
  assert [r["image_id"] for r in data] == ids and all(set(r) == {"image_id", "caption"} for r in data)
  assert all(type(r["image_id"]) is int and isinstance(r["caption"], str) for r in data)
  server.check_results(str(path), "test2014", expected_ids=ids)
  assert "9 images; the server's test2014 has 40,775" in out and f"wrote {path}" in out
  # The same captions as decoding the features through the API.
  import jaxcap
  run = jaxcap.load(str(wd))
  reader = server.features_reader(ids, str(tmp_path / "cocotest_bu_att"), str(tmp_path / "cocotest_bu_fc"),
                                  str(tmp_path / "cocotest_bu_box"))
  want = run.caption(server.chunk_features(reader, range(len(ids)), run.info), batch_size=4,
                     **run.decode_config())
  assert [r["caption"] for r in data] == want


@pytest.mark.slow
@pytest.mark.parametrize("case,extra,match", [
    ("alg-underscore", ["--alg=my_model"], "--alg=my_model: expected letters, digits and '-'"),
    ("missing-file", ["--image_info={root}/more.json"], "no features for 1 of the 4 images, e.g. "),
    ("no-image-info-list", ["--image_info={root}/bad.json"], "no 'images' list"),
    ("not-an-id", [], "is not named by an integer COCO image id"),
])
def test_server_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, case, extra, match):
  _coco_set(tmp_path, [1, 2, 3])
  (tmp_path / "more.json").write_text(json.dumps({"images": [{"id": i} for i in (1, 2, 3, 4)]}))
  (tmp_path / "bad.json").write_text(json.dumps({"annotations": []}))
  if case == "not-an-id":
    np.save(tmp_path / "cocotest_bu_att" / "thumb.npy", np.zeros((2, 8), np.float32))
  wd = runs["a"][0]
  before = sorted(p.name for p in wd.iterdir())
  code, _, err = runs["programs"].run(_server_argv(wd, tmp_path, *(e.format(root=tmp_path) for e in extra)),
                                      tmp_path)
  assert code == 2 and err.count("\n") == 1 and match in err, err
  assert sorted(p.name for p in wd.iterdir()) == before


@pytest.mark.slow
def test_server_flags_without_server_are_refused(runs, tmp_path):
  code, _, err = runs["programs"].run(["evaluate.py", f"--workdir={runs['a'][0]}", "--att_dir=x"], tmp_path)
  assert code == 2 and "--att_dir=x without --server" in err


@pytest.mark.parametrize("content,match", [
    ([{"image_id": "1", "caption": "a"}], "is not an integer"),
    ([{"image_id": 1, "caption": "a"}, {"image_id": 1, "caption": "b"}], "appears twice"),
    ([{"image_id": 1, "caption": "a", "score": 1}], "exactly 'image_id' and 'caption'"),
    ({"image_id": 1}, "non-empty JSON array"),
])
def test_check_results_holds_the_servers_format(tmp_path, content, match):
  path = tmp_path / "captions_val2014_x_results.json"
  path.write_text(json.dumps(content))
  with pytest.raises(ValueError, match=match):
    server.check_results(str(path))
  with pytest.raises(ValueError, match="expected the name"):
    server.check_results(str(tmp_path / "results.json"))


@pytest.mark.slow
def test_the_apis_train_writes_a_signed_scores_file(tmp_path):
  import jaxcap
  jaxcap.train("configs/transformer.py:synthetic,tiny", str(tmp_path / "run"), num_train_steps=2,
               eval_every_steps=2, checkpoint_every_steps=2, test_after_training=True)
  sig = _sig(tmp_path / "run" / "scores_test.json")
  assert sig["checkpoint"]["step"] == 2 and sig["features"]["source"] == "synthetic_scenes"
  assert sig["decode"]["method"] == "greedy" and sig["split"]["name"] == "test"


@pytest.mark.slow
def test_evaluate_without_a_tag_keeps_trainings_scores_and_names_its_own(runs):
  wd = runs["a"][0]
  before = {n: (wd / n).read_bytes() for n in ("scores_test.json", "predictions_test.json")}
  code, out, err = runs["programs"].run(["evaluate.py", f"--workdir={wd}", "--beam-size=4"], runs["tmp"])
  assert code == 0, err
  assert {n: (wd / n).read_bytes() for n in before} == before  # training's results kept
  assert _sig(wd / "scores_test_beam4.json")["decode"]["beam_size"] == 4
  assert f"wrote {wd / 'scores_test_beam4.json'} and predictions_test_beam4.json" in out
