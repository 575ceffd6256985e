"""Command-line helpers shared by train.py and evaluate.py."""

import subprocess
import sys
from pathlib import Path

from jaxcap.cli import default_workdir

REPO = Path(__file__).resolve().parents[1]


def test_default_workdir_names():
  assert default_workdir("configs/transformer.py:synthetic") == "runs/transformer_synthetic"
  assert default_workdir("/abs/configs/eta.py:synthetic,variant=stacked_v,gbc=tanh") == \
      "runs/eta_synthetic_variant-stacked_v_gbc-tanh"
  assert default_workdir("configs/aat.py") == "runs/aat"


def test_train_py_default_workdir(tmp_path):
  # A bad override stops the run after the workdir is chosen (and before anything is written).
  r = subprocess.run([sys.executable, str(REPO / "train.py"),
                      f"--config={REPO}/configs/eta.py:synthetic,variant=stacked_v",
                      "--config.data.name=karpathy", "--config.data.root=/nonexistent/x"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "/nonexistent/x" in r.stderr
  assert "workdir: runs/eta_synthetic_variant-stacked_v\n" in r.stdout
  assert not list(tmp_path.iterdir())
