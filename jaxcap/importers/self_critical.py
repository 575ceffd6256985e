"""self-critical.pytorch checkpoints as jaxcap runs.

A self-critical.pytorch training run (its code at commit 4c48a33; MODEL_ZOO.md's published
models) leaves ``model.pth`` (the model's ``state_dict``) and ``infos_<id>.pkl`` (a pickled dict:
``opt``, the argparse options the model was built from, and ``vocab``, its ``ix_to_word``).
:func:`import_checkpoint` turns the pair into a jaxcap run directory (``config.json``,
``vocab.json``, ``info.json`` and an orbax checkpoint at the run's iteration), which
``jaxcap.load``, ``evaluate.py``, ``Run.caption`` / ``ablate`` read like a run jaxcap trained.

Models (``opt.caption_model``) and the jaxcap model each becomes (:data:`IMPORTERS`):

- ``transformer``: jaxcap's ``transformer`` with ``norm_position="pre"`` and
  ``layer_norm="annotated"`` (self-critical's blocks are pre-norm with a final norm per stack and
  the Annotated Transformer's layer norm; every other equation is jaxcap's). The key projections'
  biases are dropped: the softmax cancels them exactly (:class:`jaxcap.models.layers.MultiHeadAttention`).
  jaxcap's Transformer has one dropout rate (``opt.dropout``, 0.1), where self-critical drops the
  region embedding at ``drop_prob_lm``: the same function at inference, a different rate there
  when an imported Transformer is trained further.
- ``newfc``: jaxcap's ``newfc`` (:mod:`jaxcap.models.newfc`), self-critical's FC model as it
  computes it (its LSTM has a maxout candidate and no tanh on it, so it is not Show and Tell's).

- ``aoa`` (self-critical's, and the AoANet authors' checkpoints, whose code it copied):
  jaxcap's ``aoa`` (:mod:`jaxcap.models.aoa`), the released code's equations; jaxcap's
  ``aoanet`` is the paper's reading (post-norm, no query norm, ...), a different function.

- ``updown`` / ``topdown`` (its ``UpDownModel``): jaxcap's ``updown`` (:mod:`jaxcap.models.updown`).

Other models (``att2in2``, ``adaatt``, ``stackatt``, ...) are refused in one line (with why, for
those in :data:`NOT_IMPORTED`): they have no jaxcap model whose equations are theirs yet. Options jaxcap cannot honour (``use_bn``, ``logit_layers``
> 1, a Transformer without ReLU after its region embedding, ...) are refused naming the option.

Vocabulary: self-critical's id 0 is both the start and the end of a caption and its last word is
usually ``UNK``; jaxcap's ids are ``PAD=0, BOS=1, EOS=2, UNK=3`` and the words from 4, in
self-critical's order. The embedding rows of BOS / EOS / PAD are self-critical's row 0, the
output row of EOS is its row 0, and PAD / BOS get an output bias of -1e9 (weights 0): their
probability is 0 in float32, so the log-probabilities over the other ids are self-critical's.

Reading: ``.pth`` with torch (``torch.load(..., weights_only=True)``) when torch is installed;
without torch, a ``.safetensors`` of the same ``state_dict``, which this one line writes where
torch is installed (docs/USAGE.md)::

    python -c "import torch, safetensors.torch as s; s.save_file({k: v.contiguous() for k, v in torch.load('model.pth', map_location='cpu').items()}, 'model.safetensors')"

The ``infos`` pickle is read by a restricted unpickler: plain containers, ``argparse.Namespace``,
numpy scalars / arrays and ``_codecs.encode`` (protocol 2's bytes, as its ``misc.pickle_dump``
writes them) only; anything else (a class that would run code) is refused naming it.

Decoding: the run's ``decode`` section is its ``eval.py``'s: greedy (its ``_sample``, UNK not
suppressed) by default, its beam search with UNK suppressed (``decode.beam_suppress_unk``).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import pickle
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import numpy as safetensors_numpy

from jaxcap import api, config_files, run_dir
from jaxcap.atomic import write_json
from jaxcap.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab
from jaxcap.errors import BadInput
from jaxcap.features import record as record_lib
from jaxcap.features import weights as feature_weights
from jaxcap.importers import fit, torch_files
from jaxcap.models import aoa as aoa_model
from jaxcap.models import registry
from jaxcap.training import optim, steps

# Output bias of the ids self-critical has no output for (PAD, BOS): exp(-1e9) is 0 in float32.
NO_OUTPUT_BIAS = -1e9

def read_infos(path: str) -> dict:
  """The ``infos_<id>.pkl`` dict (``opt`` as a Namespace, ``vocab``), read without running code."""
  last = None
  for encoding in ("ASCII", "latin1"):  # latin1: Python 2 pickles of older runs
    try:
      with open(path, "rb") as f:  # in memory, its lengths checked: a flipped one allocates no GiB
        data = torch_files.check_lengths(io.BytesIO(f.read()))
      infos = torch_files.InfosUnpickler(data, encoding=encoding).load()
      break
    except UnicodeDecodeError as e:
      last = e
    except OSError as e:
      raise BadInput(f"{path}: cannot read ({e.strerror or e})") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
      raise BadInput(f"{path}: not a self-critical.pytorch infos pickle ({e}); expected the "
                       "infos_<id>.pkl its train.py wrote (plain data, argparse.Namespace)") from None
  else:
    raise BadInput(f"{path}: not a self-critical.pytorch infos pickle ({last})")
  if not isinstance(infos, dict) or not isinstance(infos.get("opt"), argparse.Namespace):
    raise BadInput(f"{path}: not a self-critical.pytorch infos pickle; expected a dict with "
                     "'opt' (an argparse.Namespace) and 'vocab'")
  vocab = infos.get("vocab", getattr(infos["opt"], "vocab", None))
  if not isinstance(vocab, dict) or not vocab:
    raise BadInput(f"{path}: no 'vocab' (ix_to_word); expected the dict self-critical's "
                     "train.py saves beside 'opt'")
  return {**infos, "vocab": vocab}  # convert() reads it there, also when it was opt.vocab


SAFETENSORS_COMMAND = ("python -c \"import torch, safetensors.torch as s; s.save_file({k: v.contiguous() "
                       "for k, v in torch.load('model.pth', map_location='cpu').items()}, "
                       "'model.safetensors')\"")


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """``{name: float32 array}`` of a ``.pth`` (torch needed) or ``.safetensors`` state_dict;
  the ``module.`` prefix of a DataParallel save is removed."""
  if not os.path.isfile(path):
    raise BadInput(f"{path}: no such file; expected self-critical.pytorch's model.pth "
                     "or a model.safetensors converted from it")
  if path.endswith(".safetensors"):
    try:
      state = safetensors_numpy.load_file(path)
    except Exception as e:  # safetensors' own error types for a damaged header
      raise BadInput(f"{path}: not a safetensors file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  else:
    try:
      import torch
    except ImportError:
      raise BadInput(f"{path}: reading a .pth needs torch, which is not installed; convert it "
                       f"once where torch is (docs/USAGE.md): {SAFETENSORS_COMMAND}") from None
    try:
      raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch's unpickling errors
      first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      raise BadInput(f"{path}: not a torch state_dict ({first})") from None
    if not isinstance(raw, dict):
      raise BadInput(f"{path}: holds a {type(raw).__name__}, expected a state_dict (dict of tensors)")
    state = {k: v.detach().cpu().float().numpy() for k, v in raw.items() if hasattr(v, "detach")}
  feature_weights.check_finite(state, path)
  return {(k[len("module."):] if k.startswith("module.") else k): np.asarray(v, np.float32)
          for k, v in state.items()}


# ---------------------------------------------------------------------------------------------
# Vocabulary.


def vocabulary(ix_to_word: dict) -> tuple[Vocab, np.ndarray]:
  """jaxcap's vocabulary of self-critical's ``ix_to_word`` and, per jaxcap id, the
  self-critical id whose rows it takes (-1: none, i.e. UNK when self-critical has no ``UNK``)."""
  try:
    words = {int(k): str(w) for k, w in ix_to_word.items()}
  except (TypeError, ValueError, OverflowError):
    raise BadInput("infos vocab: expected ix_to_word, a dict of '1', '2', ... -> word") from None
  if sorted(words) != list(range(1, len(words) + 1)):
    raise BadInput(f"infos vocab: ids {min(words)}..{max(words)} of {len(words)} words; expected 1..{len(words)}")
  sc_of = {PAD: 0, BOS: 0, EOS: 0, UNK: -1}
  kept = []
  for i in range(1, len(words) + 1):
    w = words[i]
    if w == "UNK":
      sc_of[UNK] = i
    elif w in SPECIALS or w in kept:
      raise BadInput(f"infos vocab: word {w!r} (id {i}) is a jaxcap special token or repeated")
    else:
      sc_of[len(SPECIALS) + len(kept)] = i
      kept.append(w)
  vocab = Vocab(kept)
  return vocab, np.array([sc_of[j] for j in range(len(vocab))], np.int64)


def input_rows(table_VxE: np.ndarray, sc_of: np.ndarray) -> np.ndarray:
  """Embedding rows in jaxcap's id order (no self-critical row: zeros)."""
  out = table_VxE[np.maximum(sc_of, 0)].copy()
  out[sc_of < 0] = 0
  return out


def output_rows(weight_VxD: np.ndarray, bias_V: np.ndarray, sc_of: np.ndarray):
  """An output layer's ``(kernel [D, V'], bias [V'])`` in jaxcap's id order: PAD and BOS (and
  UNK without a self-critical UNK) get zero weights and :data:`NO_OUTPUT_BIAS`."""
  w, b = weight_VxD[np.maximum(sc_of, 0)].copy(), bias_V[np.maximum(sc_of, 0)].copy()
  none = sc_of < 0
  none[[PAD, BOS]] = True
  w[none], b[none] = 0.0, NO_OUTPUT_BIAS
  return w.T, b


# ---------------------------------------------------------------------------------------------
# Models.


class _Tensors:
  """The state_dict, handed out once per name, so that an unmapped tensor is detected."""

  def __init__(self, state: dict, path: str):
    self.state, self.path, self.used = state, path, set()

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.state:
      raise BadInput(f"{self.path}: no tensor {name!r}; expected a self-critical.pytorch "
                       "state_dict of the model its infos describe")
    self.used.add(name)
    return self.state[name]

  def ignore(self, *prefixes: str) -> None:
    self.used |= {k for k in self.state if k.startswith(prefixes)}

  def check_all_used(self) -> None:
    left = sorted(set(self.state) - self.used)
    if left:
      raise BadInput(f"{self.path}: {len(left)} tensors this importer does not map, e.g. "
                       f"{left[0]!r}; expected exactly the model the infos describe")


def _dense(t: _Tensors, prefix: str) -> dict:
  return {"kernel": t(prefix + ".weight").T, "bias": t(prefix + ".bias")}


def _heads(t: _Tensors, prefix: str, heads: int, bias: bool = True) -> dict:
  w = t(prefix + ".weight")  # [H*Dh, D]: torch splits the output as view(..., H, Dh)
  out = {"kernel": w.T.reshape(w.shape[1], heads, -1)}
  if bias:
    out["bias"] = t(prefix + ".bias").reshape(heads, -1)
  else:
    t(prefix + ".bias")  # read: the softmax cancels a key bias (module docstring)
  return out


def _attention(t: _Tensors, prefix: str, heads: int) -> dict:
  wo = t(prefix + ".linears.3.weight")  # [D, H*Dh]
  return {"query": _heads(t, prefix + ".linears.0", heads),
          "key": _heads(t, prefix + ".linears.1", heads, bias=False),
          "value": _heads(t, prefix + ".linears.2", heads),
          "out": {"kernel": wo.T.reshape(heads, -1, wo.shape[0]), "bias": t(prefix + ".linears.3.bias")}}


def _norm(t: _Tensors, prefix: str) -> dict:
  return {"scale": t(prefix + ".a_2"), "bias": t(prefix + ".b_2")}


def _ffn(t: _Tensors, prefix: str) -> dict:
  return {"fc1": _dense(t, prefix + ".w_1"), "fc2": _dense(t, prefix + ".w_2")}


def _opt(opt, name: str, default=None):
  return getattr(opt, name, default)


_REQUIRED = object()


def _number(value, kind, what: str):
  """``kind(value)`` (int or float); one line naming the infos field ``what`` when it is none."""
  try:
    return kind(value)
  except (TypeError, ValueError, OverflowError):
    raise BadInput(f"infos {what}={value!r:.60}: expected {'an integer' if kind is int else 'a number'}") from None


def _num(opt, name: str, kind, default=_REQUIRED):
  """``kind(opt.<name>)`` (``default`` when the option is absent); one line naming the option
  when it is missing without a default or is not a number."""
  value = getattr(opt, name, default)
  if value is _REQUIRED:
    raise BadInput(f"infos opt.{name}: missing; expected the option self-critical's opts.py "
                   "sets (the infos of the model's training run)")
  return _number(value, kind, f"opt.{name}")


def _refuse(option: str, value, expected: str):
  raise BadInput(f"infos opt.{option}={value!r}: jaxcap cannot honour it; expected {expected}")


def _common_checks(opt) -> None:
  if _opt(opt, "use_bn", 0):
    _refuse("use_bn", opt.use_bn, "0 (batch norm on the region features has no jaxcap model)")
  if _opt(opt, "logit_layers", 1) != 1:
    _refuse("logit_layers", opt.logit_layers, "1")


def _region_checks(opt) -> None:
  """Options of its DataLoader that change the region features a model reads."""
  for option in ("norm_att_feat", "use_box"):
    if _opt(opt, option, 0):
      _refuse(option, getattr(opt, option), "0 (features as jaxcap's data reads them)")


def transformer_fields(opt) -> dict:
  _common_checks(opt)
  _region_checks(opt)
  layers = _num(opt, "num_layers", int)
  return dict(name="transformer", dim=_num(opt, "d_model", int, _num(opt, "input_encoding_size", int)),
              num_layers=_num(opt, "N_enc", int, layers), num_dec_layers=_num(opt, "N_dec", int, layers),
              num_heads=_num(opt, "num_att_heads", int, 8), ff_dim=_num(opt, "d_ff", int, _num(opt, "rnn_size", int)),
              dropout=_num(opt, "dropout", float, 0.1), share_embeddings=False,
              region_activation="relu", norm_position="pre", layer_norm="annotated")


def transformer_params(t: _Tensors, fields: dict, sc_of: np.ndarray) -> dict:
  h = fields["num_heads"]
  t.ignore("model.tgt_embed.1.pe")  # the sinusoidal table: jaxcap computes the same one
  p = {"feat_proj": _dense(t, "att_embed.0"),
       "embed": {"embedding": input_rows(t("model.tgt_embed.0.lut.weight"), sc_of)},
       "encoder": {"final_norm": _norm(t, "model.encoder.norm")},
       "dec_final_norm": _norm(t, "model.decoder.norm")}
  kernel, bias = output_rows(t("model.generator.proj.weight"), t("model.generator.proj.bias"), sc_of)
  p["logits_proj"] = {"kernel": kernel, "bias": bias}
  for i in range(fields["num_layers"]):
    pre = f"model.encoder.layers.{i}"
    p["encoder"][f"layer_{i}"] = {
        "self_attn": _attention(t, pre + ".self_attn", h), "ffn": _ffn(t, pre + ".feed_forward"),
        "norm1": {"LayerNorm_0": _norm(t, pre + ".sublayer.0.norm")},
        "norm2": {"LayerNorm_0": _norm(t, pre + ".sublayer.1.norm")}}
  for i in range(fields["num_dec_layers"]):
    pre = f"model.decoder.layers.{i}"
    p[f"dec_layers_{i}"] = {
        "self_attn": {"mha": _attention(t, pre + ".self_attn", h)},
        "cross_attn": _attention(t, pre + ".src_attn", h), "ffn": _ffn(t, pre + ".feed_forward"),
        **{f"norm{j + 1}": {"LayerNorm_0": _norm(t, f"{pre}.sublayer.{j}.norm")} for j in range(3)}}
  return p


def newfc_fields(opt) -> dict:
  _common_checks(opt)
  return dict(name="newfc", embed_dim=_num(opt, "input_encoding_size", int), hidden_dim=_num(opt, "rnn_size", int),
              dropout=_num(opt, "drop_prob_lm", float, 0.5))


def newfc_params(t: _Tensors, fields: dict, sc_of: np.ndarray) -> dict:
  del fields
  kernel, bias = output_rows(t("logit.weight"), t("logit.bias"), sc_of)
  return {"img_embed": _dense(t, "fc_embed"),
          "embed": {"embedding": input_rows(t("embed.weight"), sc_of)},
          "i2h": _dense(t, "_core.i2h"), "h2h": _dense(t, "_core.h2h"),
          "out_proj": {"kernel": kernel, "bias": bias}}


def aoa_fields(opt) -> dict:
  _common_checks(opt)
  for option, want in (("decoder_type", "AoA"), ("use_multi_head", 2), ("mean_feats", 1)):
    if _opt(opt, option, want) != want:
      _refuse(option, getattr(opt, option), f"{want!r} (the AoANet setting; jaxcap's aoa model has no other)")
  _region_checks(opt)
  return dict(name="aoa", dim=_num(opt, "rnn_size", int), embed_dim=_num(opt, "input_encoding_size", int),
              num_heads=_num(opt, "num_heads", int), scale=_num(opt, "multi_head_scale", int, 1),
              dropout=_num(opt, "drop_prob_lm", float), dropout_aoa=_num(opt, "dropout_aoa", float, 0.3),
              refine=bool(_opt(opt, "refine", 1)), refine_aoa=bool(_opt(opt, "refine_aoa", 1)),
              use_ff=bool(_opt(opt, "use_ff", 0)), ctx_drop=bool(_opt(opt, "ctx_drop", 0)),
              out_res=bool(_opt(opt, "out_res", 0)))


def aoa_params(t: _Tensors, fields: dict, sc_of: np.ndarray) -> dict:
  kernel, bias = output_rows(t("logit.weight"), t("logit.bias"), sc_of)
  lstm = "core.att_lstm"
  p = {"att_embed": _dense(t, "att_embed.0"), "ctx2att": _dense(t, "ctx2att"),
       "embed": {"embedding": input_rows(t("embed.0.weight"), sc_of)},
       "lstm_ih": {"kernel": t(lstm + ".weight_ih").T, "bias": t(lstm + ".bias_ih")},
       "lstm_hh": {"kernel": t(lstm + ".weight_hh").T, "bias": t(lstm + ".bias_hh")},
       "attn_norm": _norm(t, "core.attention.norm"), "attn_query": _dense(t, "core.attention.linears.0"),
       "att2ctx": _dense(t, "core.att2ctx.0"), "out_proj": {"kernel": kernel, "bias": bias}}
  if fields["refine"]:
    p["refiner_norm"] = _norm(t, "refiner.norm")
    for i in range(aoa_model.REFINER_LAYERS):
      pre = f"refiner.layers.{i}"
      layer = {"norm0": _norm(t, pre + ".sublayer.0.norm"),
               **{name: _dense(t, f"{pre}.self_attn.linears.{j}") for j, name in enumerate(("query", "key", "value"))}}
      if fields["refine_aoa"]:
        layer["aoa"] = _dense(t, pre + ".self_attn.aoa_layer.0")
      else:
        layer["out"] = _dense(t, pre + ".self_attn.output_layer")
      if fields["use_ff"]:
        layer["norm1"] = _norm(t, pre + ".sublayer.1.norm")
        layer["ffn"] = _ffn(t, pre + ".feed_forward")
      p[f"refiner_{i}"] = layer
  return p


def updown_fields(opt) -> dict:
  _common_checks(opt)
  _region_checks(opt)
  return dict(name="updown", hidden_dim=_num(opt, "rnn_size", int), embed_dim=_num(opt, "input_encoding_size", int),
              att_dim=_num(opt, "att_hid_size", int), dropout=_num(opt, "drop_prob_lm", float))


def _torch_lstm_cell(t: _Tensors, prefix: str) -> dict:
  return {"ih": {"kernel": t(prefix + ".weight_ih").T, "bias": t(prefix + ".bias_ih")},
          "hh": {"kernel": t(prefix + ".weight_hh").T, "bias": t(prefix + ".bias_hh")}}


def updown_params(t: _Tensors, fields: dict, sc_of: np.ndarray) -> dict:
  del fields
  kernel, bias = output_rows(t("logit.weight"), t("logit.bias"), sc_of)
  return {"fc_embed": _dense(t, "fc_embed.0"), "att_embed": _dense(t, "att_embed.0"),
          "ctx2att": _dense(t, "ctx2att"), "embed": {"embedding": input_rows(t("embed.0.weight"), sc_of)},
          "att_lstm": _torch_lstm_cell(t, "core.att_lstm"), "lang_lstm": _torch_lstm_cell(t, "core.lang_lstm"),
          "h2att": _dense(t, "core.attention.h2att"), "alpha_net": _dense(t, "core.attention.alpha_net"),
          "out_proj": {"kernel": kernel, "bias": bias}}


@dataclasses.dataclass(frozen=True)
class Importer:
  fields: Callable[[Any], dict]  # opt -> jaxcap model config
  params: Callable[[_Tensors, dict, np.ndarray], dict]


IMPORTERS = {"transformer": Importer(transformer_fields, transformer_params),
             "newfc": Importer(newfc_fields, newfc_params),
             "aoa": Importer(aoa_fields, aoa_params),
             # self-critical's two names for one model (captioning/models/__init__.py).
             "updown": Importer(updown_fields, updown_params),
             "topdown": Importer(updown_fields, updown_params)}

# Models of self-critical.pytorch that no jaxcap model computes, with why (the refusal says it).
NOT_IMPORTED = {
    "att2in2": "its LSTM's maxout candidate adds the attended regions' projection (Att2in2Core); "
               "no jaxcap model has that cell",
}


def importer(opt) -> Importer:
  name = _opt(opt, "caption_model", None)
  if name not in IMPORTERS:
    why = f" ({NOT_IMPORTED[name]})" if name in NOT_IMPORTED else ""
    raise BadInput(f"infos opt.caption_model={name!r}: no jaxcap model computes it yet{why}; "
                     f"expected one of {sorted(IMPORTERS)}")
  return IMPORTERS[name]


def convert(state: dict, infos: dict, path: str = "model") -> tuple[dict, Vocab, np.ndarray, dict]:
  """``(model fields, vocabulary, sc id per jaxcap id, params)`` of a state_dict and its infos."""
  opt = infos["opt"]
  imp = importer(opt)
  fields = imp.fields(opt)
  vocab, sc_of = vocabulary(infos["vocab"])
  tensors = _Tensors(fit.named(state), path)
  params = imp.params(tensors, fields, sc_of)
  tensors.check_all_used()
  return fields, vocab, sc_of, params


# ---------------------------------------------------------------------------------------------
# The run directory.


def run_config(fields: dict, opt, vocab_path: str, dataset: str = "coco"):
  """The imported run's config: jaxcap's defaults for ``dataset`` (``coco``: Karpathy's
  dataset_coco.json with bottom-up features under data/coco; ``cocotalk``: self-critical's
  cocotalk.json / cocotalk_label.h5), the model's fields, the model's own vocabulary
  (``data.vocab_file``) and self-critical's decoding as its eval.py runs it by default: greedy,
  ``max_length`` 20, and with ``--beam-size`` its beam search with ``UNK`` suppressed (its
  ``suppress_UNK``, which its greedy search does not read)."""
  config_files.ensure_configs_importable()
  from jaxcap import config_common as common
  c = common.base_config(dataset, fields["name"])
  c.model.update(fields)
  c.data.vocab_file = os.path.abspath(vocab_path)
  c.data.max_len = _number(_opt(opt, "seq_length", 16) or 16, int, "opt.seq_length")
  c.data.seq_per_img = _num(opt, "seq_per_img", int, 5)
  # Its eval.py: greedy by default (beam_size 1), its beam search with --beam_size; its option
  # suppress_UNK (default 1) is read by its beam_search only, never by its greedy _sample.
  c.decode.method = "greedy"
  c.decode.beam_mode = "self_critical"
  c.decode.max_len = _number(_opt(opt, "max_length", 20) or 20, int, "opt.max_length")
  c.decode.suppress_unk = False
  c.decode.beam_suppress_unk = True
  c.imported_from = "self-critical.pytorch"
  return c


def run_info(opt, vocab: Vocab, config) -> dict:
  """The dataset sizes a run records (``info.json``), from the options the model was built with."""
  return {"feature_dim": _num(opt, "att_feat_size", int), "global_dim": _num(opt, "fc_feat_size", int),
          "max_regions": int(config.data.max_regions), "max_len": int(config.data.max_len),
          "vocab_size": len(vocab), "src_vocab_size": 0, "num_attributes": 0, "grid": False,
          "seq_per_img": int(config.data.seq_per_img), "max_attributes": int(config.data.max_attributes),
          "src_max_len": 0}


def import_checkpoint(checkpoint: str, infos: str, workdir: str, *, dataset: str = "coco",
                      data_root: str | None = None, features: str | None = None):
  """Writes ``workdir``, a jaxcap run of self-critical.pytorch's ``checkpoint`` (``model.pth``
  or ``.safetensors``) and ``infos`` (``infos_<id>.pkl``), and returns it loaded
  (:func:`jaxcap.load`). Everything is checked before anything is written; an existing
  ``workdir`` is refused.

  Args:
    dataset: the data section of the run's config, ``coco`` or ``cocotalk`` (what
      ``evaluate.py`` reads; captioning your own features needs none).
    data_root: that data's folder (default ``data/coco``), stored as an absolute path.
    features: the ``features.json`` of the extractor that made the model's features (e.g.
      ``jaxcap-extract --backbone resnet101_self_critical``, which computes self-critical's
      ``prepro_feats.py`` features): copied into the run, it lets ``Run.caption_images`` and
      ``evaluate.py --images`` caption image files with that extractor.
  """
  if dataset not in ("coco", "cocotalk"):
    raise BadInput(f"--dataset={dataset!r}: expected 'coco' or 'cocotalk'")
  if os.path.exists(workdir) and os.listdir(workdir):
    raise BadInput(f"--workdir={workdir}: exists and is not empty; expected a new run directory")
  record = None
  if features is not None:
    record = record_lib.read(features)
  info_dict = read_infos(infos)
  state = read_state_dict(checkpoint)
  fields, vocab, _, params = convert(state, info_dict, checkpoint)
  opt = info_dict["opt"]
  vocab_path = os.path.join(workdir, run_dir.VOCAB_FILE)
  config = run_config(fields, opt, vocab_path, dataset)
  if record is not None:
    # The run's data is then that extraction: grid cells as regions, no box files.
    config.data.update(root=os.path.abspath(os.path.dirname(features)), att_dir="att", fc_dir="fc",
                       box_dir="", grid=True, max_regions=int(record["att_size"]) ** 2)
  if data_root is not None:
    config.data.root = os.path.abspath(data_root)
  info = run_info(opt, vocab, config)
  model = registry.build(config.model, info)
  params = fit.fitted(model, info, {"params": params}, checkpoint, fields["name"])
  tx, _ = optim.make_optimizer(config, 1)
  step = _number(info_dict.get("iter", 0) or 0, int, "iter")
  train_state = steps.create_state(params, tx, steps.rng_key(config.seed + 1, config))
  train_state = train_state.replace(step=jnp.asarray(step, jnp.int32))
  width = None if record is None else getattr(record_lib.build(record), "feature_dim", None)
  if width is not None and int(width) != info["global_dim"]:
    raise BadInput(f"--features={features}: features of width {width}, but the model reads "
                     f"{info['global_dim']} (opt.fc_feat_size); expected the record of its extractor")
  run_dir.init_workdir(workdir, config, vocab, info)
  if record is not None:
    write_json(os.path.join(workdir, run_dir.FEATURES_FILE), record)
  ckpts = run_dir.checkpoints(workdir, config)
  try:
    ckpts.save_latest(step, train_state, {})
  finally:
    ckpts.close()
  return api.load(workdir)
