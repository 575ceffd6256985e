"""Shared command-line behaviour: bad input ends with one line on stderr and exit code 2.

``run_app(main, argv)`` replaces ``absl.app.run`` for ``train.py`` and ``evaluate.py``: it parses
the flags itself so that absl's and ml_collections' flag and config errors (an unknown or
misspelt ``--config.`` key, a value of the wrong type, a missing config file, a bad
``file.py:arg`` argument, an unknown flag, stray arguments) become one line
``error: ...`` on stderr and exit code 2 instead of a traceback or absl's usage text and exit
code 1. It can be called again in the same process (the tests drive both scripts in-process).

Exit codes: 0 success; 2 bad input (config, data, workdir, checkpoints, predictions); 3 the
run stopped on a non-finite loss or gradient norm (``config.nonfinite="stop"``, see
:mod:`jaxcap.training.guard`).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import re
import sys

from jaxcap import config_files
from jaxcap.training import checkpoint
from jaxcap.config_files import default_workdir  # noqa: F401  (train.py names its workdir)

EXIT_BAD_INPUT = 2
EXIT_NONFINITE = 3


class BadInput(ValueError):
  """A one-line bad-input error raised by the command-line layer itself."""


def resolve_config_argv(argv: list[str]) -> list[str]:
  """``argv`` with the value of ``--config`` passed through :func:`jaxcap.config_files.resolve`."""
  out, i = list(argv), 1
  while i < len(out):
    a = out[i]
    if a.startswith("--config="):
      out[i] = "--config=" + config_files.resolve(a[len("--config="):])
    elif a == "--config" and i + 1 < len(out):
      out[i + 1] = config_files.resolve(out[i + 1])
      i += 1
    i += 1
  return out


def fail(msg: str, code: int = EXIT_BAD_INPUT):
  """Prints ``error: <first line of msg>`` on stderr and exits with ``code``."""
  msg = str(msg).strip()
  msg = msg.splitlines()[0] if msg else "unknown error"
  print(f"error: {msg}", file=sys.stderr, flush=True)
  sys.exit(code)


def run_main(fn):
  """Runs ``fn()``; bad input -> one line and exit 2, a non-finite stop -> one line and exit 3."""
  from jaxcap.training.guard import NonFiniteError
  from jaxcap.training import parallel
  checkpoint.quiet_logs()
  try:
    # First, before anything can touch a JAX backend (xla_logs asks for the default backend):
    # jax.distributed must be initialised before the backend exists.
    parallel.maybe_initialize_distributed()
    from jaxcap import xla_logs
    xla_logs.install()  # CPU only: XLA's slow-compile alarms (bfloat16 is emulated there)
    fn()
  except NonFiniteError as e:
    fail(str(e), EXIT_NONFINITE)
  except FileNotFoundError as e:
    if getattr(e, "filename", None):  # raw OS error: name the path and what was expected
      fail(f"{e.filename}: {e.strerror or 'not found'}; expected an existing file or directory")
    fail(str(e) if str(e).strip() else type(e).__name__)
  except (ValueError, KeyError) as e:
    fail(str(e) if str(e).strip() else type(e).__name__)
  except SystemExit as e:
    if isinstance(e.code, str):  # raise SystemExit("<message>") in a script: one line, exit 2
      fail(e.code)
    raise
  except OSError as e:  # read-only or full disk, a workdir that is a file, ...
    where = f"{e.filename}: " if getattr(e, "filename", None) else ""
    fail(f"{where}{e.strerror or e}; expected a writable workdir with free space")
  return 0


# ------------------------------------------------------------------------------- flag parsing
# The default of each config flag defined by :func:`define_config`. ml_collections parses a
# config flag's default when the flag is defined, reading the overrides from sys.argv *at import
# time*, and defines the ``--config.<field>`` flags only then: a default config therefore could
# not take overrides in a second parse and raised a traceback on an unknown field. Instead the
# flag is defined without a default and :func:`parse_flags` writes ``--<name>=<default>`` into
# argv when the command line names none, so the default is parsed exactly like an explicit one.
_CONFIG_DEFAULTS: dict[str, str] = {}


def define_config(name: str, default: str, help_text: str, flag_values=None) -> None:
  """``config_flags.DEFINE_config_file(name, ...)`` whose default behaves like ``--name=default``."""
  from absl import flags
  from ml_collections import config_flags
  flag_values = flags.FLAGS if flag_values is None else flag_values  # an empty FlagValues is falsy
  _CONFIG_DEFAULTS[name] = default
  config_flags.DEFINE_config_file(name, None, f"{help_text} (default: {default})",
                                  flag_values=flag_values, lock_config=True)


def with_default_configs(argv: list[str], names) -> list[str]:
  """``argv`` with ``--<name>=<default>`` inserted after the program for every config flag of
  :func:`define_config` that ``argv`` does not set (before any ``--<name>.<field>`` override)."""
  out = list(argv)
  for name in names:
    default = _CONFIG_DEFAULTS.get(name)
    given = any(a == f"--{name}" or a.startswith(f"--{name}=") for a in out[1:])
    if default is not None and not given:
      out.insert(1, f"--{name}={config_files.resolve(default)}")
  return out


def _config_flag_names(flag_values) -> list[str]:
  """The config flags of ``flag_values``: every one is defined by :func:`define_config`."""
  return [name for name in _CONFIG_DEFAULTS if name in flag_values]


def _load_config(arg: str):
  """``(get_config(arg), None)`` of ``path.py[:arg]``, or ``(None, the exception it raised)``
  (only to explain an error: the exception itself, not ml_collections' text about it)."""
  path, _, rest = arg.partition(":")
  try:
    spec = importlib.util.spec_from_file_location("_jaxcap_config_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return (module.get_config(rest) if rest else module.get_config()), None
  except Exception as e:  # pylint: disable=broad-except
    return None, e


def _config_arg(argv, name: str, flag_values) -> str:
  for i in reversed(range(len(argv))):  # the last --config wins, as in absl
    a = argv[i]
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return str(flag_values[name].default or "")


def _lookup(config, path: str):
  """(found, value_or_missing_key, siblings) for a dotted path."""
  node = config
  parts = path.split(".")
  for j, p in enumerate(parts):
    try:
      keys = list(node.keys())
    except AttributeError:
      return False, ".".join(parts[:j + 1]), []
    if p not in keys:
      return False, ".".join(parts[:j + 1]), keys
    node = node[p]
  return True, node, []


def _explain_config_error(argv, name: str, flag_values, err: Exception) -> str:
  """One line for an error raised while parsing ``--<name>`` and its ``--<name>.x=v`` overrides."""
  from ml_collections.config_flags.config_flags import FlagOrderError
  arg = _config_arg(argv, name, flag_values)
  path = arg.partition(":")[0]
  if not os.path.isfile(path):
    return f"--{name}={arg}: config file {path!r} not found; expected path/to/config.py[:arg]"
  config, load_error = _load_config(arg)
  if load_error is not None:  # the config file's get_config(arg) raised: its own message
    return f"--{name}={arg}: {str(load_error).strip() or type(load_error).__name__}"
  # The overrides in the order ml_collections applies them (a repeated one at its last place).
  overrides = {}
  for a in argv:
    if a.startswith((f"--{name}.", f"--no{name}.")):
      key = a.split("=", 1)[0].split(".", 1)[1]
      overrides[key] = overrides.pop(key, None)
  for field in overrides if config is not None else ():
    found, what, keys = _lookup(config, field)
    if not found:
      leaf = what.rsplit(".", 1)[-1]
      close = difflib.get_close_matches(leaf, [str(k) for k in keys], n=1)
      hint = f" (did you mean {what.rsplit('.', 1)[0] + '.' if '.' in what else ''}{close[0]}?)" if close else ""
      return (f"config field {what}: unknown key in --{name}.{field}{hint}; expected a field of {path}")
  if isinstance(err, FlagOrderError):
    order = list(overrides)
    for i, field in enumerate(order):
      section = next((s for s in order[i + 1:] if field.startswith(s + ".")), None)
      if section is not None:
        return (f"{name}.{section} would overwrite {name}.{field} given before it; expected a "
                "section's value before the overrides of its fields")
  bad = _refused_value(argv, flag_values, prefix=f"{name}.")
  if bad is not None:  # an override whose value its field's parser refuses
    flag, value, why = bad
    field = flag[len(name) + 1:]
    want = "a value"
    if config is not None:
      found, current, _ = _lookup(config, field)
      if found:
        tname = type(current).__name__
        want = f"{'an' if tname[0] in 'aeiou' else 'a'} {tname}" if not hasattr(current, "keys") else "a nested config (set its fields)"
    return f"config field {field}: expected {want}, got {value!r} ({why})"
  text = str(err)
  last = text.strip().splitlines()[-1] if text.strip() else type(err).__name__
  return f"--{name}: {last} (expected a config file and --{name}.<field>=<value> overrides)"


def _refused_value(argv, flag_values, prefix: str = ""):
  """``(flag, value, why)`` for the first ``--flag=value`` / ``--flag value`` of ``argv`` (flag
  names starting with ``prefix``) that the flag's own parser refuses, else None: the culprit of
  absl's IllegalFlagValueError found from the flags themselves, not from its message."""
  for i, a in enumerate(argv[1:], 1):
    if not a.startswith("--" + prefix):
      continue
    flag, eq, value = a[2:].partition("=")
    if flag not in flag_values:
      continue
    if not eq:
      if flag_values[flag].boolean or i + 1 >= len(argv):
        continue
      value = argv[i + 1]
    try:
      flag_values[flag].parser.parse(value)
    except (TypeError, ValueError) as e:
      return flag, value, str(e).strip() or type(e).__name__
  return None


def _failed_validator(flag_values) -> str | None:
  """One line for the first flag validator (``flags.mark_flag_as_required``, a registered
  check) that the parsed values fail, else None: found by running the validators themselves."""
  from absl import flags
  for name in flag_values:
    for validator in flag_values[name].validators:
      try:
        validator.verify(flag_values)
      except flags.ValidationError as e:
        names = validator.get_flags_names()
        value = flag_values[names[0]].value
        if value is None:
          return f"--{names[0]}: missing; expected a value ({e})"
        return f"--{names[0]}={value}: expected a value that passes its check ({e})"
  return None


def parse_flags(argv, flag_values=None) -> list[str]:
  """Parses ``argv`` into ``flag_values`` (absl's global FLAGS by default), re-entrantly.

  Returns the positional arguments; raises :class:`BadInput` with one line on any flag or
  config error.
  """
  from absl import app, flags
  flag_values = flags.FLAGS if flag_values is None else flag_values  # an empty FlagValues is falsy
  app.define_help_flags()
  configs = _config_flag_names(flag_values)
  # A second parse in the same process: forget the last values and the --config.x flags that
  # ml_collections defined for the last command line's overrides.
  flag_values.unparse_flags()
  for fname in list(flag_values):
    if any(fname.startswith(c + ".") for c in configs):
      delattr(flag_values, fname)
  argv = with_default_configs(argv, configs)
  saved = sys.argv
  sys.argv = list(argv)  # ml_collections reads the overrides from sys.argv
  try:
    try:
      rest = flag_values(list(argv))
    except flags.UnrecognizedFlagError as e:
      raise BadInput(f"--{e.flagname}: unknown flag; expected one of the flags of --helpfull") from None
    except Exception as e:  # pylint: disable=broad-except
      text = str(e)
      culprit = next((c for c in configs if f"--{c}" in text or "config file" in text
                      or isinstance(e, (AttributeError, KeyError))), None)
      if culprit is None:
        bad = _refused_value(argv, flag_values) if isinstance(e, flags.IllegalFlagValueError) else None
        if bad is None and isinstance(e, flags.IllegalFlagValueError):
          failed = _failed_validator(flag_values)
          if failed is not None:
            raise BadInput(failed) from None
        if bad is None:
          raise BadInput(text.strip().splitlines()[0] if text.strip() else type(e).__name__) from None
        flag, value, why = bad
        kind = type(flag_values[flag].value).__name__
        want = {"int": "an int", "float": "a number", "bool": "true or false"}.get(kind, flag_values[flag].flag_type())
        raise BadInput(f"--{flag}={value}: expected {want} ({why})") from None
      raise BadInput(_explain_config_error(argv, culprit, flag_values, e)) from None
    for c in configs:  # ml_collections defers a missing config file's error to the first access.
      try:
        flag_values[c].value.get("model", None)
      except AttributeError:
        pass
      except Exception as e:  # pylint: disable=broad-except
        raise BadInput(_explain_config_error(argv, c, flag_values, e)) from None
  finally:
    sys.argv = saved
  if len(rest) > 1:
    raise BadInput(f"unexpected arguments {rest[1:]}; expected only --flags")
  return rest


def run_script(main, absl: bool = False):
  """Entry point of a ``scripts/*.py`` or ``benchmarks/*.py``: ``main(argv)`` under absl flags
  (``absl=True``, parsed as :func:`run_app` does) or ``main()`` with its own argparse (whose
  errors become the same one line); either way bad input is one line and exit code 2
  (:func:`run_main`). An int returned by an argparse ``main()`` is the exit code."""
  if absl:
    run_app(lambda argv: run_main(lambda: main(argv)))  # absl's app.run exits with main's code
  else:
    result = []
    with _argparse_errors_as_one_line():
      code = run_main(lambda: result.append(main()))
    # A main that returns an exit code (e.g. a --check that found stale files) keeps it.
    sys.exit(result[0] if result and isinstance(result[0], int) else code)


def _argparse_message(message: str) -> str:
  """argparse's error text as ``--flag: expected ..., got ...`` where it has a known form."""
  m = re.match(r"argument ([^:]+): (.*)", message)
  if m:  # "--name/-n" (an option's spellings): the first names it
    flag, why = m.group(1).split("/")[0], m.group(2)
    if m := re.match(r"invalid (\w+) value: (.*)", why):
      want = {"int": "an integer", "float": "a number"}.get(m.group(1), f"a valid {m.group(1)}")
      return f"{flag}: expected {want}, got {m.group(2)}"
    if m := re.match(r"invalid choice: (.*?) \(choose from (.*)\)$", why):
      return f"{flag}: expected one of {m.group(2)}, got {m.group(1)}"
    if why.startswith("expected "):
      return f"{flag}: {why}"
  if message.startswith("the following arguments are required: "):
    return f"{message.split(': ', 1)[1]}: missing; expected a value for each (see --help)"
  if message.startswith("unrecognized arguments: "):
    return f"{message.split(': ', 1)[1]}: unknown argument(s); expected the flags listed by --help"
  return message if "expected" in message else f"{message} (expected the flags listed by --help)"


def positive_int(text: str) -> int:
  """argparse ``type=`` for sizes and counts: a 0 or negative batch, width or step count would
  otherwise fail deep inside a model (a ZeroDivisionError in a reshape) instead of here."""
  import argparse
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
  return value


def nonnegative_int(text: str) -> int:
  """argparse ``type=`` for counts where 0 means "none" or "the default"."""
  import argparse
  try:
    value = int(text)
  except ValueError:
    value = -1
  if value < 0:
    raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
  return value


@contextlib.contextmanager
def _argparse_errors_as_one_line():
  """argparse's usage text and ``prog: error: ...`` (exit 2) as one ``error: ...`` line, like
  the absl scripts and train.py (subparsers included: the class method is replaced)."""
  import argparse
  saved = argparse.ArgumentParser.error
  argparse.ArgumentParser.error = lambda parser, message: fail(_argparse_message(message))
  try:
    yield
  finally:
    argparse.ArgumentParser.error = saved


def run_app(main, argv=None):
  """``absl.app.run(main)`` with bad flags and configs as one line and exit code 2."""
  from absl import app
  argv = list(sys.argv if argv is None else argv)
  try:
    rest = parse_flags(argv)
  except BadInput as e:
    fail(str(e))
  try:
    code = main(rest)
  except app.UsageError as e:
    fail(str(e))
  sys.exit(code or 0)
