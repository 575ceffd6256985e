"""M² against the authors' own code (tests/papers/m2/fixtures/authors.npz, written by
make_fixture.py with aimagelab/meshed-memory-transformer@239100b) and against the paper's
equations in NumPy.

Their weights go through :func:`jaxcap.papers.m2.convert.to_variables` into the jaxcap model
(``pad_mask``, ``mesh_scale``, ``positions`` at their code's readings); then the teacher-forced
log-probabilities, their greedy decoding (``model.test``) and their beam search
(``model.beam_search(visual, 20, eos, 5)``) must come out of jaxcap's model and searches.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import config_files, decoding
from jaxcap.data.vocab import BOS, EOS, PAD
from jaxcap.models import registry
from jaxcap.papers.m2 import convert
from jaxcap.papers.m2 import model as m2
from tests.tiers import one_in_default

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def _fixture():
  with np.load(os.path.join(HERE, "fixtures", "authors.npz")) as f:
    arrays = dict(f)
  with open(os.path.join(HERE, "fixtures", "authors.json")) as f:
    meta = json.load(f)
  return arrays, meta


def _fields(meta, **over):
  return dict(dict(name="m2", dim=meta["d_model"], num_heads=meta["h"], ff_dim=meta["d_ff"],
                   num_layers=meta["n_enc"], num_dec_layers=meta["n_dec"], memory_slots=meta["m"],
                   max_positions=meta["max_len"], dropout=0.0), **over)


def _info(meta):
  return {"vocab_size": meta["vocab"], "max_len": 16, "feature_dim": meta["d_in"],
          "max_regions": meta["regions"]}


@functools.lru_cache(maxsize=None)
def _theirs_in_jaxcap(**over):
  arrays, meta = _fixture()
  model = registry.build(_fields(meta, **over), _info(meta))
  state = {k[len("state/"):]: v for k, v in arrays.items() if k.startswith("state/")}
  variables = jax.tree.map(jnp.asarray, convert.to_variables(state, model))
  return model, variables


def _batch():
  arrays, _ = _fixture()
  return {"feats": jnp.asarray(arrays["feats"]), "feats_mask": jnp.asarray(arrays["feats_mask"])}


def _teacher_forced(model, variables, tokens):
  enc = model.apply(variables, _batch(), method="encode")
  logits, _ = model.apply(variables, enc, jnp.asarray(tokens), method="decode_train")
  return np.asarray(jax.nn.log_softmax(logits))


def test_the_ids_are_jaxcaps():
  _, meta = _fixture()
  assert (meta["pad"], meta["bos"], meta["eos"]) == (PAD, BOS, EOS)


def test_their_variables_fill_exactly_the_models_tree():
  arrays, meta = _fixture()
  model, variables = _theirs_in_jaxcap()
  tokens = jnp.full((2, 1, 5), BOS, jnp.int32)
  batch = {k: v[:2] for k, v in _batch().items()}
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch, tokens)
  assert jax.tree.structure(shapes) == jax.tree.structure(variables)
  for (path, s), v in zip(jax.tree_util.tree_leaves_with_path(shapes), jax.tree.leaves(variables)):
    assert s.shape == v.shape, path
  # Their init_weights overwrote the sinusoid table of the frozen pos_emb (the reason for
  # positions="authors"): what the fixture's model holds is not the sinusoid.
  table = np.asarray(variables["constants"]["positions"])
  assert np.abs(table - arrays["sinusoid"]).max() > 0.1


def test_a_checkpoint_of_another_shape_is_refused():
  arrays, meta = _fixture()
  state = {k[len("state/"):]: v for k, v in arrays.items() if k.startswith("state/")}
  model = registry.build(_fields(meta, max_positions=meta["max_len"] + 1), _info(meta))
  with pytest.raises(ValueError, match="position table"):
    convert.to_variables(state, model)
  state["decoder.extra.weight"] = np.zeros((2, 2))
  with pytest.raises(ValueError, match="does not read"):
    convert.to_variables(state, registry.build(_fields(meta), _info(meta)))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_teacher_forced_logprobs_equal_theirs_at_every_position():
  arrays, _ = _fixture()
  model, variables = _theirs_in_jaxcap()
  ours = _teacher_forced(model, variables, arrays["tf_tokens"])
  theirs = arrays["tf_logprobs"]
  assert ours.shape == theirs.shape
  assert np.abs(ours - theirs).max() < 1e-5, np.abs(ours - theirs).max()


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_authors_pad_mask_attends_padded_regions_and_input_does_not():
  arrays, _ = _fixture()
  model, variables = _theirs_in_jaxcap()
  enc = model.apply(variables, _batch(), method="encode")
  assert np.asarray(enc["mask"]).all()  # sum(LN(relu(fc(0)))) != 0: nothing masked
  masked, _ = _theirs_in_jaxcap(pad_mask="input")
  enc_in = masked.apply(variables, _batch(), method="encode")
  np.testing.assert_array_equal(np.asarray(enc_in["mask"]), arrays["feats_mask"])
  a = _teacher_forced(model, variables, arrays["tf_tokens"])
  b = _teacher_forced(masked, variables, arrays["tf_tokens"])
  padded = ~arrays["feats_mask"].all(1)
  assert np.abs(a[padded] - b[padded]).max() > 1e-3  # the switch changes the padded images
  np.testing.assert_allclose(a[~padded], b[~padded], atol=1e-6)  # and nothing else


def _stepped(model, variables, tokens_BxT):
  batch = _batch()

  @jax.jit
  def run(variables):
    enc = model.apply(variables, batch, method="encode")
    cache = model.apply(variables, enc, tokens_BxT.shape[1], method="init_cache")

    def body(cache, xs):
      tok_B, t = xs
      logits, cache, _ = model.apply(variables, enc, cache, tok_B, t, method="decode_step")
      return cache, logits

    _, logits_TxBxV = jax.lax.scan(body, cache, (jnp.asarray(tokens_BxT).T,
                                                 jnp.arange(tokens_BxT.shape[1], dtype=jnp.int32)))
    return jax.nn.log_softmax(jnp.moveaxis(logits_TxBxV, 0, 1))

  return np.asarray(run(variables))


# Fresh parameters take pad_mask="input": at initialisation (LayerNorm scale 1, bias 0) the
# sum of every normalised region is 0 up to rounding, so the authors' mask of a fresh model
# masks regions by rounding chance (and differs between jitted and eager runs).
# The authors' reading in the quick loop, the others in the slow step (tests/tiers.py).
@pytest.mark.parametrize("over", one_in_default([
    {}, {"meshed": "last", "positions": "sinusoid", "pad_mask": "input"},
    {"memory_slots": 0, "pad_mask": "input", "mesh_scale": "paper"}]),
                         ids=["authors", "last", "no_memory"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_incremental_decoding_equals_teacher_forcing(over):
  """PAD inputs included (the fixture's sequences end with PAD): their keys are masked from
  later steps and their outputs zeroed, in the cache as in teacher forcing."""
  arrays, meta = _fixture()
  if over.get("memory_slots") == 0 or over.get("meshed") == "last":
    model = registry.build(_fields(meta, **over), _info(meta))
    variables = model.init(jax.random.key(1), _batch(), jnp.full((4, 1, 3), BOS, jnp.int32))
  else:
    model, variables = _theirs_in_jaxcap(**over)
  tokens = arrays["tf_tokens"]
  np.testing.assert_allclose(_stepped(model, variables, tokens),
                             _teacher_forced(model, variables, tokens), atol=2e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_greedy_tokens_equal_theirs():
  """Their ``model.test`` feeds the argmax back for 20 steps and keeps going after EOS;
  jaxcap stops at EOS (PAD after it): equal up to and including the first EOS."""
  arrays, meta = _fixture()
  model, variables = _theirs_in_jaxcap()
  out = decoding.greedy(model, variables, _batch(), max_len=meta["steps"])
  ours, theirs = np.asarray(out.tokens), arrays["greedy_tokens"]
  for b in range(len(theirs)):
    ends = np.nonzero(theirs[b] == EOS)[0]
    n = ends[0] + 1 if len(ends) else meta["steps"]
    np.testing.assert_array_equal(ours[b, :n], theirs[b, :n])
    assert (ours[b, n:] == PAD).all()


def _m2_beam_search(model, variables, batch, beam_size, max_len):
  """Their BeamSearch.iter's rule over jaxcap's decode_step, in NumPy on the host: K places;
  every step the K best of (each alive place x every word, score = its log-probability sum)
  and (each finished place, its fixed score) are kept, so a finished caption holds its place
  until K better ones push it out; the best place at the end is the result. Ties: stable."""
  enc = model.apply(variables, batch, method="encode")
  b = enc["mask"].shape[0]
  step = jax.jit(lambda enc, cache, tok, t: model.apply(variables, enc, cache, tok, t,
                                                        method="decode_step")[:2])
  enc = jax.tree.map(lambda x: jnp.repeat(x, beam_size, 0), enc)
  cache = model.apply(variables, enc, max_len, method="init_cache")
  score = np.zeros((b, beam_size))
  score[:, 1:] = -np.inf  # one place at t = 0 (their cur_beam_size = 1)
  done = np.zeros((b, beam_size), bool)
  seqs = np.zeros((b, beam_size, 0), np.int64)
  last = np.full((b * beam_size,), BOS, np.int32)
  for t in range(max_len):
    logits, cache = step(enc, cache, jnp.asarray(last), jnp.int32(t))
    lp = np.asarray(jax.nn.log_softmax(logits), np.float64).reshape(b, beam_size, -1)
    v = lp.shape[-1]
    cand = score[..., None] + lp
    # A finished place proposes itself once (word PAD, their word 0), unchanged.
    cand = np.where(done[..., None], -np.inf, cand)
    cand[..., PAD] = np.where(done, score, cand[..., PAD])
    order = np.argsort(-cand.reshape(b, -1), axis=1, kind="stable")[:, :beam_size]
    parent, word = order // v, order % v
    score = np.take_along_axis(cand.reshape(b, -1), order, 1)
    done = np.take_along_axis(done, parent, 1) | (word == EOS)
    seqs = np.concatenate([np.take_along_axis(seqs, parent[..., None], 1), word[..., None]], -1)
    rows = (np.arange(b)[:, None] * beam_size + parent).reshape(-1)
    cache = jax.tree.map(lambda x: x[rows], cache)
    last = word.reshape(-1).astype(np.int32)
  best = np.argsort(-score, axis=1, kind="stable")[:, 0]
  return seqs[np.arange(b), best]


@pytest.mark.slow
def test_their_beam_search_rule_over_our_model_gives_their_tokens():
  arrays, meta = _fixture()
  model, variables = _theirs_in_jaxcap()
  ours = _m2_beam_search(model, variables, _batch(), meta["beam"], meta["steps"])
  np.testing.assert_array_equal(ours, arrays["beam_tokens"])


def _beam(beam_mode):
  _, meta = _fixture()
  model, variables = _theirs_in_jaxcap()
  return decoding.beam_search(model, variables, _batch(), beam_size=meta["beam"],
                              max_len=meta["steps"], beam_mode=beam_mode)


@pytest.mark.slow
def test_jaxcap_in_slots_beam_search_gives_their_tokens_and_logprobs():
  """``beam_mode="in_slots"`` (their BeamSearch's rule inside jaxcap's jitted search) returns
  their best beam: its tokens (PAD, their word 0, after EOS: image 2 ends at its third word)
  and its per-word log-probabilities (0 after EOS)."""
  arrays, _ = _fixture()
  out = _beam("in_slots")
  np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), arrays["beam_tokens"])
  np.testing.assert_allclose(np.asarray(out.token_logprobs[:, 0]), arrays["beam_logprobs"],
                             atol=1e-5)
  assert (arrays["beam_tokens"] == EOS).any()  # the finished-beam bookkeeping is exercised


@pytest.mark.slow
def test_jaxcap_live_beam_search_differs_only_by_finding_more_probable_captions():
  """``live`` keeps K live beams whatever ends: where its best caption is not theirs, it is a
  more probable one (image 1: EOS at the first step, which their search drops)."""
  arrays, _ = _fixture()
  model, variables = _theirs_in_jaxcap()
  out = _beam("live")
  ours, theirs = np.asarray(out.tokens[:, 0]), arrays["beam_tokens"]
  fed = np.concatenate([np.full((len(theirs), 1), BOS), theirs[:, :-1]], 1)
  lp = np.take_along_axis(_teacher_forced(model, variables, fed), theirs[..., None], 2)[..., 0]
  live = np.cumsum(np.concatenate([np.zeros((len(theirs), 1), bool), theirs[:, :-1] == EOS], 1), 1) == 0
  theirs_logp = (lp * live).sum(1)
  differ = (ours != theirs).any(1)
  assert differ.any()
  assert (np.asarray(out.logprobs[:, 0])[differ] > theirs_logp[differ] + 1e-3).all()
  np.testing.assert_allclose(np.asarray(out.logprobs[:, 0])[~differ], theirs_logp[~differ], atol=1e-4)


def _np_layer_norm(x, p, eps=1e-5):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def test_memory_augmented_encoder_layer_equals_the_papers_equations():
  """Eqs. 2-4 in float64 NumPy, one head at a time, on the first encoder layer with their
  weights: M_mem(X) = Attention(W_q X, K, V), K = [W_k X; sqrt(d_k) M_k], V = [W_v X; sqrt(m) M_v]
  (the code's scaling of the slots), Z = LN(X + M_mem(X)), X' = LN(Z + FFN(Z))."""
  arrays, meta = _fixture()
  model, variables = _theirs_in_jaxcap()
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), variables["params"])
  x0 = np.maximum(arrays["feats"] @ p["feat_proj"]["kernel"] + p["feat_proj"]["bias"], 0)
  x0 = _np_layer_norm(x0, p["feat_norm"])
  a = p["enc_layers_0"]["self_attn"]["attn"]
  h, m = meta["h"], meta["m"]
  dk = meta["d_model"] // h
  outs = []
  for b in range(len(x0)):
    heads = []
    for i in range(h):
      q = x0[b] @ a["query"]["kernel"][:, i] + a["query"]["bias"][i]
      k = x0[b] @ a["key"]["kernel"][:, i] + a["key"]["bias"][i]
      v = x0[b] @ a["value"]["kernel"][:, i] + a["value"]["bias"][i]
      mk = np.sqrt(dk) * a["memory_k"][:, i * dk:(i + 1) * dk]
      mv = np.sqrt(m) * a["memory_v"][:, i * dk:(i + 1) * dk]
      s = q @ np.concatenate([k, mk]).T / np.sqrt(dk)
      w = np.exp(s - s.max(-1, keepdims=True))
      heads.append((w / w.sum(-1, keepdims=True)) @ np.concatenate([v, mv]))
    att = np.einsum("nhd,hdo->no", np.stack(heads, 1), a["out"]["kernel"]) + a["out"]["bias"]
    z = _np_layer_norm(x0[b] + att, p["enc_layers_0"]["self_attn"]["norm"])
    f = p["enc_layers_0"]["ffn"]
    hid = np.maximum(z @ f["fc1"]["kernel"] + f["fc1"]["bias"], 0)
    outs.append(_np_layer_norm(z + hid @ f["fc2"]["kernel"] + f["fc2"]["bias"], f["norm"]))
  layer = m2.EncoderLayer(meta["h"], meta["d_model"], meta["d_ff"], 0.0, meta["m"], "authors")
  ours = layer.apply({"params": variables["params"]["enc_layers_0"]},
                     jnp.asarray(x0, jnp.float32), jnp.ones(x0.shape[:2], bool))
  np.testing.assert_allclose(np.asarray(ours), np.stack(outs), atol=2e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_sinusoid_positions_equal_their_table():
  arrays, meta = _fixture()
  model = registry.build(_fields(meta, positions="sinusoid"), _info(meta))
  variables = jax.jit(model.init)(jax.random.key(0), _batch(), jnp.full((4, 1, 3), BOS, jnp.int32))
  n = meta["max_len"]
  tokens = jnp.asarray(np.r_[[BOS], np.full(n - 1, 4), [PAD]][None], jnp.int32)
  emb = np.asarray(model.apply(variables, tokens, 0, n + 1, method="_embed"))[0]
  words = np.asarray(variables["params"]["embed"]["embedding"])[np.asarray(tokens[0])]
  np.testing.assert_allclose(emb[:n] - words[:n], arrays["sinusoid"][1:n + 1], atol=2e-6)
  np.testing.assert_allclose(emb[n] - words[n], 0.0)  # PAD: their zero row 0


@pytest.mark.parametrize("memory_init", m2.MEMORY_INITS)
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_memory_initialisers(memory_init):
  """``paper``: normal(0, 1/d_k) keys, normal(0, 1/m) values; ``authors``: torch's
  xavier_uniform_ of a [1, m, D] tensor, bound sqrt(6 / ((m + 1) D))."""
  m, d, h = 40, 128, 4
  model = registry.build(dict(name="m2", dim=d, num_heads=h, ff_dim=16, num_layers=1,
                              num_dec_layers=1, memory_slots=m, memory_init=memory_init),
                         {"vocab_size": 8, "max_len": 4, "feature_dim": 4, "max_regions": 2})
  batch = {"feats": jnp.ones((1, 2, 4)), "feats_mask": jnp.ones((1, 2), bool)}
  # Jitted: one compiled program instead of the whole model's init run op by op (~10 s).
  params = jax.jit(model.init)(jax.random.key(0), batch, jnp.full((1, 1, 3), BOS, jnp.int32))["params"]
  a = params["enc_layers_0"]["self_attn"]["attn"]
  mk, mv = np.asarray(a["memory_k"]), np.asarray(a["memory_v"])
  if memory_init == "paper":
    np.testing.assert_allclose([mk.mean(), mk.std()], [0, 1 / (d // h)], atol=0.05 / (d // h))
    np.testing.assert_allclose([mv.mean(), mv.std()], [0, 1 / m], atol=0.05 / m)
  else:
    bound = np.sqrt(6 / ((m + 1) * d))
    for x in (mk, mv):
      assert np.abs(x).max() <= bound and np.abs(x).max() > 0.99 * bound
      np.testing.assert_allclose(x.std(), bound / np.sqrt(3), rtol=0.05)


def test_authors_positions_refuse_sequences_past_their_table():
  arrays, meta = _fixture()
  model, variables = _theirs_in_jaxcap()
  enc = model.apply(variables, _batch(), method="encode")
  tokens = jnp.full((4, meta["max_len"] + 1), 5, jnp.int32)
  with pytest.raises(ValueError, match="max_positions"):
    model.apply(variables, enc, tokens, method="decode_train")


def _without_memory(variables):
  """Their variables less every memory slot and the encoder's key biases (a model without
  memory has neither: the softmax cancels a key bias)."""
  enc = {}
  for name, layer in variables["params"].items():
    if name.startswith("enc_layers_"):
      attn = dict(layer["self_attn"]["attn"])
      attn.pop("memory_k"), attn.pop("memory_v")
      attn["key"] = {"kernel": attn["key"]["kernel"]}
      layer = dict(layer, self_attn=dict(layer["self_attn"], attn=attn))
    enc[name] = layer
  return dict(variables, params=enc)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_mask_memory_is_the_model_without_memory():
  """The ablation masks the slots: the same as the encoder built without them (the key bias,
  which only the memory logits feel, dropped with them), at every position."""
  arrays, meta = _fixture()
  model, variables = _theirs_in_jaxcap(mask_memory=True)
  masked = _teacher_forced(model, variables, arrays["tf_tokens"])
  bare = registry.build(_fields(meta, memory_slots=0), _info(meta))
  want = _teacher_forced(bare, _without_memory(variables), arrays["tf_tokens"])
  # Float32 rounding only (the key bias cancels in exact arithmetic): 1.3e-5 measured, on
  # log-probabilities of magnitude ~5; the memory itself moves them by more than 1e-3.
  assert np.abs(masked - want).max() < 5e-5
  full, _ = _theirs_in_jaxcap()
  assert np.abs(_teacher_forced(full, variables, arrays["tf_tokens"]) - want).max() > 1e-3


@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_only_layer_is_every_other_gate_closed(k):
  """The ablation keeps encoder layer k's term of the meshed sum: the full model whose other
  gates are closed (bias -1e4: sigmoid 0) decodes the same log-probabilities."""
  arrays, meta = _fixture()
  model, variables = _theirs_in_jaxcap(only_layer=k)
  ablated = _teacher_forced(model, variables, arrays["tf_tokens"])
  full, _ = _theirs_in_jaxcap()
  params = dict(variables["params"])
  for name in [n for n in params if n.startswith("dec_layers_")]:
    layer = dict(params[name])
    for i in range(meta["n_enc"]):
      if i != k:
        layer[f"gate_{i}"] = {"kernel": jnp.zeros_like(layer[f"gate_{i}"]["kernel"]),
                              "bias": jnp.full_like(layer[f"gate_{i}"]["bias"], -1e4)}
    params[name] = layer
  closed = _teacher_forced(full, dict(variables, params=params), arrays["tf_tokens"])
  assert np.abs(ablated - closed).max() < 1e-5
  assert np.abs(ablated - _teacher_forced(full, variables, arrays["tf_tokens"])).max() > 1e-3


def test_ablation_fields_are_checked():
  from jaxcap.models import fields as fields_lib  # pylint: disable=import-outside-toplevel
  cls = registry.get("m2")
  for over, needle in ((dict(mask_memory=True, memory_slots=0), "model.mask_memory"),
                       (dict(only_layer=3), "model.only_layer"),
                       (dict(only_layer=0, meshed="last"), "model.only_layer"),
                       (dict(only_layer=-2), "model.only_layer")):
    with pytest.raises(ValueError, match=needle):
      fields_lib.validate(cls, dict(num_layers=3, **over))


def test_config_check_refuses_lengths_past_the_table():
  """The frozen table bounds teacher forcing (data.max_len + 1) and decoding (decode.max_len):
  said by the config check, before a run compiles or writes anything; the sinusoid has no bound."""
  from jaxcap.training import validation  # pylint: disable=import-outside-toplevel
  c = config_files.load("m2.py:synthetic,tiny")
  c.model.max_positions = 10
  c.data.max_len, c.decode.max_len = 9, 10
  validation.check_config(c)
  c.decode.max_len = 11
  with pytest.raises(ValueError, match=r"^config field decode.max_len: .* 10 positions; expected at most 10, got 11$"):
    validation.check_config(c)
  c.decode.max_len, c.data.max_len = 10, 10
  with pytest.raises(ValueError, match=r"^config field data.max_len: .*expected at most 9 \(\+ 1 for the BOS input\), got 10$"):
    validation.check_config(c)
  c.model.positions = "sinusoid"
  validation.check_config(c)


def test_config_and_tiny_sizes():
  c = config_files.load("m2.py:coco")
  assert (c.model.dim, c.model.num_layers, c.model.num_dec_layers, c.model.memory_slots,
          c.decode.method, c.decode.beam_size, c.decode.beam_mode) == (
              512, 3, 3, 40, "beam", 5, "in_slots")
  t = config_files.load("m2.py:synthetic,tiny").model
  assert (t.dim, t.ff_dim, t.num_layers, t.num_dec_layers, t.memory_slots) == (32, 64, 2, 1, 4)
  assert config_files.load("m2.py:synthetic,meshed=last,memory_slots=0").model.memory_slots == 0
  with pytest.raises(ValueError, match="meshed"):
    config_files.load("m2.py:synthetic,meshed=first")
