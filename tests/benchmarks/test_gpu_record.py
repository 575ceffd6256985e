"""benchmarks/gpu_record.sh (the one-call GPU record) in its tiny CPU mode, then report --collect."""

import json
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import report  # noqa: E402


@pytest.mark.slow
def test_gpu_record_small_parts_precompiled_timed_and_collected(tmp_path):
  env = dict(os.environ, SMALL="1", ONLY="t2,t8", NO_REFS="1", BUDGET_S="600", TIMED_S="300",
             OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), PYTHON=sys.executable,
             JAXCAP_GIT_COMMIT="0123456789abcdef")
  env.pop("XLA_FLAGS", None)  # one CPU device: the tiny batches of 2 need not divide by 8
  r = subprocess.run(["bash", os.path.join("benchmarks", "gpu_record.sh")], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "precompile done" in r.stdout and "skipped" not in r.stdout, r.stdout[-3000:]
  src, dest = tmp_path / "src", tmp_path / "results"
  with tarfile.open(tmp_path / "out" / "records.tgz") as tar:
    tar.extractall(src)
  written = sorted(os.path.basename(p) for p in report.collect(str(src), str(dest), note="smoke"))
  assert len(written) == 2 and written[0].startswith("cpu_") and written[1].startswith("features_cpu_")
  rec = json.loads((dest / written[0]).read_text())
  assert rec["environment"]["git_commit"] == "0123456789abcdef" and rec["note"] == "smoke"
  assert [(x["what"], x.get("reward")) for x in rec["rows"]] == [
      ("greedy", None), ("beam", None), ("scst", "device"), ("scst", "host")]
  # every row was compiled by the precompile pass, and the timed pass loaded it from the cache
  assert all(x["compile_s_cold"] is not None for x in rec["rows"]), rec["rows"]
  assert rec["environment"]["compilation_cache_dir"]
  features = json.loads((dest / written[1]).read_text())
  assert {x["backbone"] for x in features["rows"]} == {"resnet101", "vit_b16"}
