"""benchmarks/report.py: the docs' benchmark tables come from the committed JSON records."""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import report  # noqa: E402


def test_docs_tables_match_the_committed_records():
  assert report.main(["--check"]) == 0, "run python benchmarks/report.py"


def _row(**kw):
  row = {"model": "transformer", "what": "train", "dtype": "float32", "batch": 50, "beam": None,
         "images_per_s": 3265.0, "step_ms": 15.3, "spread": 0.02, "gflop_per_image": 19.2, "mfu": 0.31,
         "compile_s": 40.0}
  row.update(kw)
  return row


def test_render_names_the_record_and_compares_h100_rows_with_pytorch(tmp_path):
  rec = {"environment": {"device_kind": "NVIDIA H100 80GB HBM3", "device_count": 1, "date": "2026-11-23T10:00:00Z",
                         "jax": "0.11.2", "cuda": {"cuda_runtime": 12080}, "git_commit": "abcdef1234567"},
         "rows": [_row(), _row(what="beam", beam=3, images_per_s=2660.0, mfu=None), _row(model="eta")]}
  (tmp_path / "h100.json").write_text(json.dumps(rec))
  text = report.render(report.load_records(str(tmp_path)))
  assert "NVIDIA H100" in text and "abcdef1234" in text and "2026-11-23" in text
  lines = [l for l in text.splitlines() if l.startswith("| transformer")]
  assert "5.0× (653)" in lines[0] and "31.0%" in lines[0]
  assert "10.0× (266)" in lines[1] and "beam-3" in lines[1]
  eta = [l for l in text.splitlines() if l.startswith("| eta")][0]
  assert eta.endswith("| – |")  # no PyTorch reference for ETA


def test_a_cpu_record_gets_no_speedup_column(tmp_path):
  rec = {"environment": {"device_kind": "cpu", "device_count": 1, "date": "2026-11-23T10:00:00Z", "jax": "0.10.2",
                         "cuda": None, "git_commit": None}, "rows": [_row(images_per_s=4.5, mfu=None)]}
  (tmp_path / "cpu.json").write_text(json.dumps(rec))
  line = [l for l in report.render(report.load_records(str(tmp_path))).splitlines() if l.startswith("| transformer")][0]
  assert "×" not in line


def test_notes_name_the_reward_share_and_the_profiled_device_busy_share(tmp_path):
  rec = {"environment": {"device_kind": "NVIDIA H200", "device_count": 1, "date": "2026-11-23T10:00:00Z",
                         "jax": "0.11.2", "cuda": None, "git_commit": None},
         "rows": [_row(what="scst", samples=5, reward_share=0.18),
                  _row(what="sample", samples=5, profile={"busy_pct": 71.0, "kernels": 3000}),
                  _row(profile={"note": "no device stream events in the trace (CPU run?)"})]}
  (tmp_path / "h200.json").write_text(json.dumps(rec))
  lines = [l for l in report.render(report.load_records(str(tmp_path))).splitlines() if l.startswith("| transformer")]
  assert "| reward 18% of the step |" in lines[0]
  assert "sample ×5" in lines[1] and "| device busy 71%, 1,000 kernels/step |" in lines[1]
  assert "| – | – |" in lines[2]
