"""benchmarks/gpu_record.sh (the one-call GPU record): the commands docs/PERFORMANCE.md gives for
the next GPU session run here as written, in the script's tiny CPU mode, then report --collect."""

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import report  # noqa: E402
from tests import fast_compile  # noqa: E402

SCRIPT = os.path.join("benchmarks", "gpu_record.sh")


def next_session_commands() -> list[dict]:
  """The environment assignments of each command of docs/PERFORMANCE.md's "Next GPU session"
  block; each command must be ``[VAR=value ...] bash benchmarks/gpu_record.sh`` and must not set
  OUT (the GPU host's runner sets it to the folder that comes back)."""
  with open(os.path.join(ROOT, "docs", "PERFORMANCE.md")) as f:
    text = f.read()
  block = re.search(r"### Next GPU session\s*\n+```bash\n(.*?)\n```", text, re.S)
  assert block, "docs/PERFORMANCE.md: no bash block under 'Next GPU session'"
  commands = []
  for line in block.group(1).splitlines():
    words = shlex.split(line, comments=True)
    if not words:
      continue
    env = {}
    while re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
      key, _, value = words.pop(0).partition("=")
      env[key] = value
    assert words == ["bash", SCRIPT], line
    assert "OUT" not in env and "WORK" not in env, line
    commands.append(env)
  return commands


def _script_parts() -> dict:
  """``{part name: its arguments}`` of the script's PARTS, in order."""
  with open(os.path.join(ROOT, SCRIPT)) as f:
    block = re.search(r"^PARTS=\((.*?)^\)", f.read(), re.S | re.M).group(1)
  return dict(re.findall(r'"(\w+)\|([^"]*)"', block))


def _groups_kept(only: str | None) -> int:
  """How many precompile groups of the script hold a part of ``only`` (its ONLY rule; None: all)."""
  with open(os.path.join(ROOT, SCRIPT)) as f:
    block = re.search(r"^PRECOMPILE=\(([^)]*)\)", f.read(), re.M).group(1)
  groups = re.findall(r'"([^"]+)"', block)
  keep = set(only.split(",")) if only else {item.split(":")[0] for g in groups for item in g.split()}
  return sum(any(item.split(":")[0] in keep for item in g.split()) for g in groups)


def test_without_out_the_script_refuses_to_start(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "OUT"}
  env.update(SMALL="1", WORK=str(tmp_path / "work"))
  r = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "OUT" in r.stderr, r.stderr
  assert not (tmp_path / "work").exists()


def test_the_documented_commands_are_parsed():
  commands = next_session_commands()
  assert commands
  parts = _script_parts()
  for c in commands:
    assert set(c.get("ONLY", ",".join(parts)).split(",")) <= set(parts), c


@pytest.mark.slow
@pytest.mark.heavy  # 1.5-3 min each on 2 cores (pytest.ini)
@pytest.mark.parametrize("index", range(len(next_session_commands())))
def test_next_session_command_runs_in_small_mode_and_is_collected(tmp_path, index):
  """The documented command as written (its ONLY, budgets and switches), with SMALL=1 and the
  environment a GPU host's runner gives (OUT); the script names the checkout's commit itself."""
  documented = next_session_commands()[index]
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXCAP_GIT_COMMIT", "WORK")}
  # one CPU device (the tiny batches of 2 need not divide by 8), compiling under the tests' fast
  # flags (the smoke run's rows are compiled, not timed: the first command 93 -> 73 s alone);
  # OUT as the runner sets it
  env.update(documented, SMALL="1", OUT=str(tmp_path / "out"), PYTHON=sys.executable, TMPDIR=str(tmp_path),
             XLA_FLAGS=fast_compile.FLAGS)
  r = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  groups = _groups_kept(documented.get("ONLY"))
  assert f"[precompile: {groups} processes at once]" in r.stdout and "precompile done" in r.stdout
  work = [p for p in os.listdir(tmp_path) if p.startswith("jaxcap_gpu_work.")]
  assert len(work) == 1, os.listdir(tmp_path)  # a fresh work folder of its own
  src, dest = tmp_path / "src", tmp_path / "results"
  with tarfile.open(tmp_path / "out" / "records.tgz") as tar:
    tar.extractall(src)
  written = report.collect(str(src), str(dest), note="smoke")
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
  script_parts = _script_parts()
  parts = documented["ONLY"].split(",") if documented.get("ONLY") else list(script_parts)
  pipeline = [p for p in parts if script_parts[p].startswith("@pipeline")]
  for path in written:
    rec = json.loads(open(path).read())
    # the commit given by the script (run.py then records no dirty flag of its own)
    assert rec["environment"]["git_commit"] == head and rec["environment"]["git_dirty"] is None
  records = {os.path.basename(p).split("_cpu_")[0] if "_cpu_" in p else "run": json.loads(open(p).read())
             for p in written}
  if "run" in records:
    rec = records["run"]
    assert rec["note"] == "smoke" and f"{groups} processes compiling at once" in rec["compile_note"]
    timed = {f for f in os.listdir(src) if re.fullmatch(r"[a-z]\d+\.json", f)}
    assert timed == {p + ".json" for p in parts}, "a part was not reached: " + r.stdout[-3000:]
    # a failed variant (cuDNN's attention has no CPU kernel) names its variant; every other row ran
    cudnn = [x for x in rec["rows"] if "attention_impl=cudnn" in (x.get("overrides") or "")]
    assert bool(cudnn) == any("attention_impl=cudnn" in script_parts[p] or "$SWB" in script_parts[p]
                              for p in parts), cudnn  # $SWB: the switches with cuDNN's attention
    assert all("error" in x for x in cudnn), cudnn
    assert all("error" not in x for x in rec["rows"] if x not in cudnn), [x for x in rec["rows"] if "error" in x]
    # the switches prepared on CPU are rows of their own, beside the plain ones (of the parts kept)
    variants = {(x["what"], x.get("dropout_bits"), x.get("overrides"), x.get("fused_decode")) for x in rec["rows"]}
    want = set()
    for p in parts:
      a = script_parts[p]
      if "--what train" in a and "--dtype float32" in a:
        want.add(("train", 8, "vocab_pad_multiple=128", None) if "$SW" in a else ("train", None, None, None))
      if "--what scst" in a:
        want |= {("scst", None, None, None), ("scst", None, None, True), ("scst_sample", None, None, True),
                 ("scst_reward", None, None, None), ("scst_grad", None, None, None)}
      if "--what beam" in a:
        want.add(("beam", None, None, None))
    assert want <= variants, (want, variants)
  if any(script_parts[p].startswith("@sharded") for p in parts):  # from pixels (issue 58)
    rows = records["sharded_memory"]["rows"]
    assert {(x["rule"], x["remat"], x["batch"]) for x in rows} == {
        (r, m, b) for r in ("replicated", "fsdp") for m in (False, True) for b in (2, 4)}
    assert all(x["images_per_s"] > 0 and x["memory"]["total"] > 0 for x in rows)
  if pipeline:
    loop = [x for x in records["input_pipeline"]["rows"] if "loop_images_per_s" in x]
    assert loop and loop[0]["loop_images_per_s"] > 0
