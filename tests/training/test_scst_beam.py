"""SCST on the beams of a beam search (``scst.candidates="beam"``, the M² authors' train.py
``train_scst``): the candidates are the K beams, the baseline the mean of their rewards
(``scst.baseline="mean_all"``), the loss their ``-mean(log_probs, -1) * (reward - baseline)``
(``scst.loss_norm="steps"``); the search is not differentiated, its tokens' log-probabilities
are recomputed by teacher forcing. Impossible combinations are one config line."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap import decoding
from jaxcap.data.vocab import EOS, PAD
from jaxcap.models import registry
from jaxcap.training import scst, validation

from tests.training.test_train import tiny_config

K, T = 4, 7


def _tiny_model(seed=0):
  """A tiny Transformer with random parameters (traced init: no compile), its EOS logit raised
  so that beams end at different steps, and a batch of 3 images."""
  info = {"vocab_size": 12, "max_len": T, "feature_dim": 6}
  cfg = ml_collections.ConfigDict(dict(name="transformer", dim=16, num_heads=2, ff_dim=32,
                                       num_layers=1, num_dec_layers=2, dropout=0.0))
  model = registry.build(cfg, info)
  r = np.random.RandomState(seed)
  batch = {"feats": r.randn(3, 5, 6).astype(np.float32),
           "feats_mask": np.arange(5)[None, :] < np.array([[5], [3], [4]])}
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch, np.full((3, 1, T), EOS, np.int32))
  params = jax.tree.map(lambda x: jnp.asarray(r.randn(*x.shape) * 0.5, x.dtype), shapes)
  # The output layer's bias (the one [V] leaf): EOS a little likelier than a random word.
  params = jax.tree.map(lambda x: x.at[EOS].add(1.5) if x.shape == (info["vocab_size"],) else x, params)
  return model, params, batch


def _their_loss(log_probs_BxKxT, reward_BxK):
  """Their train_scst: baseline = mean reward of the beams; -mean over the T steps of the beam's
  per-step log-probabilities (0 after EOS) times the advantage; mean over images and beams."""
  baseline = reward_BxK.mean(-1, keepdims=True)
  return np.mean(-log_probs_BxKxT.mean(-1) * (reward_BxK - baseline))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_beam_loss_is_their_loss_from_the_same_beams_and_rewards():
  model, params, batch = _tiny_model()
  beams = decoding.beam_search(model, params, batch, beam_size=K, max_len=T, beam_mode="in_slots")
  tokens, _ = scst.sample_with_baseline(model, params, batch, jax.random.key(0), max_len=T,
                                        num_samples=K, baseline="mean_all", candidates="beam",
                                        beam_mode="in_slots")
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(beams.tokens))
  tok = np.asarray(tokens)
  assert tok.shape == (3, K, T) and (tok == PAD).any() and (tok != PAD).sum() > 3 * K
  reward = np.random.RandomState(1).uniform(0, 2, (3, K)).astype(np.float32)
  adv = reward - scst.baseline_rewards(reward, None, "mean_all")
  logits, _ = scst.sample_logits(model, params, batch, tokens, jax.random.key(2), dropout=False)
  loss, _ = scst.scst_loss(logits, tokens.reshape(3 * K, T), jnp.asarray(adv.reshape(-1)), norm="steps")
  want = _their_loss(np.asarray(beams.token_logprobs, np.float64), reward.astype(np.float64))
  np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-7)
  # The default normalisation (by the candidates' tokens) is another number: the check can fail.
  other, _ = scst.scst_loss(logits, tokens.reshape(3 * K, T), jnp.asarray(adv.reshape(-1)))
  assert abs(float(other) - want) > 1e-3 * abs(want)


@pytest.mark.slow
def test_the_gradient_step_descends_their_loss():
  """scst_grad_step's update is the gradient of their loss at the same beams and advantages."""
  from jaxcap.training import steps
  import optax
  model, params, batch = _tiny_model(3)
  tokens, _ = scst.sample_with_baseline(model, params, batch, None, max_len=T, num_samples=K,
                                        baseline="mean_all", candidates="beam", beam_mode="live")
  reward = np.random.RandomState(4).uniform(0, 2, (3, K)).astype(np.float32)
  adv = jnp.asarray(reward - reward.mean(-1, keepdims=True))
  tx = optax.sgd(1.0)
  state = steps.create_state(params, tx, jax.random.key(5))
  new, metrics = scst.scst_grad_step(state, batch, tokens, adv, model=model, tx=tx, loss_norm="steps")

  def theirs(p):  # their formula on the teacher-forced per-step log-probabilities
    logits, _ = scst.sample_logits(model, p, batch, tokens, jax.random.key(0))
    lp = jax.nn.log_softmax(logits, -1)
    lp = jnp.take_along_axis(lp, tokens.reshape(3 * K, T)[..., None], -1)[..., 0]
    lp = jnp.where(tokens.reshape(3 * K, T) != PAD, lp, 0.0).reshape(3, K, T)
    return jnp.mean(-lp.mean(-1) * adv)

  grads = jax.grad(theirs)(params)
  for p0, p1, g in zip(jax.tree.leaves(params), jax.tree.leaves(new.params), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.asarray(p0 - p1), np.asarray(g), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(metrics["scst_loss"]), float(theirs(params)), rtol=1e-5)


def test_mean_all_is_the_mean_of_every_candidate():
  r = np.array([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]])
  np.testing.assert_allclose(scst.baseline_rewards(r, None, "mean_all"), [[3, 3, 3], [1, 1, 1]])
  with pytest.raises(ValueError, match="num_samples"):
    scst.baseline_rewards(r[:, :1], None, "mean_all")


@pytest.mark.parametrize("fields, match", [
    (dict(baseline="greedy"), r"^config field scst.baseline: scst.candidates='beam' .*got 'greedy'$"),
    (dict(fused_decode=True), r"^config field scst.fused_decode: .*expected False$"),
    (dict(candidates="beams"), r"^config field scst.candidates: expected one of"),
    (dict(loss_norm="words"), r"^config field scst.loss_norm: expected one of"),
    (dict(baseline="mean_all", num_samples=1), r"^config field scst.num_samples: .*got 1$"),
])
def test_impossible_combinations_are_one_config_line(fields, match):
  config = tiny_config()
  config.scst.update(dict(candidates="beam", baseline="mean_all", start_step=2))
  validation.check_config(config)  # the authors' combination passes
  config.scst.update(fields)
  with pytest.raises(ValueError, match=match) as e:
    validation.check_config(config)
  assert "\n" not in str(e.value)


def test_the_sampling_path_refuses_what_the_config_check_refuses():
  model, params, batch = _tiny_model()
  with pytest.raises(ValueError, match="^config field scst.baseline"):
    scst.sample_with_baseline(model, params, batch, None, max_len=T, num_samples=K,
                              baseline="greedy", candidates="beam")
  with pytest.raises(ValueError, match="^config field scst.candidates"):
    scst.sample_with_baseline(model, params, batch, None, max_len=T, num_samples=K,
                              baseline="mean", candidates="beams")


@pytest.mark.slow
def test_the_trainers_steps_reward_the_beams(tmp_path):
  """In the trainer: the host step's reward function receives the K beams of the run's search
  (decode.beam_mode) for every image, and the one-jit device step runs on them."""
  from jaxcap.data import pipeline
  from jaxcap.training import parallel, train_lib
  config = tiny_config()
  config.scst.update(dict(num_samples=3, candidates="beam", baseline="mean_all", loss_norm="steps"))
  config.decode.beam_mode = "in_slots"
  config.data.cache_dir = str(tmp_path / "cache")
  trainer = train_lib.Trainer(config, str(tmp_path / "run"))
  it = pipeline.make_train_iterator(trainer.dataset.split("train"), config.batch_size, seed=0)
  batch = parallel.shard_batch(next(it), trainer.mesh)
  state = trainer.initial_state()
  seen = []

  def reward_fn(tokens_NxT, image_index_N):
    seen.append(tokens_NxT)
    return (tokens_NxT != PAD).sum(-1).astype(np.float64)  # longer beams rewarded more

  want = decoding.beam_search(trainer.model, state.params, batch, beam_size=3,
                              max_len=config.decode.max_len, beam_mode="in_slots").tokens
  _, metrics = scst.make_scst_step(trainer, reward_fn=reward_fn)(state, batch, 0)
  assert len(seen) == 1  # no greedy decode for the beams' own mean
  np.testing.assert_array_equal(seen[0], np.asarray(want).reshape(-1, want.shape[-1]))
  lengths = (np.asarray(want) != PAD).sum(-1)
  np.testing.assert_allclose(float(metrics["baseline"]), lengths.mean(), rtol=1e-6)
  state, metrics = scst.make_scst_step(trainer)(trainer.initial_state(), batch, 0)
  assert int(state.step) == 1 and np.isfinite(float(metrics["scst_loss"]))
