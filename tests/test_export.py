"""``jaxcap-export`` / ``Run.export`` and ``jaxcap.serving.load``: the exported captioner decodes
as the run does, in a process that imports no flax and no jaxcap model.

Tiny runs are built in memory from a config and freshly initialised parameters (no training):
the equalities hold for any parameters. The reloads run in a subprocess that asserts ``flax``,
``jaxcap.models`` and ``jaxcap.papers`` were never imported, then writes what it decoded as JSON;
the test compares tokens with ``Run.decode`` (greedy and beam) and attention with
``Run.decode(return_aux=True)``'s ``aux["attention"]``.

Mutants tried (each made a test here fail, then restored): the beam program returning beam 1
instead of the best (tokens differ); the artefact not padding regions to ``max_regions`` (the
ragged input fails); ``_image_layout`` taking ``fc`` as the global feature of a run without
``fc_dir`` (the image tokens differ); ``deserialize`` skipped for ``beam`` (KeyError).
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap import api, serving
from jaxcap.errors import BadInput
from jaxcap.data import batch as batch_lib
from jaxcap.data.vocab import Vocab
from jaxcap.models import registry
from jaxcap.models.base import shift_right

REPO = Path(__file__).resolve().parents[1]
V_WORDS = [f"w{i}" for i in range(12)]
INFO = {"feature_dim": 12, "global_dim": 12, "max_regions": 5, "max_len": 6, "vocab_size": 16,
        "src_vocab_size": 0, "num_attributes": 8, "grid": False, "seq_per_img": 2,
        "max_attributes": 3, "src_max_len": 0}
# MNMT translates a source sentence: its run has a source vocabulary and length.
INFO_SRC = dict(INFO, src_vocab_size=10, src_max_len=4)
# nearest_neighbour is not a network (no parameters, no decode step): nothing to export.
NO_PARAMS = ("nearest_neighbour",)
MAX_LEN = 6


def _defaults(cls) -> dict:
  return {f.name: f.default for f in dataclasses.fields(cls)
          if f.default is not dataclasses.MISSING}


def tiny_run(name: str, seed: int = 0, workdir=None, info=None, data=None) -> api.Run:
  """A run of model ``name`` at its tiny sizes (``tiny_sizes`` of its defaults), random
  parameters."""
  cls = registry.get(name)
  fields = cls.tiny_sizes(_defaults(cls))
  info = info or (INFO_SRC if name == "mnmt" else INFO)
  if "dtype" in cls.__dataclass_fields__:
    fields["dtype"] = "float32"
  cfg = ml_collections.ConfigDict({"model": dict(fields, name=name),
                                   "data": data or {"name": "synthetic_scenes"},
                                   "decode": {"method": "greedy", "beam_size": 3, "max_len": MAX_LEN}})
  model = registry.build(cfg.model, info)
  batch = jax.tree.map(jnp.asarray, batch_lib.dummy(info, 2))
  params = model.init(jax.random.PRNGKey(seed), batch, shift_right(batch["captions"]), train=False)
  if name == "tpgn":  # a data-derived constant, set when training starts
    params = dict(params, constants=dict(params["constants"],
                                         feat_mean=jnp.full((info["global_dim"],), 0.1, jnp.float32)))
  # Larger weights than flax's initialisation, so that captions differ between images.
  params = jax.tree.map(lambda x: x * 3 if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
  return api.Run(cfg, Vocab(V_WORDS), info, model, params, workdir=workdir, step=7)


def features(info, b: int = 3, seed: int = 1) -> dict:
  rng = np.random.default_rng(seed)
  n = info["max_regions"]
  xy = rng.uniform(0, 0.5, (b, n, 2))
  boxes = np.concatenate([xy, xy + rng.uniform(0.1, 0.5, (b, n, 2))], -1).astype(np.float32)
  boxes[:, 1] = [0.0, 0.0, 1.0, 1.0]
  mask = np.ones((b, n), bool)
  mask[0, 3:] = False
  feats = rng.normal(size=(b, n, info["feature_dim"])).astype(np.float32) * 2
  out = {"feats": feats, "feats_mask": mask, "boxes": boxes,
         "global_feat": rng.normal(size=(b, info["global_dim"])).astype(np.float32),
         "attributes": rng.integers(4, info["vocab_size"], (b, info["max_attributes"])).astype(np.int32)}
  if info.get("src_vocab_size"):
    src = rng.integers(4, info["src_vocab_size"], (b, info["src_max_len"] + 1)).astype(np.int32)
    src[:, -1] = 2  # EOS
    out["src"] = src
  return out


# The reload: a fresh interpreter that never imports flax or a jaxcap model.
RELOAD = textwrap.dedent("""
  import json, sys
  import numpy as np
  from jaxcap import serving
  jobs = json.load(open(sys.argv[1]))
  out = {}
  for key, job in jobs.items():
    c = serving.load(job["file"])
    feats = dict(np.load(job["features"]))
    out[key] = {m: c.caption(feats, method=m) for m in ("greedy", "beam")}
    out[key]["default"] = c.caption(feats)
    if "images" in job:
      out[key]["images"] = c.caption_images(job["images"], method="greedy")
  bad = sorted(m for m in sys.modules if m == "flax" or m.startswith(("flax.", "jaxcap.models", "jaxcap.papers")))
  assert not bad, bad
  json.dump(out, open(sys.argv[2], "w"))
""")


def reload(jobs: dict, tmp_path) -> dict:
  (tmp_path / "jobs.json").write_text(json.dumps(jobs))
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-c", RELOAD, str(tmp_path / "jobs.json"), str(tmp_path / "out.json")],
                        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads((tmp_path / "out.json").read_text())


def check_same(run: api.Run, feats: dict, got: dict, what: str):
  """The artefact's results equal Run.decode's tokens and attention, greedy and beam."""
  for method in ("greedy", "beam"):
    ref = run.decode(feats, method, 3, return_aux=True)
    tokens = ref.tokens if method == "greedy" else ref.tokens[:, 0]
    att = (ref.aux or {}).get("attention")
    if att is not None and method == "beam":
      att = att[:, 0]
    assert len(got[method]) == len(tokens)
    for i, r in enumerate(got[method]):
      want = [int(t) for t in tokens[i] if t != 0]
      assert r["tokens"] == want, f"{what} {method} image {i}"
      assert r["caption"] == run.vocab.decode(tokens[i]) == " ".join(r["words"])
      if att is None:
        assert r["attention"] is None, what
      else:
        # Two compilations of the same decoder (the run's and the exported program's) round
        # differently, and a beam's steps carry that on: AoANet's beam attention differed by
        # 2.1e-5 (at 0.0475) on one CPU while the tokens stayed equal; float32's, not a bug's.
        np.testing.assert_allclose(np.asarray(r["attention"]).reshape(att[i, :len(r["words"])].shape),
                                   att[i, :len(r["words"])], rtol=1e-4, atol=5e-5,
                                   err_msg=f"{what} {method} image {i}")
  assert got["default"] == got["greedy"]  # the run's config.decode.method


# ---------------------------------------------------------------- the default model


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("export")
  run = tiny_run("transformer")
  meta = run.export(str(tmp / "t.jaxcap"))  # platforms cpu and cuda (the default)
  return run, tmp / "t.jaxcap", meta


@pytest.mark.slow
def test_transformer_reloads_without_flax_and_decodes_as_the_run(transformer, tmp_path):
  run, path, meta = transformer
  feats = features(INFO)
  np.savez(tmp_path / "f.npz", **feats)
  got = reload({"t": {"file": str(path), "features": str(tmp_path / "f.npz")}}, tmp_path)["t"]
  assert meta["attention"]  # the Transformer's decode step returns aux["attention"]
  check_same(run, feats, got, "transformer")
  assert len({tuple(r["tokens"]) for r in got["greedy"]}) > 1  # the images' captions differ


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_metadata_says_what_the_file_holds(transformer):
  run, path, meta = transformer
  c = serving.load(str(path))
  assert c.metadata == json.loads(json.dumps(meta, default=str))
  assert meta["vocab"] == run.vocab.itos and meta["run"]["step"] == 7
  from jaxcap.evaluation import signature
  assert meta["run"]["config_hash"] == signature.config_hash(run.config)
  assert meta["decode"]["method"] == "greedy" and meta["decode"]["beam_size"] == 3
  assert meta["decode"]["max_len"] == MAX_LEN
  assert meta["inputs"]["reads"] == ["feats", "feats_mask"]
  # Images and regions symbolic: a request runs at its own number of regions (bucketed).
  assert meta["inputs"]["arrays"]["feats"] == {"shape": ["b", "n", 12], "dtype": "float32"}
  assert meta["inputs"]["max_regions"] == 5 and meta["inputs"]["symbolic_regions"] is True
  assert meta["backbone"] is None
  with zipfile.ZipFile(path) as z:
    assert sorted(z.namelist()) == ["beam.jaxexport", "greedy.jaxexport", "metadata.json", "params.npz"]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_programs_are_lowered_for_cpu_and_cuda(transformer):
  _, path, meta = transformer
  assert meta["platforms"] == ["cpu", "cuda"]
  with zipfile.ZipFile(path) as z:
    for name in ("greedy", "beam"):
      exp = jax.export.deserialize(bytearray(z.read(f"{name}.jaxexport")))
      assert tuple(exp.platforms) == ("cpu", "cuda")
      # The batch size is symbolic: one program for every B.
      assert any(not isinstance(d, int) for a in exp.in_avals for d in a.shape)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_ragged_and_fewer_regions_and_overrides(transformer, tmp_path):
  """A list of [N_i, F] arrays (padded to max_regions in the artefact) gives Run.caption's
  tokens; method / beam_size / max_len overrides reach the programs."""
  run, path, _ = transformer
  c = serving.load(str(path))
  feats = features(INFO)
  ragged = [feats["feats"][i, :k] for i, k in enumerate((2, 5, 3))]
  ref = run.decode(ragged, "greedy", return_aux=True)
  # A request runs at its own number of regions (the list's longest), not at max_regions.
  assert c.batch([x[:3] for x in ragged])[0]["feats"].shape == (3, 3, 12)
  assert c.batch(ragged)[0]["feats"].shape == (3, 5, 12)
  got = c.caption(ragged, method="greedy")
  for i, r in enumerate(got):
    assert r["tokens"] == [int(t) for t in ref.tokens[i] if t]
    # Over the batch's N = 5 regions (the list's longest), zero on an image's padding.
    np.testing.assert_allclose(r["attention"], ref.aux["attention"][i, :len(r["words"])], rtol=1e-4, atol=1e-5)
  short = tmp_path / "short.jaxcap"
  meta = run.export(str(short), method="beam", beam_size=2, max_len=3, platforms=("cpu",))
  assert (meta["decode"]["method"], meta["decode"]["beam_size"], meta["decode"]["max_len"]) == ("beam", 2, 3)
  out = serving.load(str(short)).caption(feats["feats"])
  want = run.decode(feats["feats"], "beam", 2, max_len=3).tokens[:, 0]
  assert [r["tokens"] for r in out] == [[int(t) for t in row if t] for row in want]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_an_encoder_that_needs_a_fixed_region_count_is_exported_at_max_regions(transformer, tmp_path,
                                                                                 monkeypatch):
  # A model whose encoder branches on the number of regions refuses a symbolic region axis;
  # the export notes it and writes programs at max_regions, which the reader pads to.
  run, _, _ = transformer
  real = jax.export.export

  def refusing(fn, **kw):
    exporter = real(fn, **kw)

    def go(leaves, batch):
      if any(not isinstance(d, int) for d in batch["feats"].shape[1:]):
        raise jax.errors.InconclusiveDimensionOperation("the encoder compares n with a constant")
      return exporter(leaves, batch)
    return go

  monkeypatch.setattr(jax.export, "export", refusing)
  notes = []
  from jaxcap import export as export_lib
  meta = export_lib.export(run, str(tmp_path / "fixed.jaxcap"), platforms=("cpu",), log=notes.append)
  monkeypatch.undo()
  assert meta["inputs"]["symbolic_regions"] is False
  assert meta["inputs"]["arrays"]["feats"]["shape"] == ["b", 5, 12]
  assert len(notes) == 1 and "exported at max_regions=5" in notes[0]
  c = serving.load(str(tmp_path / "fixed.jaxcap"))
  feats = features(INFO)["feats"][:, :3]
  assert c.batch(feats)[0]["feats"].shape == (3, 5, 12)
  want = run.decode(feats, "greedy").tokens
  assert [r["tokens"] for r in c.caption(feats, method="greedy")] == [[int(t) for t in row if t] for row in want]


@pytest.mark.parametrize("bad, match", [
    (np.zeros((2, 5, 7), np.float32), r"expected region features \[B, N, 12\]"),  # width
    (np.zeros((2, 5, 12), np.complex64), r"dtype complex64; expected real numbers"),  # dtype
    (np.array([[["a"] * 12] * 5] * 2), r"dtype <U1; expected real numbers"),
    (np.zeros((2, 1, 5, 12), np.float32), r"expected features \[B, Dg\] \(global\) or \[B, N, F\]"),  # rank
    (np.zeros((2, 6, 12), np.float32), r"at most 5 \(the exported max_regions\)"),
    ({"feats": np.zeros((2, 5, 12)), "feats_mask": np.zeros((2, 5), bool)}, r"marks no region of image 0"),
    ({"feats": np.full((2, 5, 12), np.nan)}, r"NaN or Inf"),
    ({"feats": np.zeros((2, 5, 12)), "color": 1}, r"unknown features key 'color'"),
    (None, r"features is None"),
])
def test_bad_features_are_one_line(transformer, bad, match):
  c = serving.load(str(transformer[1]))
  with pytest.raises(ValueError, match=match) as e:
    c.caption(bad)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"method='sample': expected one of greedy, beam"):
    c.caption(np.zeros((1, 5, 12), np.float32), method="sample")


def test_a_vocabulary_that_is_not_the_program_s_is_one_line(transformer, tmp_path):
  """A metadata.json whose vocabulary lost (or gained) a word: each id past the list read as
  UNK, silently (issue 70 item 3: the metadata checked against its programs when loaded)."""
  _, path, meta = transformer
  for vocab in (meta["vocab"][:-1], meta["vocab"] + ["extra"]):
    bad = tmp_path / "v.jaxcap"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
      for name in src.namelist():
        data = src.read(name)
        if name == "metadata.json":
          data = json.dumps(dict(json.loads(data), vocab=vocab)).encode()
        dst.writestr(name, data)
    with pytest.raises(BadInput, match=rf"v\.jaxcap: damaged or incomplete \(ValueError: 'vocab' holds "
                                       rf"{len(vocab)} words for the program's {len(meta['vocab'])} output ids"):
      serving.load(str(bad))


def test_a_file_that_is_not_an_export_is_one_line(tmp_path):
  (tmp_path / "x.jaxcap").write_text("hello")
  with pytest.raises(ValueError, match=r"x.jaxcap: unreadable .*; expected a file jaxcap-export wrote"):
    serving.load(str(tmp_path / "x.jaxcap"))


# ---------------------------------------------------------------- the program


def _export_cli(args, cwd):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  return subprocess.run([sys.executable, "-m", "jaxcap.commands.export", *args], capture_output=True,
                        text=True, timeout=300, env=env, cwd=cwd)


def _one_line(proc, match):
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], proc.stderr


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bad_program_input_is_one_line_and_writes_nothing(tmp_path):
  (tmp_path / "afile").write_text("x")
  (tmp_path / "adir").mkdir()
  before = sorted(p.name for p in tmp_path.rglob("*"))
  _one_line(_export_cli(["--workdir", "nowhere", "--out", "o.jaxcap"], tmp_path), "--workdir=nowhere: not a directory")
  _one_line(_export_cli(["--workdir", "adir", "--out", "afile/o.jaxcap"], tmp_path), "--out=afile/o.jaxcap")
  _one_line(_export_cli(["--workdir", "adir", "--out", "adir"], tmp_path), "--out=adir: is a directory")
  _one_line(_export_cli(["--workdir", "adir", "--out", "o.jaxcap", "--platforms", "gpu"], tmp_path), "--platforms=gpu")
  _one_line(_export_cli(["--workdir", "adir", "--out", "o.jaxcap"], tmp_path), "adir")  # no config.json
  assert sorted(p.name for p in tmp_path.rglob("*")) == before


# ---------------------------------------------------------------- the image backbone


def test_pixels_are_the_extractors_and_bad_files_are_one_line(tmp_path):
  """The artefact reads images with the extractor's own definition (jaxcap.images, numpy-only),
  and names a bad file in one line where the extractor lets Pillow's error through."""
  from PIL import Image
  from jaxcap import images
  from jaxcap.features import extract
  from jaxcap.serving import artefact
  assert extract.read_image is images.read_image and extract.image_array is images.image_array
  assert artefact.image_array is images.image_array
  rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
  Image.fromarray(rgb).save(tmp_path / "rgb.png")
  np.testing.assert_array_equal(artefact.read_image(str(tmp_path / "rgb.png"), 24),
                                images.read_image(str(tmp_path / "rgb.png"), 24))
  (tmp_path / "bad.jpg").write_bytes(b"not an image")
  with pytest.raises(ValueError, match=r"bad.jpg: unreadable image"):
    artefact.read_image(str(tmp_path / "bad.jpg"), 24)
  with pytest.raises(ValueError, match=r"nope.png: no such file"):
    artefact.read_image(str(tmp_path / "nope.png"), 24)
  with pytest.raises(ValueError, match=r"a directory"):
    artefact.read_image(str(tmp_path), 24)


@pytest.mark.slow
def test_a_run_with_a_backbone_captions_images_as_the_run(tmp_path):
  """A run on jaxcap-extract's features (a features.json of a tiny random-weight ResNet at 32 px,
  3 x 3 grid cells as regions, padded to max_regions 12): the exported backbone + decoder give
  Run.caption_images's captions."""
  from jaxcap.features import extract, registry as backbones
  fields = dict(width=4, depths=(1, 1, 1, 1), att_size=3)
  module = backbones.build("resnet50", **fields)
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "features.json").write_text(json.dumps(extract.make_record(
      "resnet50", module, fields, 32, "float32", None, 0)))
  d = int(module.feature_dim)
  info = dict(INFO, feature_dim=d, global_dim=d, max_regions=12, grid=True)
  run = tiny_run("transformer", workdir=str(tmp_path / "run"), info=info,
                 data={"name": "karpathy", "att_dir": "att", "grid": True})
  meta = run.export(str(tmp_path / "i.jaxcap"), platforms=("cpu",))
  assert meta["backbone"]["size"] == 32
  rng = np.random.default_rng(0)
  images = [rng.integers(0, 256, (40, 50, 3), dtype=np.uint8) for _ in range(3)]
  from PIL import Image
  paths = []
  for i, x in enumerate(images):
    Image.fromarray(x).save(tmp_path / f"{i}.png")
    paths.append(str(tmp_path / f"{i}.png"))
  np.savez(tmp_path / "f.npz", **features(info))
  got = reload({"i": {"file": str(tmp_path / "i.jaxcap"), "features": str(tmp_path / "f.npz"),
                      "images": paths}}, tmp_path)["i"]["images"]
  want = run.caption_images(paths, method="greedy")
  assert [r["caption"] for r in got] == want
  batch = run.image_batch(paths)
  ref = run.decode(batch, "greedy", return_aux=True)
  for i, r in enumerate(got):
    assert r["tokens"] == [int(t) for t in ref.tokens[i] if t]
    np.testing.assert_allclose(r["attention"], ref.aux["attention"][i, :len(r["words"]), :9], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- every registered model


@pytest.mark.paper_gate
def test_every_model_is_covered():
  assert set(registry.names()) - set(NO_PARAMS) >= {"transformer", "lstm", "aoa", "mnmt"}


@pytest.mark.slow
def test_every_model_reloads_and_decodes_as_the_run(tmp_path):
  names = [n for n in registry.names() if n not in NO_PARAMS]
  runs, jobs = {}, {}
  for name in names:
    run = runs[name] = tiny_run(name)
    meta = run.export(str(tmp_path / f"{name}.jaxcap"), platforms=("cpu",))
    # Every model's encoder takes any number of regions (a fixed count is the fallback).
    assert meta["inputs"]["symbolic_regions"] is ("feats" in meta["inputs"]["reads"]), name
    np.savez(tmp_path / f"{name}.npz", **features(run.info))
    jobs[name] = {"file": str(tmp_path / f"{name}.jaxcap"), "features": str(tmp_path / f"{name}.npz")}
  got = reload(jobs, tmp_path)
  for name in names:
    check_same(runs[name], features(runs[name].info), got[name], name)
  # Models known to attend over regions export their per-word attention.
  for name in ("transformer", "lstm", "aoa"):
    assert got[name]["greedy"][0]["attention"] is not None, name


# ---------------------------------------------------------------- what an exported captioner needs

# What `pip install .` (pyproject's dependencies: jax, numpy, flatbuffers, Pillow) does not bring:
# requirements.txt's training stack (the `train` extra). jax itself imports none of them.
TRAINING_STACK = ("flax", "optax", "orbax", "tensorflow", "tensorflow_datasets", "grain", "array_record",
                  "tensorboard", "tensorboardX", "ml_collections", "absl", "pycocoevalcap", "h5py",
                  "matplotlib", "safetensors", "sacrebleu", "aiohttp", "tqdm")
# jaxcap.serving's docstring: of jaxcap, it imports jaxcap.errors, jaxcap.images, jaxcap.data.batch and
# jaxcap.xla_options only.
SERVING_MODULES = {"jaxcap", "jaxcap.version", "jaxcap.errors", "jaxcap.serving", "jaxcap.serving.artefact",
                   "jaxcap.images", "jaxcap.data", "jaxcap.data.batch", "jaxcap.xla_options"}

# Imports jaxcap.serving, captions with an exported file, and records the modules it loaded and
# whether the training stack is importable at all (in the light environment it must not be).
LIGHT = textwrap.dedent("""
  import importlib.util, json, sys
  import numpy as np
  stack = json.loads(sys.argv[3])
  def loaded():
    return {"stack": sorted(m for m in sys.modules if m.split(".")[0] in stack),
            "jaxcap": sorted(m for m in sys.modules if m.split(".")[0] == "jaxcap")}
  import jaxcap.serving
  out = {"imported": loaded(), "jaxcap_file": jaxcap.__file__}
  c = jaxcap.serving.load(sys.argv[1])
  feats = dict(np.load(sys.argv[2]))
  out["t"] = {m: c.caption(feats, method=m) for m in ("greedy", "beam")}
  out["t"]["default"] = c.caption(feats)
  out["captioned"] = loaded()
  out["installed"] = sorted(m for m in stack if importlib.util.find_spec(m) is not None)
  json.dump(out, open(sys.argv[4], "w"))
""")


def _light(python, path, feats_file, out_file, cwd, env):
  proc = subprocess.run([str(python), "-c", LIGHT, str(path), str(feats_file), json.dumps(TRAINING_STACK),
                         str(out_file)], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(Path(out_file).read_text())


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_importing_jaxcap_serving_loads_what_it_says_and_no_training_stack(transformer, tmp_path):
  # Before, jaxcap/data/__init__.py imported the datasets, readers and vocabulary modules too.
  run, path, _ = transformer
  feats = features(INFO)
  np.savez(tmp_path / "f.npz", **feats)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  got = _light(sys.executable, path, tmp_path / "f.npz", tmp_path / "out.json", tmp_path, env)
  for when in ("imported", "captioned"):
    assert got[when]["stack"] == [], (when, got[when]["stack"])
    assert set(got[when]["jaxcap"]) <= SERVING_MODULES, (when, set(got[when]["jaxcap"]) - SERVING_MODULES)
  check_same(run, feats, got["t"], "transformer, jaxcap.serving alone")


def test_jaxcap_data_names_still_import():
  # jaxcap/data/__init__.py's names are lazy now: every one still imports and lists.
  import jaxcap.data as data
  for name in ("CaptionDataset", "SplitData", "SplitSource", "collate", "NAMES", "complete_data_config",
               "default_data_config", "reader", "load_synthetic", "synthetic_splits", "Vocab",
               "tokenize", "get_dataset"):
    assert getattr(data, name) is not None and name in dir(data), name
  from jaxcap.data import Vocab, base  # noqa: F401  (a name, then a submodule)
  with pytest.raises(AttributeError, match="no attribute 'nothing'"):
    data.nothing


def _distributions(roots) -> list:
  """The installed distributions ``roots`` need, with their requirements (no extras)."""
  import importlib.metadata as md
  from packaging.requirements import Requirement
  seen, todo = {}, list(roots)
  while todo:
    name = todo.pop().lower().replace("_", "-")
    if name in seen:
      continue
    dist = seen[name] = md.distribution(name)
    for spec in dist.requires or ():
      req = Requirement(spec)
      if req.marker is None or req.marker.evaluate({"extra": ""}):
        todo.append(req.name)
  return list(seen.values())


def _light_venv(path: Path) -> Path:
  """A virtual environment that sees, of this one's packages, only pip and what jax, numpy,
  flatbuffers and Pillow need (linked, not copied): `pip install .` then finds pyproject's
  dependencies satisfied and would have to fetch anything else."""
  # Not tests/test_package.py's _venv: its environments see all of this one's packages.
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
  py = path / "bin" / "python"
  purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip())
  linked = path / "linked"
  linked.mkdir()
  for dist in _distributions(["pip", "jax", "numpy", "flatbuffers", "pillow"]):
    root = Path(dist.locate_file(""))
    for top in {Path(f).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
      if (root / top).exists() and not (linked / top).exists():
        (linked / top).symlink_to(root / top)
  (purelib / "_light_parent_env.pth").write_text(f"{linked}\n")
  return py


@pytest.fixture(scope="module")
def light_install(tmp_path_factory) -> Path:
  """docs/USAGE.md's route for a server: `pip install .` in a checkout (no `[train]` extra), in an
  environment without the training stack; its python (the slow tests below share one install)."""
  from tests.test_package import _env, _fresh_clone
  root = tmp_path_factory.mktemp("light_install")
  py = _light_venv(root / "venv")
  clone = _fresh_clone(root / "clone")
  r = subprocess.run([str(py), "-m", "pip", "install", "."], cwd=clone, env=_env(), capture_output=True,
                     text=True, timeout=900)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  return py


@pytest.mark.slow
def test_the_documented_light_install_runs_an_exported_captioner(transformer, light_install, tmp_path):
  # The file captions in the light install as in the full environment.
  from tests.test_package import _env
  run, path, _ = transformer
  feats = features(INFO)
  np.savez(tmp_path / "f.npz", **feats)
  full = _light(sys.executable, path, tmp_path / "f.npz", tmp_path / "full.json", tmp_path,
                dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)))
  py = light_install
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  got = _light(py, path, tmp_path / "f.npz", tmp_path / "light.json", elsewhere, _env())
  assert got["installed"] == [], got["installed"]  # none of the training stack is there at all
  assert got["jaxcap_file"].startswith(str(py.parent.parent)), got["jaxcap_file"]
  assert got["t"] == full["t"]
  check_same(run, feats, got["t"], "transformer, light install")


@pytest.mark.slow
def test_every_installed_program_of_the_light_install_runs_or_names_the_install_it_needs(light_install, tmp_path):
  # setuptools installs every console script whatever the extras: each one of pyproject.toml
  # either runs (--help lists its flags) or says in one line that it needs the train extra
  # (jaxcap.entry), exit 2, no traceback, nothing written.
  import tomllib
  from tests.test_package import _env
  scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
  assert "jaxcap-serve" in scripts, scripts
  for script in scripts:
    proc = subprocess.run([str(light_install.parent / script), "--help"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
      assert "usage:" in proc.stdout, (script, proc.stdout[-2000:])
      continue
    assert proc.returncode == 2, (script, proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, (script, proc.stdout, proc.stderr[-2000:])
    assert proc.stderr.startswith(f"error: {script} needs the training install (no module named "), proc.stderr
    assert 'train extra: pip install ".[train]"' in proc.stderr, proc.stderr
  assert list(tmp_path.iterdir()) == []
