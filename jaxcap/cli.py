"""Shared command-line behaviour: bad input ends with one line on stderr and exit code 2."""

from __future__ import annotations

import os
import sys


def default_workdir(config_arg: str) -> str:
  """``runs/<config file stem>[_<arg>]`` for ``--config path/<stem>.py[:<arg>]``.

  ``configs/transformer.py:synthetic`` -> ``runs/transformer_synthetic``;
  ``configs/eta.py:synthetic,variant=stacked_v`` -> ``runs/eta_synthetic_variant-stacked_v``.
  """
  path, _, arg = config_arg.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  suffix = "_".join(p.strip().replace("=", "-").replace("/", "-") for p in arg.split(",") if p.strip())
  return os.path.join("runs", f"{name}_{suffix}" if suffix else name)


def quiet_logs() -> None:
  """Orbax and absl log every checkpoint step at INFO; keep the console for progress and results."""
  import logging
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  for name in ("orbax", "absl", "jax._src.xla_bridge"):
    logging.getLogger(name).setLevel(logging.WARNING)


def run_main(fn):
  quiet_logs()
  from jaxcap import xla_logs
  xla_logs.install()  # CPU only: XLA's slow-compile alarms (bfloat16 is emulated there)
  try:
    fn()
  except (ValueError, FileNotFoundError, KeyError) as e:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)
  return 0
