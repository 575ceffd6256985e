"""Self-critical sequence training: loss, baselines, gradient direction, a run in the trainer.

Mutants tried on jaxcap/training/scst.py: ``sample_logits`` encoding in training mode (fresh
dropout masks on the image side, as jaxcap once did) fails
test_gradient_pass_log_probs_equal_sampling_log_probs.
"""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap.data.vocab import EOS, PAD
from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.training import scst, train_lib

from tests.training.test_train import tiny_config


def test_scst_loss_matches_numpy():
  r = np.random.RandomState(0)
  logits = r.randn(3, 5, 7).astype(np.float32)
  tokens = np.array([[4, 5, EOS, PAD, PAD], [6, 6, 6, 6, 6], [EOS, PAD, PAD, PAD, PAD]], np.int32)
  adv = np.array([0.5, -1.0, 2.0], np.float32)
  extra = r.rand(3, 5).astype(np.float32)
  loss, count = scst.scst_loss(logits, tokens, adv, extra)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  lp = np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
  mask = tokens != PAD
  want = (-(adv[:, None] * lp * mask).sum() + (extra * mask).sum()) / mask.sum()
  assert int(count) == 9  # EOS counts as a sampled token, PAD does not
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_baselines():
  r = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])
  np.testing.assert_allclose(scst.baseline_rewards(r, np.array([5.0, 1.0]), "greedy"),
                             [[5, 5, 5], [1, 1, 1]])
  np.testing.assert_allclose(scst.baseline_rewards(r, None, "mean"), [[2.5, 2.0, 1.5], [3.0, 3.0, 0.0]])
  with pytest.raises(ValueError, match="scst.baseline"):
    scst.baseline_rewards(r, None, "median")
  with pytest.raises(ValueError, match="num_samples"):
    scst.baseline_rewards(r[:, :1], None, "mean")


def test_advantages_pair_each_sample_with_its_image():
  """Sample k of image b is rewarded against image b; the greedy row against the same image."""
  rng = np.random.default_rng(0)
  samples = rng.integers(4, 20, size=(3, 2, 5)).astype(np.int32)
  greedy = rng.integers(4, 20, size=(3, 5)).astype(np.int32)
  index = np.array([7, 2, 9])
  calls = []

  def reward_fn(tokens, image):  # reward = image id + first token / 100, so pairing shows
    calls.append(len(tokens))
    return image + tokens[:, 0] / 100.0

  adv, r, rg = scst.advantages(reward_fn, samples, index, greedy, "greedy")
  want_r = index[:, None] + samples[:, :, 0] / 100.0
  want_g = index + greedy[:, 0] / 100.0
  np.testing.assert_allclose(r, want_r)
  np.testing.assert_allclose(rg, want_g)
  np.testing.assert_allclose(adv, want_r - want_g[:, None], rtol=1e-6)
  assert adv.dtype == np.float32 and calls == [6, 3]
  adv, r, rg = scst.advantages(reward_fn, samples, index, None, "mean")
  assert rg is None
  np.testing.assert_allclose(adv, want_r - want_r[:, ::-1], rtol=1e-6)  # n = 2: the other sample


@pytest.mark.slow
@pytest.mark.parametrize("advantage,direction", [(1.0, +1), (-1.0, -1)])
def test_gradient_moves_log_probability_with_the_advantage(advantage, direction):
  cfg = ml_collections.ConfigDict(dict(name="transformer", dim=16, num_layers=1, num_dec_layers=1,
                                       num_heads=2, ff_dim=32, dropout=0.0))
  model = registry.build(cfg, {"vocab_size": 11, "max_len": 5, "feature_dim": 6})
  r = np.random.RandomState(1)
  batch = {"feats": r.randn(2, 3, 6).astype(np.float32), "feats_mask": np.ones((2, 3), bool)}
  sample = np.array([[4, 7, 9, EOS, PAD, PAD], [5, 5, EOS, PAD, PAD, PAD]], np.int32)
  params = model.init(jax.random.PRNGKey(0), batch, shift_right(sample[:, None]))

  def logp(p):
    logits, _ = model.apply(p, batch, shift_right(sample[:, None]))
    lp = jax.nn.log_softmax(logits[:, 0], -1)
    return jnp.sum(jnp.take_along_axis(lp, sample[..., None], -1)[..., 0] * (sample != PAD))

  def loss(p):
    logits, _ = model.apply(p, batch, shift_right(sample[:, None]))
    return scst.scst_loss(logits[:, 0], sample, jnp.full((2,), advantage))[0]

  grads = jax.grad(loss)(params)
  new = jax.tree.map(lambda w, g: w - 0.05 * g, params, grads)
  assert direction * (float(logp(new)) - float(logp(params))) > 1e-4


@pytest.mark.slow
def test_gradient_pass_log_probs_equal_sampling_log_probs():
  """On-policy: the gradient pass recomputes exactly the log-probs the samples were drawn with.

  A Transformer with heavy dropout: by default (no dropout in the gradient pass) the
  teacher-forced log-probs of the sampled tokens equal ``decoding.sample``'s per-token
  log-probs; the opt-in ``dropout=True`` pass (fresh masks) does not, so the check can fail.
  """
  from jaxcap import decoding
  cfg = ml_collections.ConfigDict(dict(name="transformer", dim=16, num_layers=1, num_dec_layers=2,
                                       num_heads=2, ff_dim=32, dropout=0.5))
  t = 6
  model = registry.build(cfg, {"vocab_size": 11, "max_len": t, "feature_dim": 6})
  r = np.random.RandomState(2)
  batch = {"feats": r.randn(2, 3, 6).astype(np.float32), "feats_mask": np.ones((2, 3), bool)}
  # Random parameters of the right shapes: tracing init (no compile) keeps the test fast.
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch,
                          np.full((2, 1, t), EOS, np.int32))
  params = jax.tree.map(lambda x: jnp.asarray(r.randn(*x.shape) * 0.5, x.dtype), shapes)
  out = decoding.sample(model, params, batch, jax.random.key(3), max_len=t, num_samples=4)
  tokens = np.asarray(out.tokens)
  assert (tokens != PAD).sum() > 12

  def recomputed(dropout):
    logits, _ = scst.sample_logits(model, params, batch, out.tokens, jax.random.key(4), dropout)
    lp = np.asarray(jax.nn.log_softmax(logits, -1))
    lp = np.take_along_axis(lp, tokens.reshape(8, t)[..., None], -1)[..., 0]
    return np.where(tokens.reshape(8, t) != PAD, lp, 0.0)

  want = np.asarray(out.token_logprobs).reshape(8, t)
  np.testing.assert_allclose(recomputed(False), want, rtol=1e-5, atol=1e-5)
  assert np.abs(recomputed(True) - want).max() > 1e-2


@pytest.mark.slow
def test_scst_phase_runs_in_the_trainer_and_reports_rewards(tmp_path):
  config = tiny_config(num_train_steps=4, log_every_steps=1)
  config.scst.start_step = 2
  config.scst.num_samples = 2
  config.scst.baseline = "mean"
  config.data.cache_dir = str(tmp_path / "cache")
  trainer = train_lib.Trainer(config, str(tmp_path / "run"))
  state = trainer.fit()
  assert int(state.step) == 4
  lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  import json
  recs = [json.loads(l) for l in lines]
  assert any("train/reward" in r for r in recs if r["step"] > 2)
  assert any("train/loss" in r for r in recs if r["step"] <= 2)
  assert any(p.name.startswith("cider_df") for p in (tmp_path / "cache").iterdir())


@pytest.mark.slow
def test_scst_step_takes_its_reward_function_as_an_argument(tmp_path):
  """sample -> reward_fn -> update: the reward is the caller's (here a constant, so with the
  'mean' baseline every advantage and the policy-gradient loss are 0)."""
  from jaxcap.data import pipeline
  from jaxcap.training import parallel
  config = tiny_config()
  config.scst.num_samples = 2
  config.scst.baseline = "mean"
  trainer = train_lib.Trainer(config, str(tmp_path / "run"))
  calls = []

  def reward_fn(tokens_NxT, image_index_N):
    calls.append((tokens_NxT.shape[0], image_index_N.shape))
    return np.full(len(image_index_N), 0.25)

  step = scst.make_scst_step(trainer, reward_fn=reward_fn)
  it = pipeline.make_train_iterator(trainer.dataset.split("train"), config.batch_size, seed=0)
  state, metrics = step(trainer.initial_state(), parallel.shard_batch(next(it), trainer.mesh), 0)
  assert calls == [(2 * config.batch_size, (2 * config.batch_size,))]  # no greedy decode for 'mean'
  assert int(state.step) == 1 and float(metrics["reward"]) == 0.25
  assert float(metrics["scst_loss"]) == 0.0 and not (tmp_path / "run" / "cache").exists()


def test_scst_start_epoch_sets_the_switch_step():
  from jaxcap.training import optim
  config = tiny_config()
  config.scst.start_step = 7
  assert optim.scst_start_step(config, 12) == 7
  config.scst.start_epoch = 2
  assert optim.scst_start_step(config, 12) == 24
  sched = optim.make_schedule(config, 12)
  assert float(sched(23)) != config.scst.learning_rate
  assert abs(float(sched(24)) - config.scst.learning_rate) < 1e-12


@pytest.mark.slow
def test_scst_from_a_cross_entropy_workdir_starts_from_its_parameters(tmp_path):
  from jaxcap.training import checkpoint as ckpt_lib
  xe = tiny_config(num_train_steps=4, eval_every_steps=4)
  xe.data.cache_dir = str(tmp_path / "cache")
  xe_trainer = train_lib.Trainer(xe, str(tmp_path / "xe"))
  xe_trainer.fit()
  xe_params = jax.device_get(xe_trainer.load().params)
  # SCST with a zero learning rate from the XE run: the parameters must be the XE ones.
  sc = tiny_config(num_train_steps=2, log_every_steps=1, eval_every_steps=1000)
  sc.data.cache_dir = str(tmp_path / "cache")
  sc.init_from = str(tmp_path / "xe")
  sc.scst.start_step = 0
  sc.scst.num_samples = 2
  sc.scst.learning_rate = 0.0
  state = train_lib.Trainer(sc, str(tmp_path / "scst")).fit()
  for a, b in zip(jax.tree.leaves(xe_params), jax.tree.leaves(jax.device_get(state.params))):
    np.testing.assert_array_equal(a, b)
  import json
  recs = [json.loads(l) for l in (tmp_path / "scst" / "metrics.jsonl").read_text().splitlines()]
  assert any("train/reward" in r for r in recs)
  # A source that is not a run is refused before anything is written.
  bad = tiny_config(num_train_steps=2)
  bad.init_from = str(tmp_path / "nope")
  with pytest.raises(ValueError, match="init_from"):
    train_lib.Trainer(bad, str(tmp_path / "scst2")).fit()
  assert not (tmp_path / "scst2").exists()


def _device_step_setup(tmp_path, baseline="greedy", **scst_fields):
  """``(trainer, a sharded training batch)`` of the tiny config with ``scst_fields`` set."""
  from jaxcap.data import pipeline
  from jaxcap.training import parallel
  config = tiny_config()
  config.scst.num_samples = 2
  config.scst.baseline = baseline
  config.scst.update(scst_fields)
  config.data.cache_dir = str(tmp_path / "cache")
  trainer = train_lib.Trainer(config, str(tmp_path / "run"))
  it = pipeline.make_train_iterator(trainer.dataset.split("train"), config.batch_size, seed=0)
  return trainer, parallel.shard_batch(next(it), trainer.mesh)


def _primitives(jaxpr):
  """Names of every primitive in a jaxpr and in all its sub-jaxprs (scan, cond, pjit, ...)."""
  out = set()
  for eqn in jaxpr.eqns:
    out.add(eqn.primitive.name)
    for v in eqn.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        # By shape, not class: jax.core's Jaxpr classes moved between JAX versions.
        if hasattr(sub, "eqns"):
          out |= _primitives(sub)
        elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
          out |= _primitives(sub.jaxpr)
  return out


@pytest.mark.slow
def test_device_reward_step_matches_the_host_reward_step(tmp_path):
  """The one-jit device step (default) and the host-reward step see the same samples, so
  rewards, baselines and the updated parameters agree."""
  baseline = "greedy"
  trainer, batch = _device_step_setup(tmp_path, baseline)
  assert trainer.config.scst.reward == "device"
  dev_step = scst.make_scst_step(trainer)
  assert hasattr(dev_step, "jitted")
  s_dev, m_dev = dev_step(trainer.initial_state(), batch, 0)
  trainer.config.scst.reward = "host"
  s_host, m_host = scst.make_scst_step(trainer)(trainer.initial_state(), batch, 0)
  keys = ["reward", "baseline", "scst_loss"] + (["greedy_reward"] if baseline == "greedy" else [])
  for k in keys:
    np.testing.assert_allclose(float(m_dev[k]), float(m_host[k]), rtol=1e-5, atol=1e-6)
  assert float(m_dev["reward"]) > 0
  for a, b in zip(jax.tree.leaves(s_dev.params), jax.tree.leaves(s_host.params)):
    # Adam divides by sqrt(v): where a gradient entry is near 0, float32 rounding of the
    # rewards (~1e-7) moves that entry's step by up to a fraction of the learning rate.
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-3)


@pytest.mark.slow
def test_device_reward_step_has_no_host_callback_and_no_transfer(tmp_path):
  trainer, batch = _device_step_setup(tmp_path, "mean")
  step = scst.make_scst_step(trainer)
  state = trainer.initial_state()
  prims = _primitives(jax.make_jaxpr(step.jitted)(state, batch, step.reward_arrays).jaxpr)
  assert "pjit" in prims or "closed_call" in prims or "scan" in prims or "while" in prims
  assert not {p for p in prims if "callback" in p}, prims
  step(state, batch, 0)  # compiles (constants are placed while tracing)
  state = trainer.initial_state()
  with jax.transfer_guard("disallow"):
    state, metrics = step(state, batch, 1)
  assert int(state.step) == 1 and np.isfinite(float(metrics["reward"]))


def test_device_reward_with_bleu_is_a_config_error():
  from jaxcap.training import validation
  config = tiny_config()
  config.scst.bleu_weight = 0.5
  with pytest.raises(ValueError, match=r"^config field scst.reward: .*bleu_weight=0.5"):
    validation.check_config(config)
  config.scst.reward = "host"
  validation.check_config(config)
  config.scst.reward = "gpu"
  with pytest.raises(ValueError, match="config field scst.reward: expected one of"):
    validation.check_config(config)
