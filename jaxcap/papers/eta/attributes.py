"""Multiple-instance noisy-OR attribute detector (Fang et al., CVPR 2015; ETA sec. 5.2).

Dimension legend: B images, N regions (padded), F region-feature width, K attribute words
(the top-K content words of the training references, ``dataset.attribute_words``), I images
of a split, E hidden width.

Each region i of an image gets an independent probability ``p_i(w) = sigmoid(MLP(x_i))_w``
that it shows word w; the image has the word when at least one region shows it:

    P(w | image) = 1 - prod_{i in real regions} (1 - p_i(w))

computed in log space, ``log(1 - P) = sum_i log sigmoid(-z_i)`` (padding regions add 0), so
neither product underflows. The loss is the per-word binary cross-entropy of P against the
multi-hot ``attr_labels`` (weak labels: the word occurs in one of the image's references).
Fang et al. fine-tune a VGG-16 over its fc7 grid; jaxcap reads the dataset's precomputed
region (or grid, or global) features instead, so the detector is a small per-region MLP.

The top words of each image (probability order) are written to a JSON
``{image_id: [words]}`` that the data pipeline reads with ``data.attributes="detected"``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn
import optax

from jaxcap.data import attributes
from jaxcap.errors import BadInput

# log(1 - P) is clipped below 0 by this much so that log P stays finite when every region's
# probability underflows to 0 in float32.
_MIN_LOG_NOT = 1e-12


def noisy_or(region_logits_BxNxK, mask_BxN):
  """Noisy-OR over the real regions: ``(log P [B, K], log(1 - P) [B, K])`` in float32.

  Args:
    region_logits_BxNxK: per-region logits z_i, p_i = sigmoid(z_i).
    mask_BxN: True on real regions; padding regions are left out of the product.
  """
  z = region_logits_BxNxK.astype(jnp.float32)
  log_not_BxNxK = jax.nn.log_sigmoid(-z)  # log(1 - p_i), stable for large |z|
  log_not_BxK = jnp.sum(jnp.where(mask_BxN[..., None], log_not_BxNxK, 0.0), axis=1)
  log_not_BxK = jnp.minimum(log_not_BxK, -_MIN_LOG_NOT)
  log_p_BxK = jnp.log(-jnp.expm1(log_not_BxK))
  return log_p_BxK, log_not_BxK


def noisy_or_loss(region_logits_BxNxK, mask_BxN, labels_BxK, valid_B=None):
  """Mean binary cross-entropy of the noisy-OR probabilities (over valid images and words)."""
  log_p, log_not = noisy_or(region_logits_BxNxK, mask_BxN)
  y = labels_BxK.astype(jnp.float32)
  bce_BxK = -(y * log_p + (1.0 - y) * log_not)
  per_image_B = jnp.mean(bce_BxK, axis=-1)
  if valid_B is None:
    return jnp.mean(per_image_B)
  w = valid_B.astype(jnp.float32)
  return jnp.sum(per_image_B * w) / jnp.maximum(jnp.sum(w), 1.0)


class NoisyOrDetector(nn.Module):
  """Per-region MLP ``F -> E -> K`` giving the region logits z_i; see :func:`noisy_or`.

  Attributes:
    num_attributes: K.
    hidden: E.
    dropout: on the hidden layer during training.
  """

  num_attributes: int
  hidden: int = 512
  dropout: float = 0.0

  @nn.compact
  def __call__(self, feats_BxNxF, mask_BxN, train: bool = False):
    """Returns ``{"region_logits" [B, N, K], "log_prob" [B, K], "prob" [B, K]}``."""
    h = nn.relu(nn.Dense(self.hidden, name="fc1")(feats_BxNxF.astype(jnp.float32)))
    h = nn.Dropout(self.dropout)(h, deterministic=not train)
    # A negative initial bias: with N regions the noisy-OR of p = 0.5 each would start near 1.
    z = nn.Dense(self.num_attributes, bias_init=nn.initializers.constant(-3.0), name="fc2")(h)
    log_p, _ = noisy_or(z, mask_BxN)
    return {"region_logits": z, "log_prob": log_p, "prob": jnp.exp(log_p)}


# --- metrics ---------------------------------------------------------------------------------


def average_precision(scores_I: np.ndarray, labels_I: np.ndarray) -> float:
  """Non-interpolated AP of one word: the mean of precision@rank at each positive's rank.

  Ties are broken by image order (stable sort), NaN when there is no positive.
  """
  labels_I = np.asarray(labels_I) > 0.5
  npos = int(labels_I.sum())
  if npos == 0:
    return float("nan")
  order = np.argsort(-np.asarray(scores_I, np.float64), kind="stable")
  hits = labels_I[order]
  precision_at = np.cumsum(hits) / np.arange(1, len(hits) + 1)
  return float(np.sum(precision_at[hits]) / npos)


def detection_metrics(scores_IxK: np.ndarray, labels_IxK: np.ndarray,
                      ks: Sequence[int] = (1, 5, 10)) -> dict:
  """``{"mAP", "precision@k"...}``: mAP over words with a positive; precision@k averaged
  over images (the fraction of an image's k top-scored words that are in its labels)."""
  scores_IxK, labels_IxK = np.asarray(scores_IxK), np.asarray(labels_IxK) > 0.5
  aps = [average_precision(scores_IxK[:, j], labels_IxK[:, j]) for j in range(scores_IxK.shape[1])]
  aps = [a for a in aps if not np.isnan(a)]
  out = {"mAP": float(np.mean(aps)) if aps else float("nan")}
  order_IxK = np.argsort(-scores_IxK, axis=1, kind="stable")
  for k in ks:
    k = min(int(k), scores_IxK.shape[1])
    top = np.take_along_axis(labels_IxK, order_IxK[:, :k], axis=1)
    out[f"precision@{k}"] = float(top.mean())
  return out


def frequency_prior(train_labels_IxK: np.ndarray) -> np.ndarray:
  """The prior baseline's scores ``[K]``: each word's frequency among training images."""
  return np.asarray(train_labels_IxK, np.float64).mean(axis=0)


# --- data ------------------------------------------------------------------------------------


def load_arrays(source, batch_size: int = 256, limit: int | None = None) -> dict:
  """Reads a split into numpy arrays ``feats [I, N, F]``, ``feats_mask``, ``attr_labels``."""
  from jaxcap.data import pipeline  # grain only when the detector reads data (ETA's config imports this module)
  out = {"feats": [], "feats_mask": [], "attr_labels": []}
  n = len(source) if limit is None else min(limit, len(source))
  seen = 0
  for batch in pipeline.eval_batches(source, batch_size, num_threads=2):
    keep = batch["valid"]
    for key in out:
      out[key].append(batch[key][keep])
    seen += int(keep.sum())
    if seen >= n:
      break
  return {k: np.concatenate(v, axis=0)[:n] for k, v in out.items()}


def predict(model: NoisyOrDetector, params, arrays: dict, batch_size: int = 256,
            fn: Callable | None = None) -> np.ndarray:
  """P(word | image) ``[I, K]`` float32 for preloaded arrays (``fn``: a jitted apply to reuse)."""
  fn = fn or jax.jit(lambda p, f, m: model.apply(p, f, m)["prob"])
  n = arrays["feats"].shape[0]
  probs = []
  for s in range(0, n, batch_size):
    f, m = arrays["feats"][s:s + batch_size], arrays["feats_mask"][s:s + batch_size]
    pad = batch_size - f.shape[0]
    if pad:  # one compiled shape for every batch
      f = np.concatenate([f, np.zeros((pad,) + f.shape[1:], f.dtype)])
      m = np.concatenate([m, np.zeros((pad,) + m.shape[1:], m.dtype)])
    probs.append(np.asarray(fn(params, f, m))[:batch_size - pad])
  return np.concatenate(probs, axis=0)


def train_detector(train_arrays: dict, num_attributes: int, *, hidden: int = 512,
                   dropout: float = 0.0, num_steps: int = 2000, batch_size: int = 100,
                   learning_rate: float = 1e-3, weight_decay: float = 0.0, seed: int = 0,
                   log: Callable[[str], Any] | None = print, log_every: int = 500):
  """Trains the detector with Adam on preloaded training arrays.

  Returns:
    ``(model, params, history)`` where history lists ``(step, loss)`` at each log point.
  """
  n = train_arrays["feats"].shape[0]
  if n == 0:
    raise BadInput("train_detector: the training split is empty, expected images")
  model = NoisyOrDetector(num_attributes, hidden, dropout)
  rng = jax.random.PRNGKey(seed)
  bs = min(batch_size, n)
  params = model.init(rng, train_arrays["feats"][:bs], train_arrays["feats_mask"][:bs])
  tx = optax.adamw(learning_rate, weight_decay=weight_decay)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, feats, mask, labels, key):
    def loss_fn(p):
      out = model.apply(p, feats, mask, train=True, rngs={"dropout": key})
      return noisy_or_loss(out["region_logits"], mask, labels)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  order_rng = np.random.default_rng(seed)
  perm, pos, history, t0 = order_rng.permutation(n), 0, [], time.time()
  for it in range(1, num_steps + 1):
    if pos + bs > n:
      perm, pos = order_rng.permutation(n), 0
    rows = perm[pos:pos + bs]
    pos += bs
    rng, key = jax.random.split(rng)
    params, opt_state, loss = step(params, opt_state, train_arrays["feats"][rows],
                                   train_arrays["feats_mask"][rows],
                                   train_arrays["attr_labels"][rows], key)
    if it % log_every == 0 or it == num_steps:
      history.append((it, float(loss)))
      if log is not None:
        log(f"detector step {it}/{num_steps}: loss {float(loss):.4f} ({time.time() - t0:.1f}s)")
  return model, params, history


# --- output ----------------------------------------------------------------------------------


def top_attributes(probs_IxK: np.ndarray, words: Sequence[str], top_k: int,
                   min_prob: float = 0.0) -> list[list[str]]:
  """Each image's ``top_k`` words by probability (highest first), those ``>= min_prob``."""
  if len(words) != probs_IxK.shape[1]:
    raise ValueError(f"top_attributes: {probs_IxK.shape[1]} probability columns but "
                     f"{len(words)} attribute words, expected equal")
  order = np.argsort(-probs_IxK, axis=1, kind="stable")[:, :top_k]
  return [[words[j] for j in row if probs_IxK[i, j] >= min_prob] for i, row in enumerate(order)]


def default_config():
  """The settings of :func:`run` (a config's ``detector`` section) with their defaults: ``hidden``
  E, ``dropout``, the training run, then the attributes kept per image (the ``top_k`` most
  probable with at least ``min_prob``) and the ``ks`` of the precision@k metrics (an
  ``ml_collections.ConfigDict``, imported here: model code imports without ml_collections)."""
  import ml_collections
  return ml_collections.ConfigDict(dict(
      hidden=512, dropout=0.0, num_steps=2000, batch_size=100, learning_rate=1e-3,
      weight_decay=0.0, seed=0, top_k=20, min_prob=0.0, ks=(1, 5, 10)))


def run(dataset, cfg, out_dir: str, log: Callable[[str], Any] = print,
        splits: Iterable[str] | None = None) -> dict:
  """Trains on ``train``, reports val metrics, writes ``attributes.json`` and ``metrics.json``.

  Args:
    dataset: a CaptionDataset (its ``attribute_words`` are the K labels).
    cfg: detector settings (those of :func:`default_config`; a missing one takes its default).
    out_dir: output directory.

  Returns:
    ``{"val": metrics, "val_prior": metrics of the frequency prior, "path": attributes file}``.
  """
  defaults = default_config()
  get = lambda k: cfg.get(k, defaults[k]) if hasattr(cfg, "get") else defaults[k]
  words = list(dataset.attribute_words)
  if not words:
    raise BadInput(f"{dataset.name}: no attribute words (data.num_attributes = 0 or no "
                     "content words), expected at least one")
  ks = tuple(get("ks"))
  t0 = time.time()
  train = load_arrays(dataset.split("train"))
  log(f"loaded {train['feats'].shape[0]} training images ({time.time() - t0:.1f}s)")
  model, params, history = train_detector(
      train, len(words), log=log, **{k: get(k) for k in ("hidden", "dropout", "num_steps",
                                                          "batch_size", "learning_rate",
                                                          "weight_decay", "seed")})
  result = {"history": history}
  apply_fn = jax.jit(lambda p, f, m: model.apply(p, f, m)["prob"])
  eval_split = "val" if "val" in dataset.splits else "test"
  if eval_split in dataset.splits:
    ev = load_arrays(dataset.split(eval_split))
    probs = predict(model, params, ev, fn=apply_fn)
    result["val"] = detection_metrics(probs, ev["attr_labels"], ks)
    prior = np.broadcast_to(frequency_prior(train["attr_labels"]), probs.shape)
    result["val_prior"] = detection_metrics(prior, ev["attr_labels"], ks)
  top_k, min_prob = int(get("top_k")), float(get("min_prob"))
  table = {}
  for split in (splits or dataset.splits):
    arrays = train if split == "train" else load_arrays(dataset.split(split))
    probs = predict(model, params, arrays, fn=apply_fn)
    for iid, ws in zip(dataset.image_ids(split), top_attributes(probs, words, top_k, min_prob)):
      if str(iid) in table:
        raise BadInput(f"{dataset.name}: image id {iid!r} occurs in two splits, expected "
                         "unique ids (the attributes file is keyed by image id)")
      table[str(iid)] = ws
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "attributes.json")
  attributes.write_file(path, table)
  result["path"] = path
  metrics_path = os.path.join(out_dir, "metrics.json")
  tmp = f"{metrics_path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump({k: v for k, v in result.items() if k != "path"}, f, indent=1)
  os.replace(tmp, metrics_path)
  return result
