"""TPGN: the Tensor Product Generation Network (Huang, Smolensky, He, Deng, Wu; NAACL 2018).

Dimension legend:
  B batch (images, or images x captions / beams), F global image feature width (paper 2048),
  T caption positions, d the TPR size (paper 25), E word-embedding width (d, or d^2 with
  ``lexical="tied"``), V vocabulary, G = 4 LSTM gates in the order (f, i, o, c) of eqs. 3-6 and
  10-13.

Section 4 of the paper, equation by equation (``x_{t-1}`` is the previous token, ``e_{t-1} =
W_e x_{t-1}`` its embedding):

* Sentence-encoding subnet S (eqs. 3-8), an LSTM whose hidden state ``Ŝ_t`` is a d x d matrix:
  ``gate_g = σ(W_{1,g} p_{t-1} - D_{1,g} e_{t-1} + U_{1,g} Ŝ_{t-1} + b_{1,g})`` with
  ``W_1, D_1 ∈ R^{d x d x d}`` (``D_1`` is d x d x E), ``U_1 ∈ R^{d x d x d x d}`` contracted
  over the last index / two indices (``einsum``), σ the logistic sigmoid for f, i, o and tanh
  for the candidate c; ``c_{1,t} = f ⊙ c_{1,t-1} + i ⊙ g``, ``Ŝ_t = o ⊙ tanh(c_{1,t})``.
* Initial state (eq. 9): ``Ŝ_0 = C_s (v - v̄) + b_s``, ``C_s ∈ R^{d x d x F}``; ``c_{1,0} = 0``.
* Unbinding subnet U (eqs. 10-15), an LSTM with vector state ``p_t ∈ R^d``:
  ``gate_g = σ(Ŝ_{t-1} w_{2,g} - D_{2,g} e_{t-1} + U_{2,g} p_{t-1} + b_{2,g})``,
  ``w_2 ∈ R^d``, ``D_2`` d x E, ``U_2`` d x d; ``p_0 = 0``, ``c_{2,0} = 0``. Both subnets read
  the previous step's states (``Ŝ_{t-1}``, ``p_{t-1}``), so their order within a step is free.
* Unbinding (eqs. 16-17): ``u_t = tanh(W_u p_t + b_u) ∈ R^{d^2}``; ``f_t = S_t u_t`` with
  ``S_t`` the d^2 x d^2 block-diagonal matrix of d copies of ``Ŝ_t``. It is never built: the
  k-th block of ``f_t`` is ``Ŝ_t u_t^{(k)}`` where ``u_t^{(k)}`` is the k-th d-slice of
  ``u_t``, i.e. ``f_t = vec(reshape(u_t, [d, d]) Ŝ_tᵀ)`` (d^3 instead of d^4 multiply-adds).
* Lexical subnet (eq. 18): ``logits = W_x f_t + b_x``, softmax in the loss.

The recurrent state ``(Ŝ, c_1, p, c_2)`` lives in the decoder cache; ``decode_step`` returns
``aux["unbinding"] = u_t [B, d^2]`` (what the section 5.3 analysis clusters,
``jaxcap/papers/tpgn/roles.py``).

v̄, the mean training feature (eq. 9), is a non-trainable variable ``constants/feat_mean``
(zeros at ``init``). ``prepare_variables(variables, dataset)`` fills it from the training split;
``train_lib`` calls it once when a run starts from scratch, and from then on it is part of the
checkpointed state (``state.params`` is the whole variables dict), so resuming, ``init_from``
and evaluation read the stored value and never recompute it. It is read through
``stop_gradient`` and the optimiser zeroes every update of the ``constants`` collection
(``frozen_collections``), so no weight decay can move it either.

Deviations from the paper, choices where it is silent and the released code's differences:
jaxcap/papers/tpgn/README.md, "The model against the paper".
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.errors import BadInput
from jaxcap.models import fields
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register

GATES = ("f", "i", "o", "c")  # eqs. 3-6 / 10-13
LEXICAL_MODES = ("learned", "tied")


def _lecun(fan_in: int):
  """Normal(0, 1/fan_in) initialiser (shape-agnostic: the fan-in is given, not inferred)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.normal(key, shape, dtype) * (1.0 / np.sqrt(fan_in))

  return init


def _gate_bias(key, shape, dtype=jnp.float32):
  """Zeros, except 1 on the forget gate (gate index 0)."""
  del key
  return jnp.zeros(shape, dtype).at[0].set(1.0)


def _lstm_update(pre_BxGx, c_Bx):
  """The LSTM update shared by both subnets (eqs. 4-8, 11-15) from the gate pre-activations
  ``[B, G, ...]`` (G = 4, gate-major: forget, input, output, candidate) and the previous
  cell ``[B, ...]``: ``(h_t, c_t)``."""
  f, i, o = (jax.nn.sigmoid(pre_BxGx[:, k]) for k in range(3))
  c_Bx = f * c_Bx + i * jnp.tanh(pre_BxGx[:, 3])
  return o * jnp.tanh(c_Bx), c_Bx


def unbind(s_Bxdxd, u_Bxd2):
  """Eq. 16 without the block-diagonal: ``f = blockdiag(Ŝ, ..., Ŝ) u``.

  Args:
    s_Bxdxd: ``Ŝ_t``.
    u_Bxd2: ``u_t`` (d slices of d).

  Returns:
    ``f_t [B, d^2]``: slice k is ``Ŝ_t u^{(k)}``.
  """
  b, d, _ = s_Bxdxd.shape
  u_Bxkxd = u_Bxd2.reshape(b, d, d)
  return jnp.einsum("bij,bkj->bki", s_Bxdxd, u_Bxkxd).reshape(b, d * d)


def with_role_centroids(variables: dict, centroids_KxD2, what: str = "role_centroids") -> dict:
  """``variables`` plus the ``ablation`` collection read when ``zero_role_cluster >= 0``:
  ``centroids_KxD2`` an array or the path of a ``.npy`` of them (``roles.py`` writes
  ``roles_k<K>.npy``); one line for centroids that are not ``[K, d^2]`` numbers of this model's
  ``d``, or a file that cannot be read."""
  if isinstance(centroids_KxD2, (str, os.PathLike)):
    what = f"{what}={centroids_KxD2}"
    try:
      centroids_KxD2 = np.load(centroids_KxD2, allow_pickle=False)
    except (OSError, ValueError) as e:
      raise BadInput(f"{what}: unreadable ({str(e).splitlines()[0]}); expected a .npy file "
                       "of [K, d*d] centroids (roles.py writes roles_k<K>.npy)") from None
  try:
    mu = np.asarray(centroids_KxD2, np.float32)
  except (TypeError, ValueError):
    mu = None
  d2 = int(variables["params"]["W_u"].shape[0])  # u_t's width d^2 (W_u: [d^2, d])
  if mu is None or mu.ndim != 2 or mu.shape[0] < 1 or mu.shape[1] != d2 or not np.isfinite(mu).all():
    got = "not numbers" if mu is None else f"{mu.dtype} {list(mu.shape)}"
    raise BadInput(f"{what}: expected finite [K, {d2}] centroids of the unbinding "
                     f"vectors u_t (d^2 = {d2} for this run), got {got}")
  out = dict(variables)
  out["ablation"] = {"centroids": jnp.asarray(mu)}
  return out


# The last table load_glove built: the check before training (check_prepare) reads the file,
# and prepare_variables then takes the same table without reading it again.
_GLOVE_CACHE: dict = {}


def load_glove(path: str, words, dim: int, seed: int = 0) -> np.ndarray:
  """Vectors ``[len(words), dim]`` from a GloVe text file, centred (the paper's zero mean).

  Words not in the file (and the special tokens) get ``N(0, s^2)`` with ``s`` the standard
  deviation of the file's vectors that are used; the mean is removed over the whole vocabulary.

  Raises a one-line BadInput (``config field model.glove_path: <path> ...``) for a file that
  is missing or unreadable, holds no vectors, has a line of another width or with values that
  are not finite numbers, or has a vector for none of ``words`` (then every embedding would
  stay random).
  """
  words = list(words)
  field = f"config field model.glove_path: {path}"
  want = f"expected GloVe text lines 'word v_1 ... v_{dim}'"
  try:
    st = os.stat(path)
  except OSError as e:
    raise BadInput(f"{field}: {e.strerror or 'not found'}; {want}") from None
  if not os.path.isfile(path):
    raise BadInput(f"{field}: not a file; {want}")
  key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, tuple(words), int(dim), int(seed))
  if key in _GLOVE_CACHE:
    return _GLOVE_CACHE[key].copy()
  index = {w: k for k, w in enumerate(words)}
  out = np.zeros((len(words), dim), np.float64)
  found = np.zeros(len(words), bool)
  vectors = 0
  try:
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f):
        parts = line.rstrip().split(" ")
        if len(parts) < 2:
          continue
        if len(parts) - 1 != dim:
          raise BadInput(f"{field} line {n + 1} has {len(parts) - 1} values; expected {dim} "
                           "(the embedding width)")
        vectors += 1
        k = index.get(parts[0])
        if k is not None and not found[k]:
          try:
            vec = np.asarray(parts[1:], np.float64)
          except ValueError:
            raise BadInput(f"{field} line {n + 1} holds values that are not numbers; "
                             f"{want}") from None
          if not np.all(np.isfinite(vec)):
            raise BadInput(f"{field} line {n + 1} ({parts[0]!r}) holds NaN or Inf values; "
                             "expected finite numbers")
          out[k] = vec
          found[k] = True
  except UnicodeDecodeError:
    raise BadInput(f"{field}: not UTF-8 text; {want}") from None
  except OSError as e:
    raise BadInput(f"{field}: unreadable ({e.strerror or e}); {want}") from None
  if not vectors:
    raise BadInput(f"{field}: holds no vectors (empty file); {want}")
  if not found.any():
    raise BadInput(f"{field}: none of its {vectors} vectors is for a word of the {len(words)}-"
                     f"word vocabulary (e.g. {', '.join(map(repr, words[4:7]))}), so every "
                     "embedding would stay random; expected vectors for the captions' "
                     "(lowercase) words")
  std = float(out[found].std()) if found.any() else 1.0
  rng = np.random.default_rng(seed)
  out[~found] = rng.normal(0.0, std, size=(int((~found).sum()), dim))
  out -= out.mean(0, keepdims=True)
  table = out.astype(np.float32)
  _GLOVE_CACHE.clear()
  _GLOVE_CACHE[key] = table
  return table.copy()


@register("tpgn")
class TPGN(CaptionModel):
  """Tensor Product Generation Network over a global image feature.

  Attributes:
    vocab_size: V.
    feature_dim: F, the width of ``batch["global_feat"]``.
    d: the TPR size (Ŝ is d x d; u_t, f_t are d^2).
    lexical: ``"learned"`` (W_x learned, V x d^2; W_e is d-dimensional) or ``"tied"``
      (one d^2-dimensional embedding is W_e and W_x).
    glove_path: a GloVe-format text file for W_e ("" = learn W_e from a random start).
    train_embedding: False keeps W_e fixed (the paper); it then lives in ``constants``.
    dropout: rate on the word embedding and on f_t (not in the paper).
    zero_role_cluster: ablation, -1 = off; k >= 0 zeroes u_t in role cluster k (needs the
      ``ablation`` collection, see :func:`with_role_centroids`).
    dtype: compute dtype of the contractions (parameters, gates' sums and logits float32).
  """

  reads_regions = False  # only the global feature
  reads_global_feat = True

  vocab_size: int
  feature_dim: int = 2048
  d: int = 25
  lexical: str = "learned"
  glove_path: str = ""
  train_embedding: bool = True
  dropout: float = 0.0
  zero_role_cluster: int = -1
  dtype: jnp.dtype = jnp.float32

  frozen_collections = ("constants",)
  ablation_inputs = ("role_centroids",)  # Run.ablate(zero_role_cluster=k, role_centroids=C)

  field_checks = {"d": fields.POSITIVE, "lexical": fields.one_of(LEXICAL_MODES),
                  "glove_path": fields.Check(lambda v: isinstance(v, str), "a path string"),
                  "dropout": fields.RATE,
                  "zero_role_cluster": fields.Check(fields.at_least(-1).test,
                                                    "-1 (off) or a cluster id >= 0")}

  @property
  def embed_dim(self) -> int:
    return self.d * self.d if self.lexical == "tied" else self.d

  def setup(self):
    d, e, g, f = self.d, self.embed_dim, len(GATES), self.feature_dim
    # v̄ of eq. 9: filled once from the training split by prepare_variables, then checkpointed.
    self.feat_mean = self.variable("constants", "feat_mean", lambda: jnp.zeros((f,), jnp.float32))
    emb_init = lambda key, shape: jax.random.normal(key, shape) * (1.0 / np.sqrt(e))
    if self.train_embedding:
      self.embedding = self.param("embedding", emb_init, (self.vocab_size, e))
    else:
      self.embedding_var = self.variable("constants", "embedding",
                                         lambda: emb_init(self.make_rng("params"), (self.vocab_size, e)))
    # Eq. 9.
    self.C_s = self.param("C_s", _lecun(f), (d, d, f))
    self.b_s = self.param("b_s", nn.initializers.zeros, (d, d))
    # S subnet (eqs. 3-8): gate-major tensors [G, ...].
    self.W_1 = self.param("W_1", _lecun(d), (g, d, d, d))
    self.D_1 = self.param("D_1", _lecun(e), (g, d, d, e))
    self.U_1 = self.param("U_1", _lecun(d * d), (g, d, d, d, d))
    self.b_1 = self.param("b_1", _gate_bias, (g, d, d))
    # U subnet (eqs. 10-15).
    self.w_2 = self.param("w_2", _lecun(d), (g, d))
    self.D_2 = self.param("D_2", _lecun(e), (g, d, e))
    self.U_2 = self.param("U_2", _lecun(d), (g, d, d))
    self.b_2 = self.param("b_2", _gate_bias, (g, d))
    # Eq. 17.
    self.W_u = self.param("W_u", _lecun(d), (d * d, d))
    self.b_u = self.param("b_u", nn.initializers.zeros, (d * d,))
    # Eq. 18 (W_x is the embedding itself when tied).
    if self.lexical == "learned":
      self.W_x = self.param("W_x", _lecun(d * d), (self.vocab_size, d * d))
    self.b_x = self.param("b_x", nn.initializers.zeros, (self.vocab_size,))
    self.drop = nn.Dropout(self.dropout)

  # ------------------------------------------------------------------ pieces
  def _embedding(self):
    if self.train_embedding:
      return self.embedding
    return jax.lax.stop_gradient(self.embedding_var.value)

  def _lexical_weight(self):
    return self._embedding() if self.lexical == "tied" else self.W_x

  def initial_state(self, v_BxF):
    """Eq. 9: ``Ŝ_0 = C_s (v - v̄) + b_s`` ``[B, d, d]``."""
    v_bar = jax.lax.stop_gradient(self.feat_mean.value)
    centred = (v_BxF.astype(jnp.float32) - v_bar).astype(self.dtype)
    return jnp.einsum("ijf,bf->bij", self.C_s.astype(self.dtype), centred).astype(jnp.float32) + self.b_s

  def s_step(self, s_Bxdxd, c1_Bxdxd, p_Bxd, e_BxE):
    """Eqs. 3-8: one step of the sentence-encoding LSTM. Returns ``(Ŝ_t, c_{1,t})``."""
    dt = self.dtype
    pre = (jnp.einsum("gijk,bk->bgij", self.W_1.astype(dt), p_Bxd.astype(dt))
           - jnp.einsum("gije,be->bgij", self.D_1.astype(dt), e_BxE.astype(dt))
           + jnp.einsum("gijkl,bkl->bgij", self.U_1.astype(dt), s_Bxdxd.astype(dt))
           ).astype(jnp.float32) + self.b_1
    return _lstm_update(pre, c1_Bxdxd)

  def u_step(self, s_Bxdxd, c2_Bxd, p_Bxd, e_BxE):
    """Eqs. 10-15: one step of the unbinding LSTM. Returns ``(p_t, c_{2,t})``."""
    dt = self.dtype
    pre = (jnp.einsum("bij,gj->bgi", s_Bxdxd.astype(dt), self.w_2.astype(dt))
           - jnp.einsum("gie,be->bgi", self.D_2.astype(dt), e_BxE.astype(dt))
           + jnp.einsum("gij,bj->bgi", self.U_2.astype(dt), p_Bxd.astype(dt))
           ).astype(jnp.float32) + self.b_2
    return _lstm_update(pre, c2_Bxd)

  def unbinding_vector(self, p_Bxd):
    """Eq. 17: ``u_t = tanh(W_u p_t + b_u)`` ``[B, d^2]``."""
    return jnp.tanh(jnp.einsum("ud,bd->bu", self.W_u, p_Bxd.astype(jnp.float32)) + self.b_u)

  def _ablate(self, u_BxD2):
    if self.zero_role_cluster < 0:
      return u_BxD2
    if not self.has_variable("ablation", "centroids"):
      raise BadInput("model.zero_role_cluster is set but the variables have no 'ablation' "
                       "collection; add the role centroids with tpgn.with_role_centroids")
    mu_KxD2 = self.get_variable("ablation", "centroids")
    if not 0 <= self.zero_role_cluster < mu_KxD2.shape[0]:
      raise BadInput(f"config field model.zero_role_cluster: {self.zero_role_cluster} is not a "
                       f"cluster of the {mu_KxD2.shape[0]} centroids given")
    dist_BxK = jnp.sum((u_BxD2[:, None, :] - mu_KxD2[None]) ** 2, -1)
    hit_B = jnp.argmin(dist_BxK, -1) == self.zero_role_cluster
    return jnp.where(hit_B[:, None], 0.0, u_BxD2)

  # ------------------------------------------------------------------ protocol
  def encode(self, batch, train: bool = False):
    del train
    return {"S0": self.initial_state(batch["global_feat"])}

  def init_cache(self, enc, max_len: int):
    del max_len  # A recurrent state does not grow with time.
    s0 = enc["S0"]
    b, d = s0.shape[0], self.d
    return {"S": s0, "c1": jnp.zeros_like(s0), "p": jnp.zeros((b, d), jnp.float32),
            "c2": jnp.zeros((b, d), jnp.float32)}

  # The teacher-forcing scan reads v̄, a fixed W_e and the role centroids too.
  scan_broadcast = ("params", "constants", "ablation")

  def step_features(self, enc, cache, tokens_B, t, train: bool = False):
    """Eqs. 3-17 of one word: ``(Dropout(f_t) [B, d^2], cache, {"unbinding": u_t [B, d^2]})``;
    teacher forcing scans this step (``CaptionModel.decode_train``: aux ``[B, T, d^2]``)."""
    del enc, t  # The state carries the image and the position.
    e_BxE = self.drop(jnp.take(self._embedding(), tokens_B, axis=0), deterministic=not train)
    s, c1 = self.s_step(cache["S"], cache["c1"], cache["p"], e_BxE)
    p, c2 = self.u_step(cache["S"], cache["c2"], cache["p"], e_BxE)
    u_BxD2 = self._ablate(self.unbinding_vector(p))
    f_BxD2 = self.drop(unbind(s, u_BxD2), deterministic=not train)
    return f_BxD2, {"S": s, "c1": c1, "p": p, "c2": c2}, {"unbinding": u_BxD2}

  def output_layer(self, f, train: bool = False):
    """Eq. 18: ``W_x f_t + b_x`` (f_t's dropout is ``step_features``'), float32 ``[..., V]``."""
    del train
    w_x = self._lexical_weight().astype(self.dtype)
    return jnp.einsum("vu,...u->...v", w_x, f.astype(self.dtype)).astype(jnp.float32) + self.b_x

  # ------------------------------------------------------------------ run set-up
  def _glove_words(self, dataset) -> list:
    return list(dataset.vocab.itos)[: self.vocab_size]

  def with_ablation_input(self, variables: dict, name: str, value) -> dict:
    """``role_centroids``: the ``ablation`` collection :func:`with_role_centroids` adds."""
    if name != "role_centroids":
      return super().with_ablation_input(variables, name, value)
    return with_role_centroids(variables, value)

  def check_prepare(self, dataset) -> None:
    """What :meth:`prepare_variables` reads besides the data (the GloVe file), checked before
    the trainer writes anything: a one-line BadInput naming the file (:func:`load_glove`)."""
    if self.glove_path:
      load_glove(self.glove_path, self._glove_words(dataset), self.embed_dim)

  def prepare_variables(self, variables: dict, dataset) -> dict:
    """Fills the constants from the training split: v̄ (eq. 9) and, given ``glove_path``, W_e.

    Called by the trainer once, when a run starts from scratch; the result is checkpointed.
    """
    # The data pipeline (grain) only when a run starts: the models import on GPU images without it.
    from jaxcap.data import pipeline
    total, count = None, 0
    for batch in pipeline.eval_batches(dataset.split("train"), 256, num_threads=0):
      valid = np.asarray(batch["valid"], bool)
      v = np.asarray(batch["global_feat"], np.float64)[valid]
      total = v.sum(0) if total is None else total + v.sum(0)
      count += int(valid.sum())
    out = {k: dict(v) for k, v in variables.items()}  # new top-level dicts; leaves shared
    out["constants"]["feat_mean"] = jnp.asarray(total / max(count, 1), jnp.float32)
    if self.glove_path:
      table = jnp.asarray(load_glove(self.glove_path, self._glove_words(dataset), self.embed_dim))
      if self.train_embedding:
        out["params"]["embedding"] = table
      else:
        out["constants"]["embedding"] = table
    return out
