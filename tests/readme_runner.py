"""Every documented command runs as written, from a fresh copy of the checkout (slow step).

The documentation is README.md, docs/*.md, the experiment pages (experiments/README.md,
experiments/<name>/README.md) and the paper pages (jaxcap/papers/<paper>/README.md;
tests/test_readme.py's ``doc_pages``). This is the runner behind one test module per part
(:data:`PARTS`): tests/test_readme_run.py (README.md), tests/test_readme_run_docs.py
(docs/*.md), tests/test_readme_run_experiments.py and tests/test_readme_run_papers.py, each
with its own fresh copy, so that the slow step's two pytest workers share the parts (no command
of one part reads what another writes).

tests/test_readme.py parses each command with the real parsers; this module *runs* them, in
page order (later commands use the runs of earlier ones, as a reader's would), each in
``bash`` from the copy's root with ``python`` / ``jaxcap-*`` / ``make`` of the test's
environment, at the tiny sizes (:func:`shrink`: a command's config gets the argument ``tiny``,
jaxcap/config_common.py and the model's tiny_sizes, and the scripts their own size-shrinking flags: steps, images, widths,
seeds, batch sizes); a command is otherwise the README's text. Each must exit 0,
print no traceback, and leave the files it promises (:data:`PROMISES`).

Data the README's commands read but this machine does not have is generated in the same
layout before the first command: tiny COCO-layout Karpathy and cocotalk files under
``data/coco`` and ``data/mine`` (tests/data/fakes.py); ``../shared/data`` (Flickr8k, Multi30k)
is the real one (``JAXCAP_SHARED_DATA``), and the commands that need it are skipped, with the
reason, where it is absent. Files a command names that no command of its part makes (the ensemble
members ``runs/a``, ``runs/b``, ``runs/c``; ``P.json`` / ``captions_test.json``; the default run
``runs/transformer_synthetic`` that an experiment page starts from) are made by
:func:`_prerequisites` right before that command, as a reader would have them.

:data:`NOT_RUN` lists the commands that are not run here and why; :data:`HEAVY` the paper-table
builds that run only with ``JAXCAP_README_RUN=all`` (too long for .ci/run's budget); a
multi-seed reproduction of a table whose first command ran is not run again (:func:`_not_run`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests import fast_compile

from tests import papers
from tests.test_readme import README, REPO, code_blocks, doc_pages, page_name

SHARED_DATA = Path(os.environ.get("JAXCAP_SHARED_DATA", REPO.parent / "shared" / "data"))

# (regex on the command, reason): matched commands are not run.
NOT_RUN = [
    (r"/work/runs/scst|^export JAXCAP_SHARED_DATA=/work/shared/data$",
     "the Flickr8k SCST sweep and table as they were run (a worktree without ../shared, absolute "
     "run folders outside the checkout, ~1 hour of training): tests/scripts/test_table_scripts.py "
     "runs table.py's --xe-workdir / --scst-* flags and scst_sweep.py on faked runs"),
    (r"^make test$", "the default test suite itself: .ci/run's first step"),
    (r"^make test-slow", "the slow test suite, which holds this test: .ci/run's second step"),
    (r"^pip install", "installs into the current environment: tests/test_package.py installs the "
                      "checkout into a fresh virtual environment (-r requirements.txt, -e ., .) "
                      "and runs the installed programs"),
    (r"^tensorboard ", "starts a server that runs until stopped"),
    (r"^jaxcap-serve ", "starts a server that runs until stopped: tests/test_serve.py runs the program "
                        "(its address printed, SIGTERM: exit 0) and its endpoints, tests/test_serve_browser.py "
                        "serves a trained run to headless Chromium and load-tests it"),
    (r"^jupyter ", "starts a notebook server; tests/test_notebooks.py executes the notebooks"),
    (r"^(source|\.) \.venv/bin/activate", "changes the interactive shell only"),
    (r"^python scripts/extract_features.py --images photos ",
     "needs real backbone weights (resnet101.safetensors) and the reader's own photos/ and "
     "captions.json: tests/features/test_extract.py runs the same extraction with random weights "
     "on generated images and trains train.py on its output"),
    (r"^python train.py .*--config.data.root=data/photos ",
     "trains on the extraction above (not run): tests/features/test_extract.py::"
     "test_train_py_trains_on_the_output runs this command's overrides on its extracted output"),
    (r"^python evaluate.py --workdir runs/photos --images photos_new ",
     "captions the reader's own photos with the run trained on the extraction above (not run; "
     "needs resnet101.safetensors): tests/features/test_caption_images.py runs evaluate.py "
     "--images on a run trained on a random-weights extraction"),
    (r"(^|\s)bash benchmarks/gpu_record\.sh",
     "the one-call GPU record (a GPU host, the PyTorch references in .anchors/): "
     "tests/benchmarks/test_gpu_record.py runs the 'Next GPU session' commands of docs/PERFORMANCE.md "
     "as written in the script's tiny CPU mode (SMALL=1, OUT as the GPU host sets it) and collects them"),
    (r"^python benchmarks/report\.py --collect DIR",
     "DIR is what a GPU call of gpu_record.sh packed: tests/benchmarks/test_gpu_record.py collects "
     "the tiny CPU run's"),
    (r"^python evaluate.py --workdir runs/bu --server test2014 ",
     "needs a run trained on COCO bottom-up features and COCO's 40,775 test2014 feature files: "
     "tests/evaluation/test_signature.py::test_server_results_file_for_a_set_without_references "
     "runs evaluate.py --server on a run trained on Karpathy-layout features and a generated set "
     "in the same layout (cocotest_bu_att/fc/box, image_info_test2014.json)"),
    (r"^jaxcap-import --checkpoint data/sc/model-best\.pth ",
     "a published self-critical.pytorch checkpoint (a .pth: torch needed) that CI does not have: "
     "tests/importers/test_self_critical.py imports its committed fixture models (.safetensors) "
     "and the line before runs jaxcap-import on one"),
    (r"^python evaluate.py --workdir runs/sc_transformer ",
     "evaluates the import above on COCO's Karpathy test split with bottom-up features: "
     "tests/importers/test_self_critical.py::test_imported_run_evaluates_on_its_data runs "
     "evaluate.py on an imported run with generated data of its feature width"),
    (r"^for i in 0 1; do .*JAX_NUM_PROCESSES=2",
     "the two-process launch: tests/training/test_multihost.py::test_train_py_two_processes_like_one "
     "runs this command (train.py, two processes x 4 CPU devices, the same environment variables) "
     "with the sizes of this module and compares it with one process x 8 devices"),
    *papers.listed("README_NOT_RUN"),  # each paper's (regex, reason) pairs
]

# Paper-table builds that train many runs even at one seed and 4 steps (seconds measured for
# the shrunk command on the 2-core CI machine while other jobs ran): they run only with
# JAXCAP_README_RUN=all, to keep .ci/run within its time (all passed that way; see the notes).
HEAVY = {
    "experiments/flickr8k/table.py": "8 models x cross-entropy + SCST on Flickr8k, and the nearest neighbour (611 s)",
    "experiments/pixels/joint.py": ("renders and trains both rows (67 s in .ci/run); tests/scripts/"
                                    "test_table_scripts.py::test_pixels_joint_table_trains_both_rows (heavy "
                                    "tier) runs it at the shrunk sizes and checks its table"),
    "experiments/pixels/run.py": ("render, extract, nearest neighbour, train, caption_images and score "
                                  "(149 s); tests/features/test_pixels.py (heavy tier) renders, extracts, "
                                  "trains and captions images, as USAGE's commands do in the slow step"),
    "benchmarks/run.py": ("a GPU benchmark whose bfloat16 rows XLA emulates on a CPU (still compiling "
                          "after 622 s); tests/benchmarks/test_scripts.py runs run.py on every "
                          "registered model at tiny sizes"),
    "experiments/flickr8k/config_sweep.py": ("a config sweep trained on Flickr8k (112 s); "
                                             "tests/scripts/test_table_scripts.py trains and reads one"),
    "benchmarks/input_pipeline.py": ("the input pipeline timed with a training loop (99 s); "
                                     "tests/benchmarks/test_scripts.py runs it at tiny sizes"),
}
HEAVY.update(papers.collected('README_HEAVY'))  # each paper's scripts

# Commands that need ../shared/data (skipped where it is absent).
NEEDS_SHARED = re.compile("|".join([r"flickr8k|multi30k|m30k",
                                    *papers.listed("README_NEEDS_SHARED")]))

# What a command promises to write (paths relative to the copy's root), by regex on the command
# (``{0}``, ``{1}``, ...: the regex's groups).
PROMISES = [
    (r"^make train$", ["runs/transformer_synthetic/scores_test.json", "runs/transformer_synthetic/best"]),
    (r"^python scripts/extract_features.py --images docs/figures --out runs/features_trial",
     ["runs/features_trial/features.json", "runs/features_trial/fc/lstm_synthetic_curves.npy",
      "runs/features_trial/att/lstm_synthetic_curves.npz"]),
    (r"^python train\.py$", ["runs/transformer_synthetic/scores_test.json"]),
    (r"--tag _clip --clip_weights", ["runs/transformer_synthetic/scores_test_clip.json"]),
    (r"--out S_clip\.json", ["S_clip.json"]),
    (r"^python -m jaxcap\.clip\.weights --random --out (\S+)/open_clip_model\.safetensors$",
     ["{0}/open_clip_model.safetensors", "{0}/open_clip_config.json"]),
    (r"^python -m jaxcap\.data\.render --out runs/scenes_test ", ["runs/scenes_test/images/20000000.png"]),
    (r"^python -m jaxcap\.data\.render --out runs/scenes_train ", ["runs/scenes_train/images/0.png"]),
    (r"--workdir runs/t1_clip ", ["runs/t1_clip/scores_test.json"]),
    (r"configs/pixels\.py:synthetic --workdir runs/pixels_scenes$", ["runs/pixels_scenes/scores_test.json",
                                                                     "runs/pixels_scenes/best"]),
    (r"--workdir runs/pixels_scenes --images ", ["runs/pixels_scenes/captions_png.json"]),
    (r"--workdir runs/t1_scst", ["runs/t1_scst/scores_test.json"]),
    (r"^jaxcap-train .*--workdir runs/pkg ", ["runs/pkg/scores_test.json"]),
    (r"^jaxcap-evaluate --workdir runs/pkg ", ["runs/pkg/predictions_test_beam3.json"]),
    (r"--workdir runs/t1 .*--config.num_train_steps=3000", ["runs/t1/scores_test.json"]),
    (r"--tag _beam3", ["runs/t1/predictions_val_beam3.json", "runs/t1/scores_val_beam3.json"]),
    (r"--tag _sample", ["runs/t1/predictions_test_sample.json"]),
    (r"--out S\.json", ["S.json"]),
    (r"--ensemble runs/a,runs/b --beam-size 3", ["runs/a/predictions_test_ensemble.json"]),
    (r"--workdir runs/ens --tag _abc", ["runs/ens/predictions_test_abc.json"]),
    (r"figures\.py curves", ["curves.png"]),
    (r"figures\.py words", ["lstm_test3_attention.png"]),
    (r"build_tfds\.py", ["data/tfds"]),
    (r"^jaxcap-import .*--workdir runs/sc_trial$", ["runs/sc_trial/config.json", "runs/sc_trial/vocab.json",
                                                     "runs/sc_trial/checkpoints/1234"]),
    (r"--workdir runs/sc_fc_trial --images", ["runs/sc_fc_trial/captions.json"]),
    (r"--beam-mode self_critical --tag _sc3", ["runs/transformer_synthetic/scores_test_sc3.json"]),
    (r"--tag _beam2$", ["runs/transformer_synthetic/scores_test_beam2.json"]),
    (r"^jaxcap-export --workdir runs/transformer_synthetic ", ["runs/transformer_synthetic.jaxcap"]),
    # Every table script writes its markdown table ({0}: the command's workdir).
    (r"(?:experiments/\w+/|jaxcap\.papers\.\w+\.)(?:table\d?|ablations)(?:\.py)? --workdir (\S+)", ["{0}/table.md"]),
    (r"experiments/pixels/run\.py --workdir (\S+)", ["{0}/table.md", "{0}/results.json"]),
    (r"experiments/pixels/joint\.py --workdir (\S+)", ["{0}/table.md", "{0}/table.json"]),
    (r"-m jaxcap\.data\.render --out (\S+)(?!.*--names image_id)", ["{0}/captions.json", "{0}/images/test_00000.png"]),
    (r"benchmarks/run\.py", ["benchmarks/results"]),
    *papers.listed("README_PROMISES"),  # each paper's scripts
]

# What a command promises to print (regexes on its stdout lines), by regex on the command:
# docs/USAGE.md's CLIP-S section says each scoring prints the signature line under the table,
# a note on the cosines clipped to 0, and the files it wrote.
PRINTS = [
    (r"^python evaluate\.py .*--clip_weights", [r"^signature: .*\|CLIP-S ViT-", r"^note: CLIP-S: \d+ of \d+ cosines",
                                                r"^wrote \S+"]),
]

# The documented command that writes stand-in CLIP weights ({0}: the file), for the commands
# that score or train with them (python -m jaxcap.clip.weights; small towers by default).
STANDIN_CLIP = re.compile(r"^python -m jaxcap\.clip\.weights --random --out (\S+\.safetensors)$")

# Appended to the scripts' and benchmarks' commands (their own size flags).
_SCRIPT_SHRINK = {
    "experiments/flickr8k/table.py": "--steps 4 --batch-size 8 --scst-steps 2 --seeds 0",
    # One setting: the choice among settings is tested in tests/scripts/test_table_scripts.py.
    "experiments/flickr8k/config_sweep.py": ("--seeds 0 --settings 'num_train_steps=4+eval_every_steps=2"
                                             "+checkpoint_every_steps=2+batch_size=8'"),
    "experiments/decoding/cider_compat_diff.py": "--images 16",
    "scripts/extract_features.py": "--size 64 --att_size 2",
    "experiments/pixels/run.py": ("--num_train 24 --num_val 8 --num_test 8 --size 32 --att_size 2 "
                                  "--fields '{\"width\": 4, \"depths\": [1, 1, 1, 1]}' --steps 4 "
                                  "--eval_every 4 --batch_size 8 --seeds 0 --override model.dim=32 "
                                  "--override model.ff_dim=64 --override model.num_layers=1 "
                                  "--override model.num_dec_layers=1"),
    "experiments/pixels/joint.py": "--seeds 0 --steps 3 --tiny --num_train 16 --num_val 8 --num_test 8 --size 32",
    "-m jaxcap.data.render": "--num_train 24 --num_val 8 --num_test 8 --size 32",
    "benchmarks/run.py": "--batch 4 --eval_batch 4 --steps 1 --windows 1 --warmup 0 --train_images 16 --set dim=32",
}
_SCRIPT_SHRINK.update(papers.collected('README_SHRINK'))  # each paper's scripts
# Script flags that take a config (their config overrides are shrunk like train.py's).
_CONFIG_SCRIPTS = ("scripts/build_tfds.py", "experiments/decoding/cider_compat_diff.py",
                   *papers.listed("README_CONFIG_SCRIPTS"))


def page_commands(page: Path = README):
  """``[(line, command text)]``: each shell command of one page, continuation lines joined,
  comments dropped; a ``for ... done`` loop is one command."""
  out = []
  for lang, body, line, _ in code_blocks(page.read_text()):
    if lang not in ("bash", "sh", "shell", "console"):
      continue
    joined = re.sub(r"\\\n\s*", " ", body)
    pending = ""
    for text in joined.splitlines():
      text = text.split(" #", 1)[0].strip() if not text.lstrip().startswith("#") else ""
      if not text:
        continue
      if pending or text.startswith("for "):
        pending = f"{pending} {text}".strip()
        if re.search(r"\bdone\b", text):
          out.append((line, pending))
          pending = ""
        continue
      out.append((line, text))
  return out


def readme_commands():
  """``[(where, command text)]`` of every page, in page order (``where`` is ``<page>:<line>``)."""
  return [(f"{page_name(p)}:{line}", cmd) for p in doc_pages() for line, cmd in page_commands(p)]


# The parts, each run by a test module of its own in a fresh copy (no command of one part reads
# what another writes: a run a page names but does not make is a prerequisite, made right before
# the command), so that the slow step's two workers share the documentation's commands.
PARTS = {"readme": ("README.md",), "docs": ("docs/",), "experiments": ("experiments/",),
         "papers": ("jaxcap/papers/",)}


def part_of(where: str) -> str:
  """The part of the command at ``where`` (``<page>:<line>``)."""
  for part, prefixes in PARTS.items():
    if where.startswith(prefixes):
      return part
  raise ValueError(f"{where}: a documentation page of no part; add its folder to PARTS")


def part_commands(part: str):
  """The commands of one part of :data:`PARTS`: ``"readme"`` (README.md), ``"docs"``
  (docs/*.md), ``"experiments"`` (the experiment pages) or ``"papers"`` (the paper pages)."""
  return [(w, c) for w, c in readme_commands() if part_of(w) == part]


# The paper-table scripts: an experiment page first shows the command that builds a table, then
# (under "Error bars" and the like) the multi-seed / longer-schedule reproductions of it. Shrunk
# to one seed and 4 steps, a reproduction is the first command's run again in another workdir.
_TABLE_SCRIPTS = ("experiments/flickr8k/table.py", "experiments/pixels/run.py",
                  *papers.listed("README_TABLE_SCRIPTS"))


def _script(words) -> str:
  """The program of ``python <script> ...`` / ``python -m <module> ...`` ("" for others)."""
  script = words[1] if len(words) > 1 and words[0] == "python" else ""
  return f"-m {words[2]}" if script == "-m" and len(words) > 2 else script


def _workdir_of(words) -> str | None:
  for i, w in enumerate(words):
    if w.startswith("--workdir="):
      return w.split("=", 1)[1]
    if w == "--workdir" and i + 1 < len(words):
      return words[i + 1]
  return None


def _not_run(cmd: str, where: str = "", commands=()):
  """Why ``cmd`` (at ``where``; ``commands`` every documented ``(where, command)`` in order) is
  not run here, or None."""
  for pattern, why in NOT_RUN:
    if re.search(pattern, cmd):
      return why
  commands = list(commands)
  earlier = commands[:commands.index((where, cmd))] if (where, cmd) in commands else []
  for w, c in earlier:
    if c == cmd:
      return f"the same command as {w}, run before"
  words = cmd.split()
  script = _script(words)
  if script in HEAVY and os.environ.get("JAXCAP_README_RUN", "") != "all":
    return f"{HEAVY[script]}; runs with JAXCAP_README_RUN=all"
  if os.environ.get("JAXCAP_README_RUN", "") != "all":
    # A command that reads what a heavy (not run) command writes: its workdir is not there.
    for w, c in earlier:
      out = _workdir_of(c.split())
      if _script(c.split()) in HEAVY and out and re.search(rf"(^|[\s=]){re.escape(out)}(/|\s|$)", cmd):
        return f"reads {out}, which {w} writes ({HEAVY[_script(c.split())]}); runs with JAXCAP_README_RUN=all"
  if script in _TABLE_SCRIPTS and "--report" not in words:
    first = next(((w, c) for w, c in earlier if " ".join(c.split()[1:3]).startswith(script)), None)
    if first:
      return (f"a multi-seed / longer reproduction with {script}, whose {first[0]} command "
              "runs before; shrunk to one seed and 4 steps it would repeat that run")
  return None


# The config a command names, or its program's default.
_DEFAULT_CONFIGS = {"experiments/decoding/cider_compat_diff.py": "configs/transformer.py:flickr8k",
                    **papers.collected("README_DEFAULT_CONFIGS")}


def _tiny(words, default: str, at: int = 2, workdir: bool = False) -> list[str]:
  """``words`` with the config at its ``tiny`` sizes (jaxcap/config_common.py): the ``--config``
  value gets the argument ``tiny`` (or ``--config <default>,tiny`` is inserted at ``at``, before
  any override), an override the command gives of a field that ``tiny`` shrinks is shrunk again
  after it (the last wins), and with ``workdir`` a command that names no workdir gets the one
  its untouched config would have (the tiny config's name would differ)."""
  from jaxcap import config_common as common
  from jaxcap import config_files
  from jaxcap.models.base import CaptionModel
  words, found = list(words), False
  spec = next((w.split("=", 1)[1] for w in words if w.startswith("--config=")),
              next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--config"), default))
  if workdir and not any(w == "--workdir" or w.startswith("--workdir=") for w in words):
    words.append(f"--workdir={config_files.default_workdir(spec)}")
  for i, w in enumerate(words):
    if w.startswith("--config="):
      words[i], found = f"{w},tiny" if ":" in w else f"{w}:tiny", True
    elif w == "--config" and i + 1 < len(words):
      words[i + 1], found = f"{words[i + 1]},tiny" if ":" in words[i + 1] else f"{words[i + 1]}:tiny", True
  if not found:
    words[at:at] = ["--config", f"{default},tiny"]
  sizes = {**common.TINY_RUN, **{f"data.{k}": v for k, v in common.TINY_DATA.items()},
           **{f"model.{k}": v for k, v in CaptionModel.TINY_SIZES.items()}}
  given = {w.split("=", 1)[0][len("--config."):]: w.split("=", 1)[1] for w in words
           if w.startswith("--config.") and "=" in w}
  words += [f"--config.{k}={sizes[k]}" for k in given if k in sizes]
  if int(given.get("scst.start_step", "0") or 0) > 0:
    words.append("--config.scst.start_step=2")  # self-critical training within the tiny run
  return words


def shrink(root: Path, cmd: str) -> str:
  """``cmd`` at the tiny sizes (see the module docstring)."""
  words = shlex.split(cmd)
  if words[:2] == ["make", "train"]:
    # The Makefile's own way to pass arguments; its set-up step is tests/test_package.py's
    # (here the environment running the tests is the one `make` would have made).
    venv = Path(sys.prefix)
    args = " ".join(_tiny([], "configs/transformer.py:synthetic", at=0, workdir=True))
    return f"make -o {venv / '.installed-requirements'} train VENV={venv} ARGS={shlex.quote(args)}"
  prog = words[1] if words[0] in ("python", "python3") and len(words) > 1 else words[0]
  if prog == "-m" and len(words) > 2:
    prog = f"-m {words[2]}"
  if prog in ("train.py", "jaxcap-train") or prog in _CONFIG_SCRIPTS:
    at = (3 if prog.startswith("-m ") else 2) if words[0] in ("python", "python3") else 1
    shrunk = shlex.join(_tiny(words, _DEFAULT_CONFIGS.get(prog, "configs/transformer.py:synthetic"),
                              at=at, workdir=prog in ("train.py", "jaxcap-train")))
    return " ".join([shrunk, _SCRIPT_SHRINK.get(prog, "")]).strip()
  if prog == "benchmarks/run.py" and re.search(r"--models mnmt(\s|$)", cmd):
    # run.py refuses a --set field of none of the selected models; MNMT's width is hidden_dim.
    return cmd + " " + _SCRIPT_SHRINK[prog].replace("dim=32", "hidden_dim=32")
  if prog == "-m jaxcap.data.render" and "--names image_id" in cmd:
    # The images of a tiny synthetic run (by the ids it uses): each split the command draws at
    # the tiny run's size.
    from jaxcap import config_common as common
    sizes = {s: words[words.index(f"--num_{s}") + 1] for s in ("train", "val", "test") if f"--num_{s}" in words}
    return cmd + "".join(f" --num_{s} {common.TINY_DATA[f'num_{s}']}" for s, n in sizes.items() if n != "0") + " --size 32"
  if prog in _SCRIPT_SHRINK:
    return cmd + " " + _SCRIPT_SHRINK[prog]
  if prog in ("evaluate.py", "jaxcap-evaluate") and "--step" in words:
    # The step of the README's run, counted in the tiny run's steps (absl: the last wins).
    from jaxcap import config_common as common
    return cmd + f" --step {common.TINY_RUN['num_train_steps']}"
  return cmd


def _prerequisites(root: Path, cmd: str, env: dict):
  """Files the command names that no command of its part makes, made as a reader would have them."""
  def train(workdir, seed):
    if not (root / workdir / "best").exists():
      base = f"python train.py --workdir {workdir} --config.seed={seed}"
      _run(root, shrink(root, base), env)
  if re.search(r"--workdir[= ]runs/transformer_synthetic(\s|$)", cmd):
    train("runs/transformer_synthetic", 0)  # the README's default run (`make train`)
  if "--ensemble" in cmd:
    for i, name in enumerate(("a", "b", "c")):
      if f"runs/{name}" in cmd:
        train(f"runs/{name}", i)
  for _, documented in readme_commands():
    # The stand-in CLIP weights a command names, made by the documented command that makes them
    # (a command run alone, e.g. selected with -k, before the page's own run of it).
    m = STANDIN_CLIP.match(documented)
    if m and m.group(1) in cmd and not STANDIN_CLIP.match(cmd) and not (root / m.group(1)).exists():
      _run(root, documented, env)
  if "--predictions P.json" in cmd:
    run = root / "runs/transformer_synthetic"
    shutil.copy(run / "predictions_test.json", root / "P.json")
    # The references of the predicted images in the COCO annotation format.
    sys.path.insert(0, str(root))
    try:
      from jaxcap import data as data_lib
      import ml_collections
      config = ml_collections.ConfigDict(json.loads((run / "config.json").read_text()))
      refs = data_lib.get_dataset(config.data).references("test")
    finally:
      sys.path.remove(str(root))
    pairs = [(k, c) for k, captions in refs.items() for c in captions]
    anns = [{"image_id": k, "id": i, "caption": c} for i, (k, c) in enumerate(pairs)]
    images = [{"id": k} for k in refs]
    (root / "captions_test.json").write_text(json.dumps({"images": images, "annotations": anns}))


def _run(root: Path, cmd: str, env: dict, timeout: int = 900):
  r = subprocess.run(["bash", "-c", cmd], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, f"$ {cmd}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
  assert "Traceback (most recent call last)" not in r.stderr + r.stdout, f"$ {cmd}\n{r.stderr[-4000:]}"
  return r


def make_checkout(tmp_path_factory):
  """A fresh copy of the checkout (tracked and untracked-but-not-ignored files, modification
  times kept so that make sees the environment as set up) plus the generated data."""
  root = tmp_path_factory.mktemp("readme") / "jaxcap"
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                         capture_output=True, check=True).stdout.decode().split("\0")
  for f in filter(None, files):
    src = REPO / f
    if src.is_file():
      (root / f).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, root / f)
  from tests.data import fakes
  fakes.write_coco_layout(str(root / "data/coco"), counts=(24, 8, 8), cocotalk=True)
  fakes.write_coco_layout(str(root / "data/mine"), counts=(24, 8, 8))
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "PYTEST"))}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(root), JAXCAP_SHARED_DATA=str(SHARED_DATA),
             PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
             MPLBACKEND="Agg",
             # The suite's one compilation cache (tests/conftest.py: its folder, size limit and
             # file lock): a documented command that builds the shapes another command or test
             # built -- the default run's steps, trained by three of the four parts, by `make
             # train` and by the training tests -- loads them instead of compiling. A cache hit
             # is the same executable (the key leaves out the fake device count), so only time
             # depends on it.
             **{k: os.environ[k] for k in ("JAX_COMPILATION_CACHE_DIR",
                                           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                                           "JAX_COMPILATION_CACHE_MAX_SIZE") if k in os.environ},
             # XLA's CPU backend without its LLVM optimisation passes: a tiny model's train
             # step compiles in 7 s instead of 31 s; it runs slower, which 4 steps never feel.
             XLA_FLAGS=fast_compile.FLAGS)
  return root, env


def run_readme_command(checkout, where, cmd, commands):
  why = _not_run(cmd, where, commands)  # every page: a repeat in the other part counts
  if why:
    pytest.skip(f"{where}: not run here: {why}")
  if NEEDS_SHARED.search(cmd) and not SHARED_DATA.exists():
    pytest.skip(f"{where}: needs {SHARED_DATA}, absent here")
  root, env = checkout
  _prerequisites(root, cmd, env)
  out = _run(root, shrink(root, cmd), env).stdout
  for pattern, lines in PRINTS:
    if re.search(pattern, cmd):
      for line in lines:
        assert re.search(line, out, re.M), f"{where}: `{cmd}` printed no line matching {line!r}:\n{out[-2000:]}"
  for pattern, paths in PROMISES:
    m = re.search(pattern, cmd)
    if m:
      for p in paths:
        p = p.format(*m.groups())
        assert (root / p).exists(), f"{where}: `{cmd}` did not write {p}"


def module_tests(part: str):
  """``(checkout fixture, test function)`` of a test module that runs one part's commands, each
  a test of its own, in one fresh checkout per module."""
  commands, everything = part_commands(part), readme_commands()

  @pytest.fixture(scope="module")
  def checkout(tmp_path_factory):
    return make_checkout(tmp_path_factory)

  @pytest.mark.parametrize("where,cmd", commands, ids=[f"{w}:{c[:100]}" for w, c in commands])
  def test_documented_command_runs(checkout, where, cmd):
    run_readme_command(checkout, where, cmd, everything)

  return checkout, test_documented_command_runs
