"""AoANet (registered ``aoanet``; jaxcap/papers/image_transformer/model.py) against NumPy code written
from AoANet's equations (Huang et al., 2019), and training smoke tests of both models.

Refiner layer: ``A' = LayerNorm(A + GLU(W [MHA'(A, A, A); A] + b))`` with MHA' the multi-head
attention without an output projection; AoA decoder: ``c_t = GLU(W [MHA'(W_q h_t, K, V); h_t] + b)``
after an LSTM on ``[W_e y_t, Ā + c_{t-1}]`` — the reference functions are the ones of
test_image_transformer.py (relations = 1, AoA, no FFN; M = 1).

Mutants tried by hand (each failed a test here; then restored): AoA inputs swapped
(``[A; att]``), GLU replaced by its linear half. The residual / norm / nonlinearity mutants of
test_image_transformer.py's docstring also fail its whole-model test of the ``aoanet`` row.
"""

from __future__ import annotations

import numpy as np
import pytest
import jax

from jaxcap import config_files
from jaxcap.papers.image_transformer.aoanet import AoANet
from jaxcap.papers.image_transformer.model import ImageTransformer
from tests.papers.image_transformer.test_model import (D, H, V, _jit, _np_params, _tiny_batch,
                                                 _train_logits, np_forward)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_aoanet_whole_model_with_six_refiner_layers_matches_numpy():
  model = AoANet(vocab_size=V, dim=D, num_heads=H, dropout=0.0)
  assert (model.num_layers, model.spatial_layers, model.num_sub, model.refine_aoa, model.ffn) == (6, (), 1, True, False)
  batch, tokens = _tiny_batch(seed=4)
  params = _jit(model.init)(jax.random.key(3), batch, tokens)
  assert "aoa_proj" in params["params"]["layer_6"]["attn"] and "ffn" not in params["params"]["layer_1"]
  logits = np.asarray(_train_logits(model, params, batch, tokens))
  p64 = _np_params(params)["params"]
  for i in range(2):
    ref = np_forward(p64, model, batch["feats"][i].astype(np.float64), batch["boxes"][i].astype(np.float64),
                     batch["feats_mask"][i], np.asarray(tokens[i, 1]))
    np.testing.assert_allclose(logits[i, 1], ref, rtol=2e-4, atol=2e-4)
  # The registered baseline is the Image Transformer with no spatial layer and M = 1.
  same = ImageTransformer(vocab_size=V, dim=D, num_heads=H, dropout=0.0, num_layers=6, spatial_layers=(),
                          num_sub=1, refine_aoa=True, ffn=False)
  np.testing.assert_array_equal(np.asarray(_train_logits(same, params, batch, tokens)), logits)
  # It never reads the boxes.
  other = dict(batch, boxes=np.zeros_like(batch["boxes"]))
  np.testing.assert_array_equal(np.asarray(_train_logits(model, params, other, tokens)), logits)


@pytest.mark.slow
@pytest.mark.parametrize("path,arg", [("aoanet", "synthetic"), ("image_transformer", "synthetic,M=2")])
def test_trains_and_tests_through_the_trainer(tmp_path, path, arg):
  from jaxcap.training import train_lib
  c = config_files.load(f"{path}.py:{arg}")
  c.data.num_train, c.data.num_val, c.data.num_test = 96, 16, 16
  c.model.dim, c.model.num_heads, c.model.ff_dim = 32, 4, 64
  c.batch_size = c.eval_batch_size = 8
  c.num_train_steps, c.eval_every_steps, c.checkpoint_every_steps, c.log_every_steps = 6, 6, 6, 2
  c.eval_num_images = 16
  scores = train_lib.train_and_evaluate(c, str(tmp_path / path))
  assert np.isfinite(scores["overall"]["CIDEr"])
  assert (tmp_path / path / "predictions_test.json").exists()
