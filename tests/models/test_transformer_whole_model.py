"""The whole Transformer captioner against a NumPy forward pass written from Vaswani et al.

The reference (tests/models/np_transformer.py) runs one image at a time in float64: region
projection (+ ReLU, or linear for ``region_activation="linear"``), every encoder block over the
real regions only, word embedding x sqrt(D) + sinusoidal positions from the formula, every
decoder block (causal self-attention as a slice of the prefix, cross-attention, FFN, each
``LayerNorm(x + sublayer)``), the classifier (own or tied to the embedding). It is fed the
model's own (randomly perturbed, so LayerNorm is not the identity) parameters and compared with

- the teacher-forced logits of ``__call__`` (``decode_train`` with ``group = S``), and
- ``decode_step``'s logits along 4 greedy steps from BOS (the reference recomputes each prefix).

Mutants tried by hand on jaxcap/models/{transformer,layers}.py, one at a time, each restored
with ``git checkout`` (TF = test_teacher_forced_logits_match_numpy, GR =
test_greedy_decode_steps_match_numpy; [relu] / [linear] = only that case, else both):

==  =========================================================================  ===========
 #  mutant                                                                     caught by
==  =========================================================================  ===========
 1  encoder self-attention sub-layer without its residual (``LN(y)``)          TF, GR
 2  decoder FFN sub-layer without LayerNorm (``x + FFN(x)``)                   TF, GR
 3  ReLU applied for ``region_activation="linear"`` too                        TF, GR [linear]
 4  ReLU dropped for ``region_activation="relu"``                              TF, GR [relu]
 5  no sinusoidal positions (``embed_tokens`` returns the scaled embedding)    TF, GR
 6  positions off by one in ``decode_step`` (``offset=t + 1``)                 GR
 7  no sqrt(D) embedding scale                                                 TF, GR
 8  FFN without its ReLU                                                       TF, GR
 9  cross-attention keys and values swapped (``attend_kv(x, v, k, ...)``)      TF, GR
10  causal mask dropped in teacher forcing (``CausalSelfAttention.__call__``)  TF
11  padding regions not masked in the encoder self-attention                   TF, GR
12  padding regions not masked in the cross-attention                          TF, GR
13  attention scores divided by Dh instead of sqrt(Dh)                         TF, GR
14  decoder cross-attention sub-layer without its residual                     TF, GR
15  ``decode_step`` attends one cache slot beyond t (``<= t + 1``)             GR
16  decoder self-attention sub-layer without its residual (teacher forcing)    TF
==  =========================================================================  ===========
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.data.vocab import BOS
from jaxcap.models.base import shift_right
from jaxcap.models.transformer import TransformerCaptioner
from tests.models import np_transformer as ref

V, F, N, D, H, FF = 19, 7, 5, 16, 4, 24
B, S, T, STEPS = 2, 2, 6, 4



def make_batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones((B, N), bool)
  mask[1, 3:] = False  # image 1 has 3 real regions; its padding rows hold large garbage
  feats = rng.normal(size=(B, N, F))
  feats[~mask] = 30.0 * rng.normal(size=(int((~mask).sum()), F))
  caps = rng.integers(4, V, size=(B, S, T)).astype(np.int32)
  return {"feats": feats.astype(np.float32), "feats_mask": mask, "captions": caps}


def random_params(model, batch, tokens, seed=0, scale=0.4):
  """Random normal parameters of the model's shapes (no init compile): kernels, biases and
  embeddings ~ N(0, scale^2), LayerNorm scales ~ 1 + N(0, scale^2)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch, tokens)
  rng = np.random.default_rng(seed)

  def draw(path, s):
    x = scale * rng.normal(size=s.shape)
    return jnp.asarray(x + (1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0),
                       s.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def run(model, params, batch, tokens):
  return ref.run_model(model, params, batch, tokens, STEPS)


@functools.lru_cache(maxsize=None)
def outputs(region_activation, share_embeddings):
  model = TransformerCaptioner(V, max_len=T - 1, dim=D, num_layers=2, num_dec_layers=2,
                               num_heads=H, ff_dim=FF, dropout=0.0,
                               share_embeddings=share_embeddings,
                               region_activation=region_activation)
  batch = make_batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  params = random_params(model, batch, tokens)
  got = jax.tree.map(np.asarray, run(model, params, batch, tokens))
  return ref.as_np(params["params"]), batch, np.asarray(tokens), got


CASES = [("relu", False), ("linear", True)]


@pytest.mark.parametrize("region_activation,share", CASES, ids=["relu", "linear"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_teacher_forced_logits_match_numpy(region_activation, share):
  p, batch, tokens, (train_logits, _, _) = outputs(region_activation, share)
  assert ("logits_proj" in p) != share
  for i in range(B):
    for j in range(S):
      want = ref.transformer_logits(p, batch["feats"][i].astype(np.float64),
                                    batch["feats_mask"][i], tokens[i, j], region_activation)
      np.testing.assert_allclose(train_logits[i, j], want, rtol=2e-4, atol=2e-4,
                                 err_msg=f"image {i} caption {j}")


@pytest.mark.parametrize("region_activation,share", CASES, ids=["relu", "linear"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_greedy_decode_steps_match_numpy(region_activation, share):
  p, batch, _, (_, step_logits, fed) = outputs(region_activation, share)
  assert (fed[:, 0] == BOS).all()
  for i in range(B):
    want = ref.transformer_logits(p, batch["feats"][i].astype(np.float64),
                                  batch["feats_mask"][i], fed[i], region_activation)
    np.testing.assert_allclose(step_logits[i], want, rtol=2e-4, atol=2e-4, err_msg=f"image {i}")
    np.testing.assert_array_equal(fed[i, 1:], want[:-1].argmax(-1))
