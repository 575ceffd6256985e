"""Bad input to the scripts in ``scripts/`` and ``experiments/<paper>/``: one ``error:`` line on stderr, exit code 2.

The scripts run through :func:`jaxcap.cli.run_script` (``run_main``, and for absl ones
``run_absl``, as ``train.py`` and ``evaluate.py`` do). Each case is a real process (the exit code and the
absence of a traceback are the point) and writes nothing: the cases name a missing run or a
bad flag value, so no training starts.

Mutant tried: the scripts' ``__main__`` blocks back to ``main()`` / ``app.run(main)`` (the
missing-run cases end in a ``FileNotFoundError`` traceback, exit 1; the bad-value cases in
``SystemExit`` text without ``error:``, exit 1).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests import fast_compile

from tests import papers

REPO = Path(__file__).resolve().parents[2]

CASES = [
    # (script, args, needle)
    ("experiments/decoding/beam_modes.py", ["--workdir={tmp}/nowhere"], "{tmp}/nowhere/config.json"),
    ("experiments/decoding/beam_modes.py", [], "--workdir"),
    ("experiments/flickr8k/table.py", ["--workdir", "{tmp}/t", "--seeds", "a,b"], "--seeds"),
] + [c for m in papers.shared_cases() for c in getattr(m, 'SCRIPT_CASES', [])]


@pytest.mark.slow
@pytest.mark.parametrize("script,args,needle", CASES, ids=[f"{c[0]}:{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_and_exit_2(tmp_path, script, args, needle):
  argv = [sys.executable, str(REPO / script)] + [a.format(tmp=tmp_path) for a in args]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert needle.format(tmp=tmp_path) in lines[0] and "expected" in lines[0], lines[0]
  assert sorted(os.listdir(tmp_path)) == []  # nothing written


# Every script in scripts/ and experiments/*/, each with a bad flag value: (args, the flag the line must name).
BAD_FLAG = {
    "experiments/decoding/beam_modes.py": (["--workdir={tmp}/t", "--beam_size=x"], "--beam_size"),
    "scripts/build_tfds.py": (["--out={tmp}/t", "--overwrite=maybe"], "--overwrite"),
    "experiments/decoding/cider_compat_diff.py": (["--cache_dir={tmp}/t", "--images=0"], "--images"),
    "scripts/extract_features.py": (["--images", "{tmp}", "--out", "{tmp}/o", "--batch_size", "x"], "--batch_size"),
    "scripts/figures.py": (["words", "--workdir", "{tmp}/t", "--out", "{tmp}/a", "--index", "x"], "--index"),
    "experiments/flickr8k/table.py": (["--workdir", "{tmp}/t", "--stages", "nope"], "--stages"),
    "experiments/flickr8k/config_sweep.py": (["--model", "transformer", "--workdir", "{tmp}/t", "--seeds", "x"],
                                             "--seeds"),
    "experiments/flickr8k/scst_sweep.py": (["--sweep", "{tmp}/s", "--xe-workdir", "{tmp}/x", "--out", "{tmp}/o",
                                            "--seed", "x"], "--seed"),
    "experiments/pixels/run.py": (["--workdir", "{tmp}/t", "--steps", "x"], "--steps"),
    "experiments/pixels/joint.py": (["--workdir", "{tmp}/t", "--size", "0"], "--size"),
}
BAD_FLAG.update(papers.collected('SCRIPT_BAD_FLAG'))  # each paper's scripts

# Scripts that read a trained run: {run} is its workdir.
READS_RUN = {
    "experiments/decoding/beam_modes.py": ["--workdir={run}"],
    "scripts/figures.py": ["words", "--workdir", "{run}", "--out", "{tmp}/a"],
}
READS_RUN.update(papers.collected('SCRIPT_READS_RUN'))  # each paper's scripts

# Scripts that write runs (or files) under a directory: {out} is that directory. A file there
# instead of a directory is refused before anything trains; ``run`` is where a row's first run
# lives (None: the script keeps no checkpoints, or needs ../shared/data).
WRITES = {
    "scripts/build_tfds.py": (["--out={out}", "--config.data.num_train=16", "--config.data.num_val=8",
                       "--config.data.num_test=8"], None),
    "experiments/decoding/cider_compat_diff.py": (["--cache_dir={out}", "--images=4", "--config={repo}/configs/transformer.py:synthetic",
                              "--config.data.num_train=16", "--config.data.num_val=8",
                              "--config.data.num_test=8"], None),
    "scripts/extract_features.py": (["--images", "{repo}/docs", "--out", "{out}", "--random_weights"], None),
    "experiments/flickr8k/table.py": (["--workdir", "{out}", "--models", "transformer", "--seeds", "0", "--steps", "1"], None),
    "experiments/flickr8k/config_sweep.py": (["--model", "transformer", "--workdir", "{out}", "--settings", "base"], None),
    "experiments/flickr8k/scst_sweep.py": (["--sweep", "{repo}/docs", "--xe-workdir", "{repo}/docs", "--out", "{out}"], None),
    "experiments/pixels/run.py": (["--workdir", "{out}", "--seeds", "0", "--steps", "1"], None),
    "experiments/pixels/joint.py": (["--workdir", "{out}", "--seeds", "0", "--steps", "1", "--tiny"], None),
}
WRITES.update(papers.collected('SCRIPT_WRITES'))  # each paper's scripts


def _run_script(script, args, cwd):
  # One CPU device: the table configs' batch sizes need not split over the suite's 8.
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1 " + fast_compile.FLAGS)
  env["PYTHONPATH"] = str(REPO)
  # A paper's script is a module of the package (python -m jaxcap.papers.<paper>.<script>).
  prog = ["-m", script[:-3].replace("/", ".")] if script.startswith("jaxcap/") else [str(REPO / script)]
  return subprocess.run([sys.executable, *prog, *args], capture_output=True,
                        text=True, env=env, timeout=300, cwd=cwd)


def _one_error_line(proc, *needles):
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert "expected" in lines[0] and all(n in lines[0] for n in needles), lines[0]
  return lines[0]


@pytest.mark.paper_gate
def test_every_script_is_covered():
  papers = [p for p in (REPO / "jaxcap" / "papers").glob("*/*.py") if "__main__" in p.read_text()]
  scripts = sorted(str(p.relative_to(REPO)) for p in [*(REPO / "scripts").glob("*.py"),
                                                       *(REPO / "experiments").glob("*/*.py"), *papers])
  assert sorted(BAD_FLAG) == scripts
  assert sorted(set(READS_RUN) | set(WRITES)) == scripts


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(BAD_FLAG))
def test_a_bad_flag_value_is_one_line(tmp_path, script):
  args, flag = BAD_FLAG[script]
  _one_error_line(_run_script(script, [a.format(tmp=tmp_path) for a in args], tmp_path), flag)
  assert sorted(os.listdir(tmp_path)) == []  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(READS_RUN))
def test_a_missing_run_is_one_line(tmp_path, script):
  args = [a.format(tmp=tmp_path, run=tmp_path / "nowhere") for a in READS_RUN[script]]
  _one_error_line(_run_script(script, args, tmp_path), str(tmp_path / "nowhere"))
  assert sorted(os.listdir(tmp_path)) == []


def _damage(workdir: Path) -> None:
  """A step whose every state file is garbage (an unreadable checkpoint, not another tree)."""
  import jax.numpy as jnp
  from jaxcap.training import checkpoint as ckpt_lib
  ck = ckpt_lib.Checkpoints(str(workdir))
  ck.save_latest(4, {"w": jnp.zeros(3)}, {"pos": 4})
  ck.close()
  for f in (workdir / "checkpoints" / "4" / "state").rglob("*"):
    if f.is_file():
      f.write_bytes(b"\x00garbage" * 4)


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory):
  """A run's workdir (config, vocabulary, info of the tiny Transformer) whose only checkpoint
  is unreadable."""
  from tests.training.test_train import tiny_config
  from jaxcap import data as data_lib
  from jaxcap import run_dir
  workdir = tmp_path_factory.mktemp("damaged") / "run"
  config = tiny_config()
  config.data.num_train, config.data.num_val, config.data.num_test = 16, 8, 8
  dataset = data_lib.get_dataset(config.data)
  run_dir.init_workdir(str(workdir), config, dataset.vocab, dict(dataset.info))
  _damage(workdir)
  return workdir


def _tree(d: Path):
  return sorted((str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(READS_RUN))
def test_a_damaged_checkpoint_is_one_line(tmp_path, script, damaged_run):
  before = _tree(damaged_run)
  args = [a.format(tmp=tmp_path, run=damaged_run) for a in READS_RUN[script]]
  _one_error_line(_run_script(script, args, tmp_path), str(damaged_run / "checkpoints" / "4"), "damaged")
  assert _tree(damaged_run) == before and sorted(os.listdir(tmp_path)) == []  # nothing written or moved


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(WRITES))
def test_a_file_for_the_output_directory_is_one_line(tmp_path, script):
  out = tmp_path / "afile"
  out.write_text("")
  args = [a.format(out=out, repo=REPO) for a in WRITES[script][0]]
  _one_error_line(_run_script(script, args, tmp_path), str(out))
  assert sorted(os.listdir(tmp_path)) == ["afile"] and out.read_text() == ""


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(s for s, (_, run) in WRITES.items() if run))
def test_a_damaged_checkpoint_in_a_table_run_is_one_line(tmp_path, script):
  """A row's run that was interrupted and whose only checkpoint is unreadable: the script
  stops with the resume's line naming the step (no traceback), as train.py does."""
  args, run = WRITES[script]
  out = tmp_path / "table"
  _damage(out / run)
  _one_error_line(_run_script(script, [a.format(out=out, repo=REPO) for a in args], tmp_path),
                  str(out / run / "checkpoints" / "4"), "damaged")


@pytest.mark.parametrize("clusters", ["0", "2,-1", "two"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_tpgn_roles_clusters_must_be_positive_numbers(tmp_path, clusters):
  line = _one_error_line(_run_script("jaxcap/papers/tpgn/roles.py",
                                     ["--workdir", str(tmp_path / "nowhere"), "--clusters", clusters],
                                     tmp_path), f"--clusters={clusters}")
  assert "positive numbers of clusters" in line and sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_image_transformer_spread_of_another_model_is_one_line(tmp_path):
  """``analysis.py spread`` reads the decoder outputs c_t of the Image Transformer / AoANet: a
  TPGN run is refused naming --workdir, not an AttributeError."""
  import jaxcap
  from jaxcap import run_dir
  from jaxcap.training import train_lib
  run = tmp_path / "tpgn"
  config = jaxcap.get_config("tpgn.py:synthetic,tiny", test_after_training=False)
  trainer = train_lib.Trainer(config, str(run))
  run_dir.init_workdir(str(run), config, trainer.dataset.vocab, trainer.info)
  ckpts = run_dir.checkpoints(str(run), config)
  ckpts.save_latest(1, trainer.prepare_variables(trainer.initial_state()), {"epoch": 0})
  ckpts.close()
  before = _tree(run)
  line = _one_error_line(_run_script("jaxcap/papers/image_transformer/analysis.py",
                                     ["spread", "--workdir", str(run)], tmp_path), f"--workdir={run}")
  assert "a run of model 'tpgn'; expected a run of the Image Transformer or AoANet" in line
  assert _tree(run) == before
