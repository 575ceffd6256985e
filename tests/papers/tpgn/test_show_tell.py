"""Show and Tell (jaxcap/papers/tpgn/show_tell.py) against a NumPy forward pass of Vinyals et al.

The reference writes the LSTM gate by gate (flax's parameter names, input kernels without bias,
hidden kernels with bias), feeds the image embedding once from a zero state, then the words.

Mutants tried by hand (each made the forward test here fail, then was reverted):
  * the image step skipped (the cache starts at zeros);
  * the output layer reading the cell state c instead of h;
  * the LSTM state not carried from step to step (``_step`` returns the old cache).

Mutant audit (each failed the forward test here):
  * c_0 and h_0 swapped after the image step;
  * the image feature zeroed before W_I (the image never reaches the LSTM);
  * the cell state reset to zero after the image step.
decode_step is checked against teacher forcing on arbitrary tokens in the same test.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.papers.tpgn.show_tell import ShowTell
from tests.models import np_cells

F, H, E, V = 7, 6, 5, 13
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


_sigmoid, _np_lstm = np_cells.sigmoid, np_cells.lstm


def np_forward(params, v, tokens):
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params["params"])
  x_img = v @ p["img_embed"]["kernel"] + p["img_embed"]["bias"]  # x_{-1} = W_I v
  h, c = _np_lstm(p["cell"], x_img, np.zeros(H), np.zeros(H))
  out = []
  for y in tokens:
    h, c = _np_lstm(p["cell"], p["embed"]["embedding"][int(y)], h, c)
    out.append(h @ p["out_proj"]["kernel"] + p["out_proj"]["bias"])
  return np.stack(out)


def _tiny_batch(seed=0, b=2, s=2, t=5):
  rng = np.random.default_rng(seed)
  batch = {"global_feat": rng.normal(size=(b, F)).astype(np.float32)}
  return batch, shift_right(jnp.asarray(rng.integers(4, V, size=(b, s, t)).astype(np.int32)))


@functools.lru_cache(maxsize=None)
def _model_and_params():
  model = ShowTell(vocab_size=V, hidden_dim=H, embed_dim=E, dropout=0.0)
  batch, tokens = _tiny_batch()
  params = _jit(model.init)(jax.random.key(0), batch, tokens)
  # Non-zero biases so that a dropped bias shows.
  params = jax.tree.map(lambda x: x + 0.1 * np.random.default_rng(x.size).normal(size=x.shape), params)
  return model, params


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_whole_forward_matches_numpy_and_decode_step_matches_teacher_forcing():
  model, params = _model_and_params()
  batch, tokens = _tiny_batch(seed=1)
  logits, _ = _jit(model.apply)(params, batch, tokens)
  b, s, t = tokens.shape
  for i in range(b):
    for j in range(s):
      np.testing.assert_allclose(logits[i, j], np_forward(params, batch["global_feat"][i].astype(np.float64),
                                                          np.asarray(tokens[i, j])), rtol=1e-4, atol=1e-4)
  enc = jax.tree.map(lambda x: jnp.repeat(x, s, axis=0), model.apply(params, batch, method="encode"))
  cache = model.apply(params, enc, t, method="init_cache")
  step = _jit(functools.partial(model.apply, method="decode_step"))
  for k in range(t):
    lg, cache, _ = step(params, enc, cache, tokens.reshape(b * s, t)[:, k], jnp.int32(k))
    np.testing.assert_allclose(lg, logits.reshape(b * s, t, -1)[:, k], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_beam_search_runs_and_gradients_are_finite():
  from jaxcap import decoding
  model, params = _model_and_params()
  batch, tokens = _tiny_batch(seed=2)
  beam = decoding.beam_search(model, params, batch, beam_size=2, max_len=4)
  assert beam.tokens.shape == (2, 2, 4)
  g = _jit(jax.grad(lambda p: jnp.sum(model.apply(p, batch, tokens)[0] ** 2)))(params)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g))


@pytest.mark.parametrize("arg,hidden", [("synthetic", 128), ("flickr8k", 512), ("coco", 512)])
def test_configs_build(arg, hidden):
  from jaxcap.papers.tpgn.configs import show_tell as cfg_lib
  cfg = cfg_lib.get_config(arg)
  model = registry.build(cfg.model, {"vocab_size": 30, "global_dim": 11})
  assert isinstance(model, ShowTell) and model.hidden_dim == hidden


@pytest.mark.parametrize("field,value", [("hidden_dim", 0), ("embed_dim", "x"), ("dropout", 1.5)])
def test_bad_config_is_a_one_line_value_error(field, value):
  import ml_collections
  with pytest.raises(ValueError, match=f"model.{field}"):
    registry.build(ml_collections.ConfigDict({"name": "show_tell", field: value}), {"vocab_size": 30})
