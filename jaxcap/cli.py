"""The command line's contract: bad input is one line on stderr and exit code 2.

Exit codes: 0 success; 2 bad input (a flag, the config, data, workdir, checkpoints,
predictions); 3 the run stopped on a non-finite loss or gradient norm (``config.nonfinite=
"stop"``, :mod:`jaxcap.training.guard`); 4 training was preempted (SIGTERM or SIGINT) and saved
a checkpoint at the current step (:mod:`jaxcap.training.preemption`): the same command resumes.

* :func:`run_absl` is ``absl.app.run`` with a flags parser that *validates the command line
  before absl parses it* (:func:`check_command_line`): the config file and its argument load,
  every ``--config.<field>=<value>`` names a field of that config and its value parses as the
  field's type, a section is not set after one of its fields. Then the config flags are defined
  (``ml_collections.config_flags``, reading this ``argv``: nothing global is swapped) and absl
  parses; an unknown flag, a flag value its own parser refuses and stray arguments are one line
  too. The program's body then runs under :func:`run_main`.
* :func:`run_main` maps the library's one-line errors (``ValueError``, missing files, ``OSError``)
  to ``error: <line>`` and exit 2, a non-finite stop to exit 3, a preempted run to one line and
  exit 4.
* :func:`run_script` is the same for argparse programs (tables, benchmarks, tools).

``--config configs/<file>.py`` names the shipped configs from any directory
(:func:`jaxcap.config_files.resolve`).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import sys

from absl import app, flags

from jaxcap import config_files
from jaxcap import xla_logs
from jaxcap.training import checkpoint, parallel
from jaxcap.training.guard import NonFiniteError
from jaxcap.training.preemption import Preempted

EXIT_BAD_INPUT = 2
EXIT_NONFINITE = 3
EXIT_PREEMPTED = 4


class BadInput(ValueError):
  """A one-line bad-input error of the command line itself."""


def fail(msg, code: int = EXIT_BAD_INPUT):
  """Prints ``error: <first line of msg>`` on stderr and exits with ``code``."""
  msg = str(msg).strip()
  print(f"error: {msg.splitlines()[0] if msg else 'unknown error'}", file=sys.stderr, flush=True)
  sys.exit(code)


def run_main(fn):
  """Runs ``fn()``; bad input -> one line and exit 2, a non-finite stop -> one line and exit 3,
  a preempted run (saved) -> one line and exit 4."""
  checkpoint.quiet_logs()
  try:
    # First, before anything touches a JAX backend: jax.distributed must be initialised before
    # the backend exists (a multi-host launch; no-op otherwise).
    parallel.maybe_initialize_distributed()
    xla_logs.install()  # CPU only: XLA's slow-compile alarms (bfloat16 is emulated there)
    fn()
  except NonFiniteError as e:
    fail(str(e), EXIT_NONFINITE)
  except Preempted as e:
    print(f"preempted: {e}", file=sys.stderr, flush=True)
    sys.exit(EXIT_PREEMPTED)
  except FileNotFoundError as e:
    if getattr(e, "filename", None):  # a raw OS error: name the path and what was expected
      fail(f"{e.filename}: {e.strerror or 'not found'}; expected an existing file or directory")
    fail(str(e) or type(e).__name__)
  except (ValueError, KeyError) as e:
    fail(str(e) or type(e).__name__)
  except SystemExit as e:
    if isinstance(e.code, str):  # raise SystemExit("<message>") in a script: one line, exit 2
      fail(e.code)
    raise
  except OSError as e:  # read-only or full disk, a workdir that is a file, ...
    where = f"{e.filename}: " if getattr(e, "filename", None) else ""
    fail(f"{where}{e.strerror or e}; expected a writable folder with free space")
  return 0


# ---------------------------------------------------------------------------- absl programs
def _values(argv, name: str):
  """Every value ``argv`` gives ``--name`` (``--name=v`` or ``--name v``), in order."""
  out = []
  for i, a in enumerate(argv[1:], 1):
    if a.startswith(f"--{name}="):
      out.append(a.split("=", 1)[1])
    elif a == f"--{name}" and i + 1 < len(argv):
      out.append(argv[i + 1])
  return out


def _overrides(argv, name: str) -> list[tuple[str, str | None]]:
  """``(field path, value)`` of every ``--name.<path>=<value>`` (``--[no]name.<path>``: None)."""
  out = []
  for i, a in enumerate(argv[1:], 1):
    for prefix in (f"--{name}.", f"--no{name}."):
      if a.startswith(prefix):
        path, eq, value = a[len(prefix):].partition("=")
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
          value, eq = argv[i + 1], "="
        out.append((path, value if eq else None))
  return out


_PARSERS = {int: (flags.IntegerParser(), "an int"), float: (flags.FloatParser(), "a number"),
            bool: (flags.BooleanParser(), "true or false")}


def _check_override(config, name: str, path: str, value, spec: str) -> None:
  from ml_collections import config_dict  # absl programs only (see parse_flags)
  node, parts = config, path.split(".")
  for j, p in enumerate(parts):
    keys = [str(k) for k in node.keys()] if isinstance(node, config_dict.ConfigDict) else []
    if p not in keys:
      close = difflib.get_close_matches(p, keys, n=1)
      hint = f" (did you mean {'.'.join(parts[:j] + close)}?)" if close else ""
      raise BadInput(f"config field {'.'.join(parts[:j + 1])}: unknown key in --{name}.{path}{hint}; "
                     f"expected a field of {spec.partition(':')[0]}")
    parent, node = node, node[p]
  kind = parent.get_type(parts[-1])  # a None placeholder's declared type too
  if issubclass(kind, config_dict.ConfigDict):
    raise BadInput(f"config field {path}: a section; expected a nested config (set its fields, "
                   f"--{name}.{path}.<field>=<value>), got {value!r}")
  parser = _PARSERS.get(kind)
  if parser is not None and value is not None:
    try:
      parser[0].parse(value)
    except (TypeError, ValueError) as e:
      raise BadInput(f"config field {path}: expected {parser[1]}, got {value!r} ({e})") from None


def check_command_line(argv, configs: dict[str, str]) -> None:
  """Validates what ``argv`` says of each config flag (``{name: default spec}``): the config
  file loads and every override names a field of it with a value of the field's type, no
  section after one of its fields. Raises :class:`BadInput` (one line) or the config file's own
  ``ValueError``."""
  for name, default in configs.items():
    given = _values(argv, name)
    if len(given) > 1:
      raise BadInput(f"--{name} given {len(given)} times ({', '.join(given)}); expected one config "
                     f"and --{name}.<field>=<value> overrides")
    spec = (given or [default])[-1]
    first = next((i for i, a in enumerate(argv) if a == f"--{name}" or a.startswith(f"--{name}=")), None)
    early = next((a for a in argv[1:first] if a.startswith((f"--{name}.", f"--no{name}."))), None) if first else None
    if early is not None:
      raise BadInput(f"{early} comes before --{name}; expected the config first, then its "
                     f"--{name}.<field> overrides")
    config = config_files.load(spec)
    overrides = _overrides(argv, name)
    fields = [p for p, _ in overrides]
    for i, path in enumerate(fields):
      later = next((s for s in fields[i + 1:] if path.startswith(s + ".")), None)
      if later is not None:
        raise BadInput(f"{name}.{later} would overwrite {name}.{path} given before it; expected a "
                       "section's value before the overrides of its fields")
    for path, value in overrides:
      _check_override(config, name, path, value, spec)


def _refused_value(argv):
  """``(flag, value, error)`` of the first ``--flag=value`` / ``--flag value`` whose own parser
  refuses the value (absl's IllegalFlagValueError does not say which), else None."""
  for i, a in enumerate(argv[1:], 1):
    flag, eq, value = a[2:].partition("=")
    if not a.startswith("--") or flag not in flags.FLAGS:
      continue
    if not eq:
      if flags.FLAGS[flag].boolean or i + 1 >= len(argv):
        continue
      value = argv[i + 1]
    try:
      flags.FLAGS[flag].parser.parse(value)
    except (TypeError, ValueError) as e:
      return flag, value, e
  return None


def parse_flags(argv, configs: dict[str, str] | None = None) -> list[str]:
  """``app.run``'s flags parser: :func:`check_command_line`, then the config flags defined on
  this ``argv`` and absl's parse. Any bad input: one line, exit 2."""
  # ml_collections is imported by the absl programs only: the benchmarks import this module on
  # GPU images that have jax, flax and optax but no ml_collections.
  from ml_collections import config_flags
  from ml_collections.config_flags.config_flags import ConfigFileFlagParser

  class ResolvingParser(ConfigFileFlagParser):
    """Loads the config as :func:`jaxcap.config_files.load` does (``configs/<file>.py`` from the
    shipped configs when it is not here; the ``tiny`` argument), locked as config_flags does."""

    def parse(self, path):
      config = config_files.load(path)
      config.lock()
      return config

  configs = configs or {}
  try:
    check_command_line(argv, configs)
    for name, default in configs.items():
      config_flags.DEFINE_config_file(name, config_files.resolve(default),
                                      f"Config file (file.py:arg; default {default}).",
                                      lock_config=True, sys_argv=list(argv))
      flags.FLAGS[name].parser = ResolvingParser(name=name, lock_config=True)
    try:
      rest = flags.FLAGS(list(argv))
    except flags.UnrecognizedFlagError as e:
      raise BadInput(f"--{e.flagname}: unknown flag; expected one of the flags of --helpfull") from None
    except flags.IllegalFlagValueError:
      bad = _refused_value(argv)
      if bad is None:
        raise
      flag, value, e = bad
      want = {"int": "an int", "float": "a number", "bool": "true or false"}.get(
          flags.FLAGS[flag].flag_type(), flags.FLAGS[flag].flag_type())
      raise BadInput(f"--{flag}={value}: expected {want} ({e})") from None
    if len(rest) > 1:
      raise BadInput(f"unexpected arguments {rest[1:]}; expected only --flags")
    return rest
  except ValueError as e:  # BadInput, and the config file's own refusal of its argument
    fail(str(e) or type(e).__name__)


def run_absl(main, configs: dict[str, str] | None = None) -> None:
  """``app.run(main)`` with :func:`parse_flags` (``configs``: the config flags and their default
  specs) and ``main`` under :func:`run_main`; exits with ``main``'s code."""
  app.run(lambda argv: run_main(lambda: main(argv)),
          flags_parser=functools.partial(parse_flags, configs=configs))


# ---------------------------------------------------------------------------- argparse programs
def _argument_error(err: argparse.ArgumentError) -> str:
  return f"{(err.argument_name or '').split('/')[0]}: {err.message}" if err.argument_name else err.message


def _argparse_error(parser, message: str):
  fail(message if "expected" in message else f"{message}; expected the flags and values --help lists")


def run_script(main):
  """Entry point of an argparse program: ``main()`` under :func:`run_main`; argparse's usage
  text and ``prog: error:`` become one ``error: --flag: ...`` line, exit 2. An int returned by
  ``main`` is the exit code (e.g. a ``--check`` that found stale files)."""
  result = []
  saved = argparse.ArgumentParser.error, argparse.ArgumentError.__str__
  argparse.ArgumentParser.error, argparse.ArgumentError.__str__ = _argparse_error, _argument_error
  try:
    code = run_main(lambda: result.append(main()))
  finally:
    argparse.ArgumentParser.error, argparse.ArgumentError.__str__ = saved
  sys.exit(result[0] if result and isinstance(result[0], int) else code)


def int_at_least(low: int, text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    value = low - 1
  if value < low:
    raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
  return value


# argparse ``type=`` for sizes and counts: a 0 or negative size would otherwise fail deep inside
# a model instead of at the flag; ``nonnegative_int`` where 0 means "none" or "the default";
# ``workers_int`` where -1 means "chosen from the host's cores".
positive_int = functools.partial(int_at_least, 1)
nonnegative_int = functools.partial(int_at_least, 0)
workers_int = functools.partial(int_at_least, -1)
