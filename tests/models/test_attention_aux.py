"""Attention weights through the decoding protocol, for every registered attention model.

Dimension legend: B images, K beams, n samples, T decoding steps, L decoder layers (or the
Image Transformer's sub-transformers, AAT's step slots), H heads, N regions, A attributes,
Ls source positions.

Each model runs at tiny sizes on random parameters and a batch with padded regions (and
padded attributes / source words), and is decoded greedily, by beam search (K = 3, "live") and
by sampling with ``return_aux=True``. Then, for every returned sequence, ``decode_step`` is
stepped by hand along that sequence's own tokens from BOS; the decoder's per-step aux must be
the hand-stepped one up to and including EOS (beam search reorders its caches and aux
histories by parent at every step: a hypothesis that took another beam's history, or whose aux
was not reordered with its cache, differs). The hand-stepped weights are then checked to be
distributions over the real regions / attributes / source words (rows sum to 1, 0 on padding),
with the zero rows each model documents. ``test_every_model_is_covered`` enumerates
``registry.names()``: a new model is either given a case here or listed as having no attention.

The Transformer's weights are also checked against a NumPy reference (the blocks of
tests/models/np_transformer.py, one image, float64): which layer and head each slot holds.

Mutants tried (on a copy of the tree), each failing the tests named:
  * the Transformer's decode_step returning no aux (as it did before):
    test_decoder_aux_equals_stepping[transformer*-greedy] (and
    tests/analysis/test_figures.py::test_run_plot_words_of_a_transformer[einsum]);
  * the Transformer's summary from the first layer instead of the last:
    test_summaries_are_documented_means[transformer*], test_transformer_weights_match_numpy_reference;
  * its ``cross_attention`` with layers and heads swapped ([B, H, L, N]; L = H here), or each
    layer reporting the previous layer's weights: test_transformer_weights_match_numpy_reference;
  * decoding.py's beam search giving every candidate beam 0's aux instead of its parent's:
    test_decoder_aux_equals_stepping[<every case>-beam];
  * decoding.py's greedy / sampling aux not zeroed after EOS:
    test_decoder_aux_equals_stepping[image_transformer-greedy];
  * the Image Transformer's summary from its first sub-transformer only:
    test_summaries_are_documented_means[image_transformer];
  * ETA's summary from ``a_v`` instead of ``gs_v``: test_summaries_are_documented_means[eta];
  * ETA's weights of an attribute-less image left uniform over padding instead of 0:
    test_rows_are_distributions_over_real_elements[eta, eta_parallel, eta_late_fusion];
  * AAT's untaken steps not zeroed in ``step_attention``, or its summary not renormalised
    without beta_0: test_rows_are_distributions_over_real_elements[aat];
  * MNMT's ``src_attention`` set to the image attention:
    test_rows_are_distributions_over_real_elements[mnmt], test_summaries_are_documented_means[mnmt].
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import decoding, xla_options
from jaxcap.data.vocab import BOS, EOS, PAD
from jaxcap.models import registry
from jaxcap.models.base import repeat_batch
from tests import papers
from tests.models import np_transformer as ref
from tests.tiers import one_in_default

V, N, A, LS, T, B, K, NS = 12, 5, 4, 5, 6, 3, 3, 2
MIN_LEN = 3  # no EOS before the 4th step: longer sequences, more beam reordering
TRANSFORMER = dict(dim=16, num_layers=1, num_dec_layers=2, num_heads=2, ff_dim=24, dropout=0.0)

# case -> (registered model, fields). Tiny sizes; dropout off (decoding runs train=False anyway).
# The shared models' cases here, each paper's in tests/papers/<paper>/shared_cases.py.
CASES = {
    "transformer": ("transformer", TRANSFORMER),
    "transformer_prenorm": ("transformer", dict(TRANSFORMER, norm_position="pre",
                                                layer_norm="annotated")),
    "lstm": ("lstm", dict(hidden_dim=16, embed_dim=8, att_dim=8, dropout=0.0)),
    "aoa": ("aoa", dict(dim=16, embed_dim=8, num_heads=2, dropout=0.0, dropout_aoa=0.0)),
    "updown": ("updown", dict(hidden_dim=16, embed_dim=8, att_dim=8, dropout=0.0)),
    **papers.collected("ATTENTION_AUX"),
}
# Registered models whose decoder attends to nothing (or that have no decoder).
NO_ATTENTION = {"nearest_neighbour": "retrieval, no decoder", "newfc": "FC features only",
                **papers.collected("NO_ATTENTION")}

# aux key -> which batch mask its last axis runs over.
_FEATS, _ATTRS, _SRC = "feats_mask", "attr_mask", "src_mask"


def _memory_of(key: str):
  """The batch mask the last axis of aux ``key`` runs over: the shared keys here, a paper's
  own from its ``aux_memory``."""
  if key in ("attention", "cross_attention"):
    return _FEATS
  found = {m for m in (hook(key) for hook in papers.hooks("aux_memory")) if m is not None}
  assert len(found) <= 1, (key, found)
  return found.pop() if found else None


def _is_attention(key: str) -> bool:
  return "attention" in key and key != "attention_steps"


INFO = {"vocab_size": V, "max_len": T, "src_vocab_size": V, "feature_dim": 7, "global_dim": 7,
        "max_regions": N, "max_attributes": A, "num_attributes": 1, "src_max_len": LS - 1,
        "seq_per_img": 1}


def _batch():
  rng = np.random.default_rng(0)
  feats_mask = np.arange(N)[None, :] < np.array([N, 3, 1])[:, None]  # padded regions
  corners = rng.uniform(size=(B, N, 2, 2)).astype(np.float32)
  boxes = np.concatenate([corners.min(2), corners.max(2)], -1) * feats_mask[..., None]
  feats = rng.normal(size=(B, N, 7)).astype(np.float32) * feats_mask[..., None]
  attributes = np.array([[4, 5, 6, 7], [8, 9, PAD, PAD], [PAD] * A], np.int32)  # image 2: none
  # Source lengths unlike the region counts, so that the two masks tell the memories apart.
  src = np.array([[4, 5, 6, EOS, PAD], [8, EOS, PAD, PAD, PAD], [10, 11, 7, EOS, PAD]], np.int32)
  return {"feats": feats, "feats_mask": feats_mask, "boxes": boxes.astype(np.float32),
          "global_feat": feats.mean(1), "attributes": attributes, "src": src,
          "captions": np.zeros((B, 1, T + 1), np.int32), "valid": np.ones((B,), bool),
          "image_index": np.arange(B, dtype=np.int32)}


BATCH = _batch()
MASKS = {_FEATS: BATCH["feats_mask"], _ATTRS: BATCH["attributes"] != PAD, _SRC: BATCH["src"] != PAD}


@functools.lru_cache(maxsize=None)
def _model(case):
  name, fields = CASES[case]
  model = registry.build(dict(fields, name=name), INFO)
  batch = jax.tree.map(jnp.asarray, BATCH)
  tokens = jnp.full((B, 1, T), BOS, jnp.int32)
  params = model.init({"params": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)},
                      batch, tokens)
  # Random parameters at a larger scale than the initialisers', so that attention is peaked
  # and words, beams and halting steps differ.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
  params = jax.tree.unflatten(tree, [x + 0.5 * jax.random.normal(k, x.shape, x.dtype)
                                     for x, k in zip(leaves, keys)])
  return model, params


@functools.lru_cache(maxsize=None)
def _stepper(model):
  # Compiled as decoding's own programs are (jaxcap/xla_options.py), so that the two compute the
  # same products the same way: a recurrent model's weights drift past 1e-5 over its steps when
  # one side's dots are YNNPACK's and the other's XLA's.
  @functools.partial(jax.jit, static_argnums=3, compiler_options=xla_options.decode_compiler_options())
  def run(params, batch, tokens_RxT, repeat):
    """decode_step along ``tokens_RxT`` (image-major rows, ``repeat`` per image) from BOS:
    aux stacked to ``[R, T, ...]``."""
    enc = repeat_batch(model.apply(params, batch, method="encode"), repeat)
    cache = model.apply(params, enc, T, method="init_cache")
    fed_RxT = jnp.concatenate([jnp.full((tokens_RxT.shape[0], 1), BOS, jnp.int32),
                               tokens_RxT[:, :-1]], axis=1)

    def body(cache, xs):
      tok_R, t = xs
      _, cache, aux = model.apply(params, enc, cache, tok_R, t, method="decode_step")
      return cache, aux

    _, aux = jax.lax.scan(body, cache, (fed_RxT.T, jnp.arange(T, dtype=jnp.int32)))
    return jax.tree.map(lambda a: jnp.moveaxis(a, 0, 1), aux)

  return run


def _stepped(model, params, tokens_RxT, repeat):
  return jax.device_get(_stepper(model)(params, BATCH, jnp.asarray(tokens_RxT), repeat))


@functools.lru_cache(maxsize=None)
def _decoded(case, method):
  model, params = _model(case)
  batch = jax.tree.map(jnp.asarray, BATCH)
  if method == "greedy":
    out = decoding.greedy(model, params, batch, max_len=T, min_len=MIN_LEN, return_aux=True)
    repeat = 1
  elif method == "beam":
    # Trigram blocking: random tiny models like to repeat one word, which leaves every
    # returned beam on one parent lineage (nothing reordered).
    out = decoding.beam_search(model, params, batch, beam_size=K, max_len=T, min_len=MIN_LEN,
                               block_trigrams=True, return_aux=True)
    repeat = K
  else:
    out = decoding.sample(model, params, batch, jax.random.PRNGKey(4), max_len=T,
                          num_samples=NS, min_len=MIN_LEN, return_aux=True)
    repeat = NS
  out = jax.device_get(out)
  tokens_RxT = out.tokens.reshape(-1, T)
  lengths_R = out.lengths.reshape(-1)
  aux = {k: v.reshape((-1,) + v.shape[1 + (out.tokens.ndim == 3):]) for k, v in out.aux.items()}
  return tokens_RxT, lengths_R, aux, _stepped(model, params, tokens_RxT, repeat), repeat


@pytest.mark.paper_gate
def test_every_model_is_covered():
  covered = {name for name, _ in CASES.values()}
  assert covered.isdisjoint(NO_ATTENTION)
  assert set(registry.names()) == covered | set(NO_ATTENTION), (
      "a registered model is neither tested for its attention aux nor listed in NO_ATTENTION")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in NO_ATTENTION if n != "nearest_neighbour"))
def test_models_without_attention_report_none(name):
  """The models listed as attention-free indeed report no attention (else: give them a case)."""
  fields = {"tpgn": dict(d=4)}.get(name, dict(hidden_dim=8, embed_dim=8))
  model = registry.build(dict(fields, name=name), INFO)
  batch = jax.tree.map(jnp.asarray, BATCH)
  params = model.init({"params": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)},
                      batch, jnp.full((B, 1, T), BOS, jnp.int32))
  out = decoding.greedy(model, params, batch, max_len=T, return_aux=True)
  assert not [k for k in out.aux if _is_attention(k)], sorted(out.aux)


# Beam search first (the case kept when the test runs in the quick loop): it reorders caches and
# aux histories, the easiest to get wrong.
@pytest.mark.parametrize("method", one_in_default(["greedy", "beam", "sample"], keep="beam"))
@pytest.mark.parametrize("case", one_in_default(sorted(CASES)))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_decoder_aux_equals_stepping(case, method):
  tokens_RxT, lengths_R, aux, stepped, _ = _decoded(case, method)
  keys = [k for k in aux if _is_attention(k)]
  assert "attention" in keys, sorted(aux)
  assert (lengths_R > 0).all()
  for r in range(len(tokens_RxT)):
    n = lengths_R[r]  # words + EOS: the steps that produced this sequence
    for k in aux:  # every aux key, attention or not, follows the sequence's own history
      # Two programs (the decode's scan, the loop of steps) compiled apart round apart: AAT's
      # recurrent halting sums carry that to ~4e-6 on a weight of 0.03 (XLA's elemental CPU
      # emitters, tests/fast_compile.py); a wrong history moves weights by 1e-2 and more.
      np.testing.assert_allclose(aux[k][r, :n], stepped[k][r, :n], rtol=1e-5, atol=1e-5,
                                 err_msg=f"{case} {method} row {r} aux {k!r}")
      assert not np.any(aux[k][r, n:]), (case, method, r, k)  # zeros after EOS
  if method == "beam":
    # The search is not trivially K copies of greedy: the beams differ.
    per_image = tokens_RxT.reshape(B, K, T)
    assert any(len({tuple(s) for s in per_image[b]}) > 1 for b in range(B))


def _real_rows_check(case, key, a_RxTx_M, repeat, stepped):
  """Rows over the last axis: 0 on padding, and sum to 1 except the documented zero rows."""
  mask_RxM = np.repeat(MASKS[_memory_of(key)], repeat, axis=0)
  mask = mask_RxM.reshape((mask_RxM.shape[0],) + (1,) * (a_RxTx_M.ndim - 2) + mask_RxM.shape[1:])
  assert np.all(np.where(mask, 0.0, a_RxTx_M) == 0.0), (case, key, "weight on padding")
  sums = a_RxTx_M.sum(-1)
  expect = np.ones_like(sums)
  if _memory_of(key) == _ATTRS:  # an image without attributes attends to none (ETA)
    empty_R = ~mask_RxM.any(-1)
    expect[empty_R] = 0.0
  for hook in papers.hooks("aux_row_sums"):  # a paper's documented zero rows (AAT's steps)
    own = hook(key, stepped, a_RxTx_M, sums)
    expect = expect if own is None else own
  np.testing.assert_allclose(sums, expect, atol=1e-5, err_msg=f"{case} {key}")


@pytest.mark.parametrize("case", one_in_default(sorted(CASES)))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_rows_are_distributions_over_real_elements(case):
  _, _, _, stepped, repeat = _decoded(case, "beam")
  keys = [k for k in stepped if _is_attention(k)]
  for k in keys:
    assert _memory_of(k) is not None, (case, k)
    _real_rows_check(case, k, np.asarray(stepped[k], np.float64), repeat, stepped)
  for hook in papers.hooks("aux_case_check"):  # e.g. AAT's case halts at more than one step
    hook(case, stepped)


@pytest.mark.parametrize("case", one_in_default(sorted(CASES)))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_summaries_are_documented_means(case):
  """``attention`` as each model's docstring defines it: the Transformer's here, a paper's by
  its ``aux_summaries`` (which says whether the model is its)."""
  _, _, _, s, _ = _decoded(case, "greedy")
  name, fields = CASES[case]
  if name == "transformer":
    np.testing.assert_allclose(s["attention"], s["cross_attention"][:, :, -1].mean(2), atol=1e-6)
  else:
    checked = [hook(name, fields, case, s) for hook in papers.hooks("aux_summaries")]
    if name in {n for n, _ in papers.collected("ATTENTION_AUX").values()}:
      assert sum(checked) == 1, (case, "a paper model needs its aux_summaries")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_transformer_weights_match_numpy_reference():
  """Each ``cross_attention[:, t, l, h]`` is layer l's head h at position t, computed from the
  papers' equations in float64 on one image at a time over its real regions."""
  model, params = _model("transformer")
  tokens_RxT, lengths_R, aux, _, _ = _decoded("transformer", "greedy")
  p = ref.as_np(params["params"])
  for b in range(B):
    mask = BATCH["feats_mask"][b]
    memory = ref.transformer_encode(p, BATCH["feats"][b].astype(np.float64), mask)
    fed = np.concatenate([[BOS], tokens_RxT[b, :-1]])
    h = ref.embed_words(p["embed"]["embedding"], fed)
    n = lengths_R[b]
    for i in range(TRANSFORMER["num_dec_layers"]):
      lp = p[f"dec_layers_{i}"]
      a = ref.layer_norm(lp["norm1"], h + ref.causal_self_attention(lp["self_attn"]["mha"], h))
      ca = lp["cross_attn"]
      for head in range(TRANSFORMER["num_heads"]):
        q = a @ ca["query"]["kernel"][:, head] + ca["query"]["bias"][head]
        k = memory @ ca["key"]["kernel"][:, head]
        w_TxM = ref.softmax(q @ k.T / np.sqrt(q.shape[-1]))
        np.testing.assert_allclose(aux["cross_attention"][b, :n, i, head, :mask.sum()], w_TxM[:n],
                                   atol=2e-5, err_msg=f"image {b} layer {i} head {head}")
      c = ref.layer_norm(lp["norm2"], a + ref.multihead(ca, a, memory))
      h = ref.layer_norm(lp["norm3"], c + ref.ffn(lp["ffn"], c))
    last = TRANSFORMER["num_dec_layers"] - 1
    np.testing.assert_allclose(aux["attention"][b, :n], aux["cross_attention"][b, :n, last].mean(1),
                               atol=1e-6)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_fused_attention_reports_none():
  """With ``attention_impl="xla"`` (a fused kernel) the weights do not exist: no attention
  keys, and decoding with ``return_aux`` still works."""
  model = registry.build(dict(TRANSFORMER, name="transformer", attention_impl="xla"), INFO)
  _, params = _model("transformer")
  out = decoding.greedy(model, params, jax.tree.map(jnp.asarray, BATCH), max_len=T,
                        return_aux=True)
  assert out.aux == {}
