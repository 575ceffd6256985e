"""Shared command-line behaviour: bad input ends with one line on stderr and exit code 2."""

from __future__ import annotations

import os
import sys


def configs_dir() -> str:
  """The directory of the shipped config files (``configs/``).

  The repository's ``configs/`` beside the ``jaxcap`` package: in a checkout, an editable
  install (``pip install -e .``) and a wheel install alike (the wheel installs ``configs`` as a
  package next to ``jaxcap``).
  """
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return os.path.join(here, "configs")


def ensure_configs_importable() -> None:
  """Makes ``import configs`` (which every config file does: ``from configs import common``)
  resolve to :func:`configs_dir`, whatever the current directory and ``sys.path``."""
  import importlib.util
  path = configs_dir()
  mod = sys.modules.get("configs")
  if mod is not None and os.path.dirname(os.path.abspath(getattr(mod, "__file__", "") or "")) == path:
    return
  init = os.path.join(path, "__init__.py")
  if not os.path.exists(init):
    raise FileNotFoundError(f"{path}: jaxcap's configs are missing (a broken installation?)")
  spec = importlib.util.spec_from_file_location("configs", init, submodule_search_locations=[path])
  mod = importlib.util.module_from_spec(spec)
  sys.modules["configs"] = mod
  for name in [k for k in sys.modules if k.startswith("configs.")]:
    del sys.modules[name]  # submodules of another ``configs`` package
  spec.loader.exec_module(mod)


def resolve_config_path(value: str) -> str:
  """``configs/<file>.py[:arg]`` -> the shipped file when the path does not exist here.

  Paths that exist (relative to the current directory, or absolute) are kept, so a checkout's
  ``--config configs/x.py:...`` and a user's own config files work as before; from any other
  directory ``configs/x.py`` (or just ``x.py``) names the config shipped with jaxcap.
  """
  path, sep, arg = value.partition(":")
  if os.path.exists(path) or os.path.isabs(path):
    return value
  parts = os.path.normpath(path).split(os.sep)
  rest = parts[1:] if parts[0] == "configs" else parts
  shipped = os.path.join(configs_dir(), *rest)
  return shipped + sep + arg if os.path.exists(shipped) else value


def resolve_config_argv(argv: list[str]) -> list[str]:
  """``argv`` with the value of ``--config`` passed through :func:`resolve_config_path`."""
  out, i = list(argv), 1
  while i < len(out):
    a = out[i]
    if a.startswith("--config="):
      out[i] = "--config=" + resolve_config_path(a[len("--config="):])
    elif a == "--config" and i + 1 < len(out):
      out[i + 1] = resolve_config_path(out[i + 1])
      i += 1
    i += 1
  return out


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
  try:
    fn()
  except (ValueError, FileNotFoundError, KeyError) as e:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)
  return 0
