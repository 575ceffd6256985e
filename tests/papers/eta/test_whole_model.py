"""The whole ETA-Transformer, every variant, against a NumPy forward pass written from the paper.

The reference (tests/models/np_transformer.py, float64, one image at a time) follows Li et al.
(ICCV 2019) sec. 4: the linear region projection V^0 and the shared, sqrt(D)-scaled word
embedding of the real attributes S^0, N encoder blocks on each (eqs. 4-5, residual + LayerNorm
after each sub-layer; none for a removed sub-encoder), word embedding x sqrt(D) + sinusoidal
positions, every multimodal decoder block (eq. 7 masked self-attention, eqs. 9-10 entangled
attention, eqs. 11-12 GBC, the FFN sub-layer) and the classifier; ``late_fusion`` is the
normalised mean of its members' log-probabilities. Sets are cut to their real elements before
anything runs; an image with no attributes at all is in the batch (its attentions over S^N
contribute zero, jaxcap's documented convention). It is fed the model's own random parameters
(LayerNorm scales ~ 1 + N(0, 0.16)) and compared with

- the teacher-forced logits of ``__call__`` (``decode_train`` with ``group = S``), and
- ``decode_step``'s logits along 4 greedy steps from BOS.

Each case compiles once (teacher forcing and the greedy scan in one jitted function).

Mutants tried by hand on jaxcap/models/{eta,layers}.py, one at a time, each restored with
``git checkout`` (TF = test_teacher_forced_logits_match_numpy, GR =
test_greedy_decode_steps_match_numpy, in brackets the cases that failed). The first three
are the issue's one-line bugs that passed all 43 ETA tests before:

Case names: eta, par (parallel, f = relu, no visual encoder), sv (stacked_v, tied classifier),
ss (stacked_s, no semantic encoder), ts (transformer_s), tv (transformer_v), lf (late_fusion);
"all" = every case of that test.

==  ===========================================================================  ==================
 #  mutant                                                                       caught by
==  ===========================================================================  ==================
 1  encoder self-attention sub-layer without its residual (layers.EncoderBlock)  TF all; GR all
 2  ReLU after the region projection (``nn.relu(self.feat_proj(...))``)         TF eta,par,ss,sv,tv;
                                                                                 GR eta,ss
 3  no positional encoding in the decoder (``embed_tokens`` returns ``x``)       TF all; GR all
 4  encoder FFN sub-layer without its residual                                   TF all; GR all
 5  attribute embeddings not scaled by sqrt(D)                                   TF all but tv;
                                                                                 GR all
 6  GBC gate arguments swapped (``[g_v, g_s, a]``)                               TF eta,par; GR eta
 7  GBC: c and 1 - c swapped in eq. 12                                           TF eta,par; GR eta
 8  ETA guidance swapped (v from g_v, s from g_s, eq. 10)                        TF eta; GR eta
 9  decoder attention sub-layers without their residual (``_attend``)            TF all; GR all
10  decoder attention sub-layers without LayerNorm (``q + y``)                   TF all; GR all
11  decoder FFN sub-layer without its residual                                   TF all; GR all
12  padding not masked in the decoder's attentions over V^N / S^N                TF all; GR all
13  attribute padding not masked in the semantic encoder                         TF all with an
                                                                                 S-encoder; GR eta,lf
14  stacked_v without the semantic guidance (``att("gs_v", a)``)                 TF sv
15  late fusion: raw logits of the visual member instead of its log-softmax      equivalent mutant
    (differs by a per-row constant, which the outer log_softmax removes)         (survives, rightly)
16  ``visual_encoder=False`` ignored (the visual encoder still runs)             TF par
17  decoder self-attention sub-layer without its residual (teacher forcing)      TF all
18  empty attribute set not zeroed (uniform average of padding embeddings)       TF all but tv;
                                                                                 GR all
19  ``decode_step`` always at position 0 (``offset=0``)                          GR all
20  f of eq. 12 applied to v only                                                TF par
21  region padding not masked in the visual encoder                              TF eta,ss,sv,tv;
                                                                                 GR eta,ss
22  GBC gate through tanh instead of the sigmoid (eq. 11)                        TF eta,par; GR eta
23  no sqrt(D) scale on the decoder's word embeddings (teacher forcing)          TF all
24  stacked_s attends in the wrong order (``att("a_v", att("gv_s", a))``)        TF ss; GR ss
25  late fusion: the sum instead of the mean of the log-probabilities            TF lf; GR lf
26  late fusion's Transformer_v member with a ReLU after its region projection   TF lf; GR lf
    (the model's behaviour before this change; sec. 4.1's projection is linear)
==  ===========================================================================  ==================

Mutants 1-3 are the issue's; mutant 3 (no positions) and 2 (ReLU on the regions) never reach
the tests of single blocks, and 1 is outside them. Equivalence between teacher forcing and
``decode_step`` (test_eta.py) cannot catch 1-5, which both paths share.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.data.vocab import BOS
from jaxcap.models.base import shift_right
from jaxcap.papers.eta.model import ETACaptioner
from tests.models import np_transformer as ref
from tests.models.test_transformer_whole_model import random_params
from tests.tiers import one_in_default

V, F, N, A, D, H, FF = 19, 7, 5, 4, 16, 4, 24
B, S, T, STEPS = 3, 2, 6, 4



def make_batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones((B, N), bool)
  mask[1, 3:] = False  # padding rows hold large garbage
  mask[2, 2:] = False
  feats = rng.normal(size=(B, N, F))
  feats[~mask] = 30.0 * rng.normal(size=(int((~mask).sum()), F))
  attrs = np.zeros((B, A), np.int32)
  attrs[0, :3] = [5, 9, 11]
  attrs[1, 1:3] = [7, 5]  # padding before a real attribute: order and gaps do not matter
  # image 2: no attribute at all
  caps = rng.integers(4, V, size=(B, S, T)).astype(np.int32)
  return {"feats": feats.astype(np.float32), "feats_mask": mask, "attributes": attrs,
          "captions": caps}


def run(model, params, batch, tokens):
  return ref.run_model(model, params, batch, tokens, STEPS)


# id: (variant, gbc f, visual_encoder, semantic_encoder, share_embeddings)
CASES = {
    "eta": ("eta", "identity", True, True, False),
    "parallel-relu-no_visual_encoder": ("parallel", "relu", False, True, False),
    "stacked_v-tied": ("stacked_v", "identity", True, True, True),
    "stacked_s-no_semantic_encoder": ("stacked_s", "identity", True, False, False),
    "transformer_s": ("transformer_s", "identity", True, True, False),
    "transformer_v": ("transformer_v", "identity", True, True, False),
    "late_fusion": ("late_fusion", "identity", True, True, False),
}


@functools.lru_cache(maxsize=None)
def outputs(case):
  variant, f, vis, sem, tied = CASES[case]
  model = ETACaptioner(V, max_len=T - 1, dim=D, num_layers=1, num_dec_layers=2, num_heads=H,
                       ff_dim=FF, dropout=0.0, variant=variant, gbc_activation=f,
                       visual_encoder=vis, semantic_encoder=sem, share_embeddings=tied)
  batch = make_batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  params = random_params(model, batch, tokens, seed=len(case))
  got = jax.tree.map(np.asarray, run(model, params, batch, tokens))
  return ref.as_np(params["params"]), batch, np.asarray(tokens), got


def reference(case, p, batch, i, tokens_T):
  variant, f, vis, sem, _ = CASES[case]
  return ref.eta_logits(p, batch["feats"][i].astype(np.float64), batch["feats_mask"][i],
                        batch["attributes"][i], tokens_T, variant, f, vis, sem)


@pytest.mark.parametrize("case", one_in_default(sorted(CASES)))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_teacher_forced_logits_match_numpy(case):
  p, batch, tokens, (train_logits, _, _) = outputs(case)
  for i in range(B):
    for j in range(S):
      np.testing.assert_allclose(train_logits[i, j], reference(case, p, batch, i, tokens[i, j]),
                                 rtol=2e-4, atol=2e-4, err_msg=f"image {i} caption {j}")


@pytest.mark.parametrize("case", ["eta", "late_fusion", "stacked_s-no_semantic_encoder"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_greedy_decode_steps_match_numpy(case):
  p, batch, _, (_, step_logits, fed) = outputs(case)
  assert (fed[:, 0] == BOS).all()
  for i in range(B):
    want = reference(case, p, batch, i, fed[i])
    np.testing.assert_allclose(step_logits[i], want, rtol=2e-4, atol=2e-4, err_msg=f"image {i}")
    np.testing.assert_array_equal(fed[i, 1:], want[:-1].argmax(-1))
