"""jaxcap-serve's endpoints (aiohttp's test client) on a tiny run, and the real program's life.

The run is written as train.py writes one, from freshly initialised parameters (no training
step compiled: tests/test_api.py's way), so its captions are noise, but every caption the
server returns is checked against :meth:`jaxcap.api.Run.decode` of the same features.
tests/test_serve_browser.py (slow) drives the page in Chromium and load-tests the server.

Mutants tried (each made a test fail, then restored): the batcher decoding each request alone
(max_wait ignored); the results of a batched call handed out in the wrong order; the region
padding dropping ``feats_mask`` (attention over padding regions); a bad .npy answered with a
500; SIGTERM leaving the program with exit 1.
"""

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("aiohttp")
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

import jax.numpy as jnp  # noqa: E402

import jaxcap  # noqa: E402
from jaxcap import run_dir  # noqa: E402
from jaxcap.serving import server  # noqa: E402
from jaxcap.training import checkpoint as ckpt_lib  # noqa: E402
from jaxcap.training import train_lib  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("run"))
  config = jaxcap.get_config("transformer.py:synthetic,tiny", num_train_steps=8, test_after_training=False,
                             **{"decode.max_len": 6})
  trainer = train_lib.Trainer(config, wd)
  run_dir.init_workdir(wd, config, trainer.dataset.vocab, trainer.info)
  state = trainer.initial_state()
  ckpts = ckpt_lib.Checkpoints(wd)
  ckpts.save_best_if_improved(2, state.replace(step=jnp.int32(2)), {"epoch": 0}, {"CIDEr": 0.5})
  ckpts.close()
  return wd, trainer.dataset


@pytest.fixture(scope="module")
def run(workdir):
  wd, dataset = workdir
  return jaxcap.load(wd, dataset=dataset)


def _serve(run, test, **kwargs):
  """Runs ``test(client, app)`` against the app of ``run`` (a fresh app and event loop)."""
  async def main():
    app = server.make_app(server.RunBackend(run, max_batch=kwargs.get("max_batch", 8)), **kwargs)
    async with TestClient(TestServer(app)) as client:
      return await test(client, app)
  return asyncio.run(main())


def _npy(x) -> bytes:
  buf = io.BytesIO()
  np.save(buf, x)
  return buf.getvalue()


def _features(run, n=4, seed=0):
  return np.random.default_rng(seed).standard_normal((n, run.info["feature_dim"])).astype(np.float32)


@pytest.mark.slow
def test_health_metadata_examples_and_a_caption(run):
  x = _features(run, 5)

  async def test(client, app):
    health = await (await client.get("/health")).json()
    meta = await (await client.get("/metadata")).json()
    r = await client.post("/caption?method=greedy", data=_npy(x), headers={"Content-Type": "application/x-npy"})
    body = await r.json()
    examples = (await (await client.get("/examples")).json())["examples"]
    png = await client.get("/examples/2.png")
    ex = await (await client.post("/caption?example=2&method=beam&beam_size=2")).json()
    page = await (await client.get("/")).text()
    js = await client.get("/static/app.js")
    return health, meta, r.status, body, examples, png.status, png.content_type, await png.read(), ex, page, js.status

  health, meta, status, body, examples, png_status, png_type, png, ex, page, js = _serve(run, test)
  assert health["status"] == "ok"
  assert meta["model"] == "transformer" and meta["vocab_size"] == len(run.vocab)
  assert meta["run"]["step"] == 2 and meta["input"]["feature_dim"] == run.info["feature_dim"]
  assert meta["input"]["examples"] and not meta["input"]["images"] and meta["decoding"]["max_len"] == 6
  # Why no image, with the runs that take one (what the page shows instead of its image drop).
  assert meta["input"]["no_images"] == server.NO_IMAGES_RUN and "configs/pixels.py:synthetic" in server.NO_IMAGES_RUN
  assert status == 200 and body["method"] == "greedy" and len(body["captions"]) == 1
  want = run.decode(x[None], "greedy", return_aux=True)
  cap = body["captions"][0]
  assert cap["caption"] == run.vocab.decode(want.tokens[0]) and cap["words"] == cap["caption"].split()
  # The tokens as the exported captioner gives them: the words' ids, then EOS when emitted.
  eos = [2] if 2 in want.tokens[0].tolist() else []
  assert cap["tokens"] == [run.vocab.stoi[w] for w in cap["words"]] + eos and cap["boxes"] is None
  if want.aux and "attention" in want.aux:  # [T][N] over the 5 real regions, rows summing to 1
    att = np.asarray(cap["attention"])
    assert att.shape == (len(cap["words"]), 5)
    np.testing.assert_allclose(att, want.aux["attention"][0, :len(cap["words"]), :5], atol=1e-4)
  assert len(examples) == len(run.dataset.split("test")) and examples[2]["image"] == "examples/2.png"
  assert png_status == 200 and png_type == "image/png" and png.startswith(b"\x89PNG")
  # The example's features and boxes are its dataset's.
  item = run.dataset.split("test")[2]
  assert ex["method"] == "beam" and ex["beam_size"] == 2 and len(ex["captions"][0]["alternatives"]) == 1
  np.testing.assert_allclose(ex["captions"][0]["boxes"], item["boxes"], atol=1e-5)
  beam = run.decode({"feats": item["feats"][None], "boxes": item["boxes"][None],
                     "global_feat": item["global_feat"][None]}, "beam", 2)
  assert ex["captions"][0]["caption"] == run.vocab.decode(beam.tokens[0, 0])
  assert "static/app.js" in page and js == 200


@pytest.mark.slow
def test_concurrent_requests_are_batched_into_fewer_decode_calls(run, monkeypatch):
  xs = [_features(run, 2 + i % 4, seed=i) for i in range(6)]
  shapes, decode = [], run.decode

  def recording(batch, *args, **kwargs):
    if isinstance(batch, dict):  # the server's calls (the checks below call it with arrays)
      shapes.append(batch["feats"].shape)
    return decode(batch, *args, **kwargs)

  monkeypatch.setattr(run, "decode", recording)

  async def test(client, app):
    async def one(x):
      r = await client.post("/caption", data=_npy(x), headers={"Content-Type": "application/octet-stream"})
      return r.status, await r.json()
    out = await asyncio.gather(*(one(x) for x in xs))
    return out, app[server.BATCHER].calls, app[server.BATCHER].images

  out, calls, images = _serve(run, test, max_batch=8, max_wait_ms=300)
  assert [s for s, _ in out] == [200] * 6 and images == 6
  assert calls < 6, f"6 concurrent requests took {calls} decode calls"
  # A call runs at its longest request's regions (at most 5 here), not at the run's max_regions.
  assert run.info["max_regions"] > 5 and shapes and all(s[1] <= 5 for s in shapes), shapes
  for x, (_, body) in zip(xs, out):  # each answer is its own image's (the order kept)
    assert body["captions"][0]["caption"] == run.caption(x[None], "greedy")[0]


def _one_line_error(status, text):
  body = json.loads(text)
  assert set(body) == {"error"} and body["error"] and "\n" not in body["error"], text
  assert 400 <= status < 500, (status, text)
  return body["error"]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bad_requests_are_one_line_4xx_and_the_server_keeps_serving(run):
  f = run.info["feature_dim"]
  bad = [  # (query, body, content type, status, words the error names)
      ("", b"\x89PNG not really", "image/png", 400, "configs/pixels.py:synthetic"),
      ("", _npy(np.zeros((3, f), np.float64)), "application/x-npy", 400, "float32"),
      ("", _npy(np.zeros((3, f + 1), np.float32)), "application/x-npy", 400, str(f)),
      ("", _npy(np.zeros((2, 3, 4, f), np.float32)), "application/x-npy", 400, "[N, "),
      ("", _npy(np.zeros((1, 11, f), np.float32)), "application/x-npy", 400, "max_regions"),
      ("", _npy(np.full((3, f), np.nan, np.float32)), "application/x-npy", 400, "NaN"),
      ("", b"\x93NUMPY garbage", "application/x-npy", 400, ".npy"),
      ("", b"not a numpy file", "application/octet-stream", 400, ".npy"),
      ("", _npy(np.zeros((3, f), np.float32)), "text/plain", 415, "content type"),
      ("", b"", "application/x-npy", 400, "empty body"),
      ("", b"x" * 50_000, "application/x-npy", 413, "limit"),
      ("?method=nucleus", _npy(_features(run)), "application/x-npy", 400, "method"),
      ("?method=beam&beam_size=0", _npy(_features(run)), "application/x-npy", 400, "beam_size"),
      ("?method=sample&samples=x", _npy(_features(run)), "application/x-npy", 400, "samples"),
      ("?example=999", b"", "application/x-npy", 404, "example='999'"),
      ("?example=-1", b"", "application/x-npy", 404, "example='-1'"),
      ("?example=abc", b"", "application/x-npy", 400, "example='abc': expected an integer index"),
  ]

  async def test(client, app):
    out = []
    for q, data, ctype, _, _ in bad:
      r = await client.post("/caption" + q, data=data, headers={"Content-Type": ctype})
      out.append((r.status, await r.text()))
    r = await client.get("/examples/x.png")
    out.append((r.status, await r.text()))
    r = await client.get("/nowhere")
    out.append((r.status, await r.text()))
    ok = await client.post("/caption?method=sample&samples=2&seed=3", data=_npy(_features(run)),
                           headers={"Content-Type": "application/x-npy"})
    return out, ok.status, await ok.json(), (await client.get("/health")).status

  out, ok, body, health = _serve(run, test, max_body=40_000)
  for (q, _, ctype, status, words), (got, text) in zip(bad, out):
    error = _one_line_error(got, text)
    assert got == status and words in error, (q, ctype, got, error)
  for got, text in out[len(bad):]:
    assert got == 404
    _one_line_error(got, text)
  assert ok == 200 and health == 200 and len(body["captions"][0]["alternatives"]) == 1


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_a_bug_is_a_500_with_its_traceback_in_the_log_and_not_the_client_s_fault(run, monkeypatch, capsys):
  # Before, every ValueError of the run's feature checks was answered as the client's 400: a
  # ValueError inside jaxcap (here in Run.batch) or an IndexError in the decode call is a 500
  # whose traceback goes to the server's log; bad input stays a 400.
  f = run.info["feature_dim"]

  def broken_batch(*a, **k):
    raise ValueError("operands could not be broadcast together")

  def broken_decode(self, settings, items):
    return [][1]

  async def test(client, app):
    out = []
    for fault in ("batch", "decode"):
      with monkeypatch.context() as m:
        if fault == "batch":
          m.setattr(run, "batch", broken_batch)
        else:
          m.setattr(server.RunBackend, "decode", broken_decode)
        r = await client.post("/caption", data=_npy(_features(run)), headers={"Content-Type": "application/x-npy"})
        out.append((r.status, await r.json()))
    r = await client.post("/caption", data=_npy(np.zeros((3, f + 1), np.float32)),
                          headers={"Content-Type": "application/x-npy"})
    out.append((r.status, await r.json()))
    return out

  (batch, batch_body), (decode, decode_body), (bad, _) = _serve(run, test)
  log = capsys.readouterr().err
  assert batch == 500 and decode == 500 and bad == 400, (batch, decode, bad)
  assert batch_body["error"].startswith("ValueError: operands could not be broadcast together -- an error in jaxcap")
  assert decode_body["error"].startswith("IndexError: list index out of range -- an error in jaxcap")
  assert "not in the request" in decode_body["error"] and "\n" not in decode_body["error"]
  assert log.count("Traceback (most recent call last)") == 2 and "broken_decode" in log, log[-3000:]


def test_a_non_image_is_refused_in_one_line():
  with pytest.raises(server.BadRequest, match="not a readable image"):
    server.decode_image(b"GIF89a not an image")
  buf = io.BytesIO()
  from PIL import Image
  Image.new("RGB", (4, 4)).save(buf, format="GIF")
  with pytest.raises(server.BadRequest, match="GIF format; expected PNG or JPEG") as e:
    server.decode_image(buf.getvalue())
  assert e.value.status == 415
  Image.new("RGB", (5, 3), (200, 10, 10)).save(buf := io.BytesIO(), format="PNG")
  assert server.decode_image(buf.getvalue()).shape == (3, 5, 3)


def test_sequence_results_cut_attention_to_the_words_and_real_regions():
  from jaxcap.data.vocab import Vocab
  vocab = Vocab(["a", "cube"])  # ids 4, 5
  tokens = np.array([[[4, 5, 2, 0], [5, 2, 0, 0]]])  # [B=1, K=2, T=4]
  att = np.arange(1 * 2 * 4 * 3, dtype=np.float32).reshape(1, 2, 4, 3)
  boxes = np.array([[[0, 0, .5, .5], [.5, .5, 1, 1], [0, 0, 0, 0]]], np.float32)
  (r,) = server.sequence_results(vocab, tokens, {"attention": att}, [2], boxes)
  assert r["caption"] == "a cube" and r["tokens"] == [4, 5, 2]  # EOS kept, as the artefact's
  assert r["attention"] == [[0, 1], [3, 4]] and r["boxes"] == [[0, 0, .5, .5], [.5, .5, 1, 1]]
  assert r["alternatives"] == [{"caption": "cube", "words": ["cube"], "tokens": [5, 2], "attention": [[12, 13]]}]
  (r,) = server.sequence_results(vocab, tokens[:, 0], None, [2], None)
  assert r["attention"] is None and r["alternatives"] == []
  # A model without attention: no boxes either (they would only place attention it has not got).
  (r,) = server.sequence_results(vocab, tokens[:, 0], {}, [2], boxes)
  assert r["attention"] is None and r["boxes"] is None
  # No EOS emitted (the caption ran to max_len): the tokens are the words' alone.
  (r,) = server.sequence_results(vocab, np.array([[4, 5, 4, 5]]), None, [2], None)
  assert r["tokens"] == [4, 5, 4, 5] and r["words"] == ["a", "cube", "a", "cube"]


def _start(args, **kw):
  return subprocess.Popen([sys.executable, "-m", "jaxcap.commands.serve", *args], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_program_serves_until_sigterm_then_exits_0(workdir):
  import urllib.request
  wd, _ = workdir
  proc = _start(["--workdir", wd, "--port", "0", "--max_wait_ms", "1"])
  try:
    line = proc.stdout.readline()
    m = re.fullmatch(rf"serving {re.escape(wd)} at (http://127\.0\.0\.1:(\d+)/)\n", line)
    assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
    with urllib.request.urlopen(m.group(1) + "health", timeout=30) as r:
      assert json.load(r)["status"] == "ok"
    # A second server on the same port: one line naming the flags, exit 2.
    busy = subprocess.run([sys.executable, "-m", "jaxcap.commands.serve", "--workdir", wd, "--port", m.group(2)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert busy.returncode == 2 and busy.stderr.startswith("error: --host=127.0.0.1 --port=")
    assert len(busy.stderr.strip().splitlines()) == 1 and "Traceback" not in busy.stderr
  finally:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert "Traceback" not in err and "stopping" in out


@pytest.mark.parametrize("args, words", [
    ([], "--workdir or --artefact"),
    (["--workdir", "/nonexistent/run"], "--workdir=/nonexistent/run"),
    (["--workdir", "x", "--artefact", "y"], "--artefact"),
    (["--workdir", ".", "--port", "70000"], "--port=70000"),
    (["--workdir", ".", "--max_batch", "0"], "--max_batch"),
    (["--workdir", ".", "--max_wait_ms", "-1"], "--max_wait_ms"),
])
@pytest.mark.slow
def test_bad_flags_are_one_line_and_exit_2(args, words):
  r = subprocess.run([sys.executable, "-m", "jaxcap.commands.serve", *args], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and r.stderr.startswith("error: ") and words in r.stderr, r.stderr
  assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_an_exported_captioner_is_served_the_same_way(run, tmp_path):
  from jaxcap import export
  from jaxcap import serving
  path = str(tmp_path / "tiny.jaxcap")
  export.export(run, path, method="greedy", beam_size=2)
  captioner = serving.load(path)
  xs = [_features(run, 3 + i, seed=10 + i) for i in range(3)]

  async def test(client, app):
    meta = await (await client.get("/metadata")).json()
    async def one(x, q="method=greedy"):
      r = await client.post(f"/caption?{q}", data=_npy(x), headers={"Content-Type": "application/x-npy"})
      return r.status, await r.json()
    out = await asyncio.gather(*(one(x) for x in xs))
    beam = await one(xs[0], "method=beam&beam_size=2")
    bad = [await one(xs[0], "method=sample"), await one(xs[0], "method=beam&beam_size=5"),
           await one(np.zeros((3, 5), np.float32)), await one(xs[0], "example=0")]
    examples = await client.get("/examples")
    bad.append((examples.status, await examples.json()))
    return meta, out, beam, bad, app[server.BATCHER].calls

  async def main():
    app = server.make_app(server.ArtefactBackend(captioner, path), max_wait_ms=300)
    async with TestClient(TestServer(app)) as client:
      return await test(client, app)

  meta, out, beam, bad, calls = asyncio.run(main())
  assert meta["model"] == "transformer" and meta["run"]["artefact"] == path and meta["vocab_size"] == len(run.vocab)
  assert meta["serving"]["methods"] == ["greedy", "beam"] and not meta["input"]["examples"]
  assert calls < 4  # 3 concurrent greedy requests + 1 beam one: fewer calls than requests
  for x, (status, body) in zip(xs, out):
    assert status == 200
    (cap,) = body["captions"]
    ref = captioner.caption([x])[0]
    assert cap["words"] == ref["words"] and cap["tokens"] == ref["tokens"]  # EOS kept by both
    assert cap["caption"] == run.caption(x[None], "greedy")[0]
    if cap["attention"] is not None:
      assert np.asarray(cap["attention"]).shape == (len(cap["words"]), len(x))
  assert beam[0] == 200 and beam[1]["captions"][0]["caption"] == run.caption(xs[0][None], "beam", 2)[0]
  for status, body in bad:
    assert 400 <= status < 500 and set(body) == {"error"}, body
  assert bad[3][0] == 404 and bad[3][1]["error"].startswith("example='0': an exported captioner has no dataset")
  assert bad[4][0] == 404 and bad[4][1]["error"].startswith("/examples: an exported captioner has no dataset")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_a_model_without_attention_is_answered_without_boxes(tmp_path):
  """Show and Tell (the global feature only, no attention): an example's caption comes without
  attention and without the region boxes, which would only place attention it has not got."""
  wd = str(tmp_path / "show_tell")
  config = jaxcap.get_config("base.py:synthetic,model=show_tell,tiny", test_after_training=False,
                             **{"decode.max_len": 4})
  trainer = train_lib.Trainer(config, wd)
  run_dir.init_workdir(wd, config, trainer.dataset.vocab, trainer.info)
  ckpts = ckpt_lib.Checkpoints(wd)
  ckpts.save_best_if_improved(1, trainer.initial_state().replace(step=jnp.int32(1)), {"epoch": 0}, {"CIDEr": 0.5})
  ckpts.close()
  run = jaxcap.load(wd, dataset=trainer.dataset)

  async def test(client, app):
    r = await client.post("/caption?example=1")
    return r.status, await r.json()

  status, body = _serve(run, test)
  assert status == 200, body
  (cap,) = body["captions"]
  assert cap["attention"] is None and cap["boxes"] is None
  item = run.dataset.split("test")[1]
  want = run.decode({"feats": item["feats"][None], "boxes": item["boxes"][None],
                     "global_feat": item["global_feat"][None]})
  assert cap["caption"] == run.vocab.decode(want.tokens[0])
