"""The non-finite guard (jaxcap/training/guard.py): stop (default) or skip, never a NaN state.

Exit code of a stop: 3 (``jaxcap.cli.EXIT_NONFINITE``; 2 is bad input).

Mutants tried (each made a test here fail, then was restored): applying the update whatever
the flag (``jnp.where(ok, n, o)`` -> ``n``: the unit test sees changed parameters); writing
metrics with ``json.dumps``'s default ``allow_nan`` and no null conversion (the strict
metrics.jsonl reader rejects the bare ``NaN``).
"""

import contextlib
import io
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcap
from jaxcap import cli, run_dir
from jaxcap.training import checkpoint as ckpt_lib
from jaxcap.training import guard, steps, train_lib

TINY = {"data.num_train": 96, "data.num_val": 16, "data.num_test": 16, "model.dim": 32,
        "model.num_layers": 1, "model.num_dec_layers": 1, "model.num_heads": 4, "model.ff_dim": 64,
        "batch_size": 8, "eval_batch_size": 8, "eval_num_images": 16, "warmup_steps": 10,
        "test_after_training": False}
HUGE_LR = {"learning_rate": 1e30, "schedule": "constant"}


def _train(workdir, **overrides):
  """train.py's library entry point under the programs' contract (cli.run_main): ``(exit code,
  stderr)``."""
  config = jaxcap.get_config("transformer.py:synthetic", **TINY, **overrides)
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
      code = cli.run_main(lambda: train_lib.train_and_evaluate(config, str(workdir)))
    except SystemExit as e:
      code = e.code
  return code, err.getvalue()


def _strict_json_lines(path: Path) -> list[dict]:
  def no_constants(name):
    raise ValueError(f"bare {name} in {path}")
  return [json.loads(l, parse_constant=no_constants) for l in path.read_text().splitlines()]


def _snapshot(d: Path) -> dict:
  return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
  """A healthy workdir at step 4 (checkpoint and best), written through the training library
  without running the loop (what the tests need is its files; it saves two compilations)."""
  from jaxcap.data import pipeline
  wd = tmp_path_factory.mktemp("nonfinite") / "wd"
  config = jaxcap.get_config("transformer.py:synthetic", **TINY)
  trainer = train_lib.Trainer(config, str(wd))
  run_dir.init_workdir(str(wd), config, trainer.dataset.vocab)
  state = trainer.initial_state().replace(step=4)
  it = pipeline.make_train_iterator(trainer.dataset.split("train"), 8, seed=0)
  for _ in range(4):
    next(it)
  ckpts = ckpt_lib.Checkpoints(str(wd))
  ckpts.save_latest(4, state, it.get_state())
  assert ckpts.save_best_if_improved(4, state, it.get_state(), {"CIDEr": 0.5, "Bleu_4": 0.1})
  ckpts.close()
  return wd


@pytest.mark.slow
def test_nan_stops_with_one_line_and_keeps_the_previous_checkpoint(four_steps, tmp_path):
  wd = tmp_path / "wd"
  shutil.copytree(four_steps, wd)
  kept = {d: _snapshot(wd / d) for d in ("checkpoints", "best")}
  code, err = _train(wd, num_train_steps=12, eval_every_steps=2, checkpoint_every_steps=2,
                     log_every_steps=2, **HUGE_LR)
  assert code == 3, err[-3000:]
  lines = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, err[-3000:]
  line = lines[0]
  assert "non-finite training loss" in line and "gradient norm" in line and "image ids [" in line
  assert "latest checkpoint is still step 4" in line
  step = int(line.split("step ", 1)[1].split(":", 1)[0])
  assert 4 < step <= 6
  # The batch's image ids: the synthetic training ids, as many as the batch's rows.
  ids = line.split("image ids [", 1)[1].split("]", 1)[0].split(", ")
  assert len(ids) == 8
  ckpts = ckpt_lib.Checkpoints(str(wd))
  assert ckpts.latest_step() == 4 and ckpts.best_step() == 4
  assert {d: _snapshot(wd / d) for d in ("checkpoints", "best")} == kept
  records = _strict_json_lines(wd / "metrics.jsonl")
  bad = [r for r in records if r.get("nonfinite")]
  assert len(bad) == 1 and bad[0]["step"] == step
  assert set(bad[0]["nonfinite"]) <= {"train/loss", "train/grad_norm"} and bad[0]["nonfinite"]
  assert all(bad[0][k] is None for k in bad[0]["nonfinite"])


@pytest.mark.slow  # ~50 s on 2 busy cores: a training compile and a decoding compile
def test_skip_mode_skips_updates_and_counts_them(four_steps, tmp_path):
  wd = tmp_path / "wd"
  shutil.copytree(four_steps, wd)
  code, err = _train(wd, num_train_steps=8, eval_every_steps=100, checkpoint_every_steps=1,
                     keep_checkpoints=2, log_every_steps=1, nonfinite="skip", **HUGE_LR)
  assert code == 0, err[-3000:]
  records = [r for r in _strict_json_lines(wd / "metrics.jsonl") if r["step"] > 4 and "train/skipped_total" in r]
  assert records and records[-1]["step"] == 8 and records[-1]["train/skipped"] == 1
  assert records[-1]["train/skipped_total"] == sum(r["train/skipped"] for r in records) >= 2
  # Step 8 was skipped: its checkpoint holds exactly step 7's parameters and optimiser state.
  ckpts = ckpt_lib.Checkpoints(str(wd))
  assert sorted(ckpts.latest.all_steps()) == [7, 8]
  import ml_collections
  config = ml_collections.ConfigDict(json.loads((wd / "config.json").read_text()))
  trainer = train_lib.Trainer(config, str(wd))
  abstract = ckpt_lib.abstract(trainer.initial_state())
  s7, _ = ckpts.restore(abstract, step=7)
  s8, _ = ckpts.restore(abstract, step=8)
  assert int(s7.step) == 7 and int(s8.step) == 8
  for a, b in zip(jax.tree.leaves((s7.params, s7.opt_state)), jax.tree.leaves((s8.params, s8.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_guarded_step_leaves_the_state_unchanged_on_nan():
  """Unit level: a NaN batch changes neither parameters nor optimiser state; the step counts."""
  import optax

  def step_fn(state, batch):
    loss, grads = jax.value_and_grad(lambda p: jnp.sum((p["w"] * batch) ** 2))(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return (state.replace(step=state.step + 1, params=params, opt_state=opt_state),
            {"loss_sum": loss, "token_count": jnp.float32(1.0), "grad_norm": optax.global_norm(grads)})

  tx = optax.adam(0.1)
  state = steps.create_state({"w": jnp.ones((3,))}, tx, jax.random.PRNGKey(0))
  fn = jax.jit(guard.guarded(step_fn))
  good, m = fn(state, jnp.float32([1.0, 2.0, 3.0]))
  assert bool(m[guard.OK]) and int(good.step) == 1
  assert not np.array_equal(good.params["w"], state.params["w"])
  bad, m = fn(good, jnp.float32([1.0, np.nan, 3.0]))
  assert not bool(m[guard.OK]) and int(bad.step) == 2
  assert np.isnan(float(m[guard.LOSS])) and float(m["loss_sum"]) == 0.0
  for a, b in zip(jax.tree.leaves((good.params, good.opt_state)), jax.tree.leaves((bad.params, bad.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_metric_writer_writes_null_and_a_flag(tmp_path):
  from jaxcap.training.writers import MetricWriter
  w = MetricWriter(str(tmp_path), enabled=True)
  w.write(3, {"loss": float("nan"), "grad_norm": float("inf"), "lr": 0.1}, prefix="train/")
  w.close()
  (rec,) = _strict_json_lines(tmp_path / "metrics.jsonl")
  assert rec["train/loss"] is None and rec["train/grad_norm"] is None and rec["train/lr"] == 0.1
  assert rec["nonfinite"] == ["train/loss", "train/grad_norm"]
