"""Multimodal attention NMT (jaxcap/papers/mnmt/model.py) against an independent NumPy reference.

The reference (``np_*`` below) is written from the paper's equations (Caglayan et al. 2016,
eqs. 3-11) and runs one example at a time in float64 with Python loops: the source is cut to
its real tokens before the GRUs run (so padding cannot leak in by construction), the decoder
keeps the paper's two recurrent states with ``h_0^(2) = h_1^(1)``, attention runs over the
real positions only. It is fed the model's own parameters, selected by the variant's flags
(a shared ``W_C``/``U_A``/``W_D`` or the per-modality ones), not by what the tree contains.

Mutants tried by hand (each made at least one test below fail; then restored):
  1. ``jnp.tanh`` dropped from eq. 8's hidden layer (``_output``)            -> whole-model, step
  2. tanh dropped from SUM fusion (eq. 5)                                    -> fusion, whole-model
  3. modalities swapped in attention (text keys from ``W_C_im``)             -> whole-model, schemes
  4. source padding ignored in attention (mask removed)                      -> schemes, whole-model
  5. no ``seq_lengths`` in the bi-GRU (backward GRU reads the PADs first)    -> encoder, whole-model
  6. initial state dropped (``h0 = 0`` instead of tanh(W_init mean(a)))      -> whole-model, step
  7. ``h_0^(2) = h_1^(1)`` dropped (g2 starts from zeros)                    -> whole-model, step
  8. ``E y_{t-1}`` dropped from eq. 8                                        -> whole-model, step
  9. mean over all source positions (PAD included) in eq. 4                  -> whole-model
Mutant audit (each failed test_whole_model_matches_numpy in every default case):
 10. tanh dropped from eq. 8's hidden layer (again, confirmed);
 11. g2 always from its cache (``h_0^(2) = h_1^(1)`` dropped; again, confirmed);
 12. padding not masked in the attention energies (eq. 10);
 13. tanh dropped inside the attention energy (eq. 9).
decode_step equals teacher forcing on arbitrary tokens (test_decode_step_equals_teacher_forcing)
and one CGRU step equals the reference directly (test_one_cgru_step), which covers greedy steps.

``decoder="nmtpy"`` (the authors' released CGRU) has its own float64 reference (``np_nmtpy_*``),
written from dl4mt's / nmtpy's equations with their stacked matrices and one carried state;
test_nmtpy_reference_tells_the_readings_apart shows that five other readings (GRU1 fed its own
state, a BOS embedding at t = 1, the readout from h', the reset gate before the matrix, no
b_att) each move it far beyond the tolerance, and test_decoders_differ_on_the_same_parameters
that the two decoders agree at t = 1 only.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxcap.models import registry
from jaxcap.models.base import shift_right
from jaxcap.papers.mnmt.model import VARIANTS, MultimodalNMT
from tests.papers.mnmt import np_nmtpy
from tests.tiers import one_in_default

E, H, A, V, VS = 6, 5, 7, 17, 13
B, S, T, L, N, C = 3, 2, 5, 7, 4, 8

_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})

# variant -> model kwargs.
_KW = {name: dict(fusion=f, encoder_dependent=e, decoder_dependent=d)
       for name, (f, e, d) in VARIANTS.items()}
_KW["nmt"] = dict(modalities="text")
_KW["imgtxt"] = dict(modalities="image")
_KW["mnmt7_linear"] = dict(fusion="concat", encoder_dependent=True, decoder_dependent=False,
                           fusion_tanh=False)


def _model(name, decoder="paper"):
  return MultimodalNMT(vocab_size=V, src_vocab_size=VS, embed_dim=E, hidden_dim=H, att_dim=A,
                       decoder=decoder, **_KW[name])


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  src = rng.integers(4, VS, size=(B, L)).astype(np.int32)
  lengths = [L, 3, 5]  # row 0 full, rows 1-2 padded (EOS then PAD)
  for b, n in enumerate(lengths):
    src[b, n - 1] = 2
    src[b, n:] = 0
  feats = rng.normal(size=(B, N, C)).astype(np.float32)
  mask = np.ones((B, N), bool)
  mask[2, 3:] = False  # a padded image too
  caps = rng.integers(4, V, size=(B, S, T)).astype(np.int32)
  return {"src": src, "feats": feats, "feats_mask": mask, "captions": caps}


@functools.lru_cache(maxsize=None)
def _model_and_params(name, decoder="paper"):
  model = _model(name, decoder)
  batch = _batch()
  params = _jit(model.init)(jax.random.key(1), batch, shift_right(jnp.asarray(batch["captions"])))
  # Non-zero biases, so that a dropped bias would show (the paper initialises them to zero).
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.1 * jax.random.normal(jax.random.key(len(str(path))), x.shape)
      if "bias" in str(path[-1]) else x, params)
  return model, params


@functools.partial(_jit, static_argnums=0)
def _logits(model, params, batch, tokens):
  return model.apply(params, batch, tokens)


@functools.partial(_jit, static_argnums=0)
def _decode_step(model, params, enc, cache, tokens, t):
  return model.apply(params, enc, cache, tokens, t, method="decode_step")


def _np(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


# ----------------------------------------------------------------------------------------------
# NumPy reference from the paper's equations.


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_gru(p, x, h):
  """GRU (flax's / dl4mt's form: the reset gate scales U_n h + b_hn)."""
  r = _sigmoid(x @ p["ir"]["kernel"] + p["ir"]["bias"] + h @ p["hr"]["kernel"])
  z = _sigmoid(x @ p["iz"]["kernel"] + p["iz"]["bias"] + h @ p["hz"]["kernel"])
  n = np.tanh(x @ p["in"]["kernel"] + p["in"]["bias"] + r * (h @ p["hn"]["kernel"] + p["hn"]["bias"]))
  return (1.0 - z) * n + z * h


def np_encoder(p, ids):
  """Eq. 3 over the real tokens ``ids`` only: ``[n, 2H]``."""
  x = p["src_embed"]["embedding"][ids]
  fwd, bwd = [], []
  h = np.zeros(H)
  for x_i in x:
    h = np_gru(p["encoder"]["forward_rnn"]["cell"], x_i, h)
    fwd.append(h)
  h = np.zeros(H)
  for x_i in x[::-1]:
    h = np_gru(p["encoder"]["backward_rnn"]["cell"], x_i, h)
    bwd.append(h)
  return np.concatenate([np.stack(fwd), np.stack(bwd[::-1])], axis=1)


def np_attention(w_d, w_c, u_a, h1, ann):
  """Eqs. 9-11 over real annotations ``ann [n, 2H]``: ``(c [2H], alpha [n])``."""
  e = np.array([np.tanh(h1 @ w_d + a_i @ w_c) @ u_a[:, 0] for a_i in ann])
  alpha = np.exp(e - e.max())
  alpha /= alpha.sum()
  return (alpha[:, None] * ann).sum(0), alpha


def np_fuse(p, kw, ctx):
  mods = sorted(ctx)
  if len(mods) == 1:
    return ctx[mods[0]]
  if kw.get("fusion") == "sum":
    return np.tanh(ctx["txt"] + ctx["im"])  # eq. 5
  z = np.concatenate([ctx["txt"], ctx["im"]]) @ p["W_fus"]["kernel"] + p["W_fus"]["bias"]  # eq. 6
  return np.tanh(z) if kw.get("fusion_tanh", True) else z


def _att_params(p, kw, m):
  both = kw.get("modalities", "both") == "both"
  enc = f"_{m}" if both and kw["encoder_dependent"] else ""
  dec = f"_{m}" if both and kw["decoder_dependent"] else ""
  return p["W_D" + dec]["kernel"], p["W_C" + enc]["kernel"], p["U_A" + enc]["kernel"]


def np_annotations(p, kw, src, feats, fmask):
  """``{m: [n_m, 2H]}`` for one example, real positions only."""
  modalities = kw.get("modalities", "both")
  ann = {}
  if modalities != "image":
    ann["txt"] = np_encoder(p, src[src != 0])
  if modalities != "text":
    ann["im"] = feats[fmask] @ p["W_im"]["kernel"]
  return ann


def np_step(p, kw, ann, y, h1, h2):
  """One CGRU step (eqs. 7-11 and 8); ``h2 is None`` at the first step (eq. 4)."""
  e = p["trg_embed"]["embedding"][y]
  h1 = np_gru(p["g1"], e, h1)
  if h2 is None:
    h2 = h1  # h_0^(2) = h_1^(1)
  ctx, alphas = {}, {}
  for m, a in ann.items():
    ctx[m], alphas[m] = np_attention(*_att_params(p, kw, m), h1, a)
  c = np_fuse(p, kw, ctx)
  h2 = np_gru(p["g2"], c, h2)
  hid = np.tanh(h2 @ p["L_s"]["kernel"] + c @ p["L_c"]["kernel"] + e)  # eq. 8
  return hid @ p["L_o"]["kernel"] + p["L_o"]["bias"], h1, h2, alphas


def np_forward(p, kw, src, feats, fmask, tokens):
  """The whole model for one example: logits ``[T, V]`` and per-step alphas."""
  ann = np_annotations(p, kw, src, feats, fmask)
  pooled = ann["txt" if "txt" in ann else "im"].mean(0)
  h1 = np.tanh(pooled @ p["W_init"]["kernel"] + p["W_init"]["bias"])  # eq. 4
  h2, out, alphas = None, [], []
  for y in tokens:
    logits, h1, h2, al = np_step(p, kw, ann, y, h1, h2)
    out.append(logits)
    alphas.append(al)
  return np.stack(out), alphas


# ----------------------------------------------------------------------------------------------


# MNMT7 (attention over regions, multiplicative fusion) in the default suite; the other variants
# in the slow one (each compiles its own model: ~7 s).
@pytest.mark.parametrize("name", one_in_default(sorted(_KW), keep="mnmt7"))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_whole_model_matches_numpy(name):
  """Embeddings, bi-GRU, W_im, CGRU with attention and fusion, classifier: every variant."""
  model, params = _model_and_params(name)
  batch = _batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  logits, aux = _logits(model, params, batch, tokens)
  assert logits.shape == (B, S, T, V) and logits.dtype == jnp.float32
  p = _np(params["params"])
  kw = _KW[name]
  for b in range(B):
    for s in range(S):
      ref, _ = np_forward(p, kw, batch["src"][b], np.float64(batch["feats"][b]),
                          batch["feats_mask"][b], np.asarray(tokens[b, s]))
      np.testing.assert_allclose(logits[b, s], ref, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mnmt1", "mnmt2", "mnmt3", "mnmt4"])
def test_attention_schemes_with_padded_sources(name):
  """Eqs. 9-11 under the four dependency schemes: the weights of both modalities equal the
  reference's over the real positions and are exactly zero on padding."""
  model, params = _model_and_params(name)
  batch = _batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  _, aux = _logits(model, params, batch, tokens)
  p = _np(params["params"])
  for b in range(B):
    _, alphas = np_forward(p, _KW[name], batch["src"][b], np.float64(batch["feats"][b]),
                           batch["feats_mask"][b], np.asarray(tokens[b, 0]))
    for m, mask in (("txt", batch["src"][b] != 0), ("im", batch["feats_mask"][b])):
      got = np.asarray(aux[f"attention_{m}"][b * S])  # [T, L_m]
      assert np.all(got[:, ~mask] == 0.0)
      np.testing.assert_allclose(got[:, mask], np.stack([a[m] for a in alphas]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["mnmt1", "mnmt5", "mnmt7_linear", "nmt", "imgtxt"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_fusion(name):
  """SUM (eq. 5), CONCAT (eq. 6, with and without its tanh), and the monomodal pass-through."""
  model, params = _model_and_params(name)
  rng = np.random.default_rng(3)
  ctx = {m: rng.normal(size=(B, 2 * H)).astype(np.float32) for m in ("txt", "im")}
  if name == "nmt":
    ctx.pop("im")
  if name == "imgtxt":
    ctx.pop("txt")
  got = model.apply(params, ctx, method=lambda mdl, c: mdl._fuse(c))
  p = _np(params["params"])
  for b in range(B):
    ref = np_fuse(p, _KW[name], {m: np.float64(c[b]) for m, c in ctx.items()})
    np.testing.assert_allclose(got[b], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_one_cgru_step():
  """decode_step at t = 0 (g2 starts from h_1^(1), eq. 4) and at t = 3 (g2 from the cached
  h^(2), eq. 7), logits by eq. 8, from arbitrary cached states."""
  model, params = _model_and_params("mnmt7")
  batch = _batch()
  enc = model.apply(params, batch, method="encode")
  p = _np(params["params"])
  rng = np.random.default_rng(5)
  cache = {"h1": rng.normal(size=(B, H)).astype(np.float32),
           "h2": rng.normal(size=(B, H)).astype(np.float32)}
  tokens = jnp.asarray(rng.integers(4, V, size=(B,)), jnp.int32)
  for t in (0, 3):
    logits, new, _ = _decode_step(model, params, enc, cache, tokens, jnp.int32(t))
    for b in range(B):
      ann = np_annotations(p, _KW["mnmt7"], batch["src"][b], np.float64(batch["feats"][b]),
                           batch["feats_mask"][b])
      ref, h1, h2, _ = np_step(p, _KW["mnmt7"], ann, int(tokens[b]), np.float64(cache["h1"][b]),
                               None if t == 0 else np.float64(cache["h2"][b]))
      np.testing.assert_allclose(logits[b], ref, rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(new["h1"][b], h1, rtol=1e-4, atol=1e-6)
      np.testing.assert_allclose(new["h2"][b], h2, rtol=1e-4, atol=1e-6)
  # The initial state of eq. 4: the mean over real source tokens.
  for b in range(B):
    a = np_encoder(p, batch["src"][b][batch["src"][b] != 0])
    ref = np.tanh(a.mean(0) @ p["W_init"]["kernel"] + p["W_init"]["bias"])
    np.testing.assert_allclose(enc["h0"][b], ref, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bidirectional_encoder_respects_padding():
  """A source padded to more positions gives the same annotations (both directions) as the
  unpadded one, and they equal eq. 3 over the real tokens."""
  model, params = _model_and_params("nmt")
  batch = _batch()
  wide = dict(batch, src=np.pad(batch["src"], ((0, 0), (0, 4))))
  enc = model.apply(params, batch, method="encode")
  enc_wide = model.apply(params, wide, method="encode")
  p = _np(params["params"])
  for b in range(B):
    real = batch["src"][b] != 0
    n = int(real.sum())
    np.testing.assert_allclose(enc_wide["txt"][b, :n], enc["txt"][b, :n], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(enc["txt"][b, :n], np_encoder(p, batch["src"][b][real]), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(enc_wide["h0"], enc["h0"], rtol=1e-6, atol=1e-6)


def _att_leaves(params):
  return sorted(k for k in params["params"] if k.startswith(("W_C", "U_A", "W_D")))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_parameter_tree_shares_arrays():
  """MNMT1: one W_C, U_A, W_D (one array each, used for both modalities); MNMT8: two of each;
  the mixed schemes in between; CONCAT adds W_fus, SUM does not."""
  expect = {
      "mnmt1": ["U_A", "W_C", "W_D"],
      "mnmt2": ["U_A", "W_C", "W_D_im", "W_D_txt"],
      "mnmt3": ["U_A_im", "U_A_txt", "W_C_im", "W_C_txt", "W_D"],
      "mnmt8": ["U_A_im", "U_A_txt", "W_C_im", "W_C_txt", "W_D_im", "W_D_txt"],
  }
  batch = _batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  for name, names in expect.items():
    shapes = jax.eval_shape(_model(name).init, jax.random.key(0), batch, tokens)
    assert _att_leaves(shapes) == names
    assert ("W_fus" in shapes["params"]) == (VARIANTS[name][0] == "concat")
  n1 = sum(x.size for x in jax.tree.leaves(jax.eval_shape(_model("mnmt1").init, jax.random.key(0), batch, tokens)))
  n8 = sum(x.size for x in jax.tree.leaves(jax.eval_shape(_model("mnmt4").init, jax.random.key(0), batch, tokens)))
  assert n8 - n1 == 2 * H * A + A + H * A  # one more W_C [2H, A], U_A [A, 1] and W_D [H, A]


@pytest.mark.slow
@pytest.mark.parametrize("name,decoder", [("mnmt7", "paper"), ("nmt", "paper"), ("imgtxt", "paper"),
                                          ("mnmt7", "nmtpy"), ("nmt", "nmtpy")])
def test_decode_step_equals_teacher_forcing(name, decoder):
  model, params = _model_and_params(name, decoder)
  batch = _batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  logits, aux = _logits(model, params, batch, tokens)
  enc = jax.tree.map(lambda x: jnp.repeat(x, S, axis=0), model.apply(params, batch, method="encode"))
  cache = model.apply(params, enc, T, method="init_cache")
  flat = tokens.reshape(B * S, T)
  for t in range(T):
    lg, cache, a = _decode_step(model, params, enc, cache, flat[:, t], jnp.int32(t))
    np.testing.assert_allclose(lg, logits.reshape(B * S, T, V)[:, t], rtol=1e-5, atol=1e-5)
    for k in a:
      np.testing.assert_allclose(a[k], aux[k][:, t], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_beam_search_through_the_protocol():
  from jaxcap import decoding
  model, params = _model_and_params("mnmt7")
  batch = _batch()
  out = decoding.beam_search(model, params, batch, beam_size=3, max_len=6)
  assert out.tokens.shape == (B, 3, 6)
  assert bool(jnp.all(jnp.isfinite(out.scores[:, 0])))
  # The best beam's score is its log-probability under teacher forcing.
  best = np.asarray(out.tokens[:, 0])
  caps = np.where(np.cumsum(best == 2, 1) - (best == 2) > 0, 0, best)[:, None, :]
  lp = jax.nn.log_softmax(_logits(model, params, batch, shift_right(jnp.asarray(caps)))[0][:, 0])
  tok_lp = np.take_along_axis(np.asarray(lp), caps[:, 0, :, None], -1)[..., 0]
  np.testing.assert_allclose((tok_lp * (caps[:, 0] != 0)).sum(-1), out.logprobs[:, 0], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# decoder="nmtpy" against a reading of nmtpy's own code (tests/papers/mnmt/np_nmtpy.py): nmtpy's
# parameter names and layouts, time-major, its masks; jaxcap's tree mapped onto the parameters
# nmtpy's init_params creates for the row (every array once).


def _full_image_batch():
  """nmtpy has no image mask (196 cells, all real): every cell real here."""
  return dict(_batch(), feats_mask=np.ones((B, N), bool))


def _nmtpy_logprobs(name, mutant=""):
  """(model's teacher-forced log-probs [B, S, T, V], nmtpy's reading's under ``mutant``)."""
  model, params = _model_and_params(name, "nmtpy")
  batch = _full_image_batch()
  logits, _ = _logits(model, params, batch, shift_right(jnp.asarray(batch["captions"])))
  tp = np_nmtpy.from_jaxcap(params["params"], name)
  x = batch["src"].T
  ref = np.stack([np_nmtpy.forward(tp, name, x, np.float64(x != 0), np.float64(batch["feats"]).transpose(1, 0, 2),
                                   batch["captions"][:, s].T, mutant).transpose(1, 0, 2)
                  for s in range(S)], axis=1)  # [B, S, T, V]
  return np.asarray(jax.nn.log_softmax(logits, axis=-1)), ref


# MNMT2 (the image's own keys) in the default suite; every other row in the slow one (~7 s each).
@pytest.mark.parametrize("name", one_in_default(np_nmtpy.ROWS, keep="mnmt2"))
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_nmtpy_every_row_matches_nmtpys_code(name):
  """decoder="nmtpy", every Table 2 row: teacher-forced log-probabilities equal nmtpy's
  computation on the same parameters (biases non-zero), and the mapping uses every array."""
  lp, ref = _nmtpy_logprobs(name)
  assert lp.shape == ref.shape == (B, S, T, V)
  np.testing.assert_allclose(lp, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name,mutant", [
    ("mnmt2", "shared_image_keys"), ("mnmt6", "shared_image_keys"),
    ("mnmt5", "tanh_concat"), ("mnmt7", "tanh_concat"),
    ("mnmt6", "gru1_own_state"), ("mnmt6", "bos_embedding"), ("mnmt6", "readout_from_gru1")])
def test_nmtpy_reading_tells_the_readings_apart(name, mutant):
  """The comparison is sharp: the image keyed by the text's Wc_att (the paper's IND, jaxcap's
  old nmtpy rows 2 and 6), a tanh on CONCAT, GRU1 fed its own previous output (the paper's g1
  chain), a BOS embedding first, or the readout from h1 each move nmtpy's log-probabilities by
  more than 1e-2 from the model's, which matches the unmutated reading within 2e-4."""
  lp, ref = _nmtpy_logprobs(name, mutant)
  assert np.abs(lp - ref).max() > 1e-2, np.abs(lp - ref).max()


def test_nmtpy_rows_refuse_the_papers_key_sharing(monkeypatch):
  """With the paper's rule (the image's keys share W_C unless the encoder side is dependent),
  MNMT2's tree has no image key projection for nmtpy's Wc_att2 / b_att2."""
  monkeypatch.setattr(MultimodalNMT, "_keys_dependent", property(lambda self: self.encoder_dependent))
  model = _model("mnmt2", "nmtpy")
  batch = _full_image_batch()
  params = jax.eval_shape(model.init, jax.random.key(0), batch, shift_right(jnp.asarray(batch["captions"])))
  with pytest.raises(KeyError, match="W_C_im"):
    np_nmtpy.from_jaxcap(jax.tree.map(lambda s: np.zeros(s.shape), params["params"]), "mnmt2")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_nmtpy_mapping_finds_a_leftover_or_missing_array():
  """A paper-decoder tree (flax's b_hn in every GRU, no b_att) does not map onto nmtpy's."""
  _, params = _model_and_params("mnmt6")
  with pytest.raises((KeyError, AssertionError)):
    np_nmtpy.from_jaxcap(params["params"], "mnmt6")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_decoders_differ_on_the_same_parameters():
  """The paper's and nmtpy's decoders on the same numbers (the biases only one of them has are
  zero, GRU2's gate biases moved to the state side where dl4mt has them, BOS's embedding zero):
  the first step agrees (the readings coincide at t = 1, as the module docstring says), every
  later step of every caption differs."""
  paper, params = _model_and_params("mnmt7")
  _, nmtpy_params = _model_and_params("mnmt7", "nmtpy")
  pp = jax.tree.map(np.array, params["params"])
  pp["g1"]["hn"]["bias"][:] = 0.0  # flax's b_hn, which dl4mt's GRU1 lacks
  pp["g2"]["in"]["bias"][:] = 0.0  # flax's b_in, which dl4mt's GRU2 lacks
  for rnn in ("forward_rnn", "backward_rnn"):  # the encoders' b_hn, which nmtpy's gru_layer lacks
    pp["encoder"][rnn]["cell"]["hn"]["bias"][:] = 0.0
  pp["trg_embed"]["embedding"][1] = 0.0  # BOS: nmtpy's zero first embedding
  pn = jax.tree.map(np.array, pp)
  del pn["g1"]["hn"]["bias"], pn["g2"]["in"]["bias"]
  for rnn in ("forward_rnn", "backward_rnn"):
    del pn["encoder"][rnn]["cell"]["hn"]["bias"]
  for g in "rz":  # GRU2's gate biases, additive on either side, sit on the state side in dl4mt
    pn["g2"]["h" + g]["bias"] = pn["g2"]["i" + g].pop("bias")
  for name in ("W_C_txt", "W_C_im", "L_s", "L_c", "W_im"):
    pn[name]["bias"] = np.zeros(pn[name]["kernel"].shape[1], np.float32)
  assert jax.tree.structure(pn) == jax.tree.structure(nmtpy_params["params"])
  batch = _batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  lp_paper = np.asarray(jax.nn.log_softmax(_logits(paper, {"params": pp}, batch, tokens)[0]))
  nmtpy = _model("mnmt7", "nmtpy")
  # The paper's CONCAT has a tanh, nmtpy's not: compare with nmtpy's decoder given the tanh.
  nmtpy = nmtpy.clone(fusion_tanh=True)
  lp_nmtpy = np.asarray(jax.nn.log_softmax(_logits(nmtpy, {"params": pn}, batch, tokens)[0]))
  np.testing.assert_allclose(lp_nmtpy[:, :, 0], lp_paper[:, :, 0], rtol=1e-5, atol=1e-6)
  gap = np.abs(lp_nmtpy[:, :, 1:] - lp_paper[:, :, 1:]).max(-1)  # [B, S, T-1]
  assert gap.min() > 1e-4, gap.min()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_nmtpy_one_cgru_step_and_cache():
  """init_cache holds the one state h_0; decode_step at t = 0 (zero word vector) gives nmtpy's
  first log-probabilities, and caches GRU2's output h_1, from which step 1 gives the second."""
  model, params = _model_and_params("mnmt6", "nmtpy")
  batch = _full_image_batch()
  enc = model.apply(params, batch, method="encode")
  cache = model.apply(params, enc, T, method="init_cache")
  assert set(cache) == {"h"}
  np.testing.assert_array_equal(cache["h"], enc["h0"])
  _, ref = _nmtpy_logprobs("mnmt6")
  caps = batch["captions"][:, 0]  # [B, T]
  tokens = np.full(B, 1, np.int32)  # BOS (nmtpy's first input is zeros whatever the token)
  for t in range(2):
    logits, cache, _ = _decode_step(model, params, enc, cache, jnp.asarray(tokens), jnp.int32(t))
    assert set(cache) == {"h"}
    np.testing.assert_allclose(jax.nn.log_softmax(logits), ref[:, 0, t], rtol=1e-4, atol=1e-5)
    tokens = caps[:, t]


def _teacher_forced_token_logprobs(model, params, batch, seq_BxT):
  """Log-probabilities of ``seq`` (cut after its first EOS) under teacher forcing: ``[B, T]``."""
  caps = np.where(np.cumsum(seq_BxT == 2, 1) - (seq_BxT == 2) > 0, 0, seq_BxT)
  logits = _logits(model, params, batch, shift_right(jnp.asarray(caps[:, None])))[0][:, 0]
  lp = jax.nn.log_softmax(logits)
  tok_lp = np.take_along_axis(np.asarray(lp), caps[:, :, None], -1)[..., 0]
  return tok_lp * (caps != 0), np.asarray(lp), caps


@pytest.mark.slow
def test_nmtpy_greedy_beam_search_and_scst_sampling():
  """decoder="nmtpy" through the protocol: greedy picks the teacher-forced arg-max, beam
  search's best score is its teacher-forced log-probability, SCST's samples carry their
  teacher-forced log-probabilities and a finite, non-zero policy gradient."""
  from jaxcap import decoding
  from jaxcap.training import scst
  model, params = _model_and_params("mnmt6", "nmtpy")
  batch = _batch()
  greedy = np.asarray(decoding.greedy(model, params, batch, max_len=6).tokens)
  _, lp, caps = _teacher_forced_token_logprobs(model, params, batch, greedy)
  real = caps != 0
  np.testing.assert_array_equal(lp.argmax(-1)[real], greedy[real])
  out = decoding.beam_search(model, params, batch, beam_size=3, max_len=6)
  assert out.tokens.shape == (B, 3, 6) and bool(jnp.all(jnp.isfinite(out.scores[:, 0])))
  tok_lp, _, _ = _teacher_forced_token_logprobs(model, params, batch, np.asarray(out.tokens[:, 0]))
  np.testing.assert_allclose(tok_lp.sum(-1), out.logprobs[:, 0], rtol=1e-4, atol=1e-4)
  # SCST: 2 samples per image, re-scored by the gradient pass (teacher forcing).
  smp = decoding.sample(model, params, batch, jax.random.key(3), max_len=6, num_samples=2)
  logits, _ = scst.sample_logits(model, params, batch, smp.tokens, jax.random.key(4))
  toks = np.asarray(smp.tokens).reshape(B * 2, 6)
  tf_lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), toks[..., None], -1)[..., 0]
  real = toks != 0
  np.testing.assert_allclose(tf_lp[real], np.asarray(smp.token_logprobs).reshape(B * 2, 6)[real],
                             rtol=1e-4, atol=1e-5)
  adv = jnp.asarray([1.0, -1.0] * B)
  grads = jax.grad(lambda prm: scst.scst_loss(scst.sample_logits(model, prm, batch, smp.tokens,
                                                                  jax.random.key(4))[0],
                                              jnp.asarray(toks), adv)[0])(params)
  g1 = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grads["params"]["g1"])])
  assert np.all(np.isfinite(g1)) and np.abs(g1).max() > 0


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_nmtpy_parameter_tree():
  """dl4mt's bias placement (GRU1 and the encoders word side, GRU2 state side), b_att on W_C,
  affine W_im / L_s / L_c, L_y for text only, the image's own W_C in every row but MNMT1 / 5;
  the paper decoder's tree has none of these changes."""
  batch = _batch()
  tokens = shift_right(jnp.asarray(batch["captions"]))
  shapes = lambda name, dec: jax.eval_shape(_model(name, dec).init, jax.random.key(0), batch,
                                            tokens)["params"]
  nm, pa = shapes("mnmt8", "nmtpy"), shapes("mnmt8", "paper")
  has_bias = lambda cell: sorted(k for k in cell if "bias" in cell[k])
  assert has_bias(nm["g1"]) == ["in", "ir", "iz"] and has_bias(nm["g2"]) == ["hn", "hr", "hz"]
  assert has_bias(pa["g1"]) == has_bias(pa["g2"]) == ["hn", "in", "ir", "iz"]
  for rnn in ("forward_rnn", "backward_rnn"):
    assert has_bias(nm["encoder"][rnn]["cell"]) == ["in", "ir", "iz"]
    assert has_bias(pa["encoder"][rnn]["cell"]) == ["hn", "in", "ir", "iz"]
  for name in ("W_C_txt", "W_C_im", "L_s", "L_c", "W_im"):
    assert "bias" in nm[name] and "bias" not in pa[name]
  assert "L_y" not in nm and "L_y" in shapes("nmt", "nmtpy") and "L_y" not in shapes("nmt", "paper")
  count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  # g1, g2 and the two encoder GRUs: one candidate bias fewer each; two b_att [A]; b_s, b_c [E];
  # W_im's bias [2H].
  assert count(nm) - count(pa) == -4 * H + 2 * A + 2 * E + 2 * H
  for name, dec in (("mnmt1", "nmtpy"), ("mnmt5", "nmtpy"), ("mnmt2", "paper"), ("mnmt6", "paper")):
    assert "W_C" in shapes(name, dec) and "W_C_im" not in shapes(name, dec)
  for name in ("mnmt2", "mnmt6"):
    tree = shapes(name, "nmtpy")
    assert {"W_C_txt", "W_C_im", "U_A", "W_D_txt", "W_D_im"} <= set(tree) and "W_C" not in tree


def test_direct_construction_rejects_an_unknown_decoder():
  with pytest.raises(ValueError, match=r"model\.decoder: expected one of \('paper', 'nmtpy'\)"):
    batch = _batch()
    _model("mnmt7", "dl4mt").init(jax.random.key(0), batch, shift_right(jnp.asarray(batch["captions"])))


# ----------------------------------------------------------------------------------------------
# Configs.


@pytest.mark.parametrize("variant", sorted(VARIANTS) + ["nmt", "imgtxt"])
def test_config_variants_build(variant):
  from jaxcap.papers.mnmt.configs import mnmt as mnmt_config
  cfg = mnmt_config.get_config(f"synthetic,variant={variant}")
  info = {"vocab_size": 20, "src_vocab_size": 30}
  model = registry.build(cfg.model, info)
  assert isinstance(model, MultimodalNMT)
  if variant in VARIANTS:
    assert (model.fusion, model.encoder_dependent, model.decoder_dependent) == VARIANTS[variant]
    assert model.modalities == "both"
  else:
    assert model.modalities == {"nmt": "text", "imgtxt": "image"}[variant]
  assert cfg.data.task == "translate"


def test_config_decoder_switch():
  from jaxcap.papers.mnmt.configs import mnmt as mnmt_config
  info = {"vocab_size": 20, "src_vocab_size": 30}
  assert registry.build(mnmt_config.get_config("synthetic").model, info).decoder == "paper"
  cfg = mnmt_config.get_config("synthetic,variant=nmt,decoder=nmtpy")
  model = registry.build(cfg.model, info)
  assert (model.decoder, model.modalities) == ("nmtpy", "text")
  with pytest.raises(ValueError, match="config argument decoder"):
    mnmt_config.get_config("synthetic,decoder=dl4mt")


def test_paper_config():
  from jaxcap.papers.mnmt.configs import mnmt as mnmt_config
  cfg = mnmt_config.get_config("multi30k")
  assert (cfg.model.embed_dim, cfg.model.hidden_dim, cfg.batch_size) == (620, 1000, 32)
  assert cfg.decode.beam_size == 12 and cfg.decode.method == "beam"
  assert cfg.l2 == 1e-5 and cfg.best_metric == "Bleu_4" and cfg.early_stopping_patience == 20
  assert mnmt_config.get_config("multi30k,size=cpu").model.hidden_dim < 1000
  assert [n for n in mnmt_config.TABLE2] == ["nmt", "imgtxt"] + [f"mnmt{i}" for i in range(1, 9)]


@pytest.mark.parametrize("field,value", [("variant", "mnmt9"), ("hidden_dim", 0), ("fusion", "max"),
                                         ("modalities", "audio"), ("dropout", 1.0),
                                         ("decoder", "dl4mt")])
def test_bad_config_is_a_one_line_value_error(field, value):
  import ml_collections
  cfg = ml_collections.ConfigDict({"name": "mnmt", field: value})
  with pytest.raises(ValueError, match=f"model.{field}"):
    registry.build(cfg, {"vocab_size": 20, "src_vocab_size": 30})


def test_needs_a_translation_source():
  import ml_collections
  with pytest.raises(ValueError, match="translate"):
    registry.build(ml_collections.ConfigDict({"name": "mnmt", "variant": "nmt"}),
                   {"vocab_size": 20, "src_vocab_size": 0})


# ----------------------------------------------------------------------------------------------
# The pieces of shared files this model needed (L2 on the cost, a capped vocabulary, the
# colour-omitted flag of the synthetic translation data, BLEU-selected checkpoints with early
# stopping, German metrics in the trainer's test).


def test_l2_adds_two_lambda_w_to_the_gradient():
  import ml_collections
  import optax
  from jaxcap import config_common as common
  from jaxcap.training import optim
  cfg = common.base_config("synthetic")
  cfg.schedule, cfg.learning_rate, cfg.grad_clip_value = "constant", 1.0, 0.0
  cfg.adam_eps = 1e-8
  params = {"w": jnp.array([2.0, -1.0])}
  grads = {"w": jnp.zeros(2)}
  for l2, expect in ((0.0, 0.0), (0.5, 1.0)):
    cfg.l2 = l2
    tx, _ = optim.make_optimizer(cfg, 10)
    updates, _ = tx.update(grads, tx.init(params), params)
    # Adam's first step moves by lr * sign(g): zero gradient, or sign(2 * l2 * w).
    np.testing.assert_allclose(updates["w"], -expect * np.sign(params["w"]), atol=1e-6)
  del ml_collections, optax


def test_vocabulary_cap_and_colour_omitted_flag():
  from jaxcap import data as data_lib
  from jaxcap.data.synthetic import COLOURS, DE_COLOUR, SyntheticScenes
  d = data_lib.default_data_config("synthetic_scenes")
  d.task, d.num_train, d.num_val, d.num_test, d.min_word_count = "translate", 60, 5, 5, 1
  d.max_vocab_size = 10
  ds = data_lib.get_dataset(d)
  assert len(ds.vocab) == 14 and ds.src_vocab is not None
  scenes = SyntheticScenes(num_train=60, num_val=5, num_test=5)
  flags = [scenes.source_omits_colour("train", i) for i in range(60)]
  assert 0 < sum(flags) < 60
  # The source names one colour fewer than the German references (which name every colour of
  # the plan they share with the source) exactly when the flag is set.
  stems = tuple(DE_COLOUR.values())
  for i, omitted in enumerate(flags):
    n_src = sum(w in COLOURS for w in scenes.source_en("train", i))
    n_de = sum(w.startswith(stems) for w in scenes.captions_de("train", i)[0])
    assert n_src == n_de - int(omitted), (i, scenes.source_en("train", i), scenes.captions_de("train", i)[0])


@pytest.mark.slow
def test_trains_and_tests_a_translation_run(tmp_path):
  """train_lib end to end on the synthetic translation data: BLEU-selected best checkpoint,
  early stopping (BLEU-4 stays 0 for 2 steps, patience 1), German metrics in the scores."""
  import json
  from jaxcap.papers.mnmt.configs import mnmt as mnmt_config
  from jaxcap.training import train_lib
  cfg = mnmt_config.get_config("synthetic,variant=mnmt7")
  cfg.data.num_train, cfg.data.num_val, cfg.data.num_test = 32, 8, 8
  cfg.model.embed_dim, cfg.model.hidden_dim = 8, 8
  cfg.batch_size, cfg.eval_batch_size, cfg.num_train_steps = 8, 8, 6
  cfg.eval_every_steps = cfg.checkpoint_every_steps = 1
  cfg.early_stopping_patience = 1
  cfg.decode.max_len = 3
  scores = train_lib.train_and_evaluate(cfg, str(tmp_path))
  assert {"sacreBLEU", "CIDEr"} <= set(scores["overall"])
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert max(l["step"] for l in lines) < 6  # stopped early


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_multimodal_variant_runs_on_real_multi30k_text_with_generated_features(shared_data, tmp_path):
  """Multi30k's ResNet features are not available: the first 24 lines of the real En/De text
  of each split with generated [lines, 196, 32] features (the paper's 14 x 14 grid) go through
  the data layer, MNMT7 teacher forcing and greedy decoding."""
  import gzip
  from jaxcap import data as data_lib, decoding
  from jaxcap.data import multi30k, pipeline
  n, rng = 24, np.random.default_rng(0)
  (tmp_path / "raw").mkdir()
  for stem in ("train", "val", "test_2016_flickr"):
    for lang in ("en", "de"):
      lines = multi30k.read_lines(str(shared_data / "multi30k" / "raw" / f"{stem}.{lang}.gz"))[:n]
      with gzip.open(tmp_path / "raw" / f"{stem}.{lang}.gz", "wt", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in lines))
    np.save(tmp_path / f"{stem}.npy", rng.standard_normal((n, 196, 32)).astype(np.float32))
  c = data_lib.default_data_config("multi30k")
  c.root, c.features_npy, c.min_word_count = str(tmp_path), "{split}.npy", 1
  ds = data_lib.get_dataset(c)
  batch = next(pipeline.eval_batches(ds.split("val"), 8, num_threads=0))
  assert batch["feats"].shape == (8, 196, 32) and batch["src"].shape[0] == 8
  model = registry.build(__import__("ml_collections").ConfigDict(
      {"name": "mnmt", "variant": "mnmt7", "embed_dim": 8, "hidden_dim": 8}), ds.info)
  tokens = shift_right(jnp.asarray(batch["captions"]))
  params = _jit(model.init)(jax.random.key(0), batch, tokens)
  logits, aux = _logits(model, params, batch, tokens)
  assert logits.shape[-1] == len(ds.vocab) and bool(jnp.all(jnp.isfinite(logits)))
  assert aux["attention_im"].shape[-1] == 196
  out = decoding.greedy(model, params, batch, max_len=4)
  assert out.tokens.shape == (8, 4)
