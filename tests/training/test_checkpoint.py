"""Checkpoint robustness: damaged latest steps, ``keep_checkpoints`` after a crash,
``metrics.jsonl`` after a resume, and kill-and-resume at the checkpoint-writing moments.

The fast tests drive :class:`jaxcap.training.checkpoint.Checkpoints` on a small state; the
slow ones train the tiny Transformer of ``test_train.py`` and compare parameters bitwise
with a straight run.

Mutants tried on the fast tests (each made a test here fail, then was restored): ``resume``
re-raising the first restore error (no fallback: 7 fail); not moving the damaged step aside
(6 fail); ``trim`` a no-op (the two keep tests fail); ``drop_lines_after`` keeping
lines past the step; ``restore`` without its parameter-tree check (the mismatch test fails:
a damaged-checkpoint message, no :class:`TreeMismatchError`). The slow kill-loop test failed when the killed and the resumed runs used
different code (an accidental mutant: parameters differed by up to 0.33), and passes bitwise
otherwise.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.training import checkpoint as ckpt_lib
from jaxcap.training import train_lib, writers

REPO = Path(__file__).resolve().parents[2]


def _state(step):
  return {"w": jnp.arange(6.0).reshape(2, 3) + step, "b": jnp.full((4,), float(step))}


def _saved(tmp_path, steps=(4, 8, 12), keep=3):
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=keep)
  for s in steps:
    ck.save_latest(s, _state(s), {"pos": s})
  ck.close()
  return tmp_path / "checkpoints"


def _files(d: Path):
  return sorted(p for p in d.rglob("*") if p.is_file())


def _empty(step_dir):
  shutil.rmtree(step_dir)
  step_dir.mkdir()


def _no_state(step_dir):
  shutil.rmtree(step_dir / "state")


def _no_data(step_dir):
  shutil.rmtree(step_dir / "data")


def _corrupt_arrays(step_dir):
  for f in _files(step_dir / "state"):
    f.write_bytes(b"\x00garbage" * 4)


def _truncated_arrays(step_dir):
  for f in _files(step_dir / "state"):
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 3])


def _data_not_an_object(step_dir):
  for f in _files(step_dir / "data"):
    f.write_text("[1, 2, 3]")


@pytest.mark.parametrize("damage", [_empty, _no_state, _no_data, _corrupt_arrays, _truncated_arrays,
                                    _data_not_an_object])
def test_a_damaged_latest_step_falls_back_to_the_newest_intact_one(tmp_path, damage, capsys):
  ckdir = _saved(tmp_path)
  damage(ckdir / "12")
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  state, data, step = ck.resume(ckpt_lib.abstract(_state(0)))
  assert step == 8 and data == {"pos": 8}
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state(8))):
    np.testing.assert_array_equal(a, b)
  out = [l for l in capsys.readouterr().out.splitlines() if "damaged" in l]
  assert len(out) == 1 and str(ckdir / "12") in out[0] and str(ckdir / "8") in out[0], out
  # Set aside (not deleted), so the resumed run can write step 12 again.
  assert sorted(os.listdir(ckdir)) == ["4", "8"]
  assert (tmp_path / "damaged_checkpoints" / "12").is_dir()
  ck.save_latest(12, _state(12), {"pos": 12})
  assert ck.latest.all_steps() == [4, 8, 12]


def test_every_step_damaged_is_one_line_naming_the_newest(tmp_path):
  ckdir = _saved(tmp_path, steps=(4, 8))
  _empty(ckdir / "8")
  _no_state(ckdir / "4")
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  with pytest.raises(ValueError) as e:
    ck.resume(ckpt_lib.abstract(_state(0)))
  msg = str(e.value)
  assert "\n" not in msg and str(ckdir / "8") in msg and "damaged" in msg


@pytest.mark.parametrize("newest_damaged", [False, True])
def test_another_parameter_tree_is_refused_and_nothing_is_moved(tmp_path, newest_damaged):
  # A run written before a model change (here "b" renamed "bias"): every step holds the old
  # tree, so falling back or setting steps aside would only lose the run.
  ckdir = _saved(tmp_path)
  if newest_damaged:
    _empty(ckdir / "12")
  before = {str(p): p.read_bytes() for p in _files(tmp_path)}
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  new = {"w": jnp.zeros((2, 3)), "bias": jnp.zeros((4,))}
  with pytest.raises(ckpt_lib.TreeMismatchError) as e:
    ck.resume(ckpt_lib.abstract(new))
  msg = str(e.value)
  step = "8" if newest_damaged else "12"
  assert "\n" not in msg and msg.startswith(str(ckdir / step) + ": checkpoint of a different")
  assert "e.g. bias" in msg and "e.g. b)" in msg, msg
  assert not (tmp_path / "damaged_checkpoints").exists()
  assert {str(p): p.read_bytes() for p in _files(tmp_path)} == before
  with pytest.raises(ckpt_lib.TreeMismatchError):
    ck.restore(ckpt_lib.abstract(new), step=4)


def test_orbax_temporary_directory_is_ignored_and_removed(tmp_path, capsys):
  ckdir = _saved(tmp_path, steps=(4, 8))
  tmp = ckdir / "12.orbax-checkpoint-tmp-1234567"
  (tmp / "state").mkdir(parents=True)
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  _, _, step = ck.resume(ckpt_lib.abstract(_state(0)))
  assert step == 8 and not tmp.exists()
  assert "damaged" not in capsys.readouterr().out


def test_keep_holds_after_a_kill_between_save_and_cleanup(tmp_path):
  # keep + 1 steps on disk, as a kill after orbax renamed step 16 but before it deleted step 4.
  ckdir = _saved(tmp_path, steps=(4, 8, 12, 16), keep=4)
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  _, _, step = ck.resume(ckpt_lib.abstract(_state(0)))
  assert step == 16 and sorted(map(int, os.listdir(ckdir))) == [8, 12, 16]
  # And a save never leaves more than keep.
  _saved(tmp_path / "b", steps=(4, 8, 12, 16), keep=4)
  ck = ckpt_lib.Checkpoints(str(tmp_path / "b"), keep=2)
  ck.save_latest(20, _state(20), {"pos": 20})
  assert ck.latest.all_steps() == [16, 20]


def test_best_keeps_one_step_after_a_kill_between_save_and_cleanup(tmp_path):
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  ck.save_best_if_improved(4, _state(4), {"pos": 4}, {"CIDEr": 0.5})
  ck.close()
  # A second best written by a manager that has not deleted the first (the kill's leftover).
  loose = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  loose.best = type(ck.best)(ck.best.directory, options=type(ck.best._options)(
      max_to_keep=5, create=True, best_fn=lambda m: m["CIDEr"], best_mode="max",
      enable_async_checkpointing=False), item_names=("state", "data"))
  loose._save(loose.best, 8, _state(8), {"pos": 8}, {"CIDEr": 0.7})
  assert sorted(os.listdir(tmp_path / "best")) == ["4", "8"]
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3)
  ck.resume(ckpt_lib.abstract(_state(0)))
  assert sorted(os.listdir(tmp_path / "best")) == ["8"] and ck.best_value() == pytest.approx(0.7)


def test_metrics_lines_past_the_resumed_step_are_dropped(tmp_path):
  lines = [json.dumps({"step": s, "train/loss": 1.0 / s}) for s in (2, 4, 6, 8, 10)]
  path = tmp_path / "metrics.jsonl"
  path.write_text("\n".join(lines) + '\n{"step": 12, "train/lo')  # half-written by a kill
  assert writers.drop_lines_after(str(tmp_path), 6) == 3
  assert path.read_text() == "\n".join(lines[:3]) + "\n"
  assert writers.drop_lines_after(str(tmp_path), 6) == 0
  assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left
  assert writers.drop_lines_after(str(tmp_path / "absent"), 0) == 0
  # Damaged lines (non-UTF-8 bytes, nesting past the stack, a step of 1e999) are dropped too;
  # they raised UnicodeDecodeError / RecursionError / OverflowError.
  path.write_bytes(path.read_bytes() + b'{"step": 3, "x": "\xff\xfe"}\n' + b"[" * 100_000 + b"\n"
                   + b'{"step": 1e999}\n')
  assert writers.drop_lines_after(str(tmp_path), 6) == 3
  assert path.read_text() == "\n".join(lines[:3]) + "\n"


# ------------------------------------------------------------------ training runs (slow)

def _params(workdir, config, dataset):
  trainer = train_lib.Trainer(config, str(workdir), dataset=dataset)
  ck = ckpt_lib.Checkpoints(str(workdir), keep=config.keep_checkpoints)
  state, data_state = ck.restore(ckpt_lib.abstract(trainer.initial_state()))
  return int(state.step), jax.device_get(state.params), data_state


def _assert_same_run(a, b, config, dataset):
  sa, pa, da = _params(a, config, dataset)
  sb, pb, db = _params(b, config, dataset)
  assert sa == sb == config.num_train_steps and da == db
  la, lb = jax.tree.leaves(pa), jax.tree.leaves(pb)
  assert len(la) == len(lb) > 0
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(x, y)  # bitwise


def _metric_lines(workdir):
  return [json.loads(l) for l in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny():
  from tests.training.test_train import tiny_config
  from jaxcap import data as data_lib
  config = tiny_config(num_train_steps=16, keep_checkpoints=2)
  return config, data_lib.get_dataset(config.data)


@pytest.mark.slow
def test_kill_during_and_right_after_a_checkpoint_write_resumes_bitwise(tmp_path, tiny):
  """SIGKILL while step 8 is half-written, resume; SIGKILL right after step 12 is saved (before
  orbax deletes the oldest step), resume to 16: the parameters, data position and metric lines
  equal a straight run's bitwise, and ``keep_checkpoints`` (2) holds."""
  from tests.training.test_train import _train_cmd
  config, dataset = tiny
  killed, straight = tmp_path / "killed", tmp_path / "straight"
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  helper = str(REPO / "tests" / "training" / "faulty_train.py")
  args = _train_cmd(killed, 16, ["--config.keep_checkpoints=2"])[2:]
  for moment, on_disk in (("during:8", ["4"]), ("after:12", ["12", "4", "8"])):
    r = subprocess.run([sys.executable, helper, moment, *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == -signal.SIGKILL, r.stdout[-2000:] + r.stderr[-2000:]
    steps = sorted(p.name for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == on_disk, (moment, steps)
  assert any(".orbax-checkpoint-tmp" in p.name for p in (killed / "checkpoints").iterdir()) is False
  train_lib.Trainer(config, str(killed), dataset=dataset).fit()
  assert sorted(os.listdir(killed / "checkpoints")) == ["12", "16"]
  train_lib.Trainer(config, str(straight), dataset=dataset).fit()
  _assert_same_run(straight, killed, config, dataset)
  a, b = _metric_lines(straight), _metric_lines(killed)
  train_steps = lambda lines: [l["step"] for l in lines if "train/loss" in l]
  assert train_steps(b) == train_steps(a) == list(range(2, 17, 2))  # each step once
  assert [l.get("train/loss") for l in b] == [l.get("train/loss") for l in a]
  assert [l.get("val/CIDEr") for l in b] == [l.get("val/CIDEr") for l in a]


@pytest.mark.slow
def test_damaged_latest_step_resumes_from_the_one_before_like_a_straight_run(tmp_path, tiny, capsys):
  config, dataset = tiny
  run, straight = tmp_path / "run", tmp_path / "straight"
  short = config.copy_and_resolve_references()
  short.num_train_steps = 12
  train_lib.Trainer(short, str(run), dataset=dataset).fit()
  assert sorted(os.listdir(run / "checkpoints")) == ["12", "8"]
  _corrupt_arrays(run / "checkpoints" / "12")
  capsys.readouterr()
  train_lib.Trainer(config, str(run), dataset=dataset).fit()
  out = capsys.readouterr().out
  warn = [l for l in out.splitlines() if "damaged checkpoint" in l]
  assert len(warn) == 1 and str(run / "checkpoints" / "12") in warn[0] \
      and str(run / "checkpoints" / "8") in warn[0], out
  assert "Resumed from" in out and "at step 8." in out
  train_lib.Trainer(config, str(straight), dataset=dataset).fit()
  _assert_same_run(straight, run, config, dataset)
  assert [l["step"] for l in _metric_lines(run) if "train/loss" in l] == list(range(2, 17, 2))


def test_a_best_save_still_in_flight_counts_as_the_best(tmp_path, monkeypatch):
  """Asynchronously, orbax knows the step of a best save in flight but not its metrics: the next
  validation must still compare with it (else it always "improves" and early stopping never
  stops, as a loaded CI machine showed). The first save's commit is held back here (at most 5 s,
  so the old code's second save, which waits for it, fails the test instead of hanging)."""
  import threading
  import orbax.checkpoint as ocp
  release = threading.Event()
  original = ocp.CheckpointManager._finalize

  def held(self, *args, **kwargs):
    release.wait(5)
    return original(self, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "_finalize", held)
  ck = ckpt_lib.Checkpoints(str(tmp_path), keep=3, asynchronous=True)
  assert ck.save_best_if_improved(1, _state(1), {"pos": 1}, {"CIDEr": 0.5})
  assert not ck.save_best_if_improved(2, _state(2), {"pos": 2}, {"CIDEr": 0.5})  # not better
  release.set()
  assert ck.save_best_if_improved(3, _state(3), {"pos": 3}, {"CIDEr": 0.6})
  ck.close()
  reread = ckpt_lib.Checkpoints(str(tmp_path))
  assert reread.best_value() == pytest.approx(0.6) and reread.best_step() == 3
  reread.close()


def test_a_best_chosen_by_another_metric_is_one_line(tmp_path):
  """A resumed run whose config.best_metric is not the one that chose best/ (it raised
  KeyError('Bleu_4') from the stored metrics)."""
  ck = ckpt_lib.Checkpoints(str(tmp_path), best_metric="CIDEr")
  assert ck.save_best_if_improved(4, _state(4), {"pos": 4}, {"CIDEr": 0.5, "Bleu_4": 0.2})
  ck.close()
  ck = ckpt_lib.Checkpoints(str(tmp_path), best_metric="CIDEr")
  assert ck.best_value() == 0.5
  ck.close()
  ck = ckpt_lib.Checkpoints(str(tmp_path), best_metric="Bleu_4")
  with pytest.raises(ckpt_lib.BadInput) as e:
    ck.save_best_if_improved(8, _state(8), {"pos": 8}, {"CIDEr": 0.6, "Bleu_4": 0.3})
  ck.close()
  assert str(e.value) == (f"{tmp_path / 'best'}: step 4 was chosen by CIDEr, this run's best_metric is "
                          "'Bleu_4'; expected the best_metric of the run that wrote it (or a new --workdir)")
