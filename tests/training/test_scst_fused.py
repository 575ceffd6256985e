"""``scst.fused_decode``: the samples and the greedy baseline from one encoding and one scan.

The switch must change how the step is computed, not what it computes: the same tokens from
the same keys (a Transformer and an LSTM), the same rewards and update through the trainer's
device and host steps, with the encoder's input projection and the decoding loop in the
program once instead of twice.

Mutants tried on jaxcap/decoding.py ``sample_and_greedy``: one key for all images (``keys_B[0]``)
fails test_fused_decode_gives_the_unfused_tokens; the greedy row sampled instead of arg-maxed
fails it too; the image's key not split per step (the same key at every step) fails it too.
"""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap import config_files
from jaxcap.data.vocab import EOS, PAD
from jaxcap.models import registry
from jaxcap.training import scst, train_lib

from tests.training.test_train import tiny_config

T, F = 7, 13  # decoding steps, region feature width (no other array of the tests is 13 wide)
MODELS = {
    "transformer": dict(dim=16, num_layers=1, num_dec_layers=2, num_heads=2, ff_dim=32, dropout=0.3),
    "lstm": dict(hidden_dim=16, embed_dim=16, att_dim=16, dropout=0.3),
}


def _model_and_batch(name):
  model = registry.build(ml_collections.ConfigDict(dict(name=name, **MODELS[name])),
                         {"vocab_size": 11, "max_len": T, "feature_dim": F})
  r = np.random.RandomState(2)
  batch = {"feats": r.randn(4, 3, F).astype(np.float32), "feats_mask": np.ones((4, 3), bool),
           "image_index": np.array([5, 2, 9, 1], np.int32)}
  batch["feats_mask"][1, 2] = False
  # Random parameters of the right shapes, large enough for spread-out distributions: tracing
  # init (no compile) keeps the test fast.
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch, np.full((4, 1, T), EOS, np.int32))
  params = jax.tree.map(lambda x: jnp.asarray(r.randn(*x.shape) * 0.5, x.dtype), shapes)
  return model, params, batch


def _decode_fn(model, baseline, fused):
  return lambda p, b, k: scst.sample_with_baseline(model, p, b, k, max_len=T, num_samples=3,
                                                   baseline=baseline, fused_decode=fused)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("baseline", ["greedy", "mean"])
@pytest.mark.parametrize("key", ["raw", "typed"])
def test_fused_decode_gives_the_unfused_tokens(name, baseline, key):
  model, params, batch = _model_and_batch(name)
  rng = jax.random.PRNGKey(3) if key == "raw" else jax.random.key(3, impl="rbg")
  (s0, g0), (s1, g1) = (jax.jit(_decode_fn(model, baseline, fused))(params, batch, rng)
                        for fused in (False, True))
  s0, s1 = np.asarray(s0), np.asarray(s1)
  assert s1.shape == (4, 3, T) and s1.dtype == np.int32
  np.testing.assert_array_equal(s1, s0)
  # Not trivially equal: the samples of an image differ, and images differ.
  assert len({tuple(row) for row in s1.reshape(-1, T)}) > 6
  assert ((s1 != PAD).sum(-1) < T).any()  # some sample ended with EOS
  if baseline == "mean":
    assert g0 is None and g1 is None
    return
  g0, g1 = np.asarray(g0), np.asarray(g1)
  assert g1.shape == (4, T)
  np.testing.assert_array_equal(g1, g0)
  assert (g1[:, None] != s1).any(-1).any()  # the greedy row is not one of the sample rows


def _count(jaxpr, pred) -> int:
  """Equations of a jaxpr and of all its sub-jaxprs (scan, cond, pjit, ...) for which ``pred``."""
  n = 0
  for eqn in jaxpr.eqns:
    n += int(pred(eqn))
    for v in eqn.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        if hasattr(sub, "eqns"):
          n += _count(sub, pred)
        elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
          n += _count(sub.jaxpr, pred)
  return n


def _decode_loops(jaxpr) -> int:
  """The decoders' loops over time (jaxcap.decoding: a while loop of at most max_len steps)."""
  return _count(jaxpr, lambda e: e.primitive.name == "while")


def _feature_matmuls(jaxpr) -> int:
  """The encoder's input projection: the matmuls that read the F-wide region features."""
  return _count(jaxpr, lambda e: e.primitive.name == "dot_general"
                and any(getattr(v.aval, "shape", ())[-1:] == (F,) for v in e.invars))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_fused_decode_encodes_once_in_one_scan(name):
  model, params, batch = _model_and_batch(name)
  unfused, fused = (jax.make_jaxpr(_decode_fn(model, "greedy", f))(params, batch, jax.random.PRNGKey(3)).jaxpr
                    for f in (False, True))
  assert (_decode_loops(unfused), _decode_loops(fused)) == (2, 1)
  assert _feature_matmuls(fused) >= 1
  assert _feature_matmuls(unfused) == 2 * _feature_matmuls(fused)


def _trainer(tmp_path, name, fused, reward="device"):
  from jaxcap.data import pipeline
  from jaxcap.training import parallel
  config = tiny_config() if name == "transformer" else config_files.load(f"{name}.py:synthetic,tiny")
  config.scst.num_samples = 3
  config.scst.fused_decode = fused
  config.scst.reward = reward
  config.data.cache_dir = str(tmp_path / "cache")
  trainer = train_lib.Trainer(config, str(tmp_path / f"run_{fused}_{reward}"))
  it = pipeline.make_train_iterator(trainer.dataset.split("train"), config.batch_size, seed=0)
  return trainer, parallel.shard_batch(next(it), trainer.mesh)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_device_and_host_steps_equal_the_unfused_step(tmp_path, name):
  """The trainer's steps (train.py's path) read the switch: one decoding loop fewer in the
  device step's and the host step's sampler, the same metrics and parameters after the step."""
  results = {}
  for fused, reward in ((False, "device"), (True, "device"), (True, "host")):
    trainer, batch = _trainer(tmp_path, name, fused, reward)
    step = scst.make_scst_step(trainer)
    state = trainer.initial_state()
    traced = step.trace(state, batch)[0]  # the device step, or the host step's sampler
    loops = _decode_loops(traced.jaxpr.jaxpr)
    state, metrics = step(state, batch, 0)
    results[fused, reward] = loops, jax.device_get(metrics), jax.device_get(state.params)
  loops, m0, p0 = results[False, "device"]
  for key in ((True, "device"), (True, "host")):
    fused_loops, m1, p1 = results[key]
    # The device step holds the gradient pass too (the LSTM's teacher-forced scans); the host
    # step's sampler only the decode (2 loops unfused: test_fused_decode_encodes_once_in_one_scan).
    assert fused_loops == (loops - 1 if key[1] == "device" else 1) and loops >= 2, key
    assert float(m0["reward"]) > 0
    for k in ("reward", "baseline", "greedy_reward", "scst_loss"):
      np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-6, err_msg=f"{key} {k}")
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p0)):
      # As test_scst's device/host comparison: Adam's step where a gradient entry is near 0.
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-3 if key[1] == "host" else 1e-6)


def test_fused_decode_is_a_checked_config_field():
  from jaxcap.training import validation
  config = tiny_config()
  assert config.scst.fused_decode is False
  config.scst.fused_decode = True
  validation.check_config(config)
  with config.ignore_type():
    config.scst.fused_decode = "yes"
  with pytest.raises(ValueError, match=r"^config field scst.fused_decode: expected"):
    validation.check_config(config)
