"""The benchmark scripts still run (tiny sizes; their numbers are not checked here)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_TINY_SHAPES = ["--regions", "4", "--feat_dim", "16", "--vocab", "50", "--words", "5"]
_TINY_MODELS = ",".join(f"{k}={v}" for k, v in {
    "dim": 16, "num_heads": 2, "ff_dim": 32, "hidden_dim": 16, "embed_dim": 16, "att_dim": 16,
    "max_steps": 2, "steps": 2}.items())
_TINY_RUN = ["--batch", "8", "--eval_batch", "8", "--steps", "1", "--windows", "1", "--warmup", "0",
             "--layers", "1", "--samples", "2", "--train_images", "20", "--out", "{tmp}/bench.json", *_TINY_SHAPES]
_TINY_TRANSFORMER = ["--set", "dim=16,num_heads=2,ff_dim=32"]  # --set names fields of the models run

# "script[:case]" -> arguments at tiny sizes.
TINY = {
    # Every registered model's training step and beam search (the tables' two rows) ...
    "run.py": ["--models", "all", "--what", "train,beam", "--set", _TINY_MODELS, *_TINY_RUN],
    # ... and every step kind of one model, traced (a CPU trace has no device plane: the rows
    # say so), with a faster PRNG (the JSON records are checked below). Every kind of every
    # model (45 compilations) outlasts the test's 10 minutes on a shared 2-core machine.
    "run.py:kinds": ["--models", "transformer", "--profile", "{tmp}/prof", "--prng", "rbg", *_TINY_TRANSFORMER,
                     *_TINY_RUN],
    # Translation shapes: one target per source sentence, a source of its own vocabulary and length.
    "run.py:translation": ["--models", "mnmt", "--captions", "1", "--src_vocab", "40", "--src_words", "7",
                           "--what", "train,beam", "--set", "hidden_dim=16,embed_dim=16,att_dim=16,modalities=text",
                           *_TINY_RUN],
    "features.py": ["--backbones", "resnet50,vit_b16", "--sizes", "32,48", "--dtype", "float32,bfloat16",
                    "--batch", "1", "--steps", "1", "--windows", "1", "--warmup", "0", "--out", "{tmp}/bench.json"],
    # FSDP splits arrays of >= 256 elements here (the tiny ViT's and Transformer's kernels).
    "sharded_memory.py": ["--fields", '{{"image_size": 32, "patch": 8, "dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64}}',  # str.format
                          "--size", "32", "--set", "dim=32,num_heads=2,ff_dim=64,num_layers=1,num_dec_layers=1",
                          "--vocab", "50", "--words", "5", "--batch", "8", "--remat", "0,1", "--min_elements", "256",
                          "--steps", "1", "--devices", "8", "--out", "{tmp}/bench.json"],
    "tpgn.py": ["--d", "3", "--batch", "4", "--vocab", "50", "--words", "5", "--steps", "1"],
    "clip_score.py": ["--pairs", "3", "--size", "tiny", "--batch", "2", "--out", "{tmp}/bench.json"],
    "clip_reward_step.py": ["--config", "configs/transformer.py:synthetic,tiny", "--clip", "tiny", "--batch", "8",
                            "--steps", "1", "--set", "dim=16,num_heads=2", "--out", "{tmp}/bench.json"],
    # The tests' tiny detector and its weights (tests/detection/fixtures), both dtypes.
    "detector.py": ["--small", "--batch", "1,2", "--windows", "1", "--steps", "1", "--out", "{tmp}/bench.json"],
    "checkpoint_save.py": ["--config", "configs/transformer.py:synthetic,tiny", "--model-as-configured",
                           "--batch", "8", "--steps", "2", "--every", "1", "--repeats", "1",
                           "--dir", "{tmp}", "--out", "{tmp}/bench.json"],
    "export.py": ["--config", "configs/transformer.py:synthetic,tiny", "--batches", "1,2", "--repeats", "1",
                  "--out", "{tmp}/bench.json"],
    "decode_aux.py": ["--config", "configs/transformer.py:synthetic,tiny", "--batch", "8", "--repeats", "1",
                      "--out", "{tmp}/bench.json"],
    # Three tiny train.py runs (1 device, 2 forced devices replicated and FSDP), a loss per step.
    "mesh_drift.py": ["--config", "configs/transformer.py:synthetic,tiny", "--steps", "3", "--batch", "8",
                      "--devices", "2", "--set=--config.eval_num_images=8", "--out", "{tmp}/bench.json"],
    # The loader, then train.py's loop from the .npz files against its step alone.
    # The importers' tiny self-critical Transformer and M2 model, jaxcap's routes only (no torch in the tests).
    "cpu_side_by_side.py": ["--checkpoint", "tests/importers/fixtures/self_critical/transformer/model.safetensors",
                            "--infos", "tests/importers/fixtures/self_critical/transformer/infos_transformer.pkl",
                            "--m2_checkpoint", "tests/papers/m2/fixtures/import/meshed_memory_transformer.pth",
                            "--m2_vocab", "tests/papers/m2/fixtures/import/vocab.pkl",
                            "--images", "4", "--regions", "5", "--b1_images", "2", "--b1_repeats", "2",
                            "--repeats", "1", "--out", "{tmp}/bench.json"],
    "input_pipeline.py": ["--images", "40", "--batch", "8", "--batches", "2", "--threads", "0", "--workers", "0",
                          "--loop_steps", "4", "--log_every", "2",
                          "--set", "dim=16,num_heads=2,ff_dim=32,num_layers=1,num_dec_layers=1"],
}


def _check_record(case, path):
  import json
  from jaxcap.models import registry
  record = json.loads(path.read_text())
  assert record["environment"]["jax"] and record["environment"]["device_kind"]
  rows = {(r["model"], r["what"]) for r in record["rows"]}
  if case == "run.py:translation":
    assert rows == {("mnmt", "train"), ("mnmt", "beam")}
    assert record["shapes"]["captions_per_image"] == 1 and record["shapes"]["src_vocab"] == 40
  elif case == "run.py:kinds":
    assert rows == {("transformer", w) for w in ("train", "greedy", "beam", "sample", "scst")}
    assert all("note" in r["profile"] for r in record["rows"])  # CPU: no device plane
  else:
    trainable = [n for n in registry.names() if getattr(registry.get(n), "trainable", True)]
    assert rows == {(m, w) for m in trainable for w in ("train", "beam")}
  for r in record["rows"]:
    assert r["images_per_s"] > 0 and r["gflop_per_image"] > 0 and r["step_ms"] > 0, r
    assert (r["reward_share"] is not None) == (r["what"] == "scst"), r


# The scripts run under the suite's XLA_FLAGS (8 fake CPU devices), so batches are multiples of 8.
@pytest.mark.slow
# run.py on every registered model (minutes of CPU) is heavy (pytest.ini); its other cases cover
# run.py's kinds, translation and the other scripts.
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.heavy) if c == "run.py" else c
                                  for c in sorted(TINY)])
def test_benchmark_runs(case, tmp_path):
  script = case.split(":")[0]
  args = [a.format(tmp=tmp_path) for a in TINY[case]]
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  if script == "run.py":
    _check_record(case, tmp_path / "bench.json")
  elif script == "clip_score.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["pairs"] == 3 and [r["scorer"] for r in record["rows"]] == ["jaxcap", "jaxcap"]
    assert all(r["pairs_per_s"] > 0 for r in record["rows"]) and record["environment"]["device_kind"]
  elif script == "clip_reward_step.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    assert [r["reward"] for r in record["rows"]] == ["cider", "clip"] and record["clip_over_cider"] > 0
    assert record["model"]["dim"] == 16 and record["model"]["num_heads"] == 2  # --set reached the model
  elif script == "detector.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["dtype"], r["batch"]) for r in record["rows"]] == [
        ("float32", 1), ("float32", 2), ("bfloat16", 1), ("bfloat16", 2)]
    # the selection's bounds (3-12 regions for the tiny settings) held on every photo
    assert all(3 <= r["regions_min"] <= r["regions_max"] <= 12 and r["device_photos_per_s"] > 0
               and r["end_to_end_photos_per_s"] > 0 for r in record["rows"]), record["rows"]
  elif script == "features.py":
    import json
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    # a ViT runs at its own side only; a ResNet at every --sizes
    assert [(r["backbone"], r["size"], r["dtype"]) for r in rows] == [
        ("resnet50", 32, "float32"), ("resnet50", 48, "float32"), ("resnet50", 32, "bfloat16"),
        ("resnet50", 48, "bfloat16"), ("vit_b16", 224, "float32"), ("vit_b16", 224, "bfloat16")]
    assert all(r["images_per_s"] > 0 and r["gflop_per_image"] > 0 for r in rows), rows
  elif script == "cpu_side_by_side.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    rows = record["rows"]
    routes = ("Run.caption", "artefact", "jaxcap-serve")
    assert [(r["model"], r["route"], r["method"], r["beam_size"]) for r in rows] == [
        ("sc_transformer", route, m, k) for m, k in (("greedy", 1), ("beam", 3)) for route in routes] + [
        ("m2", route, "beam", 5) for route in routes]
    # Every route captions the images as Run.caption does, at batch 1 and 4.
    assert all(r["same_as_run_caption"] and r["b1_median_s"] > 0 and r["batch_median_s"] > 0 for r in rows), rows
    # Each row's caption lengths: mean within its range, the empty ones counted.
    assert all(r["words_min"] <= r["mean_words"] <= r["words_max"] <= 20 and r["empty_captions"] <= 4
               and (r["empty_captions"] > 0) == (r["words_min"] == 0) for r in rows), rows
    assert record["models"]["sc_transformer"]["fields"]["num_layers"] == 2
    assert record["models"]["m2"]["decode"]["beam_mode"] == "in_slots"
    assert not any("reference" in m for m in record["models"].values())
    # The batch-1 breakdown: every kernel of the model in exactly one part; the report renders it.
    fl = record["floor"]
    assert fl["kernels"]["encoder"] + fl["kernels"]["step"] == fl["kernels"]["all"] > 0, fl
    assert fl["encoder"]["jaxcap_ms"] > 0 and fl["step"]["numpy_ms"] > 0 and fl["steps_at_max_len_20"] >= 1, fl
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import report  # noqa: PLC0415
    table = report.side_by_side_table(dict(record, _file="bench.json"))
    assert "| one decoding step (1 row) |" in table
    assert f"| {rows[0]['mean_words']:.1f} ({rows[0]['words_min']}-{rows[0]['words_max']}) |" in table
  elif script == "export.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["method"], r["batch"]) for r in record["rows"]] == [("greedy", 1), ("greedy", 2), ("beam", 1), ("beam", 2)]
    assert record["file_bytes"] > record["params_bytes"] > 0 and record["platforms"] == ["cpu", "cuda"]
    assert all(r["artefact_ms"] > 0 and r["run_ms"] > 0 for r in record["rows"])
  elif script == "decode_aux.py":
    import json
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(r["method"], r["variant"]) for r in rows] == [
        (m, v) for m in ("greedy", "beam-3") for v in ("no aux code", "return_aux=False", "return_aux=True")]
    # Not asking for the aux compiles to the program of a decoder without it (dead code).
    assert all(r["same_program_as_no_aux_code"] and r["control_program_with_aux_differs"]
               for r in rows if r["variant"] == "return_aux=False"), rows
  elif script == "sharded_memory.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["rule"], r["remat"]): r for r in record["rows"]}
    assert set(rows) == {(a, b) for a in ("replicated", "fsdp") for b in (False, True)} and record["devices"] == 8
    assert all(r["images_per_s"] > 0 and r["memory"]["arguments"] > 0 for r in rows.values())
    # The state a device holds shrinks under FSDP, in the shard shapes and in the compiled program.
    assert 0 < record["fsdp_over_replicated"]["remat=0,batch=8"] < 0.6
    assert 0 < record["fsdp_over_replicated_compiled"]["remat=0,batch=8"] < 0.6
  elif script == "tpgn.py":
    assert '"dominant"' in out.stdout, out.stdout
  elif script == "mesh_drift.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["run"]: r for r in record["rows"]}
    assert list(rows) == ["1 device", "2 devices replicated", "2 devices fsdp"], list(rows)
    assert all(len(r["losses"]) == 3 for r in rows.values()), rows
    # Three steps from the same initial state: the meshes agree far inside the record's first threshold.
    for name in ("2 devices replicated", "2 devices fsdp"):
      d = rows[name]["drift"]
      assert d["steps"] == [1, 2, 3] and d["max_relative"] < 1e-5 and d["first_step_over"]["1e-05"] is None, d
  elif script == "checkpoint_save.py":
    import json
    record = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["mode"]: r for r in record["rows"]}
    assert set(rows) == {"none", "sync", "async"} and record["environment"]["device_kind"]
    assert all(r["loop_s"] > 0 and r["saves"] == 2 for r in rows.values())
    assert not list(tmp_path.glob("jaxcap_ckpt_bench_*"))  # its checkpoints are removed
  else:
    assert "loop / step" in out.stdout and "images/s" in out.stdout, out.stdout


# A GPU image has jax, flax, optax and numpy only: run.py, tpgn.py, features.py and report.py must run
# without grain, tensorflow_datasets, ml_collections and pycocoevalcap (an import of any fails).
_BLOCKED = ("grain", "tensorflow_datasets", "tensorflow", "ml_collections", "pycocoevalcap")
_WITHOUT = """
import sys
class _Block:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in {blocked!r}:
      raise ImportError("blocked on a bare GPU image: " + name)
sys.meta_path.insert(0, _Block())
sys.argv = {argv!r}
sys.path.insert(0, {bench!r})
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("script,args", [
    ("run.py", ["--models", "transformer", "--what", "train,scst", *_TINY_TRANSFORMER, *_TINY_RUN]),
    ("tpgn.py", TINY["tpgn.py"]),
    ("features.py", ["--backbones", "resnet50", "--sizes", "32", "--batch", "1", "--steps", "1", "--windows", "1",
                     "--out", "{tmp}/f.json"]),
    ("report.py", ["--print"]),
])
def test_runs_without_grain_tfds_ml_collections(script, args, tmp_path):
  argv = [os.path.join(ROOT, "benchmarks", script), *[a.format(tmp=tmp_path) for a in args]]
  code = _WITHOUT.format(blocked=_BLOCKED, argv=argv, bench=os.path.join(ROOT, "benchmarks"))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]


# Bad flag values: one ``error:`` line naming the flag and what it expects, exit code 2, nothing
# written; every benchmark script at least once (common.py is a module, not a script).
BAD_FLAGS = [
    ("cider_throughput.py", ["--images", "0"], "--images"),
    ("clip_score.py", ["--pairs", "0"], "--pairs"),
    ("clip_reward_step.py", ["--config", "configs/transformer.py:flickr8k"], "--config"),
    ("clip_reward_step.py", ["--set", "depth=3"], "--set"),
    ("detector.py", ["--hw", "480by640"], "--hw"),
    ("detector.py", ["--batch", "1,0"], "--batch"),
    ("features.py", ["--backbones", "resnet7"], "--backbones"),
    ("features.py", ["--sizes", "0"], "--sizes"),
    ("input_pipeline.py", ["--threads", "1,x"], "--threads"),
    ("input_pipeline.py", ["--loop_steps", "2", "--model", "bogus"], "--model"),
    ("report.py", ["--results", "{tmp}/nowhere", "--print"], "--results"),
    ("run.py", ["--models", "bogus"], "--models"),
    ("run.py", ["--models", "transformer,nearest_neighbour"], "--models"),
    ("run.py", ["--batch", "0"], "--batch"),
    ("run.py", ["--eval_batch", "8,x"], "--eval_batch"),
    ("run.py", ["--dtype", "float16"], "--dtype"),
    ("run.py", ["--what", "train,nope"], "--what"),
    ("run.py", ["--captions", "0"], "--captions"),
    ("run.py", ["--set", "nope=1"], "--set"),
    ("tpgn.py", ["--steps", "0"], "--steps"),
    ("sharded_memory.py", ["--rules", "replicated,zero3"], "--rules"),
    ("sharded_memory.py", ["--remat", "2"], "--remat"),
    ("export.py", ["--batches", "1,0"], "--batches"),
    ("export.py", ["--repeats", "0"], "--repeats"),
    ("decode_aux.py", ["--repeats", "0"], "--repeats"),
    ("checkpoint_save.py", ["--every", "0"], "--every"),
    ("mesh_drift.py", ["--batch", "10", "--devices", "4"], "--batch"),
    ("mesh_drift.py", ["--set", "steps=3"], "--set"),
    ("checkpoint_save.py", ["--steps", "4", "--every", "8"], "--every"),
    ("cpu_side_by_side.py", ["--checkpoint", "{tmp}/model.safetensors", "--infos", "{tmp}/infos.pkl"], "--checkpoint"),
    ("cpu_side_by_side.py", ["--torch-python", "python3"], "--torch-python"),
    ("cpu_side_by_side.py", ["--images", "0"], "--images"),
]


def test_every_benchmark_script_is_covered():
  # side_by_side_torch.py: cpu_side_by_side.py's reference side, run under a torch Python with the
  # job file the benchmark writes (its --torch-python), not a user's command.
  scripts = {f for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py")} - {
      "common.py", "side_by_side_torch.py"}
  assert {s for s, _, _ in BAD_FLAGS} == scripts


@pytest.mark.slow
@pytest.mark.parametrize("script,args,flag", BAD_FLAGS,
                         ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD_FLAGS])
def test_a_bad_flag_value_is_one_line_and_exit_2(tmp_path, script, args, flag):
  argv = [sys.executable, os.path.join(ROOT, "benchmarks", script), *[a.format(tmp=tmp_path) for a in args]]
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith(f"error: {flag}") and "expected" in lines[0], proc.stderr[-2000:]
  assert os.listdir(tmp_path) == []  # nothing written


@pytest.mark.slow
def test_a_failing_row_is_recorded_and_the_other_rows_go_on(tmp_path, monkeypatch):
  """A row that fails (e.g. out of memory at a large batch) is one line and an ``error`` row; the
  record keeps every other row."""
  import json
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  import run as bench_run

  def broken(*a, **k):
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory\nmore detail")

  monkeypatch.setattr(bench_run, "bench_decode", broken)
  out = tmp_path / "bench.json"
  bench_run.main(["--models", "show_tell", "--what", "greedy,train", "--set", "hidden_dim=16,embed_dim=16",
                  *[a.format(tmp=tmp_path) for a in _TINY_RUN]])
  rows = json.loads(out.read_text())["rows"]
  import report
  assert {k: rows[0][k] for k in ("model", "what", "dtype", "batch", "reward", "error")} == {
      "model": "show_tell", "what": "greedy", "dtype": "float32", "batch": 8, "reward": None,
      "error": "RuntimeError: RESOURCE_EXHAUSTED: out of memory"}
  assert {k: rows[0][k] for k in report.VARIANT_FIELDS} == dict(  # the run's variant, as on a measured row
      dict.fromkeys(report.VARIANT_FIELDS), layers=1, overrides="hidden_dim=16,embed_dim=16")
  assert rows[1]["what"] == "train" and rows[1]["images_per_s"] > 0


@pytest.mark.slow
def test_a_failed_variant_row_keeps_its_variant_fields(tmp_path, monkeypatch):
  """A variant that fails (a cuDNN attention row, a flattened optimizer, no dropout) is recorded
  with the same variant fields as a measured row, so the table names the variant that failed
  rather than showing the plain step as failed."""
  import json
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  import report
  import run as bench_run

  def broken(*a, **k):
    raise RuntimeError("cuDNN: no supported kernel")

  monkeypatch.setattr(bench_run, "bench_train", broken)
  bench_run.main(["--models", "show_tell", "--what", "train", "--set", "hidden_dim=16,embed_dim=16",
                  "--dropout", "0", "--optimizer", "flat_adam", *[a.format(tmp=tmp_path) for a in _TINY_RUN]])
  rec = json.loads((tmp_path / "bench.json").read_text())
  (row,) = rec["rows"]
  assert {k: row[k] for k in report.VARIANT_FIELDS} == dict(
      dict.fromkeys(report.VARIANT_FIELDS), dropout=0.0, optimizer="flat_adam", layers=1,
      overrides="hidden_dim=16,embed_dim=16"), row
  assert row["error"] == "RuntimeError: cuDNN: no supported kernel"
  rec["_file"] = "bench.json"
  line = [l for l in report.record_table(rec).splitlines() if l.startswith("| show_tell")][0]
  assert line.startswith("| show_tell | train, dropout 0.0, optimizer flat_adam, layers 1, overrides "
                         "hidden_dim=16,embed_dim=16 | float32 | 8 | failed: RuntimeError: cuDNN"), line


def _scatter_add_dtypes(embed_module) -> set:
  """The dtypes of the scatter-adds in the gradient of a bfloat16 embedding lookup."""
  import jax
  import jax.numpy as jnp
  ids = jnp.array([[1, 2, 1]])
  params = embed_module.init(jax.random.PRNGKey(0), ids)
  from jax.extend import core

  def eqns(jaxpr):  # nested jaxprs (pjit, custom_jvp) included
    for e in jaxpr.eqns:
      yield e
      for v in e.params.values():
        for sub in (v if isinstance(v, (list, tuple)) else [v]):
          if isinstance(sub, (core.Jaxpr, core.ClosedJaxpr)):
            yield from eqns(getattr(sub, "jaxpr", sub))

  closed = jax.make_jaxpr(jax.grad(lambda p: embed_module.apply(p, ids).astype(jnp.float32).sum()))(params)
  return {str(e.outvars[0].aval.dtype) for e in eqns(closed.jaxpr) if e.primitive.name == "scatter-add"}


@pytest.mark.slow
def test_embed_table_restores_flax_cast_then_gather(tmp_path, monkeypatch):
  """``--embed table`` (the A/B of layers.Embed on a GPU): rows say so, and the embedding's
  gradient is flax's bfloat16 scatter-add again instead of layers.Embed's float32 one."""
  import json
  import jax.numpy as jnp
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  import run as bench_run
  from jaxcap.models import layers

  embed = layers.Embed(num_embeddings=10, features=4, dtype=jnp.bfloat16)
  assert _scatter_add_dtypes(embed) == {"float32"}
  monkeypatch.setattr(layers.Embed, "__call__", layers.Embed.__call__)  # restored after the test
  bench_run.main(["--models", "transformer", "--what", "train", "--dtype", "bfloat16", "--embed", "table",
                  *_TINY_TRANSFORMER, *[a.format(tmp=tmp_path) for a in _TINY_RUN]])
  rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
  assert [(r["embed"], r["images_per_s"] > 0) for r in rows] == [("table", True)]
  assert _scatter_add_dtypes(embed) == {"bfloat16"}
