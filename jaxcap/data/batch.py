"""The batch contract: what a batch is, one check of it, and the dummy and random batches.

A **batch** is a dict of arrays whose leading axis ``B`` is the images of this process's batch
(docs/DESIGN.md, section 2). :data:`KEYS` is the one definition of its keys, dtypes and shapes;
everything that makes or checks a batch goes through this module:

- :func:`zeros` (the padded arrays that :func:`jaxcap.data.base.collate` fills from a dataset's
  examples), :func:`dummy` (an all-padding batch with one real region per image: model init and
  shape checks) and :func:`random` (random inputs on the device: the benchmarks);
- :func:`from_features` (a user's features for :meth:`jaxcap.api.Run.caption`: every array
  checked, one ``BadInput`` line naming the argument and what was expected) and
  :func:`check_boxes` (the box rule the readers and the Image Transformer rely on).

Dimension legend (from a dataset's ``info``): B images, N ``max_regions``, D ``feature_dim``,
Dg ``global_dim``, S captions per image (``seq_per_img``), T = ``max_len + 1`` caption
positions, A ``max_attributes``, K ``num_attributes``, Ls = ``src_max_len + 1`` source
positions.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxcap.errors import BadInput

# key -> (dtype, dims, meaning). ``src`` is present for translation data only.
KEYS = {
    "image_index": (np.int32, ("B",), "row of the image in its split"),
    "valid": (np.bool_, ("B",), "False for padding rows of the last evaluation batch"),
    "feats": (np.float32, ("B", "N", "D"), "region (or grid-cell) features, zero-padded"),
    "feats_mask": (np.bool_, ("B", "N"), "True for real regions"),
    "boxes": (np.float32, ("B", "N", 4), "x1, y1, x2, y2 normalised to [0, 1]; zeros on padding"),
    "global_feat": (np.float32, ("B", "Dg"), "the fc feature (mean of regions when absent)"),
    "captions": (np.int32, ("B", "S", "T"), "word ids, EOS, then PAD"),
    "attributes": (np.int32, ("B", "A"), "attribute word ids (target vocabulary), PAD-padded"),
    "attr_labels": (np.float32, ("B", "K"), "multi-hot over the attribute vocabulary"),
    "src": (np.int32, ("B", "Ls"), "translation source ids, EOS then PAD"),
    # A run from pixels (info["image_size"] = P > 0) has these instead of the four feature keys:
    # its backbone makes them (jaxcap/models/pixels.py).
    "pixels": (np.uint8, ("B", "P", "P", 3), "RGB images resized to P x P (data.image_size)"),
}
FEATURE_KEYS = ("feats", "feats_mask", "boxes", "global_feat")


def bucket(n: int, limit: int | None = None) -> int:
  """The padded size of an axis of ``n`` (images of a call, regions of an image): ``n`` rounded up
  to four significant bits (exact up to 16, then 18, 20, ..., 32, 36, 40, ..., 64, 72, ...), at
  most ``limit``. Padding costs under 12.5 % of the rows (50 -> 52, 36 -> 36, 100 -> 104) while
  a server or a loop over requests compiles eight sizes per doubling, not one per size."""
  n = max(1, int(n))
  step = 1 << max(0, n.bit_length() - 4)
  size = -(-n // step) * step
  return size if limit is None else max(1, min(size, int(limit)))


def _sizes(info: Mapping, batch_size: int, seq_per_img: int) -> dict:
  return {"B": batch_size, "N": int(info["max_regions"]), "D": int(info["feature_dim"]),
          "Dg": int(info["global_dim"]), "S": seq_per_img, "T": int(info["max_len"]) + 1,
          "A": int(info.get("max_attributes", 1)), "K": int(info.get("num_attributes", 1)),
          "Ls": int(info.get("src_max_len", 0)) + 1, "P": int(info.get("image_size", 0))}


def shapes(info: Mapping, batch_size: int, seq_per_img: int = 1, has_src: bool = False) -> dict:
  """``{key: (shape, dtype)}`` of a batch of the dataset ``info`` describes."""
  sizes = _sizes(info, batch_size, seq_per_img)
  skip = {"src"} if not has_src else set()
  skip |= set(FEATURE_KEYS) if sizes["P"] else {"pixels"}
  return {k: (tuple(sizes.get(d, d) for d in dims), dtype) for k, (dtype, dims, _) in KEYS.items()
          if k not in skip}


def zeros(info: Mapping, batch_size: int, seq_per_img: int = 1, has_src: bool = False) -> dict:
  """A batch of zeros (every row padding, ``valid`` False)."""
  return {k: np.zeros(shape, dtype) for k, (shape, dtype) in
          shapes(info, batch_size, seq_per_img, has_src).items()}


def dummy(info: Mapping, batch_size: int = 2) -> dict:
  """An all-padding batch with the dataset's shapes and one real region, attribute and source
  word per image, so every attention is defined (model init and shape checks)."""
  batch = zeros(info, batch_size, int(info.get("seq_per_img", 1)),
                bool(info.get("src_vocab_size", 0)))
  if "feats_mask" in batch:  # a batch of pixels (a run from pixels) has no region mask
    batch["feats_mask"][:] = True
  batch["valid"][:] = True
  batch["attributes"][:, 0] = 4
  if "src" in batch:
    batch["src"][:, 0] = 4
  return batch


def random(rng, b, s, n, d_feat, vocab, t, src_len: int = 16, src_vocab: int = 0):
  """A random batch made on the device: ``b`` images of ``n`` x ``d_feat`` regions with valid
  random boxes (every fourth one inside the region before it, so a spatial graph has all three
  relations: inside, contains, apart), ``s`` captions of ``t`` random tokens each, and a
  translation source of ``src_len`` random tokens of ``src_vocab`` (0: ``vocab``) + EOS; 20
  attribute slots, all padding."""
  import jax  # only the benchmarks make device batches
  import jax.numpy as jnp
  k1, k2, k3, k4 = jax.random.split(rng, 4)
  corners = jax.random.uniform(k3, (b, n, 2, 2), jnp.float32)
  boxes = jnp.concatenate([corners.min(axis=2), corners.max(axis=2)], axis=-1)  # x1 <= x2, y1 <= y2
  inner = jnp.arange(1, n, 4)
  outer = boxes[:, inner - 1]
  centre, half = (outer[..., :2] + outer[..., 2:]) / 2, (outer[..., 2:] - outer[..., :2]) / 4
  boxes = boxes.at[:, inner].set(jnp.concatenate([centre - half, centre + half], axis=-1))
  src = jax.random.randint(k4, (b, src_len + 1), 4, src_vocab or vocab, jnp.int32).at[:, -1].set(2)  # EOS
  feats = jax.random.normal(k1, (b, n, d_feat), jnp.float32)
  info = {"max_regions": n, "feature_dim": d_feat, "global_dim": d_feat, "max_len": t - 1,
          "max_attributes": 20, "num_attributes": 1, "src_max_len": src_len}
  batch = {k: jnp.zeros(shape, dtype) for k, (shape, dtype) in shapes(info, b, s, has_src=True).items()}
  batch.update(feats=feats, feats_mask=jnp.ones((b, n), bool), boxes=boxes,
               global_feat=feats.mean(axis=1), captions=jax.random.randint(k2, (b, s, t), 4, vocab, jnp.int32),
               src=src, valid=jnp.ones((b,), bool), image_index=jnp.arange(b, dtype=jnp.int32))
  return batch


# Normalised coordinates may overshoot [0, 1] by float rounding (pixels / image size).
BOX_TOLERANCE = 1e-5


def check_boxes(boxes, name: str, field: str = "boxes", mask=None,
                allow_degenerate: bool = True) -> np.ndarray:
  """Validates ``[..., n, 4]`` boxes (x1, y1, x2, y2, normalised): finite, ``x1 <= x2``,
  ``y1 <= y2``, inside ``[0, 1]`` (up to ``BOX_TOLERANCE``); returns them as float32 or raises
  a one-line BadInput naming ``name`` and ``field``.

  Degenerate boxes (``x1 == x2`` or ``y1 == y2``: zero area) are valid here when
  ``allow_degenerate``. The rule for them, used by the Image Transformer's spatial graph: a
  zero-area box overlaps nothing, so it is neither parent nor child of any region — a
  neighbour of every region (and of itself). The data readers call this with
  ``allow_degenerate=False`` unless ``data.degenerate_boxes="allow"``: a detector never emits
  a zero-area box, so one in a box file means broken coordinates (e.g. an all-zero row).
  ``mask`` (bool ``[..., n]``, True for real regions) skips padding rows.
  """
  b = np.asarray(boxes, np.float32)
  if b.ndim < 2 or b.shape[-1] != 4:
    raise BadInput(f"{name}: field {field!r} must be [..., regions, 4], got shape {list(b.shape)}")
  real = np.ones(b.shape[:-1], bool) if mask is None else np.asarray(mask, bool)
  r = b[real]
  if not np.all(np.isfinite(r)):
    raise BadInput(f"{name}: field {field!r} contains NaN or Inf values, expected finite numbers")
  bad = (r[:, 0] > r[:, 2]) | (r[:, 1] > r[:, 3])
  if bad.any():
    raise BadInput(f"{name}: field {field!r} has {int(bad.sum())} box(es) with x1 > x2 or "
                     f"y1 > y2 (first {r[bad][0].tolist()}), expected x1 <= x2 and y1 <= y2")
  out = (r < -BOX_TOLERANCE) | (r > 1.0 + BOX_TOLERANCE)
  if out.any():
    raise BadInput(f"{name}: field {field!r} has coordinates outside [0, 1] (first box "
                     f"{r[out.any(-1)][0].tolist()}), expected boxes normalised to the image")
  if not allow_degenerate:
    flat = (r[:, 0] == r[:, 2]) | (r[:, 1] == r[:, 3])
    if flat.any():
      raise BadInput(f"{name}: field {field!r} has {int(flat.sum())} zero-area box(es) (first "
                       f"{r[flat][0].tolist()}), expected x1 < x2 and y1 < y2 (or set "
                       "data.degenerate_boxes='allow')")
  return b


def required_inputs(model) -> tuple[str, ...]:
  """What ``model`` (or every member of an ensemble) reads that features may lack
  (:meth:`jaxcap.models.base.CaptionModel.required_inputs`)."""
  members = getattr(model, "models", None)
  if members is not None:
    return tuple(dict.fromkeys(n for m in members for n in required_inputs(m)))
  fn = getattr(model, "required_inputs", None)
  return tuple(fn()) if fn is not None else ()


def _array(x, what: str, dtype=None) -> np.ndarray:
  try:
    return np.asarray(x) if dtype is None else np.asarray(x, dtype)
  except (TypeError, ValueError) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise BadInput(f"caption: {what} is not a numeric array ({first}); expected "
                     f"{'numbers' if dtype is None else np.dtype(dtype).name}") from None


def from_features(features, info: dict, model=None) -> dict:
  """The decoder's batch dict from features (the forms :meth:`jaxcap.api.Run.caption` accepts).

  Every array is checked first, so bad input is one ``BadInput`` naming the argument and what
  was expected, not a failure inside NumPy or JAX or empty captions: at least one image; region
  features ``[B, N, F]`` / global ``[B, Dg]`` of the dataset's sizes, finite; ``feats_mask``
  ``[B, N]`` with a real region per image; ``boxes`` ``[B, N, 4]`` normalised to [0, 1];
  ``attributes`` / ``src`` integer ids ``[B, L]`` inside their vocabularies. Given the ``model``,
  the inputs it reads (:func:`required_inputs`: boxes, attributes, a source) must be there.
  """
  if features is None:
    raise BadInput("caption: features is None; expected region features [B, N, F], global "
                     "features [B, Dg], a list of per-image arrays or a dict of batch arrays")
  if isinstance(features, Mapping):
    unknown = [k for k in features if k not in KEYS]
    if unknown:
      raise BadInput(f"caption: unknown features key {unknown[0]!r}; expected keys among "
                       f"{', '.join(KEYS)}")
    batch = {k: _array(v, f"features[{k!r}]") for k, v in features.items()}
  elif isinstance(features, (list, tuple)):
    if not len(features):
      raise BadInput(f"caption: features is an empty {type(features).__name__}; expected at "
                       "least one image ([N_i, F] region or [Dg] global arrays)")
    items = [_array(f, f"features[{i}]", np.float32) for i, f in enumerate(features)]
    batch = _stack_ragged(items, info)
  else:
    x = _array(features, "features", np.float32)
    if x.ndim == 2:
      batch = {"global_feat": x}
    elif x.ndim == 3:
      batch = {"feats": x}
    else:
      raise BadInput(f"caption: expected features [B, Dg] (global) or [B, N, F] (regions), got "
                       f"shape {x.shape}")
  if "feats" not in batch and "global_feat" not in batch:
    raise BadInput(f"caption: the features dict needs 'feats' [B, N, F] or 'global_feat' [B, Dg]; "
                     f"got keys {sorted(batch)}")
  if "feats" not in batch and not getattr(model, "reads_regions", True) and "global_feat" in batch:
    g = _array(batch["global_feat"], "features['global_feat']", np.float32)
    if g.ndim != 2 or g.shape[1] != int(info["global_dim"]):
      raise BadInput(f"caption: expected global features [B, {info['global_dim']}], got shape {g.shape}")
    batch["feats"] = np.zeros((len(g), 1, int(info["feature_dim"])), np.float32)  # never read
  if "feats" not in batch:
    if int(info["max_regions"]) != 1:
      raise BadInput(f"caption: this model reads region features 'feats' [B, N, {info['feature_dim']}] "
                       f"(its dataset has up to {info['max_regions']} regions per image); "
                       "give them, not only the global feature")
    g = _array(batch["global_feat"], "features['global_feat']", np.float32)
    if g.ndim != 2 or g.shape[1] != int(info["global_dim"]):
      raise BadInput(f"caption: expected global features [B, {info['global_dim']}], got shape "
                       f"{g.shape}")
    batch["feats"] = g[:, None, :]  # global-only datasets: one region
  feats = batch["feats"] = _array(batch["feats"], "features['feats']", np.float32)
  if feats.ndim != 3 or feats.shape[-1] != int(info["feature_dim"]):
    raise BadInput(f"caption: expected region features [B, N, {info['feature_dim']}], got shape "
                     f"{feats.shape}")
  b, n = feats.shape[:2]
  if b == 0 or n == 0:
    raise BadInput(f"caption: region features of shape {feats.shape} hold no "
                     f"{'image' if b == 0 else 'region'}; expected at least one image with at "
                     "least one region")
  valid = batch["valid"] = _array(batch.get("valid", np.ones((b,), bool)), "features['valid']",
                                  bool)
  if valid.shape != (b,):
    raise BadInput(f"caption: features['valid'] has shape {valid.shape}, expected [{b}]")
  mask = batch["feats_mask"] = _array(batch.get("feats_mask", np.ones((b, n), bool)),
                                      "features['feats_mask']", bool)
  if mask.shape != (b, n):
    raise BadInput(f"caption: features['feats_mask'] has shape {mask.shape}, expected [B, N] = "
                     f"[{b}, {n}] like the region features")
  empty = valid & ~mask.any(1)
  if empty.any():
    raise BadInput(f"caption: features['feats_mask'] marks no region of image "
                     f"{int(np.argmax(empty))} as real; expected at least one True per image")
  _check_finite(feats[valid], "features['feats']" if isinstance(features, Mapping) else "features")
  if "global_feat" not in batch:
    if getattr(model, "reads_global_feat", True):
      w = mask[..., None].astype(np.float32)
      batch["global_feat"] = (feats * w).sum(1) / np.maximum(w.sum(1), 1.0)  # mean of the real regions
    else:  # never read: zeros of the run's width (its regions may be of another)
      batch["global_feat"] = np.zeros((b, int(info["global_dim"])), np.float32)
  g = batch["global_feat"] = _array(batch["global_feat"], "features['global_feat']", np.float32)
  if g.shape != (b, int(info["global_dim"])):
    raise BadInput(f"caption: expected global features [{b}, {info['global_dim']}], got shape {g.shape}")
  _check_finite(g[valid], "features['global_feat']")
  batch.setdefault("image_index", np.arange(b, dtype=np.int32))
  needs = required_inputs(model) if model is not None else ()
  name = getattr(model, "registry_name", None) or type(model).__name__
  if "boxes" in batch:
    boxes = batch["boxes"] = _array(batch["boxes"], "features['boxes']", np.float32)
    if boxes.shape != (b, n, 4):
      raise BadInput(f"caption: features['boxes'] has shape {boxes.shape}; expected [B, N, 4] = "
                       f"[{b}, {n}, 4] (x1, y1, x2, y2 normalised to [0, 1])")
    check_boxes(boxes, "caption", field="boxes", mask=mask & valid[:, None])
  elif "boxes" in needs:
    if n > 1:
      raise BadInput(f"caption: model {name!r} builds its spatial graph from region boxes; "
                       f"expected features['boxes'] [B, N, 4] (x1, y1, x2, y2 normalised to "
                       "[0, 1]) with the region features (or ablate(graph='all_neighbour'))")
    # One region per image: its box relates it to nothing, so the whole image's will do.
    batch["boxes"] = np.tile(np.float32([0.0, 0.0, 1.0, 1.0]), (b, n, 1))
  for key, size, what in (("attributes", int(info.get("vocab_size", 0) or 0), "attribute word ids"),
                          ("src", int(info.get("src_vocab_size", 0) or 0), "source word ids")):
    if key not in batch:
      if key in needs:
        raise BadInput(f"caption: model {name!r} reads {what}; expected features[{key!r}] "
                         f"int32 [B, L] (ids of the run's {'source ' if key == 'src' else ''}"
                         "vocabulary, 0-padded)")
      continue
    if size == 0 and key not in needs:
      continue  # a source given to a run without one (or no vocabulary size known): never read
    ids = batch[key]
    if ids.ndim != 2 or len(ids) != b:
      raise BadInput(f"caption: features[{key!r}] has shape {ids.shape}; expected [B, L] = "
                       f"[{b}, L] {what}")
    if not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
      raise BadInput(f"caption: features[{key!r}] has dtype {ids.dtype}; expected integer {what}")
    rows = ids[valid]
    bad = (rows < 0) | (rows >= size)
    if bad.any():
      raise BadInput(f"caption: features[{key!r}] holds id {int(rows[bad][0])}; expected {what} "
                       f"in [0, {size}) (the run's {'source ' if key == 'src' else ''}vocabulary)")
    if key == "src" and key in needs and not (rows != 0).any(1).all():
      raise BadInput("caption: features['src'] has a row of padding only; expected at least "
                       "one source word id per image")
    batch[key] = ids.astype(np.int32)
  return batch


def _check_finite(x: np.ndarray, what: str) -> None:
  if x.size and not np.isfinite(x.sum(dtype=np.float64)):
    bad = ~np.isfinite(x).reshape(len(x), -1).all(1)
    raise BadInput(f"caption: {what} contains NaN or Inf values (image {int(np.argmax(bad))}"
                     "); expected finite numbers")


def _stack_ragged(items, info) -> dict:
  if all(x.ndim == 1 for x in items):
    sizes = {x.shape[0] for x in items}
    if len(sizes) > 1:
      raise BadInput(f"caption: the global features of a list have sizes {sorted(sizes)}; "
                       f"expected [{info['global_dim']}] each")
    return {"global_feat": np.stack(items)}
  if not all(x.ndim == 2 for x in items):
    raise BadInput("caption: a list of features holds arrays of shapes "
                     f"{[x.shape for x in items]}; expected [Dg] global or [N_i, F] region arrays")
  widths = {x.shape[-1] for x in items}
  if len(widths) > 1 or min(x.shape[0] for x in items) == 0:
    raise BadInput(f"caption: a list of region features holds arrays of shapes "
                     f"{[x.shape for x in items]}; expected [N_i, {info['feature_dim']}] arrays "
                     "with N_i >= 1")
  n = max(x.shape[0] for x in items)
  feats = np.zeros((len(items), n, items[0].shape[-1]), np.float32)
  mask = np.zeros((len(items), n), bool)
  for i, x in enumerate(items):
    feats[i, :len(x)], mask[i, :len(x)] = x, True
  return {"feats": feats, "feats_mask": mask}


