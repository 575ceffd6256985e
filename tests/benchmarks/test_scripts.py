"""The benchmark scripts still run (tiny sizes; their numbers are not checked here)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = {
    "decode.py": ["--batch-size", "2", "--max-len", "4", "--iters", "1"],
    "train_throughput.py": ["--batch", "8", "--layers", "1", "--steps", "1", "--windows", "1", "--warmup", "1",
                            "--dtype", "float32", "--regions", "4", "--feat_dim", "16", "--vocab", "50",
                            "--words", "5", "--prng", "rbg", "--profile", "{tmp}"],
    "scst_step.py": ["--batch", "8", "--samples", "2", "--layers", "1", "--steps", "1", "--regions", "4",
                     "--feat_dim", "16", "--vocab", "50", "--words", "5", "--train_images", "20"],
    "aat.py": ["--dim", "32", "--heads", "2", "--batch", "2", "--regions", "4", "--feat_dim", "16",
               "--vocab", "50", "--words", "5", "--eval_batch", "2", "--iters", "1"],
    "tpgn.py": ["--d", "3", "--batch", "8", "--feat_dim", "16", "--vocab", "50", "--words", "5",
                "--eval_batch", "8", "--steps", "1"],
    "input_pipeline.py": ["--images", "100", "--batches", "2", "--threads", "0"],
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
