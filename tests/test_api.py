"""The Python API (jaxcap.load / Run.caption / Run.evaluate / jaxcap.score / get_config).

A tiny Transformer workdir is written as train.py writes it (config.json, vocab.json, info.json,
orbax ``best/`` and ``checkpoints/``) from freshly initialised parameters, so no training step
is compiled here; tests/test_package.py loads a trained run from an installed package.

Mutants tried (each made a test fail, then restored): ``batch.from_features`` not padding ragged region
lists with a False mask (padding regions count as real: tokens differ); ``load`` restoring
the latest instead of the best checkpoint; ``init_workdir`` not writing ``info.json``.
"""

import json
import os
import shutil

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jaxcap
from jaxcap import api, config_files, decoding, run_dir
from jaxcap import data as data_lib
from jaxcap.data import batch as batch_lib
from jaxcap.data import pipeline
from jaxcap.training import checkpoint as ckpt_lib
from jaxcap.training import train_lib


def _tiny_config():
  return jaxcap.get_config("transformer.py:synthetic,tiny", num_train_steps=8, test_after_training=False,
                           **{"decode.max_len": 8, "eval_num_images": -1})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A workdir with best/ at step 2 (the initial parameters) and checkpoints/ at step 3 (+1)."""
  wd = str(tmp_path_factory.mktemp("run"))
  config = _tiny_config()
  trainer = train_lib.Trainer(config, wd)
  run_dir.init_workdir(wd, config, trainer.dataset.vocab, trainer.info)
  state = trainer.initial_state()
  ckpts = ckpt_lib.Checkpoints(wd)
  ckpts.save_best_if_improved(2, state.replace(step=jnp.int32(2)), {"epoch": 0}, {"CIDEr": 0.5})
  later = state.replace(step=jnp.int32(3), params=jax.tree.map(lambda x: x + 1, state.params))
  ckpts.save_latest(3, later, {"epoch": 0})
  ckpts.close()
  return wd, trainer.dataset, jax.device_get(state.params)


def _test_batch(dataset, n=5):
  return next(iter(pipeline.eval_batches(dataset.split("test"), n, num_threads=0)))


@pytest.mark.slow
def test_info_json_is_the_dataset_info(workdir):
  wd, dataset, _ = workdir
  with open(os.path.join(wd, "info.json")) as f:
    assert json.load(f) == json.loads(json.dumps(dict(dataset.info)))


@pytest.mark.slow
def test_load_needs_no_dataset_and_captions_every_feature_form(workdir, monkeypatch):
  wd, dataset, params = workdir
  batch = _test_batch(dataset)

  def no_dataset(*_):
    raise AssertionError("jaxcap.load read the dataset")

  monkeypatch.setattr(data_lib, "get_dataset", no_dataset)
  run = jaxcap.load(wd)
  assert run.step == 2 and run.info == json.loads(json.dumps(dict(dataset.info)))
  for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The reference: the shared greedy decoder on the dataset's own batch.
  ref = decoding.greedy(run.model, run.params, jax.tree.map(jnp.asarray, batch), max_len=8)
  ref_caps = [run.vocab.decode(r) for r in np.asarray(ref.tokens)]
  assert run.caption(batch, "greedy") == ref_caps
  np.testing.assert_array_equal(run.decode(batch, "greedy").tokens, ref.tokens)
  ragged = [batch["feats"][i, batch["feats_mask"][i]] for i in range(5)]  # [N_i, F] each
  assert len({len(r) for r in ragged}) > 1
  out = run.decode(ragged, "greedy", batch_size=2)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.token_logprobs, ref.token_logprobs, rtol=1e-4, atol=1e-5)
  caps = run.caption({"feats": batch["feats"], "feats_mask": batch["feats_mask"]}, method="beam", beam_size=2)
  assert len(caps) == 5 and all(isinstance(c, str) for c in caps)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_load_step_and_old_workdirs(workdir, tmp_path, monkeypatch):
  wd, dataset, params = workdir
  run = jaxcap.load(wd, step=3)
  assert run.step == 3
  first = jax.tree.leaves(params)[0]
  np.testing.assert_allclose(np.asarray(jax.tree.leaves(run.params)[0]), np.asarray(first) + 1)
  with pytest.raises(ValueError, match="no checkpoint at step 7"):
    jaxcap.load(wd, step=7)
  with pytest.raises(ValueError, match="config.json: not found"):
    jaxcap.load(str(tmp_path))
  # A workdir from before info.json: info comes from its dataset, or a one-line error.
  old = tmp_path / "old"
  os.symlink(wd, old)
  os.remove(os.path.join(wd, "info.json"))
  try:
    assert jaxcap.load(str(old)).info == dict(dataset.info)

    def unreadable(_):
      raise FileNotFoundError("/data/coco/dataset_coco.json")

    monkeypatch.setattr(data_lib, "get_dataset", unreadable)
    with pytest.raises(ValueError, match=r"info.json: not found .* could not be read") as e:
      jaxcap.load(str(old))
    assert "\n" not in str(e.value)
  finally:
    run_dir.save_info(wd, dict(dataset.info))


def test_batch_from_features_defaults_and_errors():
  info = {"feature_dim": 4, "global_dim": 4, "max_regions": 3}
  x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  b = batch_lib.from_features(x, info)
  assert b["feats_mask"].all() and b["valid"].all()
  np.testing.assert_allclose(b["global_feat"], x.mean(1))
  b = batch_lib.from_features({"feats": x, "feats_mask": np.array([[1, 1, 0], [1, 0, 0]], bool)}, info)
  np.testing.assert_allclose(b["global_feat"], [x[0, :2].mean(0), x[1, 0]])
  with pytest.raises(ValueError, match="reads region features 'feats'"):
    batch_lib.from_features(x[:, 0], info)  # global features for a model with regions
  g = batch_lib.from_features(x[:, 0], dict(info, max_regions=1))
  np.testing.assert_array_equal(g["feats"], x[:, :1])
  with pytest.raises(ValueError, match=r"expected region features \[B, N, 4\]"):
    batch_lib.from_features(np.zeros((2, 3, 5), np.float32), info)
  with pytest.raises(ValueError, match=r"expected features \[B, Dg\]"):
    batch_lib.from_features(np.zeros((2,), np.float32), info)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_evaluate_scores_the_split(workdir):
  wd, dataset, _ = workdir
  run = jaxcap.load(wd)
  run._dataset = dataset  # the same data, already built
  scores = run.evaluate("test", metrics=("Bleu", "CIDEr"), num_images=10, method="greedy")
  preds = scores["predictions"]
  assert list(preds) == dataset.image_ids("test")[:10]
  refs = dataset.references("test")
  again = jaxcap.score({k: refs[k] for k in preds}, [{"image_id": k, "caption": v} for k, v in preds.items()],
                       metrics=("Bleu", "CIDEr"))
  assert scores["overall"] == again["overall"]
  batch = _test_batch(dataset, 10)
  assert list(preds.values()) == run.caption(batch, "greedy")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_every_entry_point_decodes_with_the_runs_config_decode(workdir, monkeypatch):
  """Run.caption / Run.decode / Run.caption_images (through caption) decode as Run.predict,
  evaluate.py, jaxcap-serve and an exported captioner do: the run's config.decode (greedy
  here), not a beam search of their own, unless told otherwise."""
  from jaxcap import inference
  wd, dataset, _ = workdir
  run = jaxcap.load(wd, dataset=dataset)
  assert run.config.decode.method == "greedy"
  batch = _test_batch(dataset, 10)
  configs = []
  real = inference.decode_features

  def spy(model, params, vocab, batch, cfg, **kw):
    configs.append(dict(cfg))
    return real(model, params, vocab, batch, cfg, **kw)

  monkeypatch.setattr(inference, "decode_features", spy)
  preds = run.predict("test", num_images=10)  # what evaluate.py and Run.evaluate decode
  assert run.caption(batch) == list(preds.values())
  tokens = run.decode(batch).tokens
  assert tokens.ndim == 2  # greedy's [B, T], not beams' [B, K, T]
  assert [run.vocab.decode(r) for r in tokens] == list(preds.values())
  assert configs == [run.decode_config()] * 2
  # Told otherwise: the option given replaces the run's, the rest stay the run's.
  beams = run.decode(batch, "beam", 2)
  assert beams.tokens.shape[:2] == (10, 2) and configs[-1] == run.decode_config("beam", 2)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_decoding_options_are_checked_at_every_entry_point(workdir):
  """A beam wider than the vocabulary (empty captions, silently) and bad option values are
  refused in one line naming the argument, by caption / decode and the export alike."""
  wd, dataset, _ = workdir
  run = jaxcap.load(wd, dataset=dataset)
  batch = _test_batch(dataset, 2)
  words = len(run.vocab)
  with pytest.raises(ValueError, match=rf"^decoding option beam_size: {words + 1} is wider than the "
                                       rf"vocabulary of .* \({words} words\); expected at most {words}$"):
    run.caption(batch, "beam", words + 1)
  with pytest.raises(ValueError, match=r"^decoding option temperature: expected"):
    run.decode(batch, "sample", temperature=-1.0)
  with pytest.raises(ValueError, match=r"^decoding option beam_size: "):
    run.decode_config("beam", words + 1)
  assert run.decode_config("beam", words)["beam_size"] == words
  # Valid option sets are checked once (Run keeps them); a refused one is refused every time.
  for _ in range(2):
    with pytest.raises(ValueError, match=r"^decoding option beam_size: "):
      run.decode_config("beam", words + 1)
  assert run.decode_config("beam", words)["beam_size"] == words


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_score_on_known_captions():
  refs = {1: ["a red cube left of a blue ball"], 2: ["two green cones"]}
  perfect = jaxcap.score(refs, {1: "a red cube left of a blue ball", 2: "two green cones"},
                         metrics=("Bleu", "CIDEr"))
  assert perfect["overall"]["Bleu_1"] == pytest.approx(1.0)
  worse = jaxcap.score(refs, {1: "a red ball", 2: "two green cones"}, metrics=("Bleu",))
  assert worse["overall"]["Bleu_1"] < 1.0 and set(worse["per_image"]) == {1, 2}
  # The M² authors' convention: a repeated word kept once before scoring.
  stutter = {1: "a red red cube left of a blue ball ball", 2: "two green cones"}
  assert jaxcap.score(refs, stutter, metrics=("Bleu",))["overall"]["Bleu_1"] < 1.0
  deduped = jaxcap.score(refs, stutter, metrics=("Bleu",), caption_postprocess="dedupe_repeats")
  assert deduped["overall"]["Bleu_1"] == pytest.approx(1.0)


def test_get_config_works_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  c = jaxcap.get_config("configs/eta.py:synthetic,variant=stacked_v", model__dim=32, **{"data.num_train": 50})
  assert (c.model.name, c.model.variant, c.model.dim, c.data.num_train) == ("eta", "stacked_v", 32, 50)
  assert jaxcap.get_config("aat:synthetic").model.name == "aat"
  with pytest.raises(ValueError, match="config field model.dimm: unknown"):
    jaxcap.get_config("transformer", model__dimm=3)
  with pytest.raises(ValueError, match="config file 'nonexistent.py': not found"):
    jaxcap.get_config("nonexistent.py")
  # A paper's config lives in its folder; configs/<file>.py finds it from anywhere.
  shipped = os.path.join(os.path.dirname(jaxcap.__file__), "papers", "eta", "configs", "eta.py")
  assert config_files.resolve("configs/eta.py:synthetic") == shipped + ":synthetic"
  assert config_files.resolve("configs/transformer.py") == os.path.join(config_files.configs_dir(), "transformer.py")
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "eta.py").write_text("")
  assert config_files.resolve("configs/eta.py:synthetic") == "configs/eta.py:synthetic"  # a local file wins


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_load_ensemble_of_a_run_with_itself_captions_as_the_run(workdir):
  """The API's ensemble (jaxcap.ensemble behind it): two copies of one run average to the run."""
  wd, dataset, _ = workdir
  batch = _test_batch(dataset)
  run = jaxcap.load(wd)
  ens = jaxcap.load_ensemble([wd, run])
  assert ens.caption(batch, "greedy") == run.caption(batch, "greedy")
  np.testing.assert_allclose(ens.decode(batch, "greedy").token_logprobs,
                             run.decode(batch, "greedy").token_logprobs, atol=1e-5)
  with pytest.raises(ValueError, match="ensemble"):
    ens.ablate(num_heads=2)


def test_load_ensemble_refuses_another_vocabulary(workdir):
  from jaxcap.data.vocab import Vocab
  wd, _, _ = workdir
  run = jaxcap.load(wd)
  other = api.Run(run.config, Vocab(run.vocab.itos[:-1]), run.info, run.model, run.params,
                  workdir="other")
  with pytest.raises(ValueError, match="another vocabulary"):
    jaxcap.load_ensemble([run, other])


def test_a_corrupt_info_json_is_one_line_naming_it(workdir, tmp_path):
  wd, _, _ = workdir
  copy = tmp_path / "run"
  shutil.copytree(wd, copy)
  (copy / "info.json").write_text('{"vocab_size": 12,')
  with pytest.raises(ValueError, match=rf"^{copy}/info.json: not valid JSON .*delete it to rebuild"):
    jaxcap.load(str(copy))
  (copy / "info.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match=rf"^{copy}/info.json: not the dataset sizes train.py writes"):
    jaxcap.load(str(copy))


@pytest.mark.slow
def test_global_features_alone_caption_a_model_that_reads_only_them():
  """TPGN reads the global feature only: ``[B, Dg]`` captions it on a dataset with regions, as
  the full batch does; a model that reads regions still refuses them, naming what it reads."""
  from tests.test_ablations import TPGN, _batch, _run
  run, batch = _run(TPGN), _batch()
  alone = run.caption(batch["global_feat"], method="greedy")
  full = run.caption({"feats": batch["feats"], "global_feat": batch["global_feat"]}, method="greedy")
  assert alone == full and len(alone) == 3
  transformer = _run({"name": "transformer", "dim": 16, "num_layers": 1, "num_dec_layers": 1,
                      "num_heads": 2, "ff_dim": 32})
  with pytest.raises(ValueError, match="reads region features 'feats'"):
    transformer.caption(batch["global_feat"], method="greedy")
