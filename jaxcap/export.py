"""A run's whole captioner as one file that runs with jax and numpy only (``jaxcap-export``).

Dimension legend: b the symbolic batch size, n the symbolic number of regions (N ``max_regions``
where the model's encoder needs a fixed count), F ``feature_dim``, Dg
``global_dim``, T ``max_len`` decoding steps, S the backbone's square image side, K beams.

:func:`export` writes a zip (:data:`jaxcap.serving.artefact.FORMAT`) holding

- ``metadata.json``: the vocabulary (``itos``), the decoding settings (the run's ``decode``
  section with ``method`` / ``beam_size`` / ``max_len`` overridden), the run's identity (config
  hash as :mod:`jaxcap.evaluation.signature` hashes it, checkpoint step, ``features.json``
  record), the input spec (which batch keys the encoder reads, their shapes and dtypes) and
  what each function returns;
- ``params.npz`` (the model's variables) and ``backbone.npz`` (the image backbone's, when the
  run has one: its ``features.json`` backbone, or for a run from pixels the trained backbone,
  whose captioner's variables are then ``params.npz``), each array once, in ``jax.tree.leaves``
  order;
- ``greedy.jaxexport`` and ``beam.jaxexport``: ``jax.export`` of ``(param leaves, batch) ->
  {"tokens" [b, T], "attention" [b, T, ...]}`` (beam search's best hypothesis), encoder and
  search in one program, the region axis symbolic too (``metadata.inputs.symbolic_regions``:
  a request runs at a bucket of its own region count, :func:`jaxcap.data.batch.bucket`, not
  padded to ``max_regions``); ``features.jaxexport``: ``(backbone leaves, images uint8 [b, S, S, 3])
  -> batch``, the backbone and the layout :func:`jaxcap.data.base.image_features_batch` gives
  its features. Serialized StableHLO with the batch size symbolic, lowered for each of
  ``platforms``.

The parameters are arguments, not constants baked into the programs: the three programs share
one copy of them (baked in, each program would carry its own), the file is the size of the
arrays plus a few hundred kB of programs, and loading is reading arrays, not parsing
constants out of MLIR bytecode (XLA also constant-folds large baked-in weights slowly).

:mod:`jaxcap.serving.artefact` reads the file back without flax or any jaxcap model module.
"""

from __future__ import annotations

import io
import json
import os
import sys
import zipfile

import numpy as np
import jax
import jax.numpy as jnp

from jaxcap import atomic, decoding, run_dir
from jaxcap.data import base as data_base
from jaxcap.data import batch as batch_lib
from jaxcap.errors import BadInput, first_line
from jaxcap.evaluation import signature
from jaxcap.features import extract as extract_lib
from jaxcap.serving import artefact

PLATFORMS = ("cpu", "cuda")
METHODS = ("greedy", "beam")
# Batch keys an encoder may read from a user's features (the rest are training's).
_INPUT_KEYS = ("feats", "feats_mask", "boxes", "global_feat", "attributes", "src")


class _Recording(dict):
  """A batch dict that notes which keys the encoder reads."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.read: set = set()

  def __getitem__(self, key):
    self.read.add(key)
    return super().__getitem__(key)

  def get(self, key, default=None):
    self.read.add(key)
    return super().get(key, default)

  def __contains__(self, key):
    self.read.add(key)
    return super().__contains__(key)


# The region axis of these keys is symbolic ("n") in the exported programs: a request is padded to
# a bucket of its own region count (jaxcap.data.batch.bucket), not to max_regions.
_REGION_KEYS = ("feats", "feats_mask", "boxes")


def input_spec(model, params, info: dict, symbolic_regions: bool = True) -> dict:
  """``{key: (shape with "b", dtype name)}`` of the batch keys ``model.encode`` reads, at the
  padded sizes the exported programs take ("n" for the region axis when ``symbolic_regions``,
  else N = ``max_regions``; A = ``max_attributes``, Ls = ``src_max_len + 1``)."""
  has_src = bool(info.get("src_vocab_size", 0))
  shapes = batch_lib.shapes(info, 1, 1, has_src)
  dummy = batch_lib.dummy(info, 1)
  probe = _Recording({k: jnp.asarray(dummy[k]) for k in _INPUT_KEYS if k in dummy})
  jax.eval_shape(lambda p: model.apply(p, probe, method="encode"), params)
  if not probe.read:
    raise ValueError("export: the model's encode read no batch key; expected it to read features")
  out = {}
  for k in _INPUT_KEYS:
    if k in probe.read:
      rest = tuple(shapes[k][0][1:])
      if symbolic_regions and k in _REGION_KEYS:
        rest = ("n",) + rest[1:]
      out[k] = (("b",) + rest, np.dtype(shapes[k][1]).name)
  return out


def _symbolic(spec: dict, scope) -> dict:
  out = {}
  for key, (shape, dtype) in spec.items():
    dims = jax.export.symbolic_shape(",".join(str(d) for d in shape), scope=scope)
    out[key] = jax.ShapeDtypeStruct(dims, np.dtype(dtype))
  return out


def _leaf_specs(leaves) -> tuple:
  return tuple(jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves)


def decode_settings(run, method=None, beam_size=None, max_len=None) -> dict:
  """Every decoding option (:data:`jaxcap.decoding._DEFAULTS` under the run's ``decode``
  section) with the given ones replacing them; one line for a method that is not exported."""
  extra = {} if max_len is None else {"max_len": int(max_len)}
  cfg = {**decoding._DEFAULTS, **run.decode_config(method, beam_size, **extra)}  # pylint: disable=protected-access
  if cfg["method"] not in METHODS:
    raise BadInput(f"--method={cfg['method']}: expected one of {', '.join(METHODS)} (sampling is "
                   "not exported; the run's config.decode.method is the default)")
  if int(cfg["beam_size"]) < 1 or int(cfg["max_len"]) < 1:
    raise BadInput(f"--beam_size={cfg['beam_size']} / --max_len={cfg['max_len']}: expected >= 1")
  if int(cfg["beam_size"]) % int(cfg["beam_groups"]):
    raise BadInput(f"--beam_size={cfg['beam_size']}: expected a multiple of the run's "
                   f"decode.beam_groups={cfg['beam_groups']}")
  return cfg


def _decoders(run, cfg: dict, treedef):
  """``{"greedy": fn, "beam": fn}``, each ``(param leaves, batch) -> {"tokens", "attention"?}``,
  and whether the model's decode step returns ``aux["attention"]``."""
  model = run.feature_model
  bad = decoding.bad_ending_ids(run.vocab) if cfg["remove_bad_endings"] else ()
  common = dict(max_len=int(cfg["max_len"]), suppress_unk=bool(cfg["suppress_unk"]),
                min_len=int(cfg["min_len"]), bad_endings=bad)

  def outputs(out, best):
    res = {"tokens": out.tokens[:, 0] if best else out.tokens}
    att = (out.aux or {}).get("attention")
    if att is not None:
      res["attention"] = (att[:, 0] if best else att).astype(jnp.float32)
    return res

  def greedy(leaves, batch):
    params = jax.tree.unflatten(treedef, leaves)
    return outputs(decoding.greedy(model, params, batch, return_aux=("attention",), **common), False)

  def beam(leaves, batch):
    params = jax.tree.unflatten(treedef, leaves)
    out = decoding.beam_search(
        model, params, batch, beam_size=int(cfg["beam_size"]), beam_mode=cfg["beam_mode"],
        length_penalty=cfg["length_penalty"], alpha=float(cfg["alpha"]),
        block_trigrams=bool(cfg["block_trigrams"]), beam_groups=int(cfg["beam_groups"]),
        diversity_strength=float(cfg["diversity_strength"]), return_aux=("attention",),
        **dict(common, suppress_unk=decoding.beam_suppresses_unk(cfg)))
    return outputs(out, True)

  return {"greedy": greedy, "beam": beam}


def _image_layout(run, record: dict, spec: dict):
  """``(module, layout)``: the recorded backbone and ``layout(fc [b, D], att [b, C, D]) ->
  batch`` in JAX, what :func:`jaxcap.data.base.image_features_batch` computes in numpy."""
  info, get = run.info, run.image_layout.get
  n, grid = int(info["max_regions"]), bool(get("grid", False))
  if get("att_dir") and get("box_dir") and not grid:
    raise BadInput(f"export: this run read region boxes from data.box_dir={get('box_dir')!r}; "
                   "expected a run on jaxcap-extract's grid features (or export with --no_backbone)")

  def layout(fc_BxD, att_BxCxD):
    if get("att_dir"):
      regions = att_BxCxD
      c = regions.shape[1]
      boxes_Cx4 = (data_base.grid_boxes(int(round(np.sqrt(c)))) if grid
                   else np.tile(np.float32([0, 0, 1, 1]), (c, 1)))
      glob = fc_BxD if get("fc_dir") else regions.mean(1)  # the mean over every cell, as the reader
    else:
      regions, boxes_Cx4, glob = fc_BxD[:, None, :], np.float32([[0, 0, 1, 1]]), fc_BxD
    k = min(regions.shape[1], n)  # regions beyond max_regions dropped, as collate drops them
    pad = ((0, 0), (0, n - k), (0, 0))
    batch = {"feats": jnp.pad(regions[:, :k].astype(jnp.float32), pad),
             "feats_mask": jnp.broadcast_to(jnp.arange(n) < k, (regions.shape[0], n)),
             "boxes": jnp.broadcast_to(jnp.pad(jnp.asarray(boxes_Cx4[:k]), pad[1:]), (regions.shape[0], n, 4)),
             "global_feat": glob.astype(jnp.float32)}
    return {key: batch[key] for key in spec if key in batch}

  return layout


def export(run, path: str, *, method: str | None = None, beam_size: int | None = None,
           max_len: int | None = None, platforms=PLATFORMS, weights: str | None = None,
           backbone: bool = True, log=None) -> dict:
  """Writes ``run``'s captioner to ``path`` (see the module docstring); returns its metadata.

  Args:
    run: a :class:`jaxcap.api.Run`.
    path: the file to write (atomically: nothing is left on failure).
    method, beam_size, max_len: the default decoding, replacing the run's ``config.decode``;
      both greedy and beam search (at ``beam_size``) are exported either way.
    platforms: what the programs are lowered for (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``).
    weights: the backbone's ``.safetensors`` file when the run's ``features.json`` records one.
    backbone: include the run's image backbone (when it has a ``features.json``).
    log: receives notes (default: stderr).

  Raises:
    BadInput: one line, for settings the run cannot export (a sampling method, a backbone's
      weights missing or not the recorded ones, features whose width is not the run's).
  """
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  cfg = decode_settings(run, method, beam_size, max_len)
  info = run.feature_info
  # A run from pixels exports as a feature run whose backbone is its trained one: the decoders
  # take its captioner's features, features.jaxexport computes them from images.
  leaves, treedef = jax.tree.flatten(jax.device_get(run.feature_params))
  leaves = [np.asarray(x) for x in leaves]
  decoders = _decoders(run, cfg, treedef)
  # The region axis symbolic, so that a request runs at its own number of regions (bucketed),
  # not padded to max_regions (100 for an import: a 36-region request ran as 100); a model whose
  # encoder needs a fixed region count (shape polymorphism refused) is exported at max_regions.
  for symbolic_regions in (True, False):
    spec = input_spec(run.feature_model, run.feature_params, info, symbolic_regions)
    scope = jax.export.SymbolicScope()
    batch_specs = _symbolic(spec, scope)
    programs, outputs = {}, {}
    try:
      for name, fn in decoders.items():
        exp = jax.export.export(jax.jit(fn), platforms=tuple(platforms))(_leaf_specs(leaves), batch_specs)
        programs[name] = exp.serialize()
        outputs[name] = {k: [str(d) for d in a.shape] for k, a in
                         zip(sorted(exp.out_tree.unflatten(range(len(exp.out_avals)))), _sorted_avals(exp))}
      break
    except jax.errors.InconclusiveDimensionOperation as e:
      if not symbolic_regions or not any(k in spec for k in _REGION_KEYS):
        raise
      log(f"note: the model's encoder needs a fixed number of regions ({first_line(e)}); "
          f"exported at max_regions={info['max_regions']}")

  if run.from_pixels:
    if weights is not None:
      run.backbone(weights)  # its one-line refusal: the weights are the checkpoint's
    record = run.backbone().record
  else:
    record = run_dir.read_features_record(run.workdir) if run.workdir else None
  bb_meta, bb_leaves = None, None
  if record is not None and backbone:
    size = extract_lib.parse_size(record["size"], "features.json: size")
    if size == extract_lib.NATIVE:
      log("note: the run's features were extracted at each image's native size; the backbone is "
          "not exported (caption features, or re-extract with a fixed --size)")
    else:
      bb = run.backbone(weights)
      dim = int(record.get("feature_dim") or 0)
      if dim and dim != int(info["feature_dim"]):
        raise BadInput(f"export: features.json records feature_dim={dim}, the run has "
                       f"{info['feature_dim']}; expected the backbone the run was trained on")
      layout = _image_layout(run, record, spec)
      bb_leaves_tree, bb_treedef = jax.tree.flatten(jax.device_get(bb.variables))
      bb_leaves = [np.asarray(x) for x in bb_leaves_tree]

      def features(leaves, images):
        feats = bb.module.apply(jax.tree.unflatten(bb_treedef, leaves), images)
        att = feats["att"].astype(jnp.float32)
        return layout(feats["fc"].astype(jnp.float32), att.reshape(att.shape[0], -1, att.shape[-1]))

      images = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b,{size},{size},3", scope=scope), np.uint8)
      exp = jax.export.export(jax.jit(features), platforms=tuple(platforms))(_leaf_specs(bb_leaves), images)
      programs["features"] = exp.serialize()
      bb_meta = {"size": size, "backbone": record["backbone"], "weights": record["weights"]}

  decode_meta = {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in cfg.items()}
  metadata = {
      "format": artefact.FORMAT, "format_version": artefact.FORMAT_VERSION,
      "jaxcap": signature.jaxcap_version(), "jax": jax.__version__,
      "model": getattr(run.feature_model, "registry_name", type(run.feature_model).__name__),
      "platforms": list(platforms),
      "run": {"workdir": os.path.abspath(run.workdir) if run.workdir else None, "step": run.step,
              "config_hash": signature.config_hash(run.config),
              "vocab_hash": signature.short_hash(run.vocab.itos), "features_record": record,
              "ablations": {k: v for k, v in run.ablations.items()
                            if v is None or isinstance(v, (bool, int, float, str))}},
      "vocab": list(run.vocab.itos),
      "decode": decode_meta,
      "inputs": {"reads": sorted(spec), "arrays": {k: {"shape": list(s), "dtype": d} for k, (s, d) in spec.items()},
                 "max_regions": int(info["max_regions"]),
                 "symbolic_regions": symbolic_regions and any(k in spec for k in _REGION_KEYS),
                 "feature_dim": int(info["feature_dim"]),
                 "global_dim": int(info["global_dim"]), "vocab_size": int(info["vocab_size"]),
                 "src_vocab_size": int(info.get("src_vocab_size", 0) or 0)},
      "required": list(batch_lib.required_inputs(run.model)),
      "outputs": outputs,
      "attention": "attention" in outputs["greedy"],
      "backbone": bb_meta,
      "params": {"arrays": len(leaves), "bytes": int(sum(x.nbytes for x in leaves)),
                 "backbone_arrays": len(bb_leaves or []),
                 "backbone_bytes": int(sum(x.nbytes for x in bb_leaves or []))},
  }
  members = {"metadata.json": (json.dumps(metadata, indent=1, default=str) + "\n").encode(),
             "params.npz": _npz(leaves)}
  if bb_leaves is not None:
    members["backbone.npz"] = _npz(bb_leaves)
  for name, blob in programs.items():
    members[f"{name}.jaxexport"] = bytes(blob)

  def write(f):
    # Stored, not deflated: the arrays hardly compress and loading should not inflate them.
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
      for name, blob in members.items():
        z.writestr(name, blob)

  atomic.write_with(path, write)
  return metadata


def _sorted_avals(exp):
  tree = exp.out_tree.unflatten(list(exp.out_avals))
  return [tree[k] for k in sorted(tree)]


def _npz(leaves) -> bytes:
  buf = io.BytesIO()
  # Non-numpy dtypes (bfloat16) as raw bytes of the same width; the programs' input avals give
  # the dtype back on loading.
  np.savez(buf, *[x if x.dtype.kind != "V" and x.dtype.isbuiltin else x.view(f"u{x.dtype.itemsize}")
                  for x in leaves])
  return buf.getvalue()
