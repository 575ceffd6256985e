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

import jaxcap
from jaxcap import decoding
from jaxcap.data.vocab import EOS, PAD, UNK
from jaxcap.importers import self_critical as sc

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "self_critical")
MODELS = ("transformer", "newfc", "newfc_resnet101", "aoa", "aoa_ff")


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


def batch_of(run, e):
  return {"feats": jnp.asarray(e["att_feats"]), "feats_mask": jnp.asarray(e["att_masks"] > 0),
          "global_feat": jnp.asarray(e["fc_feats"]),
          "boxes": jnp.zeros(e["att_feats"].shape[:2] + (4,), jnp.float32)}


def to_sc(tokens_BxT, sc_of):
  """jaxcap tokens -> self-critical's ids (EOS and PAD -> 0)."""
  t = np.asarray(tokens_BxT)
  out = sc_of[t]
  out[(t == EOS) | (t == PAD)] = 0
  return out


def test_teacher_forced_logprobs_equal(imported):
  name, run, e, sc_of, _ = imported
  labels = e["labels"]  # [B*S, L]: 0, w1..wn, 0 ...
  jax_of_sc = {int(s): j for j, s in enumerate(sc_of) if j > 1 and s >= 0}
  jax_of_sc[0] = 1  # self-critical's leading 0 is BOS
  tokens = np.vectorize(lambda i: jax_of_sc.get(int(i), PAD))(labels)
  tokens[:, 0] = 1
  b = batch_of(run, e)
  s = labels.shape[0] // b["feats"].shape[0]
  logits, _ = run.model.apply(run.params, b, jnp.asarray(tokens.reshape(-1, s, labels.shape[1])))
  logp = np.asarray(jax.nn.log_softmax(logits.reshape(labels.shape[0], labels.shape[1], -1)))
  want = e["logprobs"]  # [B*S, L, V+1]
  # Positions up to the caption's end (self-critical stops at the first all-zero column and
  # masks keys at 0 after BOS; the positions after the end are not scored by either).
  length = (labels[:, 1:] > 0).sum(1) + 1
  cols = np.where(sc_of >= 0)[0]
  cols = cols[cols > 1]  # EOS, UNK, words
  for r in range(labels.shape[0]):
    for t in range(length[r]):
      np.testing.assert_allclose(logp[r, t, cols], want[r, t, sc_of[cols]], rtol=1e-5, atol=1e-5,
                                 err_msg=f"{name} row {r} position {t}")
      # PAD and BOS have no probability: the other ids are normalised exactly as self-critical's.
      assert np.exp(logp[r, t, [PAD, 1]]).max() == 0.0


def test_greedy_tokens_equal(imported):
  name, run, e, sc_of, _ = imported
  out = decoding.greedy(run.model, run.params, batch_of(run, e), max_len=e["greedy"].shape[1])
  np.testing.assert_array_equal(to_sc(out.tokens, sc_of), e["greedy"], err_msg=name)


def test_beam3_tokens_equal(imported):
  name, run, e, sc_of, _ = imported
  out = decoding.beam_search(run.model, run.params, batch_of(run, e), beam_size=3,
                             max_len=e["beam3"].shape[1], beam_mode="self_critical", suppress_unk=True)
  np.testing.assert_array_equal(to_sc(out.tokens[:, 0], sc_of), e["beam3"], err_msg=name)


def test_imported_run_loads_captions_and_ablates(imported):
  name, run, e, sc_of, workdir = imported
  again = jaxcap.load(workdir)
  assert again.step == 1234
  feats = (e["fc_feats"] if name.startswith("newfc") else
           {"feats": e["att_feats"], "feats_mask": e["att_masks"] > 0, "global_feat": e["fc_feats"]})
  caps = again.caption(feats, method="greedy", max_len=e["greedy"].shape[1], suppress_unk=False)
  vocab = sc.read_infos(files(name)[1])["vocab"]
  want = [" ".join(vocab[str(int(i))] for i in row if i > 0) for row in e["greedy"]]
  assert [c.replace("<unk>", "UNK") for c in caps] == want
  field = "dropout"
  ablated = again.ablate(**{field: 0.0})
  assert ablated.caption(feats, method="greedy", max_len=4, suppress_unk=False)


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


@pytest.mark.parametrize("option,value,match", [
    ("use_bn", 1, "opt.use_bn=1"), ("logit_layers", 2, "opt.logit_layers=2"),
    ("caption_model", "updown", "opt.caption_model='updown'")])
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
    code, out, err = programs.run(["evaluate.py", "--workdir=runs/sc", "--beam-size=3"], tmp_path)
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


def test_an_imported_run_is_served_like_a_trained_one(imported):
  """jaxcap-serve's app on an imported run: a caption of posted features equals the run's own."""
  import asyncio
  import io
  from aiohttp.test_utils import TestClient, TestServer
  from jaxcap.serving import server
  name, run, e, sc_of, workdir = imported
  if name.startswith("newfc"):
    pytest.skip("the FC models read global features only; the server posts region arrays")
  x = e["att_feats"][1, :3]  # one image's 3 real regions
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
  want = run.caption({"feats": x[None], "feats_mask": np.ones((1, 3), bool)}, method="greedy")
  assert body["captions"][0]["caption"] == want[0]
