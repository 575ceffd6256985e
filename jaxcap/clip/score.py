"""CLIP-S, RefCLIP-S, PAC-S and RefPAC-S, as their reference code computes them.

Dimension legend: N captions (one per image), E embedding width, R references (all images').

- **CLIP-S** (Hessel et al., EMNLP 2021; jmhessel/clipscore ``get_clip_score``):
  ``w * max(cos(image, caption), 0)`` with ``w = 2.5``, the caption prefixed with
  ``"A photo depicts "`` and tokenised with ``truncate=True``, OpenAI's ViT-B/32.
- **RefCLIP-S** (clipscore.py's ``main``): the harmonic mean ``2 a b / (a + b)`` of CLIP-S ``a``
  and ``b`` = the largest cosine between the caption and the image's references (prefixed the
  same way). Two readings of ``b``, named by ``refclip_variant``:
  ``"clipscore"`` (default): the raw cosine, as clipscore.py (no ``w``, no clip at 0);
  ``"clip_caption_reward"``: ``w * max(cosine, 0)``, as j-min/CLIP-Caption-Reward scores it.
  Where ``a + b = 0`` theirs divides 0 by 0 (NaN); here the score is 0 (our choice, said here).
- **PAC-S / RefPAC-S** (Sarto et al., CVPR 2023; aimagelab/pacscore ``PACScore`` /
  ``RefPACScore`` and compute_metrics.py): the same with ``w = 2.0`` and PAC-S's fine-tuned
  ViT-B/32 weights (their RefPAC-S's ``b`` is the raw cosine, as clipscore's).

Embeddings are normalised as theirs (``x / sqrt(sum(x ** 2))``, float32); the formulas run in
NumPy on the host (they are cheap; the towers run jitted on the device in fixed-size batches, so
one program serves every image batch, and each image's embedding is computed once per scorer and
kept; the captions go shortest first, each batch cut to its longest caption rounded up to 8
tokens: one program per such length, the same embeddings as at 77 under the causal mask).
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap.clip import model as model_lib
from jaxcap.clip import preprocess as preprocess_lib
from jaxcap.clip import tokenizer as tokenizer_lib
from jaxcap.clip import weights as weights_lib
from jaxcap.errors import BadInput

PREFIX = "A photo depicts "
WEIGHT = {"clip": 2.5, "pac": 2.0}
REFCLIP_VARIANTS = ("clipscore", "clip_caption_reward")


def normalize(x_NxE) -> np.ndarray:
  x_NxE = np.asarray(x_NxE, np.float32)
  return x_NxE / np.sqrt(np.sum(x_NxE ** 2, axis=1, keepdims=True))


def cosines(images_NxE, captions_NxE) -> np.ndarray:
  """Per caption the raw cosine to its image (before CLIP-S's ``max(cos, 0)``)."""
  return np.sum(normalize(images_NxE) * normalize(captions_NxE), axis=1)


def from_cosines(cos_N, w: float) -> np.ndarray:
  """``w * max(cos, 0)`` of given cosines (the one place CLIP-S / PAC-S clip)."""
  return w * np.clip(cos_N, 0, None)


def image_text(images_NxE, captions_NxE, w: float) -> np.ndarray:
  """Per caption ``w * max(cos, 0)`` (CLIP-S with ``w = 2.5``, PAC-S with ``w = 2.0``)."""
  return from_cosines(cosines(images_NxE, captions_NxE), w)


def clipped(cos_N, w: float) -> dict:
  """How many of the cosines ``w * max(cos, 0)`` clipped to 0 (a cosine <= 0), of how many, and
  their mean before clipping: a CLIP-S of 0.00 with random weights reads as broken without it."""
  cos_N = np.asarray(cos_N, np.float32)
  return {"pairs": int(len(cos_N)), "clipped": int(np.sum(cos_N <= 0)),
          "mean_cosine": float(np.mean(cos_N)) if len(cos_N) else None, "w": w}


def best_reference(captions_NxE, refs_RxE, ref_owner_R: Sequence[int]) -> np.ndarray:
  """Per caption the largest cosine to its own image's references (``ref_owner_R[r]``: the
  caption index reference ``r`` belongs to; every caption needs one)."""
  c, r = normalize(captions_NxE), normalize(np.reshape(refs_RxE, (-1, np.shape(captions_NxE)[1])))
  owner = np.asarray(ref_owner_R, np.int64)
  out = np.full(len(c), -np.inf, np.float32)
  sims = np.sum(c[owner] * r, axis=1)
  np.maximum.at(out, owner, sims)
  if np.isinf(out).any():
    raise BadInput(f"caption {int(np.argmax(np.isinf(out)))}: no reference; expected at least one per image")
  return out


def harmonic(a_N, b_N) -> np.ndarray:
  """``2 a b / (a + b)``, 0 where ``a + b = 0`` (theirs: NaN)."""
  a, b = np.asarray(a_N, np.float32), np.asarray(b_N, np.float32)
  total = a + b
  return np.where(total == 0, 0.0, 2 * a * b / np.where(total == 0, 1.0, total)).astype(np.float32)


def with_references(image_text_N, captions_NxE, refs_RxE, ref_owner_R, w: float,
                    variant: str = "clipscore") -> np.ndarray:
  """RefCLIP-S / RefPAC-S per caption (module docstring)."""
  if variant not in REFCLIP_VARIANTS:
    raise BadInput(f"refclip variant {variant!r}: expected one of {', '.join(REFCLIP_VARIANTS)}")
  b = best_reference(captions_NxE, refs_RxE, ref_owner_R)
  if variant == "clip_caption_reward":
    b = w * np.clip(b, 0, None)
  return harmonic(image_text_N, b)


# The text tower's length step: batches are cut to a multiple of it (at most 10 programs for
# CLIP's 77 tokens; padding under 8 positions per caption).
TOKEN_STEP = 8


class Scorer:
  """A CLIP from a weights file, its towers jitted at ``batch_size``; ``image_embeddings`` keeps
  each image's embedding by key, so a scorer reused over runs computes each image once."""

  def __init__(self, weights_file: str, batch_size: int = 64, progress: Callable | None = None,
               **overrides):
    self.weights_file = weights_file  # overrides: ClipSizes fields a file does not hold
    self.sizes, variables, self.format = weights_lib.load(weights_file, **overrides)
    if self.sizes.vocab_size != tokenizer_lib.VOCAB_SIZE:
      raise BadInput(f"{weights_file}: a vocabulary of {self.sizes.vocab_size} tokens; expected "
                       f"CLIP's {tokenizer_lib.VOCAB_SIZE} (its BPE tokenizer)")
    self.batch_size = batch_size
    self.progress = progress
    model = model_lib.CLIP(self.sizes)
    self._image = jax.jit(lambda v, x: model.apply(v, x, method=model.encode_image))
    self._text = jax.jit(lambda v, t: model.apply(v, t, method=model.encode_text))
    self._pooled = jax.jit(lambda v, t: model.apply(v, t, method=model.encode_text_pooled))
    self.variables = variables
    self._images: dict = {}

  @functools.cached_property
  def weights_sha256(self) -> str:
    """The weights file's sha256 (read once per scorer: ViT-B-32.pt is 350 MB)."""
    from jaxcap.features import extract
    return extract.sha256(self.weights_file)

  def signature(self, kind: str = "clip", refclip_variant: str = "clipscore") -> dict:
    """How the scores were made: the tower (read off the weights), the weights file's sha256
    (first 8 hex digits), the prompt, ``w`` and the RefCLIP-S reading."""
    s = self.sizes
    return {"model": f"ViT-{s.vision_width}/{s.vision_patch_size}@{s.image_resolution},{s.activation}",
            "format": self.format, "sha256": self.weights_sha256[:8], "prompt": PREFIX,
            "w": WEIGHT[kind], "ref": refclip_variant}

  def _batched(self, fn, x: np.ndarray, width: int | None = None) -> np.ndarray:
    n, out = len(x), []
    for start in range(0, n, self.batch_size):
      chunk = x[start:start + self.batch_size]
      pad = self.batch_size - len(chunk)  # one program: the last batch padded
      if pad:
        chunk = np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)])
      out.append(np.asarray(fn(self.variables, jnp.asarray(chunk)))[:len(chunk) - pad])
    return np.concatenate(out) if out else np.zeros((0, width or self.sizes.embed_dim), np.float32)

  def text_embeddings(self, captions: Sequence[str], prefix: str = PREFIX, pooled: bool = False) -> np.ndarray:
    """``[N, E]`` (``pooled``: the text tower's ``[N, Dt]`` before its projection).

    The captions are embedded shortest first, each batch cut to its longest caption's tokens
    rounded up to a multiple of :data:`TOKEN_STEP` (the tower's causal mask makes the cut exact;
    a handful of programs, one per length): a 15-token caption costs 16 positions, not 77."""
    tokens = tokenizer_lib.tokenize([prefix + c for c in captions], self.sizes.context_length,
                                    truncate=True)
    fn, width = (self._pooled, self.sizes.transformer_width) if pooled else (self._text, None)
    lengths = tokens.argmax(-1) + 1  # the end-of-text token has the largest id: the last one kept
    order = np.argsort(lengths, kind="stable")
    out = np.zeros((len(tokens), width or self.sizes.embed_dim), np.float32)
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      t = min(-(-int(lengths[rows].max()) // TOKEN_STEP) * TOKEN_STEP, self.sizes.context_length)
      out[rows] = self._batched(fn, tokens[rows, :t], width)
    return out

  def image_embeddings(self, keys: Sequence, files: Mapping) -> np.ndarray:
    """Embeddings of ``files[key]`` (image paths), computed once per key."""
    todo = [k for k in dict.fromkeys(keys) if k not in self._images]
    n_px = self.sizes.image_resolution
    bar = None
    if self.progress is None and len(todo) > 4 * self.batch_size:  # long work: a progress bar
      import sys
      from tqdm import tqdm
      bar = tqdm(total=len(todo), desc="CLIP image embeddings", unit="img", file=sys.stderr)
    for start in range(0, len(todo), self.batch_size):
      part = todo[start:start + self.batch_size]
      pixels = np.stack([preprocess_lib.load_image(files[k], n_px) for k in part])
      for k, e in zip(part, self._batched(self._image, pixels)):
        self._images[k] = e
      if self.progress:
        self.progress(len(part))
      if bar is not None:
        bar.update(len(part))
    if bar is not None:
      bar.close()
    return np.stack([self._images[k] for k in keys]) if keys else np.zeros((0, self.sizes.embed_dim), np.float32)

  def score(self, captions: Mapping, files: Mapping, references: Mapping | None = None,
            kind: str = "clip", refclip_variant: str = "clipscore") -> dict:
    """``{"overall": {name: mean}, "per_image": {key: {name: value}}, "cosines": {name:
    clipped(...)}}`` for ``captions`` (``{key: caption}``), names ``CLIP-S`` / ``RefCLIP-S``
    (``kind="clip"``) or ``PAC-S`` / ``RefPAC-S`` (``kind="pac"``); references (``{key:
    [caption, ...]}``) add the Ref- score; ``cosines``: :func:`clipped` of the image-caption
    cosines."""
    keys = list(captions)
    missing = [k for k in keys if k not in files]
    if missing:
      raise BadInput(f"image {missing[0]!r}: no image file for it; expected one per scored image")
    w = WEIGHT[kind]
    name = "CLIP-S" if kind == "clip" else "PAC-S"
    cand = self.text_embeddings([captions[k] for k in keys])
    cos = cosines(self.image_embeddings(keys, files), cand)
    per = {name: from_cosines(cos, w)}  # image_text, the cosines kept for clipped()
    if references is not None:
      refs, owner = [], []
      for i, k in enumerate(keys):
        refs.extend(references.get(k, ()))
        owner.extend([i] * len(references.get(k, ())))
      per["Ref" + name] = with_references(per[name], cand, self.text_embeddings(refs), owner, w,
                                          refclip_variant)
    return {"overall": {n: float(np.mean(v)) if len(v) else float("nan") for n, v in per.items()},
            "per_image": {k: {n: float(v[i]) for n, v in per.items()} for i, k in enumerate(keys)},
            "cosines": {name: clipped(cos, w)}}
