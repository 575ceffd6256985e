"""Bad input to the scripts in ``scripts/``: one ``error:`` line on stderr, exit code 2.

The scripts run through :func:`jaxcap.cli.run_script` (``run_main``, and for absl ones
``run_app``, as ``train.py`` and ``evaluate.py`` do). Each case is a real process (the exit code and the
absence of a traceback are the point) and writes nothing: the cases name a missing run or a
bad flag value, so no training starts.

Mutant tried: the scripts' ``__main__`` blocks back to ``main()`` / ``app.run(main)`` (the
missing-run cases end in a ``FileNotFoundError`` traceback, exit 1; the bad-value cases in
``SystemExit`` text without ``error:``, exit 1).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CASES = [
    # (script, args, needle)
    ("beam_modes.py", ["--workdir={tmp}/nowhere"], "{tmp}/nowhere/config.json"),
    ("beam_modes.py", [], "--workdir"),
    ("plot_attention_steps.py", ["--workdir", "{tmp}/nowhere", "--out", "{tmp}/a.png"],
     "{tmp}/nowhere/config.json"),
    ("flickr8k_table.py", ["--workdir", "{tmp}/t", "--seeds", "a,b"], "--seeds"),
    ("aat_table1.py", ["--workdir", "{tmp}/t", "--rows", "nope"], "--rows"),
    ("eta_ablations.py", ["--workdir={tmp}/t", "--seeds=x"], "--seeds"),
]


@pytest.mark.parametrize("script,args,needle", CASES, ids=[f"{c[0]}:{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_and_exit_2(tmp_path, script, args, needle):
  argv = [sys.executable, str(REPO / "scripts" / script)] + [a.format(tmp=tmp_path) for a in args]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert needle.format(tmp=tmp_path) in lines[0] and "expected" in lines[0], lines[0]
  assert sorted(os.listdir(tmp_path)) == []  # nothing written
