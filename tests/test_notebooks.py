"""notebooks/*.ipynb and each paper's jaxcap/papers/*/*.ipynb: committed without outputs, and each one executes with its assertions holding.

Every notebook trains its own tiny checkpoint, so executing them is slow (about 1.5-3.5 minutes each
on 2 CPU cores): those tests are marked heavy (``make test-heavy`` runs them alone) and run in
.ci/run's second step with the rest of the slow tier. They run through
nbclient in a fresh kernel whose current directory is a temporary one (the runs go to its
``runs/``) and which imports jaxcap from this checkout.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fast_compile

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*(REPO / "notebooks").glob("*.ipynb"), *(REPO / "jaxcap" / "papers").glob("*/*.ipynb")])
EXPECTED = {"notebooks/quickstart", "jaxcap/papers/eta/ablations", "jaxcap/papers/aat/attention_time",
            "jaxcap/papers/image_transformer/spatial_graph", "jaxcap/papers/mnmt/congruent_images",
            "jaxcap/papers/tpgn/roles"}


def _name(path: Path) -> str:
  return str(path.relative_to(REPO).with_suffix(""))


def test_every_notebook_is_there():
  assert EXPECTED <= {_name(p) for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_name)
def test_committed_without_outputs(path):
  nb = json.loads(path.read_text())
  for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] == "code":
      assert cell.get("outputs") == [] and cell.get("execution_count") is None, (
          f"{path.name} cell {i} has outputs; strip them before committing (e.g. "
          "jupyter nbconvert --clear-output --inplace <the notebook>)")
  assert "widgets" not in nb.get("metadata", {})


# Executes one notebook in a child process: a kernel that never comes up (jupyter_client once
# hung here joining its heartbeat thread, with no timeout of nbclient's to end it) costs one
# attempt's wall-clock limit instead of the whole CI run.
_EXECUTE = """
import sys, time
import nbclient, nbformat
path, out, cwd = sys.argv[1:4]
nb = nbformat.read(path, as_version=4)
client = nbclient.NotebookClient(nb, timeout=900, startup_timeout=120, kernel_name="python3",
                                 resources={"metadata": {"path": cwd}})
start = time.time()
client.execute()  # raises CellExecutionError (with the cell and traceback) if an assert fails
nbformat.write(nb, out)
print(f"executed in {time.time() - start:.0f} s")
"""
ATTEMPT_S = 600  # each notebook takes 1-2 minutes on 2 CPU cores


def _execute(path: Path, out: Path, cwd: Path) -> str | None:
  """Runs :data:`_EXECUTE`; its stderr tail on failure, None when it timed out (its process
  group killed: the kernel too)."""
  proc = subprocess.Popen([sys.executable, "-c", _EXECUTE, str(path), str(out), str(cwd)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    stdout, stderr = proc.communicate(timeout=ATTEMPT_S)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    return None
  print(stdout.strip(), file=sys.stderr)
  return "" if proc.returncode == 0 else stderr[-4000:]


def _cell_seconds(cell) -> float:
  from datetime import datetime
  t = cell.get("metadata", {}).get("execution", {})
  try:
    a, b = (datetime.fromisoformat(t[k].replace("Z", "+00:00"))
            for k in ("iopub.execute_input", "shell.execute_reply"))
  except (KeyError, ValueError):
    return float("nan")
  return (b - a).total_seconds()


@pytest.mark.slow
@pytest.mark.heavy  # 1-3 min of CPU each (pytest.ini)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_name)
def test_notebook_executes(path, tmp_path, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  pytest.importorskip("nbclient")
  # The kernel inherits this environment: import jaxcap from the checkout, and run on the real
  # CPU device, not the 8 fake devices of tests/conftest.py. A notebook trains hundreds of
  # steps: the flags for many steps, not the tests' fast-compile ones (tests/fast_compile.py says
  # why, with the measurements; the M² notebook at d = 128 alone: 188 s with the fast-compile
  # flags, 99 s with only the elemental emitters, 90 s with neither).
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  monkeypatch.setenv("XLA_FLAGS", fast_compile.MANY_STEPS_FLAGS)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  out = tmp_path / path.name  # the executed copy, outputs included
  for attempt in range(2):  # a second attempt only after a hang, never after a failure
    error = _execute(path, out, tmp_path)
    if error is not None:
      break
    print(f"{path.name}: attempt {attempt + 1} exceeded {ATTEMPT_S} s; killed", file=sys.stderr)
  assert error is not None, f"{path.name}: two attempts each exceeded {ATTEMPT_S} s"
  assert error == "", f"{path.name} failed:\n{error}"
  nb = nbformat.read(str(out), as_version=4)
  print(f"{path.name}: {out}; per cell: "
        f"{[round(_cell_seconds(c)) for c in nb.cells if c.cell_type == 'code']}", file=sys.stderr)
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
  assert "notebook ran in" in outputs
