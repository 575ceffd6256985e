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
  parses; an unknown flag (with a "did you mean"), a flag value its own parser refuses and stray
  arguments are one line too. ``--help`` lists the program's own flags and exits 0;
  ``--print_config`` prints the resolved config; ``--only_check_args`` runs the program's
  ``check`` (every check it makes before it starts) and says so in one line. The program's body
  then runs under :func:`run_main`.
* :func:`run_main` maps bad input (:class:`jaxcap.errors.BadInput`, raised where jaxcap judges
  what a user gave; missing files, ``OSError``) to ``error: <line>`` and exit 2, a non-finite
  stop to exit 3, a preempted run to one line and exit 4. Anything else is a bug: its traceback
  and one line saying so (:func:`jaxcap.errors.bug_line`), exit 1.
* :func:`run_script` is the same for argparse programs (tables, benchmarks, tools) built with
  :class:`ArgumentParser` (argparse's own refusals as one line; nothing of argparse patched).

``--config configs/<file>.py`` names the shipped configs from any directory
(:func:`jaxcap.config_files.resolve`).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import sys
import traceback

from absl import app, flags

from jaxcap import config_files
from jaxcap import errors
from jaxcap import xla_logs
from jaxcap.evaluation import coco_metrics
from jaxcap.training import checkpoint, parallel
from jaxcap.training.guard import NonFiniteError
from jaxcap.training.preemption import Preempted

EXIT_BAD_INPUT = 2
EXIT_NONFINITE = 3
EXIT_PREEMPTED = 4


# What a user gave is wrong (jaxcap.errors): one line, exit 2. Anything else is a bug: its traceback.
BadInput = errors.BadInput


def fail(msg, code: int = EXIT_BAD_INPUT):
  """Prints ``error: <first line of msg>`` on stderr and exits with ``code``."""
  msg = str(msg).strip()
  print(f"error: {msg.splitlines()[0] if msg else 'unknown error'}", file=sys.stderr, flush=True)
  sys.exit(code)


def run_main(fn, setup: bool = True):
  """Runs ``fn()``; bad input -> one line and exit 2, a non-finite stop -> one line and exit 3,
  a preempted run (saved) -> one line and exit 4. ``setup``: first join a multi-host launch and
  install XLA's log filter (a run; not a check of the command line)."""
  checkpoint.quiet_logs()
  try:
    if setup:
      # First, before anything touches a JAX backend: jax.distributed must be initialised before
      # the backend exists (a multi-host launch; no-op otherwise).
      parallel.maybe_initialize_distributed()
      xla_logs.install()  # CPU only: XLA's slow-compile alarms (bfloat16 is emulated there)
    # The environment's metric choice is read when a run is scored, minutes in: checked first.
    coco_metrics.skipped_metrics()
    fn()
  except NonFiniteError as e:
    fail(str(e), EXIT_NONFINITE)
  except Preempted as e:
    print(f"preempted: {e}", file=sys.stderr, flush=True)
    sys.exit(EXIT_PREEMPTED)
  except errors.BadInput as e:
    fail(errors.first_line(e))
  except FileNotFoundError as e:
    if getattr(e, "filename", None):  # a raw OS error: name the path and what was expected
      fail(f"{e.filename}: {e.strerror or 'not found'}; expected an existing file or directory")
    fail(str(e) or type(e).__name__)
  except SystemExit as e:
    if isinstance(e.code, str):  # raise SystemExit("<message>") in a script: one line, exit 2
      fail(e.code)
    raise
  except OSError as e:  # read-only or full disk, a workdir that is a file, ...
    where = f"{e.filename}: " if getattr(e, "filename", None) else ""
    fail(f"{where}{e.strerror or e}; expected a writable folder with free space")
  except Exception:  # noqa: BLE001 - not the input's fault: jaxcap's (or a library's) bug
    bug()
  return 0


def bug():
  """The current exception as a bug: its traceback, then one line saying whose error it is and
  how to report it, exit 1 (a ``ValueError`` inside a model is not the user's mistake)."""
  traceback.print_exc()
  print(errors.bug_line(), file=sys.stderr, flush=True)
  sys.exit(errors.EXIT_BUG)


def typed_flag(name: str, argv=None) -> str | None:
  """The spelling of flag ``name`` the user typed (``--beam_size``, ``--beam-size``,
  ``--noblock_trigrams``), else None: the name a refusal of its value gives back."""
  argv = sys.argv if argv is None else argv
  for a in argv[1:]:
    for spelled in dict.fromkeys((name, name.replace("_", "-"))):
      for word in (f"--{spelled}", f"--no{spelled}"):
        if a == word or a.startswith(word + "="):
          return f"--{spelled}"
  return None


def as_typed(error: ValueError, fields: dict[str, str]) -> ValueError:
  """``error`` with each config path of ``fields`` (``{"decode.beam_size": "--beam-size"}``)
  named by the flag that set it: a flag's value checked as a config field is refused in the
  user's words (``--beam-size: expected an int >= 1, got 0``), not the config's."""
  import re
  msg = str(error)
  for path, flag in fields.items():
    msg = re.sub(rf"(config field )?(?<![\w.]){re.escape(path)}(?![\w])", flag, msg)
  return type(error)(msg) if msg != str(error) else error


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


def did_you_mean(word: str, choices) -> str | None:
  """The choice closest to a misspelt ``word`` (difflib's ratio >= 0.6), else None: the one
  suggestion of a config key's and a flag's refusal."""
  close = difflib.get_close_matches(word, list(choices), n=1)
  return close[0] if close else None


def _check_override(config, name: str, path: str, value, spec: str) -> None:
  from ml_collections import config_dict  # absl programs only (see parse_flags)
  node, parts = config, path.split(".")
  for j, p in enumerate(parts):
    keys = [str(k) for k in node.keys()] if isinstance(node, config_dict.ConfigDict) else []
    if p not in keys:
      close = did_you_mean(p, keys)
      hint = f" (did you mean {'.'.join(parts[:j] + [close])}?)" if close else ""
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
  section after one of its fields. Raises :class:`BadInput` (one line; the config file's own
  refusal of its argument too: :func:`jaxcap.config_files.load`)."""
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


# The help flags jaxcap answers itself: absl's --help lists the flags of ``__main__`` (none: the
# programs define theirs in jaxcap.commands) and exits 1; --helpfull buries them among absl's.
_HELP = ("--help", "-help", "--helpshort", "-helpshort", "-?", "-h")
_HELPFULL = ("--helpfull", "-helpfull")


def _own_flags(module: str) -> list:
  """The flags ``module`` defines (absl files a script's, ``__main__``'s, under its path)."""
  by_module = flags.FLAGS.flags_by_module_dict()
  names = [module] + ([sys.argv[0]] if module == "__main__" else [])
  return [f for name in names for f in by_module.get(name, [])]


def _help_text(module: str, configs: dict[str, str], full: bool = False) -> str:
  """The program's docstring, its own flags with their help, the config flags and where the
  config's fields are described; ``full``: then every flag absl knows."""
  wrap = functools.partial(flags.text_wrap, indent="    ", firstline_indent="  ")
  doc = (getattr(sys.modules.get(module), "__doc__", None) or "").strip()
  lines = [doc, "", "flags:"] if doc else ["flags:"]
  for name, default in configs.items():
    lines += [wrap(f"--{name}: the config file, path/to/config.py[:arg]; any of its fields is set "
                   f"with --{name}.<field>=<value>."),
              flags.text_wrap("config fields: see --print_config (the resolved config, one field "
                              "a line) and docs/USAGE.md", indent="    ", firstline_indent="    "),
              f"    (default: {default!r})"]
  own = {f.name: f for f in _own_flags(module)}
  aliases = {f.help[len("Alias for --"):].rstrip("."): n for n, f in own.items()
             if f.help.startswith("Alias for --")}  # --beam-size: said beside --beam_size
  for name, flag in sorted(own.items()):
    if name in aliases.values():
      continue
    also = f" (also --{aliases[name]})" if name in aliases else ""
    default = "" if flag.default is None else f" (default: {flag.default_as_str})"
    lines.append(wrap(f"--{'[no]' if flag.boolean else ''}{name}{also}: {flag.help}{default}"))
  lines += [wrap("--only_check_args: make every check the program makes before it starts (the "
                 "command line and the values), say so in one line and exit; a refusal is the "
                 "run's one line and exit code 2"),
            wrap("--helpfull: every flag, absl's and the libraries' too")]
  if full:
    lines += ["", "all flags:", flags.FLAGS.get_help()]
  return "\n".join(lines)


def _flag_suggestion(name: str, module: str) -> str:
  """``; did you mean --<flag>?`` for an unknown ``--name``: the program's own flags first, then
  every flag absl knows (the dashed spellings and ``--no<flag>`` too)."""
  own = [f.name for f in _own_flags(module)]
  own += [f"no{f.name}" for f in _own_flags(module) if f.boolean]
  every = list(flags.FLAGS)
  every += [f"no{n}" for n in every if flags.FLAGS[n].boolean]
  close = did_you_mean(name, own) or did_you_mean(name, every)
  return (f"; did you mean --{close}? (expected one of the flags --help lists)" if close else
          "; expected one of the flags --help lists")


def _dotted(config, prefix: str = "") -> list[str]:
  """``<prefix>field = value`` for every field of a config, nested sections dotted."""
  from ml_collections import config_dict
  out = []
  for key in config.keys():
    value = config[key]
    if isinstance(value, config_dict.ConfigDict):
      out += _dotted(value, f"{prefix}{key}.")
    else:
      out.append(f"{prefix}{key} = {value!r}")
  return out


def _print_and_exit(text: str) -> None:
  """Prints ``text`` and exits 0; a reader that stops early (``| head``) is not an error."""
  try:
    print(text, flush=True)
  except BrokenPipeError:
    sys.stdout = open(os.devnull, "w")  # the interpreter's final flush would raise again
  sys.exit(0)


def parse_flags(argv, configs: dict[str, str] | None = None, check=None,
                module: str = "__main__") -> list[str]:
  """``app.run``'s flags parser: :func:`check_command_line`, then the config flags defined on
  this ``argv`` and absl's parse. Any bad input: one line, exit 2.

  Before that, ``--help`` / ``--helpfull`` print the program's help (``module``'s docstring and
  flags) and exit 0. After it, ``--print_config`` (programs with ``configs``) prints the
  resolved config and ``--only_check_args`` runs ``check()`` (the checks the program makes
  before it starts) and says in one line that it passed; both then exit 0 without running."""
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
  if configs and "print_config" not in flags.FLAGS:
    flags.DEFINE_bool("print_config", False, "Print the resolved config (the file, its argument "
                      "and the --config.<field> overrides), one field a line, and exit.",
                      module_name=module)
  words = argv[1:argv.index("--")] if "--" in argv else argv[1:]
  if any(a in _HELP or a in _HELPFULL for a in words):
    _print_and_exit(_help_text(module, configs, full=any(a in _HELPFULL for a in words)))
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
      raise BadInput(f"unknown flag --{e.flagname}{_flag_suggestion(e.flagname, module)}") from None
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
  except errors.BadInput as e:  # the command line's, and the config file's refusal of its argument
    fail(errors.first_line(e))
  except Exception:  # noqa: BLE001 - a bug while reading the command line: its traceback
    bug()
  only_check = flags.FLAGS["only_check_args"].value if "only_check_args" in flags.FLAGS else False
  if only_check and check is not None:
    run_main(check, setup=False)  # a refusal: its one line, exit 2, as the run's
  if configs and flags.FLAGS.print_config:
    _print_and_exit("\n".join(line for name in configs
                              for line in _dotted(flags.FLAGS[name].value, f"{name}.")))
  if only_check:
    prog = os.path.basename(argv[0])
    what = ("the command line and the config's values pass" if configs else "the command line passes")
    said = (f"{what} every check {prog} makes before it starts" if check is not None else
            f"the command line parses ({prog} has no other check to make before it starts)")
    print(f"ok: {said}; --only_check_args: nothing was run", flush=True)
    sys.exit(0)
  return rest


def run_absl(main, configs: dict[str, str] | None = None, check=None) -> None:
  """``app.run(main)`` with :func:`parse_flags` (``configs``: the config flags and their default
  specs; ``check``: the checks ``main`` makes before it starts, which ``--only_check_args``
  runs alone) and ``main`` under :func:`run_main`; exits with ``main``'s code. ``--help`` lists
  the flags of ``main``'s module."""
  app.run(lambda argv: run_main(lambda: main(argv)),
          flags_parser=functools.partial(parse_flags, configs=configs, check=check,
                                         module=main.__module__))


# ---------------------------------------------------------------------------- argparse programs
class ArgumentParser(argparse.ArgumentParser):
  """``argparse.ArgumentParser`` whose refusals are :class:`BadInput` (``--flag: <why>``), so
  that :func:`run_script` prints them as one line, exit 2, instead of argparse's usage text and
  exit 2 from deep inside ``parse_args`` (subparsers are built of this class too)."""

  def error(self, message: str):
    # argparse formats "argument --beam_size/--beam-size: invalid int value: 'x'"
    m = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message, re.S)
    message = f"{m.group(1)}: {m.group(2)}" if m else message
    raise BadInput(message if "expected" in message else
                   f"{message}; expected the flags and values --help lists")


def run_script(main):
  """Entry point of an argparse program (its parser an :class:`ArgumentParser`): ``main()``
  under :func:`run_main`. An int returned by ``main`` is the exit code (e.g. a ``--check`` that
  found stale files)."""
  result = []
  code = run_main(lambda: result.append(main()))
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
