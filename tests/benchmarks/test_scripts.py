"""The benchmark scripts still run (tiny sizes; their numbers are not checked here)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = {
    "decode.py": ["--batch", "8", "--words", "4", "--steps", "1"],
    "train_throughput.py": ["--batch", "8", "--layers", "1", "--steps", "1", "--windows", "1", "--warmup", "1",
                            "--dtype", "float32", "--regions", "4", "--feat_dim", "16", "--vocab", "50",
                            "--words", "5", "--prng", "rbg", "--profile", "{tmp}"],
    "scst_step.py": ["--batch", "8", "--samples", "2", "--layers", "1", "--steps", "1", "--regions", "4",
                     "--feat_dim", "16", "--vocab", "50", "--words", "5", "--train_images", "20"],
    "aat.py": ["--dim", "32", "--heads", "2", "--batch", "2", "--regions", "4", "--feat_dim", "16",
               "--vocab", "50", "--words", "5", "--eval_batch", "2", "--steps", "1"],
    "tpgn.py": ["--d", "3", "--batch", "8", "--feat_dim", "16", "--vocab", "50", "--words", "5",
                "--eval_batch", "8", "--steps", "1"],
    "input_pipeline.py": ["--images", "100", "--batches", "2", "--threads", "0"],
    # Every registered model, every step kind, at tiny sizes (the JSON is checked below).
    "run.py": ["--models", "all", "--batch", "8", "--eval_batch", "8", "--steps", "1", "--windows", "1",
               "--warmup", "0", "--layers", "1", "--regions", "4", "--feat_dim", "16", "--vocab", "50",
               "--words", "5", "--samples", "2", "--train_images", "20", "--out", "{tmp}/bench.json",
               "--set", ",".join(f"{k}={v}" for k, v in {
                   "dim": 16, "num_heads": 2, "ff_dim": 32, "hidden_dim": 16, "embed_dim": 16, "att_dim": 16,
                   "max_steps": 2, "steps": 2}.items())],
    "image_transformer.py": ["--dim", "32", "--heads", "2", "--batch", "8", "--regions", "5", "--feat_dim", "16",
                             "--vocab", "50", "--words", "5", "--eval_batch", "8", "--steps", "1"],
    "mnmt.py": ["--embed", "8", "--hidden", "8", "--batch", "8", "--cells", "4", "--feat_dim", "16",
                "--vocab", "50", "--src_vocab", "40", "--src_words", "5", "--words", "5",
                "--beam", "3", "--eval_batch", "8", "--steps", "1"],
}


# The scripts run under the suite's XLA_FLAGS (8 fake CPU devices), so batches are multiples of 8.
@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY))
def test_benchmark_runs(script, tmp_path):
  args = [a.format(tmp=tmp_path) for a in TINY[script]]
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "images" in out.stdout.lower() or "img" in out.stdout.lower(), out.stdout
  if script == "run.py":
    import json
    from jaxcap.models import registry
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["environment"]["jax"] and record["environment"]["device_kind"]
    rows = {(r["model"], r["what"]) for r in record["rows"]}
    trainable = [n for n in registry.names() if getattr(registry.get(n), "trainable", True)]
    assert rows == {(m, w) for m in trainable for w in ("train", "greedy", "beam", "scst")}
    for r in record["rows"]:
      assert r["images_per_s"] > 0 and r["gflop_per_image"] > 0 and r["step_ms"] > 0, r


# Bad flag values: one ``error:`` line naming the flag and what it expects, exit code 2, nothing
# written; every benchmark script at least once (common.py is a module, not a script).
BAD_FLAGS = [
    ("aat.py", ["--batch", "0"], "--batch"),
    ("cider_throughput.py", ["--images", "0"], "--images"),
    ("decode.py", ["--methods", "greedy,nope"], "--methods"),
    ("image_transformer.py", ["--heads", "x"], "--heads"),
    ("input_pipeline.py", ["--threads", "1,x"], "--threads"),
    ("mnmt.py", ["--variant", "mnmt99"], "--variant"),
    ("report.py", ["--results", "{tmp}/nowhere", "--print"], "--results"),
    ("run.py", ["--models", "bogus"], "--models"),
    ("run.py", ["--models", "transformer,nearest_neighbour"], "--models"),
    ("run.py", ["--batch", "0"], "--batch"),
    ("run.py", ["--eval_batch", "8,x"], "--eval_batch"),
    ("run.py", ["--dtype", "float16"], "--dtype"),
    ("run.py", ["--what", "train,nope"], "--what"),
    ("scst_step.py", ["--dtype", "float16"], "--dtype"),
    ("tpgn.py", ["--steps", "-1"], "--steps"),
    ("train_throughput.py", ["--batch", "8,0"], "--batch"),
]


def test_every_benchmark_script_is_covered():
  scripts = {f for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py")} - {"common.py"}
  assert {s for s, _, _ in BAD_FLAGS} == scripts


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
