"""The training spine: data parallelism, exact resume after SIGKILL, bad input, end to end."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap import config_files
from jaxcap import data as data_lib
from jaxcap.models import registry
from jaxcap.training import checkpoint as ckpt_lib
from jaxcap import run_dir
from jaxcap.training import optim, parallel, steps, train_lib

REPO = Path(__file__).resolve().parents[2]


def tiny_config(**overrides) -> ml_collections.ConfigDict:
  c = config_files.load("transformer.py:synthetic,tiny")
  c.update(num_train_steps=8, eval_every_steps=1000, test_after_training=False)
  return set_fields(c, overrides)


def set_fields(c: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
  """``c`` with ``{"section.field": value}`` set."""
  for k, v in overrides.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


@pytest.fixture(scope="module")
def tiny_dataset():
  return data_lib.get_dataset(tiny_config().data)


@pytest.mark.slow
def test_one_and_eight_devices_give_the_same_loss_and_gradients(tiny_dataset):
  assert jax.device_count() == 8, "tests/conftest.py sets 8 fake CPU devices"
  config = tiny_config()
  model = registry.build(config.model, dict(tiny_dataset.info))
  batch = next(iter(data_lib.pipeline.eval_batches(tiny_dataset.split("train"), 8, num_threads=0)))
  results = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = parallel.make_mesh(devices)
    params = train_lib.init_params(model, batch, 0, mesh)
    gbatch = parallel.shard_batch(batch, mesh)
    fn = jax.jit(jax.value_and_grad(steps.xe_loss_fn, has_aux=True), static_argnums=(1,),
                 in_shardings=(parallel.replicated(mesh), parallel.batch_sharding(mesh), None),
                 out_shardings=parallel.replicated(mesh))
    (loss, _), grads = fn(params, model, gbatch, jax.random.PRNGKey(3))
    results.append((float(loss), jax.device_get(grads)))
  (l1, g1), (l8, g8) = results
  assert np.isfinite(l1) and abs(l1 - l8) < 1e-5 * max(1.0, abs(l1))
  flat1, flat8 = jax.tree.leaves(g1), jax.tree.leaves(g8)
  assert len(flat1) == len(flat8) > 0
  for a, b in zip(flat1, flat8):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_noam_schedule_matches_the_formula():
  fn = optim.noam_schedule(2.0, 64, 10)
  for step in (0, 4, 9, 10, 50):
    s = step + 1
    assert abs(float(fn(step)) - 2.0 * 64 ** -0.5 * min(s ** -0.5, s * 10 ** -1.5)) < 1e-7


def test_apply_gradients_is_one_optax_update_and_keeps_the_checkpointed_leaves():
  """The update both steps share: the gradients of ``loss_fn`` through ``tx`` once, the step
  counted; the state's leaves stay step (int32), params, opt_state and rng."""
  import optax
  tx = optax.adam(0.1)
  params = {"w": jnp.arange(3.0)}
  state = steps.create_state(params, tx, jax.random.PRNGKey(0))
  fields = {p[0].name for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
  assert fields == {"step", "params", "opt_state", "rng"}  # tx is static, not checkpointed
  assert state.step.dtype == jnp.int32 and state.step.shape == ()
  loss_fn = lambda p: (jnp.sum(p["w"] ** 2), {"loss_sum": jnp.sum(p["w"] ** 2)})
  new, metrics = jax.jit(lambda s: steps.apply_gradients(s, loss_fn))(state)
  grads = jax.grad(lambda p: loss_fn(p)[0])(params)
  updates, opt_state = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(new.params["w"], optax.apply_updates(params, updates)["w"], rtol=1e-6)
  assert int(new.step) == 1 and set(metrics) == {"loss_sum", "grad_norm", "steps"}
  assert jax.tree.structure(new.opt_state) == jax.tree.structure(opt_state)
  np.testing.assert_array_equal(new.rng, state.rng)


def _params_of(workdir, config, dataset):
  trainer = train_lib.Trainer(config, str(workdir), dataset=dataset)
  ckpts = ckpt_lib.Checkpoints(str(workdir))
  state, data_state = ckpts.restore(ckpt_lib.abstract(trainer.initial_state()))
  return int(state.step), jax.device_get(state.params), data_state


def _train_cmd(workdir, steps, extra=()):
  return [sys.executable, str(REPO / "train.py"), "--config=configs/transformer.py:synthetic,tiny",
          f"--workdir={workdir}", f"--config.num_train_steps={steps}", "--config.eval_every_steps=1000",
          "--config.test_after_training=False", *extra]


@pytest.mark.slow
def test_resume_after_sigkill_continues_identically(tmp_path, tiny_dataset):
  total = 24
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  # A run that would go on for a long time, hard-killed as soon as a checkpoint exists.
  proc = subprocess.Popen(_train_cmd(killed, 100000), env=env, cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 300
  ckdir = killed / "checkpoints"
  while time.time() < deadline and proc.poll() is None:
    if ckdir.exists() and any(p.name.isdigit() for p in ckdir.iterdir()):
      break
    time.sleep(0.05)
  assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  config = tiny_config(num_train_steps=total)
  first = ckpt_lib.Checkpoints(str(killed)).latest_step()
  assert first is not None and first < total
  # A kill mid-write leaves write_with's temporary file (made here: the kill above lands
  # wherever it lands); the resumed run removes it once it is a minute old, and says so.
  leftover = killed / "metrics.jsonl.q1w2e3r4.tmp"
  leftover.write_text('{"step": 1')
  os.utime(leftover, (time.time() - 120,) * 2)
  # Resume to `total`, and compare with a straight run of `total` steps.
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    train_lib.Trainer(config, str(killed), dataset=tiny_dataset).fit()
  assert not leftover.exists()
  assert f"Removed 1 temporary file(s) a stopped run left (e.g. {leftover})." in out.getvalue()
  train_lib.Trainer(config, str(straight), dataset=tiny_dataset).fit()
  s1, p1, d1 = _params_of(straight, config, tiny_dataset)
  s2, p2, d2 = _params_of(killed, config, tiny_dataset)
  assert s1 == s2 == total and d1 == d2
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  lines = [json.loads(l) for l in (straight / "metrics.jsonl").read_text().splitlines()]
  assert any("train/loss" in l for l in lines)
  assert (straight / "tensorboard").is_dir() and any((straight / "tensorboard").iterdir())


def _run(args, **kw):
  return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600, **kw)


def _snapshot(d: Path) -> dict:
  return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("args,needle", [
    (["--config.model.no_such_field=3"], "no_such_field"),
    (["--config.batch_size=abc"], "batch_size"),
    (["--config.data.name=karpathy", "--config.data.root=/nonexistent/jaxcap"], "/nonexistent/jaxcap"),
])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bad_command_line_gives_one_line_and_nonzero_exit(tmp_path, args, needle):
  r = _run(_train_cmd(tmp_path / "w", 2, args))
  assert r.returncode != 0
  err_lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
  assert needle in r.stderr, r.stderr[-2000:]
  assert len([l for l in err_lines if needle in l]) >= 1
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.slow
def test_workdir_of_another_model_or_vocab_is_refused_and_left_intact(tmp_path, tiny_dataset):
  workdir = tmp_path / "run"
  train_lib.Trainer(tiny_config(num_train_steps=4), str(workdir), dataset=tiny_dataset).fit()
  before = _snapshot(workdir)
  # Another model in the same workdir.
  r = _run(_train_cmd(workdir, 4, ["--config.model.num_heads=2"]))
  assert r.returncode == 2 and "another model" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
  # Same model, data with another vocabulary.
  r = _run(_train_cmd(workdir, 4, ["--config.data.min_word_count=100000"]))
  assert r.returncode == 2 and "vocabulary" in r.stderr, r.stderr[-2000:]
  assert _snapshot(workdir) == before


def test_another_runs_workdir_is_refused_before_the_steps_compile(tmp_path, tiny_dataset, monkeypatch):
  """The workdir's config.json / vocab.json are checked before compile_steps (seconds of
  compiling otherwise precede the refusal); nothing is written."""
  workdir = tmp_path / "run"
  other = tiny_config(**{"model.num_heads": 2})
  run_dir.init_workdir(str(workdir), other, tiny_dataset.vocab)
  before = _snapshot(workdir)

  def compiled(*_, **__):
    raise AssertionError("compiled the steps before checking the workdir")

  monkeypatch.setattr(train_lib.Trainer, "compile_steps", compiled)
  with pytest.raises(ValueError, match="another model"):
    train_lib.Trainer(tiny_config(num_train_steps=4), str(workdir), dataset=tiny_dataset).fit()
  assert _snapshot(workdir) == before


@pytest.mark.slow
def test_prng_impl_keys_dropout_and_is_fixed_for_a_run(tmp_path, tiny_dataset):
  # rbg: the state's key has rbg's shape, the dropout masks other bits (another loss after
  # the first step), a resume continues with it; threefry in the same workdir is refused.
  config = tiny_config(num_train_steps=4, prng_impl="rbg", **{"model.dropout": 0.3})
  rbg_run = tmp_path / "rbg"
  state = train_lib.Trainer(config, str(rbg_run), dataset=tiny_dataset).fit()
  assert str(jax.random.key_impl(state.rng)) == "rbg" and jax.random.key_data(state.rng).shape == (4,)
  fry = train_lib.Trainer(tiny_config(num_train_steps=4, **{"model.dropout": 0.3}), str(tmp_path / "fry"),
                          dataset=tiny_dataset).fit()
  assert not np.allclose(jax.tree.leaves(state.params)[0], jax.tree.leaves(fry.params)[0])
  config.num_train_steps = 6
  assert int(train_lib.Trainer(config, str(rbg_run), dataset=tiny_dataset).fit().step) == 6
  before = _snapshot(rbg_run)
  r = _run(_train_cmd(rbg_run, 8, ["--config.model.dropout=0.3"]))
  assert r.returncode == 2 and "prng_impl='rbg', not 'threefry2x32'" in r.stderr, r.stderr[-2000:]
  assert _snapshot(rbg_run) == before
  r = _run(_train_cmd(tmp_path / "bad", 2, ["--config.prng_impl=philox"]))
  assert r.returncode == 2 and "prng_impl" in r.stderr and "expected one of" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_train_checkpoint_evaluate_end_to_end(tmp_path):
  workdir = tmp_path / "e2e"
  r = _run(_train_cmd(workdir, 8, ["--config.test_after_training=True", "--config.eval_every_steps=4"]))
  assert r.returncode == 0, r.stderr[-3000:]
  scores = json.loads((workdir / "scores_test.json").read_text())
  assert set(scores["overall"]) >= {"Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"}
  assert len(scores["per_image"]) == 16
  assert (workdir / "best").is_dir()
  r = _run([sys.executable, str(REPO / "evaluate.py"), f"--workdir={workdir}", "--split=val",
            "--beam-size=2", "--length-penalty=gnmt", "--block-trigrams", "--tag=_beam2",
            "--beam-mode=self_critical", "--remove-bad-endings", "--sample-n=3"])
  assert r.returncode == 0, r.stderr[-3000:]
  preds = json.loads((workdir / "predictions_val_beam2.json").read_text())
  assert len(preds) == 16 and all(set(p) == {"image_id", "caption"} for p in preds)
  assert "CIDEr" in r.stdout
  # --sample-n: 3 sampled captions per image in their own file (self-critical.pytorch's sample_n).
  many = json.loads((workdir / "predictions_val_beam2_n3.json").read_text())
  assert len(many) == 16 * 3 and len({p["image_id"] for p in many}) == 16


@pytest.mark.slow
def test_evaluate_ensemble_end_to_end(tmp_path):
  """evaluate.py --ensemble: a run with itself decodes as the run alone (diverse beams too)."""
  workdir = tmp_path / "e2e"
  r = _run(_train_cmd(workdir, 4, []))
  assert r.returncode == 0, r.stderr[-3000:]
  flags = ["--split=val", "--beam-size=2", "--beam-groups=2", "--diversity-strength=0.5"]
  r = _run([sys.executable, str(REPO / "evaluate.py"), f"--ensemble={workdir},{workdir}",
            f"--workdir={tmp_path / 'ens'}", *flags])
  assert r.returncode == 0, r.stderr[-3000:]
  assert "CIDEr" in r.stdout and "Member 1" in r.stdout
  r = _run([sys.executable, str(REPO / "evaluate.py"), f"--workdir={workdir}", "--tag=_single",
            *flags])
  assert r.returncode == 0, r.stderr[-3000:]
  ens = json.loads((tmp_path / "ens" / "predictions_val_ensemble.json").read_text())
  single = json.loads((workdir / "predictions_val_single.json").read_text())
  assert len(ens) == 16 and sorted(map(str, ens)) == sorted(map(str, single))


def test_a_model_field_added_later_with_its_default_keeps_the_workdir_resumable(tmp_path, tiny_dataset):
  """A workdir whose config.json predates a model field (e.g. AAT's ``norm_h1``) resumes when the
  new field holds the model's default, and is refused when it does not."""
  from jaxcap.papers.aat.configs import aat as aat_config
  workdir = tmp_path / "old"
  workdir.mkdir()
  config = aat_config.get_config("synthetic")
  saved = run_dir.config_to_dict(config)
  del saved["model"]["norm_h1"]
  (workdir / "config.json").write_text(json.dumps(saved))
  run_dir.check_workdir(str(workdir), config, tiny_dataset.vocab)  # default False: accepted
  config.model.norm_h1 = True
  with pytest.raises(ValueError, match="another model.*norm_h1"):
    run_dir.check_workdir(str(workdir), config, tiny_dataset.vocab)
  del config.model["norm_h1"]  # absent now, set before: refused unless it was the default
  saved["model"]["norm_h1"] = True
  (workdir / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match="another model.*norm_h1"):
    run_dir.check_workdir(str(workdir), config, tiny_dataset.vocab)
