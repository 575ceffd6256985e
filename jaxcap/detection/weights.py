"""The detector's weights from the reference's ``state_dict`` names (LXMERT's ``modeling_frcnn.py``:
``pytorch_model.bin`` of ``unc-nlp/frcnn-vg-finetuned``; airsplay's detectron2 pickle uses the same
names without ``num_batches_tracked``), tensor by tensor through jaxcap.features.weights' name map
machinery: a missing, unexpected or wrongly shaped tensor is one line naming it as the file does.

Conv ``weight [O, I, Kh, Kw]`` -> ``kernel [Kh, Kw, I, O]``; linear ``weight [O, I]`` ->
``kernel [I, O]``; batch norm ``weight`` / ``bias`` -> ``scale`` / ``bias``, ``running_mean`` /
``running_var`` -> ``batch_stats`` ``mean`` / ``var``; ``cell_anchors.0 [A, 4]`` -> the
``consts`` collection (the reference loads it from the file too, over its computed anchors).

MILVLG/bottom-up-attention.pytorch's ``bua-caffe-frcn-r101*.pth`` (the Caffe model's blobs under
detectron2 names, read by its ``bua/caffe`` modules) is not a renaming: :func:`from_bua_caffe`
turns its head tensors into the reference's, exactly where the two compute the same thing, and
sets ``DetectorConfig.bua_caffe`` (its "+1" box geometry, which no tensor can absorb):

* RPN objectness ``[2A]``: a 2-way softmax, channels ``[0, A)`` background and ``[A, 2A)``
  object (its ``view(N, 2, A, H, W)``); its object probability is ``sigmoid(fg - bg)``, so the
  sigmoid-form logit's weights are ``w[A + a] - w[a]`` (same for the bias).
* ``cls_score`` / ``cls_embed`` ``[K + 1]``: background at row 0 -> rows ``[1..K, 0]``
  (background last).
* ``bbox_pred`` ``[4 (K + 1)]``: class-specific, background's 4 rows first -> dropped; its
  deltas are decoded with weights (1, 1, 1, 1) (Caffe baked the (0.1, 0.1, 0.2, 0.2) stds in).
* ``attr_linear1`` -> ``fc_attr``; ``attr_linear2`` ``[T + 1]``, no-attribute at row 0 ->
  ``attr_score`` rows ``[1..T, 0]``.
* anchors: the file's ``cell_anchors.0`` where it holds them (detectron2 then saved its
  anchor buffers; its channels follow them), else py-faster-rcnn's ``generate_anchors`` (base 16,
  ratios 0.5 / 1 / 2, scales 4 / 8 / 16 / 32, ratio-major: the Caffe model's, the order of its
  blobs' channels) -- an assumption: the checkpoint itself was not available to read.
* ``min_box_size`` 16 (its configs' ``PROPOSAL_GENERATOR.MIN_SIZE``).
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.detection import boxes as box_ops
from jaxcap.detection.frcnn import BLOCKS, Detector, DetectorConfig
from jaxcap.errors import BadInput
from jaxcap.features import weights as fw

CELL_ANCHORS = "proposal_generator.anchor_generator.cell_anchors.0"


def abstract_variables(cfg: DetectorConfig):
  model = Detector(cfg)
  x = jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32)
  hw = jax.ShapeDtypeStruct((1, 2), jnp.int32)
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), x, hw)


def _conv_bn(shapes, torch_prefix: str, path) -> dict:
  out = {f"{torch_prefix}.weight": fw._conv(shapes, ("params",) + path + ("conv", "kernel"))}
  out.update(fw._batch_norm(shapes, f"{torch_prefix}.norm", path + ("norm",)))
  return out


def _block(shapes, torch_prefix: str, path, shortcut: bool) -> dict:
  out = {}
  for k in ("conv1", "conv2", "conv3") + (("shortcut",) if shortcut else ()):
    out.update(_conv_bn(shapes, f"{torch_prefix}.{k}", path + (k,)))
  return out


def name_map(cfg: DetectorConfig) -> dict:
  """Reference name -> :class:`jaxcap.features.weights.Target` for every variable of ``cfg``'s
  detector."""
  shapes = fw._leaf_shapes(abstract_variables(cfg))
  out = _conv_bn(shapes, "backbone.stem.conv1", ("backbone", "stem_conv1"))
  for stage, n in enumerate(BLOCKS[cfg.depth][:3]):
    for i in range(n):
      out.update(_block(shapes, f"backbone.res{stage + 2}.{i}", ("backbone", f"res{stage + 2}_{i}"), i == 0))
  for i in range(3):
    out.update(_block(shapes, f"roi_heads.res5.{i}", ("res5", f"res5_{i}"), i == 0))
  rpn = "proposal_generator.rpn_head"
  for k in ("conv", "objectness_logits", "anchor_deltas"):
    out[f"{rpn}.{k}.weight"] = fw._conv(shapes, ("params", "rpn_head", k, "kernel"))
    out[f"{rpn}.{k}.bias"] = fw._same(shapes, ("params", "rpn_head", k, "bias"))
  head = "roi_heads.box_predictor"
  for k in ("cls_score", "bbox_pred", "fc_attr", "attr_score"):
    out[f"{head}.{k}.weight"] = fw._linear(shapes, ("params", "box_predictor", k, "kernel"))
    out[f"{head}.{k}.bias"] = fw._same(shapes, ("params", "box_predictor", k, "bias"))
  out[f"{head}.cls_embedding.weight"] = fw._same(shapes, ("params", "box_predictor", "cls_embedding", "embedding"))
  out[CELL_ANCHORS] = fw._same(shapes, ("consts", "cell_anchors"))
  return out


BUA_HEAD = "roi_heads.box_predictor."
BUA_RPN = "proposal_generator.rpn_head."
# The settings a bua-caffe file implies (its configs/caffe/test-caffe-r101.yaml and box coder).
BUA_SETTINGS = {"bua_caffe": True, "bbox_reg_weights": (1.0, 1.0, 1.0, 1.0), "min_box_size": 16.0}


def is_bua_caffe(tensors: dict) -> bool:
  """MILVLG's bua-caffe layout: its attribute head's names (``cls_embed``, ``attr_linear1``)."""
  return f"{BUA_HEAD}cls_embed.weight" in tensors or f"{BUA_HEAD}attr_linear1.weight" in tensors


def from_bua_caffe(tensors: dict, source: str = "state_dict") -> tuple[dict, dict]:
  """``(tensors under the reference's names, settings)`` of a MILVLG bua-caffe state_dict (the
  module docstring gives each conversion). A missing or wrongly shaped tensor is one line
  naming it as the file does."""
  def get(name, rows_mod=None):
    if name not in tensors:
      raise BadInput(f"{source}: missing tensor {name}: expected MILVLG's bua-caffe state_dict "
                     f"(bottom-up-attention.pytorch's bua/caffe names)")
    v = np.asarray(tensors[name])
    if rows_mod and (v.ndim < 1 or v.shape[0] % rows_mod or v.shape[0] < 2 * rows_mod):
      raise BadInput(f"{source}: tensor {name} {list(v.shape)}: expected a multiple of {rows_mod} rows "
                     f"(at least {2 * rows_mod}) in the bua-caffe layout")
    return v

  out = {k: v for k, v in tensors.items() if not k.startswith((BUA_HEAD, f"{BUA_RPN}objectness_logits."))}
  for p in ("weight", "bias"):
    obj = get(f"{BUA_RPN}objectness_logits.{p}", 2)
    a = obj.shape[0] // 2
    # softmax([bg, fg])[fg] = sigmoid(fg - bg): the sigmoid form's logit is the difference.
    out[f"{BUA_RPN}objectness_logits.{p}"] = (obj[a:].astype(np.float64) - obj[:a]).astype(np.float32)
  cls_w = get(f"{BUA_HEAD}cls_score.weight")
  k1 = cls_w.shape[0]
  bg_last = np.r_[1:k1, 0]
  for p in ("weight", "bias"):
    out[f"{BUA_HEAD}cls_score.{p}"] = get(f"{BUA_HEAD}cls_score.{p}")[bg_last]
    box = get(f"{BUA_HEAD}bbox_pred.{p}")
    if box.shape[0] != 4 * k1:
      raise BadInput(f"{source}: tensor {BUA_HEAD}bbox_pred.{p} has {box.shape[0]} rows; expected "
                     f"4 x {k1} (class-specific, background first, as cls_score's {k1} classes)")
    out[f"{BUA_HEAD}bbox_pred.{p}"] = box[4:]
    out[f"{BUA_HEAD}fc_attr.{p}"] = get(f"{BUA_HEAD}attr_linear1.{p}")
    attr = get(f"{BUA_HEAD}attr_linear2.{p}")
    out[f"{BUA_HEAD}attr_score.{p}"] = attr[np.r_[1:attr.shape[0], 0]]
  emb = get(f"{BUA_HEAD}cls_embed.weight")
  if emb.shape[0] != k1:
    raise BadInput(f"{source}: tensor {BUA_HEAD}cls_embed.weight has {emb.shape[0]} rows; expected "
                   f"{k1} (one per class of cls_score)")
  out[f"{BUA_HEAD}cls_embedding.weight"] = emb[bg_last]
  known = {f"{BUA_HEAD}{n}.{p}" for n in ("cls_score", "bbox_pred", "attr_linear1", "attr_linear2")
           for p in ("weight", "bias")} | {f"{BUA_HEAD}cls_embed.weight"}
  extra = sorted(k for k in tensors if k.startswith(BUA_HEAD) and k not in known)
  if extra:
    raise BadInput(f"{source}: unexpected tensor {extra[0]} in the bua-caffe box predictor")
  if CELL_ANCHORS not in out:
    a = out[f"{BUA_RPN}objectness_logits.weight"].shape[0]
    anchors = box_ops.caffe_cell_anchors()
    if a != anchors.shape[0]:
      raise BadInput(f"{source}: no {CELL_ANCHORS} and {a} anchors per cell; the Caffe model's "
                     f"anchors (scales 4-32 x ratios 0.5-2) are {anchors.shape[0]}")
    out[CELL_ANCHORS] = anchors
  return out, dict(BUA_SETTINGS)


def config_from_state_dict(tensors: dict, source: str = "state_dict", **settings) -> DetectorConfig:
  """The detector's shape read off the tensors' shapes (depth from the res4 block count, widths,
  classes, attributes, anchors per cell); ``settings`` are the inference fields the file does
  not hold (DetectorConfig's defaults otherwise)."""
  def shape(name):
    if name not in tensors:
      raise BadInput(f"{source}: missing tensor {name}: expected the bottom-up-attention detector's "
                     f"state_dict (LXMERT's modeling_frcnn.py names)")
    return tuple(np.shape(tensors[name]))

  res4 = {int(m.group(1)) for k in tensors for m in [re.match(r"backbone\.res4\.(\d+)\.", k)] if m}
  depth = {n[2]: d for d, n in BLOCKS.items()}.get(len(res4))
  if depth is None:
    raise BadInput(f"{source}: {len(res4)} res4 blocks; expected one of "
                   f"{sorted(n[2] for n in BLOCKS.values())} (ResNet-50 / 101 / 152)")
  stem = shape("backbone.stem.conv1.weight")
  res2 = shape("backbone.res2.0.conv3.weight")
  width = shape("backbone.res2.0.conv1.weight")
  cls = shape("roi_heads.box_predictor.cls_score.weight")
  attr = shape("roi_heads.box_predictor.attr_score.weight")
  embed = shape("roi_heads.box_predictor.cls_embedding.weight")
  hidden = shape("roi_heads.box_predictor.fc_attr.weight")
  rpn = shape("proposal_generator.rpn_head.conv.weight")
  obj = shape("proposal_generator.rpn_head.objectness_logits.weight")
  anchors = np.asarray(tensors[CELL_ANCHORS], np.float64) if CELL_ANCHORS in tensors else None
  fields = dict(depth=depth, stem_out=stem[0], res2_out=res2[0], width_per_group=width[0],
                rpn_hidden=rpn[0], num_classes=cls[0] - 1, num_attrs=attr[0] - 1)
  feature = res2[0] * 8
  # The attribute head's widths: 0 (D / 8, D / 4) where they follow the reference's rule.
  fields.update(attr_embed=0 if embed[1] == feature // 8 else embed[1],
                attr_hidden=0 if hidden[0] == feature // 4 else hidden[0])
  cfg = DetectorConfig(**{**fields, **settings})
  if obj[0] != cfg.num_anchors:
    raise BadInput(f"{source}: tensor proposal_generator.rpn_head.objectness_logits.weight has {obj[0]} "
                   f"outputs; expected {cfg.num_anchors} (one sigmoid logit per anchor: "
                   + ("a 2-way softmax over 2A channels is the Caffe / MILVLG reading" if obj[0] == 2 * cfg.num_anchors
                      else "anchor sizes x aspect ratios") + ")")
  if anchors is not None and anchors.shape != (cfg.num_anchors, 4):
    raise BadInput(f"{source}: tensor {CELL_ANCHORS} {list(anchors.shape)}: expected [{cfg.num_anchors}, 4]")
  return cfg


def from_state_dict(tensors: dict, cfg: DetectorConfig, source: str = "state_dict"):
  """The detector's variables (``params``, ``batch_stats``, ``consts``) from reference-named
  arrays; ``num_batches_tracked`` counters are skipped. Where the file has no ``cell_anchors``
  (airsplay's pickle may not), the anchors computed from ``cfg`` are used."""
  tensors = dict(fw.check_finite(tensors, source))
  if CELL_ANCHORS not in tensors:
    tensors[CELL_ANCHORS] = box_ops.cell_anchors(cfg.anchor_sizes, cfg.aspect_ratios)
  variables, _ = fw.from_state_dict(Detector(cfg), tensors, source, name_map(cfg),
                                    ignored=lambda n: n.endswith(".num_batches_tracked"))
  return variables


EXPECTED = ("the bottom-up-attention detector's weights: LXMERT's pytorch_model.bin "
            "(unc-nlp/frcnn-vg-finetuned), airsplay's faster_rcnn_from_caffe_attr.pkl or MILVLG's "
            "bua-caffe-frcn-r101*.pth")


def _read_pickle(path: str) -> dict:
  """airsplay's detectron2 pickle, read without running code: ``{"model": {name: ndarray}, ...}``."""
  import io  # noqa: PLC0415
  import pickle  # noqa: PLC0415
  from jaxcap.importers import torch_files  # noqa: PLC0415
  try:
    with open(path, "rb") as f:
      data = torch_files.check_lengths(io.BytesIO(f.read()))
    obj = torch_files.InfosUnpickler(data, encoding="latin1").load()
  except OSError as e:
    raise BadInput(f"{path}: cannot read ({e.strerror or e})") from None
  except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, IndexError) as e:
    first = " ".join(str(e).split())[:200] or type(e).__name__
    raise BadInput(f"{path}: not a readable pickle ({first}); expected {EXPECTED}") from None
  if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
    raise BadInput(f"{path}: no 'model' dict of arrays; expected {EXPECTED}")
  return obj["model"]


def read(path: str) -> dict:
  """``{name: float32 array}`` of a detector checkpoint (a torch ``state_dict`` file, zip or legacy,
  read without torch; or a detectron2 pickle), every value checked to be a finite array."""
  from jaxcap.importers import torch_files  # noqa: PLC0415
  path = str(path)
  if not os.path.isfile(path):
    raise BadInput(f"{path}: no such file; expected {EXPECTED}")
  with open(path, "rb") as f:
    head = f.read(2)
  # A torch file is a zip (PK) or a legacy pickle starting with its magic number; a detectron2
  # pickle starts with the pickle protocol opcode and holds the dict itself.
  if path.endswith(".pkl") and head[:1] == b"\x80":
    tensors = _read_pickle(path)
  else:
    tensors = torch_files.read(path, EXPECTED)
  if isinstance(tensors, dict) and isinstance(tensors.get("model"), dict):
    # detectron2's Checkpointer.save: {"model": state_dict, ...extras} (MILVLG's .pth files).
    tensors = tensors["model"]
  if not isinstance(tensors, dict):
    raise BadInput(f"{path}: holds a {type(tensors).__name__}, not a state_dict; expected {EXPECTED}")
  out = {}
  for k, v in tensors.items():
    if not isinstance(k, str) or not isinstance(v, np.ndarray) or v.dtype.kind not in "fiub":
      what = f"a {v.dtype} array" if isinstance(v, np.ndarray) else f"a {type(v).__name__}"
      raise BadInput(f"{path}: entry {k!r:.80} is {what}, not a numeric array; expected {EXPECTED}")
    out[k] = v
  return fw.check_finite(out, path)


def read_config(path: str, **settings):
  """``(tensors under the reference's names, DetectorConfig)`` of the checkpoint at ``path``;
  ``settings``: the inference fields a checkpoint does not hold (DetectorConfig). A bua-caffe
  file (:func:`is_bua_caffe`) brings its own geometry settings; one given that contradicts them
  is refused."""
  tensors = read(path)
  if is_bua_caffe(tensors):
    tensors, implied = from_bua_caffe(tensors, str(path))
    for k, v in implied.items():
      if k in settings and settings[k] != v:
        raise BadInput(f"{path}: {k}={settings[k]!r} contradicts the file, a MILVLG bua-caffe checkpoint "
                       f"(its reading needs {k}={v!r})")
    settings = {**settings, **implied}
  return tensors, config_from_state_dict(tensors, str(path), **settings)


def load(path: str, **settings):
  """``(DetectorConfig, variables)`` of the checkpoint at ``path`` (:func:`read_config`'s
  reading)."""
  tensors, cfg = read_config(path, **settings)
  return cfg, from_state_dict(tensors, cfg, str(path))
