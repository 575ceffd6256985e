"""Captioning on this CPU, side by side: imported region captioners through every jaxcap route
against their producers' own code, on the same features with the same weights.

  python benchmarks/cpu_side_by_side.py --torch-python /path/to/python-with-torch \\
      --sc_root /path/to/self-critical.pytorch --m2_src /path/to/meshed-memory-transformer [--out record.json]
  python benchmarks/cpu_side_by_side.py --checkpoint model.safetensors --infos infos.pkl \\
      --m2_checkpoint meshed_memory_transformer.pth --m2_vocab vocab.pkl          # jaxcap's routes only

The models (``--models``), each built by its producer's own code under ``--torch-python``
(benchmarks/side_by_side_torch.py; torch never enters jaxcap's process) or given as files:

- ``sc_transformer``: self-critical.pytorch's Transformer of its configs/transformer/transformer.yml
  (6 + 6 layers, d = 512, 8 heads, d_ff 2048; a COCO-sized vocabulary of ``--vocab_size`` words)
  on random weights of its own initialisation, saved by its ``utils.save_checkpoint``, with its end
  token's logit rising with the caption's position and its output bias shifted so that its greedy
  captions of the features average ``--target_words`` words; imported with ``jaxcap-import``; greedy and beam-3 (its eval.py's
  options), against ``model(fc, att, masks, opt=..., mode="sample")``;
- ``m2``: the Meshed-Memory Transformer at its test.py's sizes (3 + 3 layers, d = 512, 40 memory
  slots) with its authors' code, their initialisation with the tests' fixture moves (layer norms,
  biases; ``<pad>`` / ``<bos>`` / ``<unk>`` logits lowered), the ``<eos>`` logit rising with the
  caption's position and shifted so that their beam-5 captions average ``--target_words`` words, saved as their train.py saves; imported
  with ``jaxcap-import --format m2``; beam-5 against test.py's ``model.beam_search(visual, 20,
  eos, 5, out_size=1)``.

Random weights with an unshifted end token never end a caption, and every decode would run all
20 steps; with a constant shift, a beam search ends each caption at once or never (a random
model's word distributions barely change between steps). A trained model's end token grows
likely as its caption grows: here the end token's logit rises by 1 per word along a direction of
the output layer's input that reads the position (a least-squares fit on the model's own states;
benchmarks/side_by_side_torch.py ``_position_direction``), so captions end around ~10 words, as a
trained model's do on COCO, on both sides (self-critical's greedy loop and jaxcap's decoders stop
once every caption has ended; the reference beam searches run every step). Each row records the
captions' mean, shortest and longest length (``words_min`` / ``words_max``) and the empty ones.

The features: ``--images`` images of ``--regions`` regions of the model's width, ReLU'd Gaussian
(bottom-up features are non-negative), fc the regions' mean (as cocobu_fc).

Timed, each after a first call reported apart (compilation, for jaxcap): batch 1 (the first
``--b1_images`` images one at a time, ``--b1_repeats`` times each: median and p99) and the whole
batch (median of ``--repeats``), by the producer's code (its process alone, torch with
``--threads`` threads, before jaxcap's routes), ``Run.caption`` (the imported run), the exported
artefact (``Run.export``, ``jaxcap.serving.load(...).caption``) and ``jaxcap-serve --workdir`` (a
process; HTTP POSTs of ``.npy`` features, one request per call).

Every route's captions are compared with ``Run.caption``'s (``same_as_run_caption``) and the
producer's, word for word (``same_captions``; jaxcap's ``<unk>`` read as self-critical's
``UNK``). Writes ``benchmarks/results/cpu_side_by_side_<device>_<date>.json`` (``--out`` to name
it); ``report.py`` renders it.
"""

from __future__ import annotations

import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)

from jaxcap import cli  # noqa: E402

BENCHMARK = "benchmarks/cpu_side_by_side.py"
MODELS = ("sc_transformer", "m2")
REFERENCE = {"sc_transformer": "self-critical.pytorch@4c48a33 model(..., mode='sample')",
             "m2": "meshed-memory-transformer@239100b model.beam_search(visual, 20, eos, 5, out_size=1)"}


def parse_args(argv=None):
  p = cli.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--checkpoint", default=None, help="a self-critical.pytorch model.safetensors (jaxcap reads "
                 "no .pth without torch: docs/USAGE.md's one-line conversion)")
  p.add_argument("--infos", default=None, help="its infos_<id>.pkl")
  p.add_argument("--torch-python", default=None, help="a Python with torch and self-critical's requirements")
  p.add_argument("--sc_root", default=None, help="self-critical.pytorch checked out at 4c48a33")
  p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
  p.add_argument("--m2_checkpoint", default=None, help="their meshed_memory_transformer.pth (jaxcap only)")
  p.add_argument("--m2_vocab", default=None, help="their vocab.pkl (with --m2_checkpoint)")
  p.add_argument("--m2_src", default=None, help="their repository's models/, utils/, data/ (with --torch-python)")
  p.add_argument("--m2_vocab_size", type=cli.positive_int, default=10201, help="the built M2 model's words (their COCO vocabulary's)")
  p.add_argument("--build_dir", default=None, help="where the built self-critical checkpoint is kept (reused when there)")
  p.add_argument("--vocab_size", type=cli.positive_int, default=9487, help="the built model's words (COCO's 9,487)")
  p.add_argument("--target_words", type=float, default=10.0, help="the built model's mean greedy caption length")
  p.add_argument("--images", type=cli.positive_int, default=50)
  p.add_argument("--regions", type=cli.positive_int, default=36)
  p.add_argument("--b1_images", type=cli.positive_int, default=5)
  p.add_argument("--b1_repeats", type=cli.positive_int, default=3, help="timed calls per batch-1 image")
  p.add_argument("--repeats", type=cli.positive_int, default=3, help="timed calls at the whole batch")
  p.add_argument("--threads", type=cli.positive_int, default=2, help="torch's threads (this machine's cores)")
  p.add_argument("--no_serve", action="store_true", help="leave the jaxcap-serve route out")
  p.add_argument("--no_floor", action="store_true", help="leave out the batch-1 breakdown beside NumPy's "
                 "products of the same matrices (the record's floor)")
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  for flag, path in (("--checkpoint", a.checkpoint), ("--infos", a.infos), ("--m2_checkpoint", a.m2_checkpoint),
                     ("--m2_vocab", a.m2_vocab)):
    if path and not os.path.isfile(path):
      p.error(f"{flag}={path}: no such file; expected the producer's file")
  a.models = [m.strip() for m in a.models.split(",") if m.strip()]
  if not a.models or any(m not in MODELS for m in a.models):
    p.error(f"--models={','.join(a.models)}: expected a comma-separated subset of {', '.join(MODELS)}")
  if bool(a.torch_python) != bool(a.sc_root) or (a.torch_python and "m2" in a.models and not a.m2_src):
    p.error("--torch-python: expected with --sc_root (and --m2_src for m2), or none of them")
  if bool(a.checkpoint) != bool(a.infos) or bool(a.m2_checkpoint) != bool(a.m2_vocab):
    p.error("--checkpoint / --infos and --m2_checkpoint / --m2_vocab: expected both of a pair or neither")
  if not a.torch_python and (("sc_transformer" in a.models and not a.checkpoint)
                             or ("m2" in a.models and not a.m2_checkpoint)):
    p.error("--torch-python: not given; expected it (with --sc_root, --m2_src), or each model's files "
            "(--checkpoint / --infos, --m2_checkpoint / --m2_vocab)")
  if a.sc_root and not os.path.isfile(os.path.join(a.sc_root, "captioning", "models", "TransformerModel.py")):
    p.error(f"--sc_root={a.sc_root}: no captioning/models/TransformerModel.py; expected a self-critical.pytorch checkout")
  if a.m2_src and not os.path.isfile(os.path.join(a.m2_src, "models", "beam_search", "beam_search.py")):
    p.error(f"--m2_src={a.m2_src}: no models/beam_search/beam_search.py; expected their repository's files")
  if a.b1_images > a.images:
    p.error(f"--b1_images={a.b1_images}: expected at most --images={a.images}")
  return a


def _feature_width(infos: str | None) -> int:
  """The model's region width: its infos' ``opt.att_feat_size`` (2048 for the built model), read
  by the importer's restricted unpickler."""
  if not infos or not os.path.isfile(infos):
    return 2048
  from jaxcap.importers import self_critical
  return int(getattr(self_critical.read_infos(infos)["opt"], "att_feat_size", 2048))


def features(images: int, regions: int, width: int) -> dict:
  rng = np.random.default_rng(0)
  att = np.maximum(rng.normal(size=(images, regions, width)), 0.0).astype(np.float32)
  return {"att": att, "fc": att.mean(1)}


def _stats(seconds: list) -> dict:
  s = sorted(seconds)
  return {"median_s": statistics.median(s), "p99_s": s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))],
          "calls": len(s)}


def _timed(fn, b1_inputs: list, batch_input, b1_repeats: int, repeats: int) -> dict:
  """``fn(x) -> captions``: first call (compiles), batch-1 calls, whole-batch calls."""
  t0 = time.perf_counter()
  fn(b1_inputs[0])
  first = time.perf_counter() - t0
  b1, captions_b1 = [], []
  for x in b1_inputs:
    for _ in range(b1_repeats):
      t0 = time.perf_counter()
      caps = fn(x)
      b1.append(time.perf_counter() - t0)
    captions_b1 += caps
  t0 = time.perf_counter()
  fn(batch_input)  # the whole batch's shapes compile here, not in the timed calls
  first_batch = time.perf_counter() - t0
  batch = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    captions = fn(batch_input)
    batch.append(time.perf_counter() - t0)
  return {"first_call_s": first, "first_batch_call_s": first_batch, "b1": _stats(b1), "batch": _stats(batch),
          "captions_b1": captions_b1, "captions": captions}


class _Server:
  """``jaxcap-serve --workdir`` in a process on a free port."""

  def __init__(self, workdir: str, max_batch: int):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "jaxcap.commands.serve", "--workdir", workdir, "--port", str(self.port),
         "--max_batch", str(max_batch), "--max_wait_ms", "0", "--max_body_mb", "256"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=_REPO)
    deadline = time.time() + 300
    while time.time() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f"jaxcap-serve exited: {self.proc.stderr.read()[-2000:]}")
      try:
        urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
        return
      except OSError:
        time.sleep(0.5)
    raise RuntimeError("jaxcap-serve did not answer /health within 300 s")

  def caption(self, x: np.ndarray, method: str, beam: int) -> list[str]:
    buf = io.BytesIO()
    np.save(buf, np.asarray(x, np.float32))
    query = f"method={method}" + (f"&beam_size={beam}" if method == "beam" else "")
    req = urllib.request.Request(f"http://127.0.0.1:{self.port}/caption?{query}", data=buf.getvalue(),
                                 headers={"Content-Type": "application/x-npy"})
    with urllib.request.urlopen(req, timeout=600) as r:
      return [c["caption"] for c in json.loads(r.read())["captions"]]

  def close(self):
    self.proc.terminate()
    self.proc.wait(timeout=30)


def _torch_job(a, tmp: str, job: dict, name: str) -> dict:
  job = dict(job, threads=a.threads, repeats=a.repeats, b1_images=a.b1_images, b1_repeats=a.b1_repeats,
             out=os.path.join(tmp, f"{name}_reference.json"))
  with open(os.path.join(tmp, f"{name}_job.json"), "w") as f:
    json.dump(job, f)
  proc = subprocess.run([a.torch_python, os.path.join(_HERE, "side_by_side_torch.py"),
                         os.path.join(tmp, f"{name}_job.json")], capture_output=True, text=True, cwd=_REPO)
  if proc.returncode:
    raise RuntimeError(f"the reference side ({name}) failed: {proc.stderr.strip()[-3000:]}")
  with open(job["out"]) as f:
    return json.load(f)


def sc_model(a, tmp: str, feats_path: str):
  """``(reference record or None, checkpoint, infos)`` of self-critical's Transformer."""
  if not a.torch_python:
    return None, a.checkpoint, a.infos
  job = {"sc_root": os.path.abspath(a.sc_root), "features": feats_path}
  keep = a.build_dir and os.path.join(os.path.abspath(a.build_dir), "sc")
  if a.checkpoint:
    job.update(checkpoint=os.path.abspath(a.checkpoint), infos=os.path.abspath(a.infos))
  elif keep and os.path.isfile(os.path.join(keep, "model.safetensors")):
    job.update(checkpoint=os.path.join(keep, "model.safetensors"), infos=os.path.join(keep, "infos_bench.pkl"))
  else:
    job["build"] = {"dir": keep or os.path.join(tmp, "sc_model"),
                    "cfg": os.path.join(os.path.abspath(a.sc_root), "configs", "transformer", "transformer.yml"),
                    "vocab_size": a.vocab_size, "target_words": a.target_words}
  ref = _torch_job(a, tmp, job, "sc")
  if "build" not in job and os.path.isfile(os.path.join(keep or "", "built.json")):
    with open(os.path.join(keep, "built.json")) as f:  # the kept checkpoint's calibration
      ref["built"] = dict(json.load(f), reused=True)
  built = ref.get("built", {})
  return ref, built.get("checkpoint", job.get("checkpoint")), built.get("infos", job.get("infos"))


def m2_model(a, tmp: str, feats_path: str):
  """``(reference record or None, checkpoint, vocab.pkl)`` of the Meshed-Memory Transformer."""
  if not a.torch_python:
    return None, a.m2_checkpoint, a.m2_vocab
  job = {"model": "m2", "m2_src": os.path.abspath(a.m2_src), "features": feats_path, "beam_size": 5,
         "build": {"dir": os.path.join(tmp, "m2_model"), "vocab_size": a.m2_vocab_size,
                   "target_words": a.target_words, "calibration_images": min(a.images, 10)}}
  ref = _torch_job(a, tmp, job, "m2")
  return ref, ref["built"]["checkpoint"], ref["built"]["vocab"]


def _reference_row(model: str, theirs: dict, images: int) -> dict:
  return {"model": model, "route": REFERENCE[model], "method": theirs["method"], "beam_size": theirs["beam_size"],
          "first_call_s": theirs["first_call_s"], "b1_median_s": theirs["b1_median_s"],
          "b1_p99_s": _stats(theirs["b1_s"])["p99_s"], "batch": images, "batch_median_s": theirs["batch_median_s"],
          **_lengths(theirs["captions"])}


def _lengths(captions: list) -> dict:
  n = [len(c.split()) for c in captions]
  return {"mean_words": float(np.mean(n)), "words_min": min(n), "words_max": max(n),
          "empty_captions": n.count(0)}


def time_routes(a, model: str, run, workdir: str, att, decodings, ref, tmp: str) -> list[dict]:
  """Every jaxcap route of ``run`` for each ``(method, beam)``, beside the reference's rows."""
  from jaxcap import serving
  beam_size = max(beam for _, beam in decodings)
  t0 = time.perf_counter()
  run.export(os.path.join(tmp, f"{model}.jaxcap"), beam_size=beam_size, platforms=("cpu",))
  export_s = time.perf_counter() - t0
  captioner = serving.load(os.path.join(tmp, f"{model}.jaxcap"))
  b1_inputs = [att[i:i + 1] for i in range(a.b1_images)]
  server = None if a.no_serve else _Server(workdir, max_batch=a.images)
  rows = []
  try:
    for method, beam in decodings:
      routes = {
          "Run.caption": lambda x: run.caption(x, method, beam, batch_size=len(x)),
          "artefact": lambda x: [r["caption"] for r in captioner.caption(x, method=method)],
      }
      if server is not None:
        routes["jaxcap-serve"] = lambda x: server.caption(x, method, beam)
      theirs = None
      if ref is not None:
        theirs = next(r for r in ref["rows"] if r["beam_size"] == beam)
        rows.append(_reference_row(model, theirs, a.images))
      for route, fn in routes.items():
        t = _timed(fn, b1_inputs, att, a.b1_repeats, a.repeats)
        row = {"model": model, "route": route, "method": method, "beam_size": beam,
               "first_call_s": t["first_call_s"], "first_batch_call_s": t["first_batch_call_s"],
               "b1_median_s": t["b1"]["median_s"], "b1_p99_s": t["b1"]["p99_s"], "batch": a.images,
               "batch_median_s": t["batch"]["median_s"],
               **_lengths(t["captions"])}
        if route == "artefact":
          row["export_s"] = export_s
        if route == "Run.caption":
          run_captions = t["captions"] + t["captions_b1"]
        row["same_as_run_caption"] = t["captions"] + t["captions_b1"] == run_captions
        if theirs is not None:
          # jaxcap's unknown word is its special "<unk>"; self-critical's vocabulary spells it "UNK".
          unk = "UNK" if model == "sc_transformer" else "<unk>"
          ours = [" ".join(unk if w == "<unk>" else w for w in c.split()) for c in t["captions"] + t["captions_b1"]]
          pairs = list(zip(ours, theirs["captions"] + theirs["captions_b1"]))
          row["same_captions"] = len(t["captions"]) == len(theirs["captions"]) and all(x == y for x, y in pairs)
          if not row["same_captions"]:
            row["first_difference"] = next(([i, x, y] for i, (x, y) in enumerate(pairs) if x != y), None)
          row["speedup_b1"] = theirs["b1_median_s"] / t["b1"]["median_s"]
          row["speedup_batch"] = theirs["batch_median_s"] / t["batch"]["median_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
  finally:
    if server is not None:
      server.close()
  return rows


def main(argv=None) -> dict:
  a = parse_args(argv)
  import common
  import run as bench_run  # the same environment record as run.py
  from jaxcap.importers import self_critical
  from jaxcap.papers.m2 import importer as m2_importer
  record = {"benchmark": BENCHMARK, "environment": dict(bench_run.environment(), cpu_count=os.cpu_count()),
            "images": a.images, "regions": a.regions, "b1_images": a.b1_images, "b1_repeats": a.b1_repeats,
            "repeats": a.repeats, "models": {}, "rows": []}
  with tempfile.TemporaryDirectory() as tmp:
    for model in a.models:
      if model == "m2":
        width = 2048 if a.torch_python else _m2_width(a.m2_checkpoint)  # test.py's d_in
      else:
        width = _feature_width(a.infos or (a.build_dir and os.path.join(a.build_dir, "sc", "infos_bench.pkl")))
      feats = features(a.images, a.regions, width)
      feats_path = os.path.join(tmp, f"{model}_features.npz")
      np.savez(feats_path, **feats)
      workdir = os.path.join(tmp, f"{model}_run")
      if model == "sc_transformer":
        ref, checkpoint, infos = sc_model(a, tmp, feats_path)
        t0 = time.perf_counter()
        run = self_critical.import_checkpoint(checkpoint, infos, workdir)
        decodings = (("greedy", 1), ("beam", 3))
      else:
        ref, checkpoint, vocab = m2_model(a, tmp, feats_path)
        t0 = time.perf_counter()
        run = m2_importer.import_checkpoint(checkpoint, vocab, workdir)
        decodings = (("beam", 5),)
      info = {"import_s": time.perf_counter() - t0,
              "fields": {k: v for k, v in run.config.model.to_dict().items() if isinstance(v, (int, float, str, bool))},
              "decode": {"max_len": int(run.config.decode.max_len), "beam_mode": run.config.decode.beam_mode}}
      if ref is not None:
        info["reference"] = {"code": REFERENCE[model], "torch": ref["torch"], "threads": ref["threads"],
                             **{k: v for k, v in ref.get("built", {}).items() if k not in ("checkpoint", "infos", "vocab")}}
      record["models"][model] = info
      record["rows"] += time_routes(a, model, run, workdir, feats["att"], decodings, ref, tmp)
      if model == "sc_transformer" and not a.no_floor:
        record["floor"] = floor(run, feats["att"])
        print(json.dumps(record["floor"]), flush=True)
  common.write_record("cpu_side_by_side", record, a.out)
  return record


def _kernels(params) -> list:
  """``(path, [in, out] float32 matrix)`` of every Dense kernel under ``params`` (DenseGeneral's
  ``[D, H, Dh]`` / ``[H, Dh, D]`` kernels flattened to the product they compute)."""
  import jax
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    name = name[len("params/"):] if name.startswith("params/") else name
    if name.endswith("/kernel"):
      a = np.asarray(leaf, np.float32)
      if a.ndim == 3:  # [D, H, Dh] (queries, keys, values) or [H, Dh, D] (the output)
        a = a.reshape(a.shape[0], -1) if "/out/" not in name else a.reshape(-1, a.shape[-1])
      out.append((name, np.ascontiguousarray(a)))
  return out


def floor(run, att, repeats: int = 15) -> dict:
  """Where one image's greedy caption goes, beside what NumPy's BLAS does with the same matrices
  on this host: the encoder (every product that runs once per image: the region projection,
  the encoder blocks, the decoder layers' cross-attention keys and values) at the image's
  regions, and one decoding step (every product of a step: self-attention, cross-attention's
  queries and output, FFN, output layer) at one row. NumPy runs the model's own kernels one
  after another (in the parameter tree's order), each on a random activation of its width (the
  encoder's ~92 MB and a step's ~108 MB exceed the 32 MB L3 cache, so the weights stream from
  memory as in the model). jaxcap's encoder: ``encode`` jitted alone; a step: greedy at
  max_len 20 minus max_len 1, divided by the further steps the captions ran."""
  import jax
  from jaxcap import decoding, xla_options
  model, params = run.feature_model, run.feature_params
  x = run.batch(att[:1])
  x = {k: jax.numpy.asarray(v) for k, v in x.items()}

  def median(fn):
    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

  options = xla_options.decode_compiler_options()  # decoding's own (its programs are compiled so)
  encode = jax.jit(lambda p, b: model.apply(p, b, method="encode"), compiler_options=options)
  encode_s = median(lambda: encode(params, x))
  greedy = {n: jax.jit(lambda p, b, n=n: decoding.greedy(model, p, b, max_len=n), compiler_options=options)
            for n in (1, 20)}
  t1 = median(lambda: greedy[1](params, x).tokens)
  t20 = median(lambda: greedy[20](params, x).tokens)
  # The loop stops when the caption ends: the steps it ran are the caption's length (EOS included).
  steps = int(np.asarray(greedy[20](params, x).lengths).max())
  step_s = (t20 - t1) / max(1, steps - 1)
  kernels = _kernels(params)
  once = [a for n, a in kernels if n.startswith(("encoder/", "feat_proj/"))
          or ("cross_attn/" in n and ("/key/" in n or "/value/" in n))]
  per_step = [a for n, a in kernels if n.startswith(("dec_layers_", "logits_proj/"))
              and not ("cross_attn/" in n and ("/key/" in n or "/value/" in n))]
  rng = np.random.default_rng(0)
  n = att.shape[1]

  def numpy_pass(mats, rows):
    xs = {a.shape[0]: rng.standard_normal((rows, a.shape[0])).astype(np.float32) for a in mats}
    ts = []
    for _ in range(repeats + 1):
      t0 = time.perf_counter()
      for a in mats:
        xs[a.shape[0]] @ a
      ts.append(time.perf_counter() - t0)
    return statistics.median(ts[1:])

  enc_flop = 2.0 * n * sum(a.size for a in once)
  step_bytes = 4.0 * sum(a.size for a in per_step)
  np_enc, np_step = numpy_pass(once, n), numpy_pass(per_step, 1)
  return {"model": "sc_transformer", "regions": int(n), "steps_at_max_len_20": steps,
          "kernels": {"all": len(kernels), "encoder": len(once), "step": len(per_step)},
          "encoder": {"gflop": enc_flop / 1e9, "jaxcap_ms": 1e3 * encode_s, "numpy_ms": 1e3 * np_enc,
                      "jaxcap_gflop_s": enc_flop / encode_s / 1e9, "numpy_gflop_s": enc_flop / np_enc / 1e9},
          "step": {"weights_mb": step_bytes / 1e6, "jaxcap_ms": 1e3 * step_s, "numpy_ms": 1e3 * np_step,
                   "jaxcap_gb_s": step_bytes / step_s / 1e9, "numpy_gb_s": step_bytes / np_step / 1e9},
          "greedy_max_len_1_ms": 1e3 * t1, "greedy_max_len_20_ms": 1e3 * t20,
          "numpy_blas": _blas_name()}


def _blas_name() -> str | None:
  try:
    cfg = np.show_config(mode="dicts")
    return cfg["Build Dependencies"]["blas"]["name"]
  except Exception:  # noqa: BLE001 - older NumPy
    return None


def _m2_width(checkpoint: str | None) -> int:
  """Their encoder's input width (``encoder.fc.weight`` [d_model, d_in])."""
  from jaxcap.papers.m2 import importer as m2_importer
  state = m2_importer.read_state_dict(checkpoint)
  return int(np.shape(state["encoder.fc.weight"])[1])


if __name__ == "__main__":
  cli.run_script(main)
