"""CLIP-S as a self-critical reward, computed inside the jitted SCST step (Cho et al., NAACL
2022; j-min/CLIP-Caption-Reward: reward = ``clip_weight * (CLIP-S(sample) - CLIP-S(baseline))``,
their ``clipscore_reward_weight`` 2.0, CLIP-S = 2.5 max(cos, 0) with the prompt "A photo depicts").

Dimension legend: N captions, T caption words, V the run's vocabulary, K the most CLIP tokens
one word takes, C = 77 CLIP tokens, I training images, E CLIP's embedding width.

- Words to CLIP tokens without leaving the device: CLIP's tokenizer never joins pieces across a
  space, so ``clip.tokenize(prompt + " " + " ".join(words))`` is ``[sot] + ids(prompt) +
  ids(word_1) + ... + [eot]``. A table built once on the host gives each vocabulary id its
  CLIP ids (``[V, K]``, ``ids(vocab.itos[v])``; 0 ids for PAD and BOS, which ``Vocab.decode``
  skips; ``<unk>`` as the string ``Vocab.decode`` writes) and :func:`clip_tokens` scatters them
  after the prompt, words after the first EOS dropped, cut at 77 with ``eot`` last
  (``truncate=True``), exactly the ids the host gets from ``Vocab.decode`` + ``tokenize``.
- The training images' embeddings are computed once (:func:`image_embeddings`, cached in the
  run's cache folder by weights hash and file list) and indexed by ``image_index`` in the step.
- The text tower runs in the step on the N sampled and B baseline captions.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, NamedTuple

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap.clip import model as model_lib
from jaxcap.clip import score as score_lib
from jaxcap.clip import tokenizer as tokenizer_lib
from jaxcap.errors import BadInput


class ClipReward(NamedTuple):
  """The reward's arrays (a pytree, an argument of the jitted step)."""
  variables: Any          # the CLIP's variables (the text tower is used)
  word_ids_VxK: jax.Array  # int32 CLIP ids of each vocabulary id, 0-padded
  word_len_V: jax.Array    # int32 how many of them
  prompt_P: jax.Array      # int32 CLIP ids of the prompt
  images_IxE: jax.Array    # float32 unit-length embeddings of the training images
  grammar: Any = None      # {"w1_DxP", "w2_Px2"}: the grammar head (load_grammar_head), or None


GRAMMAR_TENSORS = ("grammar_score_head.0.weight", "grammar_score_head.2.weight")


def load_grammar_head(path: str, text_width: int) -> dict:
  """CLIP-Caption-Reward's grammar head (``nn.Sequential(Linear(Dt, P, bias=False), ReLU,
  Linear(P, 2, bias=False))`` named ``grammar_score_head``) from a ``.pth`` / ``.ckpt`` (a
  ``state_dict``, or a dict holding one under ``state_dict``) or a ``.safetensors``: the two
  tensors whose names end in ``grammar_score_head.0.weight`` / ``.2.weight`` (any prefix)."""
  from jaxcap.importers import torch_files
  expected = "a file holding grammar_score_head.0.weight [P, Dt] and grammar_score_head.2.weight [2, P]"
  if path.endswith(".safetensors"):
    from jaxcap.features import weights as fw
    try:
      state = fw.read_safetensors(path)
    except (BadInput, FileNotFoundError) as e:
      raise BadInput(f"{e}; expected {expected}") from None
  else:
    raw = torch_files.read(path, expected)
    state = raw.get("state_dict", raw) if isinstance(raw, dict) else {}
  found = []
  for suffix in GRAMMAR_TENSORS:
    names = [k for k in state if k == suffix or k.endswith("." + suffix)]
    if len(names) != 1:
      raise BadInput(f"{path}: {len(names)} tensors named *{suffix}; expected {expected}")
    found.append(np.asarray(state[names[0]], np.float32))
  w1, w2 = found
  if w1.ndim != 2 or w1.shape[1] != text_width or w2.shape != (2, w1.shape[0]):
    raise BadInput(f"{path}: grammar head shapes {list(w1.shape)}, {list(w2.shape)}; expected "
                     f"[P, {text_width}] and [2, P] for this CLIP's text width {text_width}")
  return {"w1_DxP": jnp.asarray(w1.T), "w2_Px2": jnp.asarray(w2.T)}


def grammar_prob(pooled_NxD, head: dict):
  """P(grammatical) = softmax(relu(x W1) W2)[:, 1] (their ``torch.softmax(logit, -1)[:, 1]``)."""
  logits_Nx2 = jax.nn.relu(pooled_NxD.astype(jnp.float32) @ head["w1_DxP"]) @ head["w2_Px2"]
  return jax.nn.softmax(logits_Nx2, axis=-1)[:, 1]


def word_table(vocab, tok: tokenizer_lib.Tokenizer | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``(ids [V, K], lengths [V])``: each vocabulary id's CLIP ids as ``Vocab.decode`` writes it."""
  from jaxcap.data import vocab as vocab_lib
  tok = tok or tokenizer_lib.default()
  rows = []
  for i, word in enumerate(vocab.itos):
    rows.append([] if i in (vocab_lib.PAD, vocab_lib.BOS, vocab_lib.EOS) else tok.encode(word))
  k = max(1, max(len(r) for r in rows))
  ids = np.zeros((len(rows), k), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  return ids, np.array([len(r) for r in rows], np.int32)


def clip_tokens(words_NxT, word_ids_VxK, word_len_V, prompt_P, context_length: int = 77):
  """int32 ``[N, C]``: ``clip.tokenize(prompt + " " + decoded caption, truncate=True)`` on device."""
  from jaxcap.data import vocab as vocab_lib
  n, _ = words_NxT.shape
  k = word_ids_VxK.shape[1]
  words_NxT = words_NxT.astype(jnp.int32)
  before_eos_NxT = jnp.cumsum(words_NxT == vocab_lib.EOS, axis=1) == 0
  len_NxT = jnp.where(before_eos_NxT, word_len_V[words_NxT], 0)
  start = 1 + prompt_P.shape[0]
  off_NxT = start + jnp.cumsum(len_NxT, axis=1) - len_NxT
  pos_NxTxK = off_NxT[..., None] + jnp.arange(k)
  ok_NxTxK = (jnp.arange(k) < len_NxT[..., None]) & (pos_NxTxK < context_length - 1)
  tokens_NxC = jnp.zeros((n, context_length), jnp.int32)
  tokens_NxC = tokens_NxC.at[:, 0].set(tokenizer_lib.VOCAB_SIZE - 2)  # <|startoftext|>
  tokens_NxC = tokens_NxC.at[:, 1:start].set(prompt_P[None, :])
  rows = jnp.broadcast_to(jnp.arange(n)[:, None, None], pos_NxTxK.shape)
  cols = jnp.where(ok_NxTxK, pos_NxTxK, context_length)  # out of range: dropped
  tokens_NxC = tokens_NxC.at[rows, cols].set(word_ids_VxK[words_NxT], mode="drop")
  end_N = jnp.minimum(start + len_NxT.sum(axis=1), context_length - 1)
  return tokens_NxC.at[jnp.arange(n), end_N].set(tokenizer_lib.VOCAB_SIZE - 1)  # <|endoftext|>


def device_scores(reward: ClipReward, sizes: model_lib.ClipSizes, words_NxT, image_index_N,
                  w: float = score_lib.WEIGHT["clip"]):
  """``(CLIP-S [N], P(grammatical) [N] or None)`` of the captions (word ids), on device: one
  pass of the text tower serves both."""
  model = model_lib.CLIP(sizes)
  tokens = clip_tokens(words_NxT, reward.word_ids_VxK, reward.word_len_V, reward.prompt_P,
                       sizes.context_length)
  pooled_NxD = model.apply(reward.variables, tokens, method=model.encode_text_pooled)
  text_NxE = model_lib.normalized(pooled_NxD @ reward.variables["params"]["text"]["text_projection"])
  cos_N = jnp.sum(text_NxE * reward.images_IxE[image_index_N], axis=-1)
  grammar_N = grammar_prob(pooled_NxD, reward.grammar) if reward.grammar is not None else None
  return w * jnp.maximum(cos_N, 0.0), grammar_N


def host_clip_s(scorer: score_lib.Scorer, vocab, words_NxT, images_NxE,
                w: float = score_lib.WEIGHT["clip"]) -> np.ndarray:
  """The same on the host from strings (``Vocab.decode`` + the Scorer's tokenizer): the check."""
  captions = [vocab.decode(row) for row in np.asarray(words_NxT)]
  return score_lib.image_text(images_NxE, scorer.text_embeddings(captions), w)


def host_grammar(scorer: score_lib.Scorer, vocab, words_NxT, head: dict) -> np.ndarray:
  """P(grammatical) on the host from strings: the check of :func:`device_scores`'s."""
  captions = [vocab.decode(row) for row in np.asarray(words_NxT)]
  pooled = scorer.text_embeddings(captions, pooled=True)
  return np.asarray(grammar_prob(jnp.asarray(pooled), head))


def image_embeddings(scorer: score_lib.Scorer, keys: list, files: dict, cache_dir: str | None,
                     log=print) -> np.ndarray:
  """float32 unit-length ``[I, E]`` of ``files[key]`` for ``keys`` in order, computed once and
  cached in ``cache_dir`` (by the weights file's and the file list's hashes)."""
  digest = hashlib.sha256("\n".join(f"{k}\t{files[k]}" for k in keys).encode()).hexdigest()[:12]
  path = os.path.join(cache_dir, f"clip_images_{scorer.weights_sha256[:8]}_{digest}.npy") if cache_dir else None
  if path and os.path.exists(path):
    out = np.load(path)
    if out.shape == (len(keys), scorer.sizes.embed_dim):
      return out
  log(f"CLIP reward: embedding {len(keys)} training images once ({scorer.weights_file})")
  out = score_lib.normalize(scorer.image_embeddings(keys, files))
  if path:
    from jaxcap import atomic
    os.makedirs(cache_dir, exist_ok=True)
    atomic.write_with(path, lambda f: np.save(f, out))
  return out


def build(scorer: score_lib.Scorer, vocab, images_IxE: np.ndarray, grammar: dict | None = None) -> ClipReward:
  ids, lens = word_table(vocab)
  prompt = np.array(tokenizer_lib.default().encode(score_lib.PREFIX), np.int32)
  return ClipReward(scorer.variables, jnp.asarray(ids), jnp.asarray(lens), jnp.asarray(prompt),
                    jnp.asarray(images_IxE, jnp.float32), grammar)
