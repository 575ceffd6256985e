"""Every command in the documentation's code blocks is exercised by this test (or by a named CI step).

The documentation is README.md (the overview), every ``docs/*.md`` page and the experiment pages
(``experiments/README.md``, ``experiments/<paper>/README.md``): :func:`doc_pages`. Their fenced
``bash`` blocks are split into commands (continuation lines joined, comments dropped) and each
command is checked by the rule of its program:

* ``python train.py ...`` / ``jaxcap-train ...``: the real flag parser of the program
  (``jaxcap.commands.train``) parses it, which loads the config file with its argument and
  applies every ``--config.<field>=<value>`` override (a typo in a field, a bad value or an
  unknown config argument fails) — the run itself is not started;
* ``python evaluate.py ...`` / ``jaxcap-evaluate ...``: parsed by ``jaxcap.commands.evaluate``'s
  flags (names and value types);
* ``python scripts/<x>.py`` / ``python experiments/<paper>/<x>.py`` / ``python benchmarks/<x>.py``
  (any ``.py`` file of the checkout): the file exists and defines every ``--flag`` the command
  uses (absl or argparse);
* ``python -m jaxcap.<module>``: the module's file exists and defines every ``--flag``, as a script;
* ``make <target>``: a Makefile target (``make test`` / ``make test-slow`` are .ci/run's steps);
* ``pip install -r requirements.txt`` / ``-e .`` / ``.`` / ``-e ".[train]"``: the files (and
  the extra) exist (tests/test_package.py and tests/test_export.py install the package into fresh
  virtual environments);
* a few others (``tensorboard``, ``source .venv/bin/activate``, ``jupyter``, ``cd``): see RULES.

A command that no rule covers fails the test with its page and line, so a new section's commands
are either checked by an existing rule or need one added here. ``python`` blocks must compile;
the block marked ``<!-- readme-snippet: python-api -->`` is executed by tests/test_package.py.
Every relative link of the pages names a file or folder of the checkout. tests/readme_runner.py
*runs* the same commands (slow step).
"""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.programs import Programs

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SNIPPET_MARK = "<!-- readme-snippet: python-api -->"


def code_blocks(text: str):
  """``[(language, body, line number, marker)]`` of the fenced blocks; ``marker`` is an HTML
  comment on the line before the fence (or "")."""
  out, lines, i = [], text.splitlines(), 0
  while i < len(lines):
    m = re.match(r"^```(\w*)\s*$", lines[i])
    if m:
      start, body = i, []
      i += 1
      while i < len(lines) and not lines[i].startswith("```"):
        body.append(lines[i])
        i += 1
      prev = lines[start - 1].strip() if start else ""
      out.append((m.group(1), "\n".join(body), start + 1, prev if prev.startswith("<!--") else ""))
    i += 1
  return out


def shell_commands(body: str):
  """The commands of a shell block: continuation lines joined, comments and blanks dropped."""
  joined = re.sub(r"\\\n\s*", " ", body)
  cmds = []
  for line in joined.splitlines():
    words = shlex.split(line, comments=True)
    # Shell structure around a command (the multi-host loop): `for ... do`, `done; wait`,
    # `VAR=value` prefixes and a trailing `&` are not programs; the command inside is checked.
    if not words or words[0] in ("for", "done", "done;", "wait", "do"):
      continue
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
      words = words[1:]
    if words and words[-1] == "&":
      words = words[:-1]
    if words:
      cmds.append(words)
  return cmds


def doc_pages() -> list[Path]:
  """The pages whose commands are checked here and run by tests/readme_runner.py: README.md,
  docs/*.md, then experiments/README.md, each experiments/<name>/README.md and each paper's
  page, jaxcap/papers/<paper>/README.md."""
  return ([README] + sorted((REPO / "docs").glob("*.md")) + [REPO / "experiments" / "README.md"]
          + sorted((REPO / "experiments").glob("*/README.md"))
          + sorted((REPO / "jaxcap" / "papers").glob("*/README.md")))


def page_name(page: Path) -> str:
  return str(page.relative_to(REPO))


def readme_commands(page: Path = README):
  """``[(line, words)]``: the shell commands of one page."""
  cmds = []
  for lang, body, line, _ in code_blocks(page.read_text()):
    if lang in ("bash", "sh", "shell", "console"):
      cmds += [(line, c) for c in shell_commands(body)]
  return cmds


def documented_commands():
  """``[("<page>:<line>", words)]`` of every page of :func:`doc_pages`."""
  return [(f"{page_name(p)}:{line}", words) for p in doc_pages() for line, words in readme_commands(p)]


def _program(words):
  """``("train" | "evaluate" | <path.py> | <executable>, args)``."""
  if words[0] in ("python", "python3", ".venv/bin/python") and len(words) > 1:
    if words[1] == "-m":
      return "-m " + words[2], words[3:]
    return {"train.py": "train", "evaluate.py": "evaluate"}.get(words[1], words[1]), words[2:]
  if words[0] in ("jaxcap-compare", "jaxcap-import", "jaxcap-export", "jaxcap-serve"):
    module = {"jaxcap-compare": "compare", "jaxcap-import": "import_checkpoint",
              "jaxcap-export": "export", "jaxcap-serve": "serve"}[words[0]]
    return f"-m jaxcap.commands.{module}", words[1:]
  return {"jaxcap-train": "train", "jaxcap-evaluate": "evaluate"}.get(words[0], words[0]), words[1:]


def _flag_names(args):
  return [a[2:].split("=", 1)[0] for a in args if a.startswith("--") and len(a) > 2]


def _check_script(path: str, args) -> str:
  p = REPO / path
  if not p.exists():
    return f"{path}: no such file"
  src = p.read_text()
  # Flags may be defined by a jaxcap module the script imports (the experiments' shared
  # --workdir / --rows / --seeds / --steps of jaxcap.analysis.experiment.argument_parser).
  for package, module in re.findall(r"^from (jaxcap(?:\.\w+)*) import (\w+)", src, re.M):
    imported = REPO / package.replace(".", "/") / f"{module}.py"
    if imported.exists():
      src += imported.read_text()
  # ... or by a module beside it (benchmarks/common.py's shared shape and model flags).
  for module in re.findall(r"^import (\w+)", src, re.M):
    if (p.parent / f"{module}.py").exists():
      src += (p.parent / f"{module}.py").read_text()
  if path == "jaxcap/commands/import_checkpoint.py":
    # jaxcap-import --format F: the flags of F's importer, a module a paper declares.
    fmt = next((a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args)
                if a.split("=", 1)[0] == "--format" and ("=" in a or i + 1 < len(args))), None)
    if fmt is not None:
      from jaxcap.commands import import_checkpoint
      module = import_checkpoint.paper_importers().get(fmt)
      if module is None and fmt != import_checkpoint.DEFAULT_FORMAT:
        return f"{path}: --format {fmt}: no paper declares that importer"
      if module is not None:
        src += (REPO / (module.replace(".", "/") + ".py")).read_text()
  for name in _flag_names(args):
    if name.startswith("config."):
      continue  # config overrides of a DEFINE_config_file flag
    under = name.replace("-", "_")
    if not re.search(rf"[\"'](--)?({re.escape(under)}|{re.escape(name)})[\"']", src):
      return f"{path}: defines no flag --{name}"
  return ""


def _check_make(args) -> str:
  targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
  missing = [a for a in args if "=" not in a and a not in targets]
  return f"Makefile has no target {missing}" if missing else ""


def _check_pip(args) -> str:
  if args[:1] != ["install"]:
    return "only 'pip install' is covered"
  rest = args[1:]
  if rest[-2:] == ["--config-settings", "editable_mode=compat"]:  # tests/test_editable_install.py
    rest = rest[:-2]
  if rest[:1] == ["-r"]:
    return "" if (REPO / rest[1]).exists() else f"{rest[1]}: no such file"
  if rest in (["-e", "."], ["."]):
    return "" if (REPO / "pyproject.toml").exists() else "pyproject.toml: missing"
  if rest in (["-e", ".[train]"], [".[train]"]):  # the extra that brings requirements.txt
    import tomllib
    dynamic = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    extras = dynamic.get("optional-dependencies", {})
    return "" if "train" in extras else "pyproject.toml: no 'train' extra"
  return f"pip install {' '.join(rest)}: not covered"


RULES = {
    "make": _check_make,
    "pip": _check_pip,
    "tensorboard": lambda args: "" if "tensorboard" in (REPO / "requirements.txt").read_text() else
    "tensorboard is not in requirements.txt",
    "source": lambda args: "" if args == [".venv/bin/activate"] else f"source {args}: not covered",
    ".": lambda args: "" if args == [".venv/bin/activate"] else f". {args}: not covered",
    "cd": lambda args: "",
    "export": lambda args: "" if args and all("=" in a for a in args) else f"export {args}: not covered",
    "jupyter": lambda args: "" if all((REPO / a).exists() for a in args if a.endswith(".ipynb"))
    else "a notebook the command names is missing",
    "-m pytest": lambda args: "",
    "bash": lambda args: "" if args and (REPO / args[0]).is_file() and subprocess.run(
        ["bash", "-n", str(REPO / args[0])]).returncode == 0 else f"bash {args}: no such script, or it does not parse",
}



def test_the_readme_has_commands_and_the_api_snippet():
  cmds = readme_commands()
  assert len(cmds) > 20
  assert any(_program(c)[0] == "train" for _, c in cmds) and any(_program(c)[0] == "evaluate" for _, c in cmds)
  marked = [b for b in code_blocks(README.read_text()) if b[3] == SNIPPET_MARK]
  assert len(marked) == 1 and marked[0][0] == "python"
  assert "jaxcap.load(" in marked[0][1] and len(marked[0][1].splitlines()) <= 12
  top = code_blocks(README.read_text())[0]
  assert [c[:2] for c in shell_commands(top[1])] == [["make", "train"], ["make", "test"]]


def test_the_pages_are_found():
  names = [page_name(p) for p in doc_pages()]
  assert names[0] == "README.md" and "docs/USAGE.md" in names and "experiments/README.md" in names
  for paper in ("eta", "aat", "image_transformer", "mnmt", "tpgn"):
    assert f"jaxcap/papers/{paper}/README.md" in names
  assert "experiments/flickr8k/README.md" in names
  assert len(README.read_text().splitlines()) < 300, "the README is the overview; details go to docs/"


@pytest.mark.paper_gate
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_every_readme_command_is_covered():
  parsed, failures = [], []
  for where, words in documented_commands():
    prog, args = _program(words)
    if prog in ("train", "evaluate"):
      parsed.append((where, prog, args))
    elif prog.endswith(".py"):
      err = _check_script(prog, args)
      if err:
        failures.append(f"{where}: {' '.join(words)}\n    {err}")
    elif prog.startswith("-m jaxcap."):  # a module of the package run as a program
      err = _check_script(prog[3:].replace(".", "/") + ".py", args)
      if err:
        failures.append(f"{where}: {' '.join(words)}\n    {err}")
    elif prog in RULES:
      err = RULES[prog](args)
      if err:
        failures.append(f"{where}: {' '.join(words)}\n    {err}")
    else:
      failures.append(f"{where}: {' '.join(words)}\n    no rule covers {prog!r}; add one to "
                      "tests/test_readme.py")
  # train.py / evaluate.py parse each command as they would run it (absl's --only_check_args:
  # the command line validated and parsed, then nothing runs), each in a process of its own.
  with Programs() as programs:
    for where, prog, args in parsed:
      code, _, err = programs.run([f"{prog}.py", *args, "--only_check_args"], REPO)
      if code != 0:
        failures.append(f"{where}: {prog} {' '.join(args)}\n    {err.strip()[-500:]}")
  assert not failures, "documented commands that fail their check:\n" + "\n".join(failures)


def test_python_blocks_compile():
  for page in doc_pages():
    for lang, body, line, _ in code_blocks(page.read_text()):
      if lang == "python":
        compile(body, f"{page_name(page)}:{line}", "exec")


def test_relative_links_name_files_of_the_checkout():
  missing = []
  for page in doc_pages():
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"^[a-z]+:", target) or target.startswith("#"):
        continue
      path = (page.parent / target.split("#", 1)[0]).resolve()
      if not path.exists():
        missing.append(f"{page_name(page)}: {target}")
  assert not missing, "links to nothing:\n" + "\n".join(missing)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_parser_catches_a_bad_command(tmp_path):
  """The checks are not vacuous: a typo in a config field, a flag or a script name fails."""
  bad = [("train", ["--config", "configs/eta.py:synthetic", "--config.model.dimm=3"]),
         ("train", ["--config", "configs/eta.py:synthetic,variantt=x"]),
         ("evaluate", ["--workdir", "x", "--beam-sise", "3"]),
         ("train", ["--workdir", "x", "--config.no_such_key=3"]),  # the default config
         ("train", ["--config", "configs/aat.py:synthetic", "--config.num_train_steps=300"]),
         ("train", ["--workdir", "x", "--config.init_from=runs/y", "--config.scst.start_step=0"])]
  with Programs() as programs:
    codes = [programs.run([f"{prog}.py", *args, "--only_check_args"], REPO)[0] for prog, args in bad]
  assert codes == [2, 2, 2, 2, 0, 0], codes
  assert _check_script("jaxcap/papers/aat/table1.py", ["--workdir", "x", "--nonexistent-flag", "1"])
  assert not _check_script("jaxcap/papers/aat/table1.py", ["--workdir", "x"])
  assert _check_script("scripts/nonexistent.py", [])
  assert _check_make(["train", "bogus"]) and not _check_make(["test-slow", "ARGS=-x"])


@pytest.mark.paper_gate
def test_the_model_table_shows_the_declared_rows():
  """README.md's model table is ``python -m jaxcap.papers``'s (each paper's MODEL_ROWS): every
  row it shows is the printed one, in the printed order (a paper added since may be missing
  until the table is copied again; it is never wrong)."""
  from jaxcap.papers import __main__ as model_table
  text = README.read_text()
  start = text.index(model_table.HEADER)
  shown = text[start:text.index("\n\n", start)].splitlines()[2:]
  printed = model_table.rows()
  assert shown and all(row in printed for row in shown), [r for r in shown if r not in printed]
  assert shown == [row for row in printed if row in shown]
