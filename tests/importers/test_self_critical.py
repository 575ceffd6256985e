"""self-critical.pytorch checkpoints imported: outputs equal to its own code's.

The fixture (tests/importers/fixtures/self_critical/<model>/) was written once by
scripts/self_critical/make_import_fixture.py, which runs self-critical.pytorch's own models (its
code at commit 4c48a33) on random weights: their state_dict as model.safetensors, their infos
pickle, and their teacher-forced log-probabilities, greedy and beam-3 sequences. torch is not
needed here.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

import jaxcap
from jaxcap import decoding
from jaxcap.data.vocab import EOS, PAD, UNK
from jaxcap.importers import self_critical as sc
from tests.tiers import one_in_default

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "self_critical")
MODELS = ("transformer", "newfc", "newfc_resnet101", "aoa", "aoa_ff", "updown", "transformer_d16")
BATCHES = (0, 1)  # the fixture's two batches of 24 test images, each padded by its loader


def files(name):
  d = os.path.join(FIXTURES, name)
  return os.path.join(d, "model.safetensors"), os.path.join(d, f"infos_{name}.pkl"), np.load(os.path.join(d, "expected.npz"))


@pytest.fixture(scope="module", params=MODELS)
def imported(request, tmp_path_factory):
  name = request.param
  ckpt, infos, expected = files(name)
  workdir = str(tmp_path_factory.mktemp(name) / "run")
  run = sc.import_checkpoint(ckpt, infos, workdir)
  _, _, sc_of, _ = sc.convert(sc.read_state_dict(ckpt), sc.read_infos(infos))
  return name, run, expected, sc_of, workdir


def batch_of(run, e, b):
  """A jaxcap batch of self-critical's loader batch ``b``: its padded regions and masks; its
  fc features where it gives the model any (a Transformer gets none: zeros stand in, unread)."""
  att, fc = e[f"att_feats_{b}"], e[f"fc_feats_{b}"]
  if att.shape[1] == 0:  # an FC model: its loader gives no regions
    att = np.zeros((fc.shape[0], 1, int(run.info["feature_dim"])), np.float32)
  masks = e[f"att_masks_{b}"] if e[f"att_masks_{b}"].shape[1] else np.ones(att.shape[:2], np.float32)
  if fc.shape[1] == 0:
    fc = np.zeros((att.shape[0], int(run.info["global_dim"])), np.float32)
  return {"feats": jnp.asarray(att), "feats_mask": jnp.asarray(masks > 0), "global_feat": jnp.asarray(fc),
          "boxes": jnp.zeros(att.shape[:2] + (4,), jnp.float32)}


def to_sc(tokens_BxT, sc_of):
  """jaxcap tokens -> self-critical's ids (EOS and PAD -> 0)."""
  t = np.asarray(tokens_BxT)
  out = sc_of[t]
  out[(t == EOS) | (t == PAD)] = 0
  return out


def to_jaxcap(ids, sc_of):
  """self-critical's word ids -> jaxcap's (its 0 -> PAD)."""
  jax_of_sc = {int(s): j for j, s in enumerate(sc_of) if j > 1 and s >= 0}
  return np.vectorize(lambda i: jax_of_sc.get(int(i), PAD))(ids)


def _columns(sc_of):
  cols = np.where(sc_of >= 0)[0]
  return cols[cols > 1]  # EOS, UNK, words


@pytest.mark.parametrize("b", one_in_default(BATCHES))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_teacher_forced_logprobs_equal(imported, b):
  name, run, e, sc_of, _ = imported
  labels = e[f"labels_{b}"]  # [B*S, 18]: 0, w1..wn, 0 ...; captions of up to seq_length = 16 words
  assert labels.shape[1] == 18 and (labels[:, 16] > 0).any()  # full-length captions are there
  tokens = to_jaxcap(labels, sc_of)
  tokens[:, 0] = 1  # self-critical's leading 0 is BOS
  batch = batch_of(run, e, b)
  s = labels.shape[0] // batch["feats"].shape[0]
  logits, _ = run.model.apply(run.params, batch, jnp.asarray(tokens.reshape(-1, s, labels.shape[1])))
  logp = np.asarray(jax.nn.log_softmax(logits.reshape(labels.shape[0], labels.shape[1], -1)))
  want = e[f"logprobs_{b}"]  # [B*S, 18, V+1]
  # Positions up to the caption's end (self-critical stops at the first all-zero column and
  # masks keys at 0 after BOS; the positions after the end are not scored by either).
  length = (labels[:, 1:] > 0).sum(1) + 1
  cols = _columns(sc_of)
  for r in range(labels.shape[0]):
    np.testing.assert_allclose(logp[r, :length[r]][:, cols], want[r, :length[r]][:, sc_of[cols]],
                               rtol=1e-5, atol=1e-5, err_msg=f"{name} batch {b} row {r}")
  # PAD and BOS have no probability: the other ids are normalised exactly as self-critical's.
  assert np.exp(logp[..., [PAD, 1]]).max() == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("b", BATCHES)
def test_step_logprobs_equal_to_max_length(imported, b):
  """Its step function fed BOS and 20 words: every position up to max_length = 20, past the
  training captions' 18 (the Transformer's positions 18 and 19 read their own sinusoid)."""
  name, run, e, sc_of, _ = imported
  batch = batch_of(run, e, b)
  forced = to_jaxcap(e[f"forced_{b}"], sc_of)  # [B, 20]
  want = e[f"steplogprobs_{b}"]  # [B, 20, V+1]
  assert want.shape[1] == run.config.decode.max_len == 20
  model, params = run.model, run.params
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, want.shape[1], method="init_cache")
  step = jax.jit(lambda enc, cache, tok, t: model.apply(params, enc, cache, tok, t, method="decode_step"))
  tok = jnp.full((forced.shape[0],), 1, jnp.int32)
  cols = _columns(sc_of)
  for t in range(want.shape[1]):
    logits, cache, _ = step(enc, cache, tok, jnp.int32(t))
    logp = np.asarray(jax.nn.log_softmax(logits))
    np.testing.assert_allclose(logp[:, cols], want[:, t, sc_of[cols]], rtol=1e-5, atol=1e-5,
                               err_msg=f"{name} batch {b} position {t}")
    tok = jnp.asarray(forced[:, t], jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize("b", BATCHES)
def test_default_decoding_is_its_greedy(imported, b):
  """The imported run's default decoding (its config.decode) is self-critical's eval.py greedy:
  its _sample, which never reads suppress_UNK."""
  name, run, e, sc_of, _ = imported
  assert run.config.decode.method == "greedy"
  out = decoding.decode(run.model, run.params, batch_of(run, e, b), run.config.decode)
  got = to_sc(out.tokens, sc_of)
  np.testing.assert_array_equal(got, e[f"greedy_{b}"], err_msg=name)


def test_greedy_reaches_unk_and_max_length():
  """The fixture exercises what the decoding tests claim: greedy captions with UNK in them, and
  captions that run to max_length = 20."""
  for name in MODELS:
    e = files(name)[2]
    greedy = np.concatenate([e[f"greedy_{b}"] for b in BATCHES])
    assert greedy.shape == (48, 20)
    assert (greedy[:, -1] > 0).any(), name
  unk = {name: int((np.concatenate([files(name)[2][f"greedy_{b}"] for b in BATCHES]) == 15).sum())
         for name in MODELS}  # 15: its UNK
  assert sum(v > 0 for v in unk.values()) >= 3, unk


@pytest.mark.slow
@pytest.mark.parametrize("b", BATCHES)
def test_beam3_is_its_beam_search(imported, b):
  """``--beam-size 3`` on the imported run: self-critical's beam_search with UNK suppressed."""
  name, run, e, sc_of, _ = imported
  cfg = run.decode_config(method="beam", beam_size=3)
  out = decoding.decode(run.model, run.params, batch_of(run, e, b), cfg)
  np.testing.assert_array_equal(to_sc(out.tokens[:, 0], sc_of), e[f"beam3_{b}"], err_msg=name)


@pytest.mark.slow
def test_imported_run_loads_captions_and_ablates(imported):
  """Features as a user has them: FC models their global features, UpDown regions and global
  features, the Transformer and AoA their regions alone (the Transformer's fc_feat_size, 2048,
  is not its regions' 10: it never reads fc features)."""
  name, run, e, sc_of, workdir = imported
  again = jaxcap.load(workdir)
  assert again.step == 1234
  masks = e["att_masks_0"] > 0
  if name.startswith("newfc"):
    feats = e["fc_feats_0"]
  elif e["fc_feats_0"].shape[1] == 0:  # its loader gives it none: the Transformer, AoA
    if name == "transformer":
      assert again.info["global_dim"] != again.info["feature_dim"]
    feats = {"feats": e["att_feats_0"], "feats_mask": masks}
  else:
    feats = {"feats": e["att_feats_0"], "feats_mask": masks, "global_feat": e["fc_feats_0"]}
  caps = again.caption(feats, method="greedy")
  vocab = sc.read_infos(files(name)[1])["vocab"]
  want = [" ".join(vocab[str(int(i))] for i in row if i > 0) for row in e["greedy_0"]]
  assert [c.replace("<unk>", "UNK") for c in caps] == want
  field = "dropout"
  ablated = again.ablate(**{field: 0.0})
  assert ablated.caption(feats, method="greedy", max_len=4)


def test_every_tensor_is_mapped(tmp_path):
  ckpt, infos, _ = files("transformer")
  state = sc.read_state_dict(ckpt)
  state["model.decoder.layers.0.extra.weight"] = np.zeros((2, 2), np.float32)
  with pytest.raises(ValueError, match="extra.weight"):
    sc.convert(state, sc.read_infos(infos), ckpt)
  state = sc.read_state_dict(ckpt)
  del state["model.decoder.layers.1.src_attn.linears.2.bias"]
  with pytest.raises(ValueError, match="src_attn.linears.2.bias"):
    sc.convert(state, sc.read_infos(infos), ckpt)


def test_a_tensor_of_another_shape_is_named_as_the_file_names_it(tmp_path):
  """Issue 70: the refusal names the file's tensor (and the jaxcap parameter it became)."""
  ckpt, infos, _ = files("transformer")
  state = sc.read_state_dict(ckpt)
  state["model.decoder.layers.0.feed_forward.w_1.bias"] = np.zeros((23,), np.float32)
  path = tmp_path / "model.safetensors"
  safetensors_numpy.save_file(state, str(path))
  with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'model\.decoder\.layers\.0\.feed_forward"
                                       r"\.w_1\.bias' \[23\] does not fit .*expected \[24\]") as e:
    sc.import_checkpoint(str(path), infos, str(tmp_path / "run"))
  assert "\n" not in str(e.value)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option,value,match", [
    ("use_bn", 1, "opt.use_bn=1"), ("logit_layers", 2, "opt.logit_layers=2"),
    ("caption_model", "att2in2", "opt.caption_model='att2in2'.*maxout")])
def test_unsupported_options_refused(tmp_path, option, value, match):
  ckpt, infos, _ = files("transformer")
  info = sc.read_infos(infos)
  setattr(info["opt"], option, value)
  path = tmp_path / "infos.pkl"
  path.write_bytes(pickle.dumps(info))
  with pytest.raises(ValueError, match=match):
    sc.import_checkpoint(ckpt, str(path), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


class Evil:
  def __reduce__(self):
    return (os.system, ("echo pwned",))


def test_infos_unpickler_refuses_code(tmp_path):
  path = tmp_path / "infos.pkl"
  path.write_bytes(pickle.dumps({"opt": Evil(), "vocab": {"1": "a"}}))
  with pytest.raises(ValueError, match=r"refused to construct (posix|os)\.system"):
    sc.read_infos(str(path))


def test_pth_without_torch_names_the_conversion(tmp_path, monkeypatch):
  import builtins
  real = builtins.__import__

  def no_torch(name, *a, **k):
    if name == "torch":
      raise ImportError("no torch")
    return real(name, *a, **k)

  monkeypatch.setattr(builtins, "__import__", no_torch)
  path = tmp_path / "model.pth"
  path.write_bytes(b"PK")
  with pytest.raises(ValueError, match="needs torch.*safetensors"):
    sc.read_state_dict(str(path))


def test_existing_workdir_refused(tmp_path):
  ckpt, infos, _ = files("newfc")
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "x").write_text("keep")
  with pytest.raises(ValueError, match="--workdir=.*not empty"):
    sc.import_checkpoint(ckpt, infos, str(tmp_path / "run"))
  assert (tmp_path / "run" / "x").read_text() == "keep"


@pytest.mark.slow
def test_imported_run_evaluates_on_its_data(tmp_path):
  """jaxcap-import, then evaluate.py on COCO-layout data of the model's widths: the documented
  commands, on generated features of the fixture Transformer's widths (10 both)."""
  from tests.data import fakes
  from tests.programs import Programs
  ckpt, infos, _ = files("transformer")
  data = tmp_path / "coco"
  fakes.write_karpathy(str(data), counts=(3, 2, 4), dim=10, fc_dim=10)
  for d in ("att", "fc", "box"):
    os.rename(data / d, data / f"cocobu_{d}")
  with Programs() as programs:
    code, out, err = programs.run(["-m", "jaxcap.commands.import_checkpoint", f"--checkpoint={ckpt}",
                                   f"--infos={infos}", "--workdir=runs/sc", f"--data_root={data}"], tmp_path)
    assert code == 0, err
    assert out.startswith("imported transformer (") and "step 1234" in out
    # Its printed next step runs as printed.
    printed = [line.split("evaluate: ", 1)[1] for line in out.splitlines() if "evaluate: " in line]
    assert printed == ["python evaluate.py --workdir runs/sc --split test"], out
    code, out, err = programs.run(printed[0].split()[1:] + ["--beam-size=3"], tmp_path)
  assert code == 0, err[-2000:]
  assert "Traceback" not in err
  written = sorted((tmp_path / "runs/sc").glob("scores_test*.json"))
  assert len(written) == 1, written
  scores = json.loads(written[0].read_text())
  assert len(scores["per_image"]) == 4 and scores["overall"]["CIDEr"] >= 0


@pytest.mark.parametrize("args,match", [
    (["--checkpoint={ckpt}", "--infos=/nonexistent/infos.pkl", "--workdir=runs/x"], "/nonexistent/infos.pkl: cannot read"),
    (["--checkpoint=/nonexistent/model.pth", "--infos={infos}", "--workdir=runs/x"], "/nonexistent/model.pth: no such file"),
    (["--checkpoint={ckpt}", "--infos={ckpt}", "--workdir=runs/x"], "not a self-critical.pytorch infos pickle"),
    (["--checkpoint={infos}", "--infos={infos}", "--workdir=runs/x"], "needs torch|not a torch state_dict"),
    (["--checkpoint={ckpt}", "--infos={infos}", "--workdir=runs/x", "--dataset=flickr"], "--dataset"),
    (["--checkpoint={ckpt}", "--infos={infos}", "--workdir=runs/x", "--features=/nonexistent/features.json"],
     "/nonexistent/features.json"),
])
@pytest.mark.slow
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, match):
  import re
  from tests.programs import Programs
  ckpt, infos, _ = files("newfc")
  argv = [a.format(ckpt=ckpt, infos=infos) for a in args]
  with Programs() as programs:
    code, out, err = programs.run(["-m", "jaxcap.commands.import_checkpoint", *argv], tmp_path)
  assert code == 2, (out, err)
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(match, lines[0]), err
  assert not (tmp_path / "runs").exists()


def test_the_package_exposes_the_importer():
  assert jaxcap.import_checkpoint is sc.import_checkpoint
  assert "import_checkpoint" in dir(jaxcap)


@pytest.mark.slow
def test_an_imported_run_is_served_like_a_trained_one(imported):
  """jaxcap-serve's app on an imported run: a caption of posted features equals the run's own."""
  import asyncio
  import io
  from aiohttp.test_utils import TestClient, TestServer
  from jaxcap.serving import server
  name, run, e, sc_of, workdir = imported
  if name.startswith("newfc"):
    pytest.skip("the FC models read global features only; the server posts region arrays")
  if name == "updown":
    pytest.skip("its fixture's global features (12 wide) are not its regions' mean (10 wide); "
                "the server posts region arrays")
  n = int(e["att_masks_0"][1].sum())
  x = e["att_feats_0"][1, :n]  # one image's real regions
  buf = io.BytesIO()
  np.save(buf, x.astype(np.float32))

  async def main():
    app = server.make_app(server.RunBackend(jaxcap.load(workdir), max_batch=4))
    async with TestClient(TestServer(app)) as client:
      meta = await (await client.get("/metadata")).json()
      r = await client.post("/caption?method=greedy", data=buf.getvalue(),
                            headers={"Content-Type": "application/x-npy"})
      return meta, r.status, await r.json()

  meta, status, body = asyncio.run(main())
  assert status == 200, body
  assert meta["model"] == name.split("_")[0] and meta["run"]["step"] == 1234
  want = run.caption({"feats": x[None], "feats_mask": np.ones((1, n), bool)}, method="greedy")
  assert body["captions"][0]["caption"] == want[0]


@pytest.mark.slow
@pytest.mark.parametrize("pth", ["model.pth", "model_legacy.pth", "model_dataparallel.pth"])
def test_pth_files_as_torch_saves_them(pth):
  """The ``.pth`` files its training writes (``torch.save(model.state_dict())``, torch's zip
  format), older torch's legacy format, and a DataParallel wrapper's state_dict (``module.``
  names) read with torch into the same tensors as the safetensors conversion."""
  pytest.importorskip("torch")
  ckpt, infos, _ = files("transformer")
  want = sc.read_state_dict(ckpt)
  got = sc.read_state_dict(os.path.join(FIXTURES, "transformer", pth))
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_every_pth_imports_with_torch(tmp_path, name):
  """``jaxcap-import`` of each model's ``model.pth`` as its save_checkpoint wrote it gives the
  parameters of its safetensors conversion."""
  pytest.importorskip("torch")
  ckpt, infos, _ = files(name)
  run = sc.import_checkpoint(os.path.join(FIXTURES, name, "model.pth"), infos, str(tmp_path / "run"))
  fields, _, sc_of, params = sc.convert(sc.read_state_dict(ckpt), sc.read_infos(infos))
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, run.params["params"]), params)


def test_infos_as_its_pickle_dump_writes_them():
  """The committed infos pickles are protocol 2 (its misc.pickle_dump) and hold what its
  tools/train.py saves, the numpy float64 of pycocoevalcap's CIDEr among them."""
  import pickletools
  for name in MODELS:
    path = files(name)[1]
    data = open(path, "rb").read()
    assert data[:2] == b"\x80\x02", name
    globals_ = {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
    assert "_codecs encode" in globals_, globals_
    infos = sc.read_infos(path)
    assert isinstance(infos["best_val_score"], np.float64)
    assert sorted(infos) == ["best_val_score", "epoch", "iter", "loader_state_dict", "opt", "vocab"]
    assert infos["opt"].seq_length == 16 and infos["opt"].max_length == 20


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_printed_next_steps_run_as_printed(tmp_path):
  """Without the run's data, no evaluate.py command that would fail (it says what is missing);
  a random-weights features record asks for no --weights."""
  from tests.programs import Programs
  ckpt, infos, _ = files("newfc_resnet101")
  record = {"backbone": "resnet101_self_critical", "size": 224, "att_size": 7, "dtype": "float32",
            "weights": {"random": True, "seed": 0}}
  (tmp_path / "feats").mkdir()
  (tmp_path / "feats" / "features.json").write_text(json.dumps(record))
  with Programs() as programs:
    code, out, err = programs.run(["-m", "jaxcap.commands.import_checkpoint", f"--checkpoint={ckpt}",
                                   f"--infos={infos}", "--workdir=runs/a"], tmp_path)
    assert code == 0, err
    assert "python evaluate.py --workdir runs/a --split test" not in out.replace("then python", "")
    assert "evaluate: no coco data at" in out and "--data_root" in out
    code, out, err = programs.run(["-m", "jaxcap.commands.import_checkpoint", f"--checkpoint={ckpt}",
                                   f"--infos={infos}", "--workdir=runs/b", "--features=feats/features.json"],
                                  tmp_path)
  assert code == 0, err
  photos = [line for line in out.splitlines() if "photos:" in line]
  assert len(photos) == 1 and "--weights" not in photos[0], out
