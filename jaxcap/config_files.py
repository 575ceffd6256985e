"""Config files: where ``configs/<file>.py`` is, loading ``get_config(arg)``, setting fields.

A config is named ``<path>.py[:<arg>]`` (big_vision's form: the text after the colon is
``get_config``'s argument). The path as given wins when it exists (a user's own file, or the
checkout's ``configs/``); otherwise ``configs/<file>.py`` (or ``<file>.py``) names a shipped
config, looked up in jaxcap's ``configs/`` (the shared baselines) and then in each paper's
``jaxcap/papers/<paper>/configs/``. So ``--config configs/eta.py:synthetic`` works from any
directory, and the file lives with its paper.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import traceback

from jaxcap.errors import BadInput
from jaxcap.config_literal import literal  # noqa: F401  (the parsers' name for it)
from jaxcap.papers import PAPERS

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def configs_dir() -> str:
  """The shipped shared configs: the package ``jaxcap.configs`` (a checkout's ``configs/`` is a
  link to it)."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def shipped_dirs() -> list[str]:
  """Where shipped configs are looked up, in order: ``configs/``, then each paper's."""
  return [configs_dir()] + [os.path.join(_ROOT, "jaxcap", "papers", p, "configs") for p in PAPERS]


def shipped_names() -> list[str]:
  """Every shipped config file's name (``eta.py``, ...), the shared ones first."""
  names = []
  for d in shipped_dirs():
    names += sorted(os.path.basename(f) for f in glob.glob(os.path.join(d, "*.py"))
                    if not os.path.basename(f).startswith("_") and os.path.basename(f) != "common.py")
  return names


def ensure_configs_importable() -> None:
  """Lets a user's own config file import the helpers under their first name, ``from configs
  import common`` (jaxcap's config files import ``jaxcap.config_common``): ``import configs``
  resolves to :func:`configs_dir` unless a module of that name is imported already or found
  on ``sys.path`` (another package's ``configs``, or a checkout's own folder, is left alone)."""
  if "configs" in sys.modules or importlib.util.find_spec("configs") is not None:
    return
  path = configs_dir()
  init = os.path.join(path, "__init__.py")
  if not os.path.exists(init):
    raise FileNotFoundError(f"{path}: jaxcap's configs are missing (a broken installation?)")
  spec = importlib.util.spec_from_file_location("configs", init, submodule_search_locations=[path])
  mod = importlib.util.module_from_spec(spec)
  sys.modules["configs"] = mod
  spec.loader.exec_module(mod)


def resolve(spec: str) -> str:
  """``configs/<file>.py[:arg]`` -> the shipped file when the path does not exist here (module
  docstring); a path that exists, or an absolute one, is kept."""
  path, sep, arg = spec.partition(":")
  if os.path.exists(path) or os.path.isabs(path):
    return spec
  parts = os.path.normpath(path).split(os.sep)
  rest = parts[1:] if parts[0] == "configs" else parts
  for d in shipped_dirs():
    shipped = os.path.join(d, *rest)
    if os.path.exists(shipped):
      return shipped + sep + arg
  return spec


def load(spec: str):
  """``get_config(arg)`` of the config file ``spec`` names (``<path>[.py][:<arg>]``); the bare
  word ``tiny`` in ``arg`` shrinks the result (``jaxcap.config_common.tiny``).

  Raises:
    BadInput: one line, for a file that is not there (naming where it was looked for) or the
      config file's own refusal of its argument.
  """
  path, _, arg = spec.partition(":")
  module = config_module(path)
  resolved = module.__file__
  if not callable(getattr(module, "get_config", None)):
    raise BadInput(f"config file {resolved}: no get_config; expected a Python file defining "
                     "get_config(arg)")
  words = [w for w in arg.split(",") if w.strip()]
  is_tiny = "tiny" in [w.strip() for w in words]
  given = ",".join(w for w in words if w.strip() != "tiny") or None
  try:
    config = module.get_config(given)
  except ValueError as e:  # the config file's own one-line refusal of its argument: a user's file
    if isinstance(e, BadInput):
      raise
    raise BadInput(str(e)) from e
  except Exception as e:  # noqa: BLE001
    raise _failed(resolved, f"get_config({given!r})", e) from None
  if is_tiny:  # every config's argument (jaxcap/config_common.py): the smallest sizes that run
    from jaxcap import config_common  # ml_collections: not imported by the benchmarks' reader
    config = config_common.tiny(config)
  return config


def config_module(path: str):
  """The config file ``path`` (``<path>[.py]``, resolved as :func:`load` resolves it) as an
  executed module: what :func:`load` calls ``get_config`` of, and how a config file reads
  another's constants (ETA's: the Transformer's CPU sizes).

  Raises:
    BadInput: one line naming the file, for a file that is not there, does not parse or
      raises while it runs.
  """
  ensure_configs_importable()  # a user's own config file may still import configs.common
  if not path.endswith(".py"):
    path += ".py"
  resolved = resolve(path)
  if not os.path.isfile(resolved):
    raise BadInput(f"config file {path!r}: not found here nor among the shipped configs "
                     f"({', '.join(shipped_names())}); expected path/to/config.py[:arg]")
  name = "jaxcap_config_" + os.path.splitext(os.path.basename(resolved))[0]
  module_spec = importlib.util.spec_from_file_location(name, resolved)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SyntaxError as e:  # the file's own line, not the import machinery's traceback
    raise BadInput(f"config file {resolved}, line {e.lineno}: {e.msg}; expected a Python file "
                     "defining get_config(arg)") from None
  except Exception as e:  # noqa: BLE001  (whatever it raises, one line naming the file)
    raise _failed(resolved, "importing it", e) from None
  return module


def _failed(path: str, what: str, e: BaseException) -> BadInput:
  """One line for an exception a config file raised: the file, the line of it that raised (the
  innermost frame in the file), what was run and the exception."""
  lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
           if os.path.abspath(f.filename) == os.path.abspath(path)]
  at = f", line {lines[-1]}" if lines else ""
  text = str(e).strip().splitlines()
  return BadInput(f"config file {path}{at}: {what} raised {type(e).__name__}"
                    f"{': ' + text[0] if text else ''}; expected a config file whose "
                    "get_config(arg) returns its config")


def set_field(config, dotted: str, value) -> None:
  """``config.a.b.c = value`` for ``dotted="a.b.c"``; an unknown field is a one-line error."""
  node = config
  *path, last = dotted.split(".")
  for p in path:
    if p not in node:
      raise BadInput(f"config field {dotted}: unknown ({p!r} is not in the config)")
    node = node[p]
  if last not in node:
    raise BadInput(f"config field {dotted}: unknown; expected one of {sorted(node.keys())}")
  node[last] = value


def default_workdir(spec: str) -> str:
  """``runs/<config file stem>[_<arg>]`` for ``path/<stem>.py[:<arg>]``:
  ``configs/transformer.py:synthetic`` -> ``runs/transformer_synthetic``,
  ``configs/eta.py:synthetic,variant=stacked_v`` -> ``runs/eta_synthetic_variant-stacked_v``."""
  path, _, arg = spec.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  suffix = "_".join(p.strip().replace("=", "-").replace("/", "-") for p in arg.split(",") if p.strip())
  return os.path.join("runs", f"{name}_{suffix}" if suffix else name)
