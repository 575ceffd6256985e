"""jaxcap's programs run as a user runs them, many per second.

A program (``train.py``, ``evaluate.py``, ``python -m jaxcap....``) runs in a process of its own:
its own ``sys.argv``, absl flags defined and parsed once, its real exit code, stdout and stderr.
Starting Python and importing JAX for each of hundreds of bad-input cases would take minutes, so
a server process imports the heavy libraries once and forks a child per run; the child is the
program's process (``runpy``, as ``python <file>`` / ``python -m <module>`` would run it). The
server imports none of jaxcap's programs, so every child defines their flags afresh.

  with Programs() as programs:
    code, out, err = programs.run(["train.py", "--config.batch_size=0"], cwd=tmp_path)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import fast_compile

REPO = Path(__file__).resolve().parents[1]

_SERVER = r"""
import json, os, runpy, sys, tempfile, threading, traceback
sys.path.insert(0, REPO)
import numpy, jax, flax.linen, optax, ml_collections, absl.flags, absl.app  # noqa: F401
import orbax.checkpoint  # noqa: F401
from jaxcap import config_files
from jaxcap.models import registry
import jaxcap.data  # noqa: F401
registry.names()  # every model module imported
config_files.ensure_configs_importable()
import jaxcap.config_common  # noqa: F401
assert threading.active_count() == 1, threading.enumerate()  # forking is safe
out = sys.stdout
for line in sys.stdin:
  req = json.loads(line)
  files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
  pid = os.fork()
  if pid == 0:
    code = 1
    try:
      os.dup2(files[0].fileno(), 1)
      os.dup2(files[1].fileno(), 2)
      sys.stdout = os.fdopen(1, "w", buffering=1)
      sys.stderr = os.fdopen(2, "w", buffering=1)
      os.chdir(req["cwd"])
      os.environ.update(req["env"])
      argv = req["argv"]
      try:
        exec(req.get("prelude", ""), {})  # a test's patch of the program's process (a planted fault)
        if argv[0] == "-m":
          sys.argv = [argv[1]] + argv[2:]
          runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
          path = argv[0] if os.path.isabs(argv[0]) else os.path.join(REPO, argv[0])
          sys.argv = [path] + argv[1:]
          sys.path[0] = os.path.dirname(path)
          runpy.run_path(path, run_name="__main__")
        code = 0
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
          print(e.code, file=sys.stderr)
      except BaseException:
        traceback.print_exc()
        code = 1
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)
  _, status = os.waitpid(pid, 0)
  got = []
  for f in files:
    f.seek(0)
    got.append(f.read().decode(errors="replace"))
    f.close()
  out.write(json.dumps({"code": os.waitstatus_to_exitcode(status), "stdout": got[0], "stderr": got[1]}) + "\n")
  out.flush()
"""


def one_device_env() -> dict:
  """This environment with one CPU device, as on a user's machine (the suite's 8 fake devices
  split a batch and write replicated arrays in 8 pieces)."""
  return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1 " + fast_compile.FLAGS)


class Programs:
  """A server of forked program processes (module docstring); use as a context manager."""

  def __init__(self, env: dict | None = None):
    env = dict(os.environ if env is None else env)
    env.setdefault("JAX_PLATFORMS", "cpu")
    self._proc = subprocess.Popen([sys.executable, "-c", f"REPO = {str(REPO)!r}\n" + _SERVER],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env, cwd=str(REPO))

  def run(self, argv, cwd, env: dict | None = None, prelude: str = "") -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``argv`` (``["train.py", ...]`` or ``["-m", module,
    ...]``; a script path relative to the checkout) run from ``cwd``; ``prelude``: Python run
    in the program's process first (a test's planted fault)."""
    req = {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": dict(env or {}), "prelude": prelude}
    self._proc.stdin.write(json.dumps(req) + "\n")
    self._proc.stdin.flush()
    line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the program server died (exit {self._proc.wait()})")
    r = json.loads(line)
    return r["code"], r["stdout"], r["stderr"]

  def close(self):
    if self._proc.poll() is None:
      self._proc.stdin.close()
      self._proc.wait(timeout=60)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
