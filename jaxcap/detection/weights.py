"""The detector's weights from the reference's ``state_dict`` names (LXMERT's ``modeling_frcnn.py``:
``pytorch_model.bin`` of ``unc-nlp/frcnn-vg-finetuned``; airsplay's detectron2 pickle uses the same
names without ``num_batches_tracked``), tensor by tensor through jaxcap.features.weights' name map
machinery: a missing, unexpected or wrongly shaped tensor is one line naming it as the file does.

Conv ``weight [O, I, Kh, Kw]`` -> ``kernel [Kh, Kw, I, O]``; linear ``weight [O, I]`` ->
``kernel [I, O]``; batch norm ``weight`` / ``bias`` -> ``scale`` / ``bias``, ``running_mean`` /
``running_var`` -> ``batch_stats`` ``mean`` / ``var``; ``cell_anchors.0 [A, 4]`` -> the
``consts`` collection (the reference loads it from the file too, over its computed anchors).
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
  rpn = shape("proposal_generator.rpn_head.conv.weight")
  obj = shape("proposal_generator.rpn_head.objectness_logits.weight")
  anchors = np.asarray(tensors[CELL_ANCHORS], np.float64) if CELL_ANCHORS in tensors else None
  fields = dict(depth=depth, stem_out=stem[0], res2_out=res2[0], width_per_group=width[0],
                rpn_hidden=rpn[0], num_classes=cls[0] - 1, num_attrs=attr[0] - 1)
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
            "(unc-nlp/frcnn-vg-finetuned) or airsplay's faster_rcnn_from_caffe_attr.pkl")


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
  if not isinstance(tensors, dict):
    raise BadInput(f"{path}: holds a {type(tensors).__name__}, not a state_dict; expected {EXPECTED}")
  out = {}
  for k, v in tensors.items():
    if not isinstance(k, str) or not isinstance(v, np.ndarray) or v.dtype.kind not in "fiub":
      what = f"a {v.dtype} array" if isinstance(v, np.ndarray) else f"a {type(v).__name__}"
      raise BadInput(f"{path}: entry {k!r:.80} is {what}, not a numeric array; expected {EXPECTED}")
    out[k] = v
  return fw.check_finite(out, path)


def load(path: str, **settings):
  """``(DetectorConfig, variables)`` of the checkpoint at ``path``; ``settings``: the inference
  fields a checkpoint does not hold (DetectorConfig)."""
  tensors = read(path)
  cfg = config_from_state_dict(tensors, str(path), **settings)
  return cfg, from_state_dict(tensors, cfg, str(path))
