"""``jaxcap-import --format m2`` against files their code wrote (tests/papers/m2/fixtures/import/,
make_import_fixture.py: their ``data.vocab.Vocab`` pickled as train.py does, their train.py's
``torch.save`` dict): the imported run, loaded with ``jaxcap.load``, captions as their
``model.test`` / ``model.beam_search`` (words through their ``itos``) and its teacher-forced
log-probabilities are theirs (ids renamed); bad input is one line, exit 2, nothing written.
Torch is not needed (the importer reads the .pth itself).
"""

import functools
import json
import os
import pickle
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcap
from jaxcap.papers.m2 import importer

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "import")
PTH = os.path.join(FIX, "meshed_memory_transformer.pth")
VOCAB = os.path.join(FIX, "vocab.pkl")


@functools.lru_cache(maxsize=None)
def _expected():
  with np.load(os.path.join(FIX, "expected.npz")) as f:
    arrays = dict(f)
  with open(os.path.join(FIX, "expected.json")) as f:
    return arrays, json.load(f)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  _, meta = _expected()
  workdir = str(tmp_path_factory.mktemp("m2import") / "run")
  importer.import_checkpoint(PTH, VOCAB, workdir, heads=meta["h"])
  return jaxcap.load(workdir)


def test_the_pickles_read_as_their_code_wrote_them():
  arrays, meta = _expected()
  assert importer.read_vocab(VOCAB) == meta["itos"]
  raw = importer.read_pth(PTH)
  # train.py's dict, key for key; the state_dict's tensors are NumPy arrays.
  assert set(raw) == {"torch_rng_state", "cuda_rng_state", "numpy_rng_state", "random_rng_state",
                      "epoch", "val_loss", "val_cider", "state_dict", "optimizer", "scheduler",
                      "patience", "best_cider", "use_rl"}
  assert raw["state_dict"]["decoder.word_emb.weight"].shape == (len(meta["itos"]), meta["d_model"])
  assert raw["numpy_rng_state"][0] == "MT19937"


def test_the_pre_1_6_format_reads_the_same():
  # Their torch 1.1.0 saved the sequential format; the fixture holds the same dict in both.
  legacy = importer.read_pth(os.path.join(FIX, "meshed_memory_transformer_legacy.pth"))
  zipped = importer.read_pth(PTH)
  assert set(legacy) == set(zipped)
  a, b = legacy["state_dict"], zipped["state_dict"]
  assert set(a) == set(b)
  for k in a:
    assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
  np.testing.assert_array_equal(legacy["optimizer"]["state"][0]["exp_avg"], zipped["optimizer"]["state"][0]["exp_avg"])


@pytest.mark.skipif(not os.environ.get("JAXCAP_M2_VOCAB_PKL"),
                    reason="JAXCAP_M2_VOCAB_PKL: their released vocab.pkl (in their repository)")
def test_their_released_vocab_reads():
  itos = importer.read_vocab(os.environ["JAXCAP_M2_VOCAB_PKL"])
  vocab, theirs_of = importer.vocabulary(itos)
  assert itos[:4] == list(importer.SPECIALS) and len(vocab) == len(itos)
  assert sorted(theirs_of.tolist()) == list(range(len(itos)))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_config_is_the_authors_reading(imported):
  _, meta = _expected()
  m, d = imported.config.model, imported.config.decode
  assert (m.pad_mask, m.positions, m.mesh_scale, m.meshed) == ("authors", "authors", "authors", "meshed")
  assert (m.dim, m.num_heads, m.ff_dim, m.memory_slots, m.max_positions) == (
      meta["d_model"], meta["h"], meta["d_ff"], meta["m"], meta["max_len"])
  assert (d.method, d.beam_size, d.max_len) == ("beam", 5, 20)
  # Their test.py scores each caption with its runs of one word kept once.
  assert imported.config.caption_postprocess == "dedupe_repeats"
  # jaxcap's ids: the specials first, then their words in their order.
  assert imported.vocab.itos[4:] == meta["itos"][4:]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_their_detections_file_sets_their_loaders_region_layout(tmp_path):
  import h5py
  path = tmp_path / "coco_detections.hdf5"
  with h5py.File(path, "w") as f:
    f.create_dataset("1_features", data=np.ones((3, 4), np.float32))
  workdir = str(tmp_path / "run")
  _, meta = _expected()
  run = importer.import_checkpoint(PTH, VOCAB, workdir, heads=meta["h"], detections_hdf5=str(path))
  d = run.config.data
  assert (d.detections_hdf5, d.att_dir, d.fc_dir, d.box_dir) == (str(path), "", "", "")
  assert (d.max_regions, d.truncate_regions) == (importer.MAX_DETECTIONS, True)
  assert run.info["max_regions"] == importer.MAX_DETECTIONS
  with pytest.raises(ValueError, match=r"^--detections_hdf5=.*nothing.hdf5: not a file"):
    importer.import_checkpoint(PTH, VOCAB, str(tmp_path / "run2"), heads=meta["h"],
                               detections_hdf5=str(tmp_path / "nothing.hdf5"))
  assert not os.path.exists(tmp_path / "run2")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_teacher_forced_logprobs_are_theirs(imported):
  arrays, meta = _expected()
  itos = meta["itos"]
  ours_of_theirs = np.array([imported.vocab.stoi[w] for w in itos])
  tokens = ours_of_theirs[arrays["tf_tokens"]]
  batch = {"feats": jnp.asarray(arrays["feats"]),
           "feats_mask": jnp.ones(arrays["feats"].shape[:2], bool)}
  enc = imported.model.apply(imported.params, batch, method="encode")
  logits, _ = imported.model.apply(imported.params, enc, jnp.asarray(tokens), method="decode_train")
  ours = np.asarray(jax.nn.log_softmax(logits))[..., ours_of_theirs]  # their id order
  # float32 log-probabilities of up to ~20 in magnitude: 1e-5 absolute + relative, as the other
  # import tests (an absolute 1e-5 alone failed at 1.0014e-5 on another CPU's instruction set).
  np.testing.assert_allclose(ours, arrays["tf_logprobs"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_beam_captions_are_their_test_py_captions(imported):
  arrays, meta = _expected()
  assert imported.caption(arrays["feats"]) == [" ".join(c) for c in meta["beam"]]


@pytest.mark.slow  # the beam captions' test is the quick loop's
def test_greedy_captions_are_their_model_test(imported):
  arrays, meta = _expected()
  assert imported.caption(arrays["feats"], "greedy") == [" ".join(c) for c in meta["greedy"]]


def _foreign_vocab(path):
  class Evil:
    def __reduce__(self):
      return (os.system, ("true",))
  with open(path, "wb") as f:
    pickle.dump(Evil(), f)


def _other_shape(path):
  from safetensors import numpy as safetensors_numpy
  state = importer.read_state_dict(PTH)
  state["decoder.layers.0.pwff.fc1.weight"] = np.zeros((7, state["decoder.word_emb.weight"].shape[1]), np.float32)
  safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, path)


def _truncated(path):
  with open(PTH, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])


# A program per case (~4 s each): the slow step; test_bad_inputs_in_process is the quick loop's.
@pytest.mark.slow
@pytest.mark.parametrize("case,args,match", [
    ("foreign", ["--checkpoint={pth}", "--vocab={bad}", "--heads=2"], r"bad\.pkl: not their vocab\.pkl \(refused to construct (posix|os|nt)\.system\)"),
    ("truncated", ["--checkpoint={bad}", "--vocab={vocab}", "--heads=2"], r"bad\.pth: not a PyTorch checkpoint"),
    ("shape", ["--checkpoint={bad}", "--vocab={vocab}", "--heads=2"], r"bad\.safetensors: .*(do not fit|fc1)"),
    ("heads", ["--checkpoint={pth}", "--vocab={vocab}", "--heads=3"], r"--heads 3"),
    ("no-vocab", ["--checkpoint={pth}", "--heads=2"], r"--vocab"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, case, args, match):
  from tests.programs import Programs
  bad = {"foreign": str(tmp_path / "bad.pkl"), "truncated": str(tmp_path / "bad.pth"),
         "shape": str(tmp_path / "bad.safetensors")}.get(case, "")
  {"foreign": _foreign_vocab, "truncated": _truncated, "shape": _other_shape}.get(case, lambda p: None)(bad)
  argv = ["--format=m2", "--workdir=runs/x"] + [a.format(pth=PTH, vocab=VOCAB, bad=bad) for a in args]
  with Programs() as programs:
    code, out, err = programs.run(["-m", "jaxcap.commands.import_checkpoint", *argv], tmp_path)
  assert code == 2, (out, err)
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(match, lines[0]), err
  assert not (tmp_path / "runs").exists()


def test_bad_inputs_in_process(tmp_path):
  """The same refusals without starting programs (quick): one line, nothing written."""
  bad_pkl, bad_pth, bad_st = (str(tmp_path / n) for n in ("bad.pkl", "bad.pth", "bad.safetensors"))
  _foreign_vocab(bad_pkl)
  _truncated(bad_pth)
  _other_shape(bad_st)
  work = str(tmp_path / "run")
  for ckpt, vocab, match in ((PTH, bad_pkl, "refused to construct"), (bad_pth, VOCAB, "not a PyTorch checkpoint"),
                             (bad_st, VOCAB, r"bad\.safetensors: tensor 'decoder\.layers\.0\.pwff\.fc1\.bias' \[32\] "
                                             r"does not fit jaxcap's m2: .*expected \[7\]")):
    with pytest.raises(ValueError, match=match) as e:
      importer.import_checkpoint(ckpt, vocab, work, heads=2)
    assert "\n" not in str(e.value)
    assert not os.path.exists(work)


def test_the_command_keeps_self_critical_the_default():
  from jaxcap.commands import import_checkpoint as cmd
  assert cmd.paper_importers()["m2"] == "jaxcap.papers.m2.importer"
  a = cmd.parser(cmd.paper_importers()).parse_args(["--checkpoint=m.pth", "--infos=i.pkl", "--workdir=w"])
  assert a.format == "self_critical"
