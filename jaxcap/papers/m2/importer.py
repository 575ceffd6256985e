"""The authors' released M² (aimagelab/meshed-memory-transformer) as a jaxcap run.

  jaxcap-import --format m2 --checkpoint meshed_memory_transformer.pth --vocab vocab.pkl --workdir runs/m2

Their test.py loads ``vocab.pkl`` (a pickled ``data.vocab.Vocab``: ``itos``, ``stoi``,
``freqs``), builds ``MeshedDecoder(len(vocab), 54, 3, vocab.stoi['<pad>'])`` and loads
``torch.load('meshed_memory_transformer.pth')['state_dict']``: the dict their train.py saves
(``state_dict`` beside rng states, epoch, losses, Adam's and the schedule's states).
:func:`import_checkpoint` reads the pair and writes a jaxcap run directory (``config.json``,
``vocab.json``, ``info.json``, an orbax checkpoint at step 0), as
:mod:`jaxcap.importers.self_critical` does for self-critical.pytorch.

- Reading: the ``.pth`` is read without torch (:func:`read_pth`: the zip format of PyTorch >=
  1.6 and the older sequential one, with a restricted unpickler that builds NumPy arrays; only
  the ``state_dict`` is used, the optimiser / schedule / rng entries are read and dropped); a
  ``.safetensors`` of the ``state_dict`` is read too. Their decoding-state buffers
  (``running_keys`` ...) are skipped (:func:`jaxcap.papers.m2.convert.to_variables`).
- ``vocab.pkl`` goes through a restricted unpickler: their ``data.vocab.Vocab`` becomes a plain
  stand-in, ``collections.Counter`` / ``defaultdict`` / ``OrderedDict`` and their
  ``_default_unk_index`` are allowed, anything else is refused naming the file and the class.
- Vocabulary: their ids are ``<unk>=0, <pad>=1, <bos>=2, <eos>=3`` (their ``Field.build_vocab``
  order) then the words; jaxcap's ``PAD=0, BOS=1, EOS=2, UNK=3`` then the words in their order.
  The embedding rows and the output layer's columns are permuted accordingly: the
  log-probabilities are theirs, with ids renamed.
- Sizes come from the tensors (width, feed-forward width, memory slots, layers, position table,
  feature width), except the number of heads, which a state_dict does not hold (``h * d_k``
  only): ``--heads`` (their default and test.py's: 8).
- Config: ``configs/m2.py:coco`` with those sizes and the model's switches at the code's
  readings (``pad_mask="authors"``, ``positions="authors"``, ``mesh_scale="authors"``;
  ``memory_init`` changes no imported weight), decoding as their test.py: beam search, beam 5,
  20 steps; scoring as their test.py: ``caption_postprocess = "dedupe_repeats"``.

Bad input is one line naming the file and what was expected (``BadInput``; exit 2 from the
command), and nothing is written.
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import pickle

import numpy as np

from jaxcap.errors import BadInput
from jaxcap.features import weights as feature_weights
from jaxcap.importers import torch_files

FORMAT_HELP = ("the authors' Meshed-Memory Transformer (aimagelab/meshed-memory-transformer): "
               "--checkpoint meshed_memory_transformer.pth --vocab vocab.pkl")
SPECIALS = ("<unk>", "<pad>", "<bos>", "<eos>")  # their TextField: unk, pad, init, eos tokens

# ---------------------------------------------------------------------------------------------
# The .pth, without torch.

def read_pth(path: str):
  """What ``torch.load(path)`` returns, tensors as NumPy arrays, read without torch
  (:func:`jaxcap.importers.torch_files.read`)."""
  return torch_files.read(path, "their train.py's torch.save dict (meshed_memory_transformer.pth)")


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """Their ``state_dict`` (``module.`` prefixes of a DataParallel save removed), from the
  train.py dict in a ``.pth``, a bare state_dict ``.pth``, or a ``.safetensors`` of it."""
  if path.endswith(".safetensors"):
    from safetensors import numpy as safetensors_numpy
    if not os.path.isfile(path):
      raise BadInput(f"{path}: no such file; expected a .safetensors of their state_dict")
    try:
      state = safetensors_numpy.load_file(path)
    except Exception as e:  # safetensors' own error types for a damaged header
      raise BadInput(f"{path}: not a safetensors file ({(str(e).splitlines() or [type(e).__name__])[0]})") from None
  else:
    raw = read_pth(path)
    state = raw.get("state_dict", raw) if isinstance(raw, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, np.ndarray) for v in state.values()):
      raise BadInput(f"{path}: holds no state_dict; expected their train.py's dict with "
                       "'state_dict' (a dict of tensors)")
  feature_weights.check_finite(state, path)
  return {(k[len("module."):] if k.startswith("module.") else k): np.asarray(v)
          for k, v in state.items()}


# ---------------------------------------------------------------------------------------------
# vocab.pkl.


class TheirVocab:
  """Stand-in for their ``data.vocab.Vocab``: the pickle's attributes (``itos``, ``stoi``,
  ``freqs``, ``vectors``), no behaviour."""


def _default_unk_index():  # their data.vocab._default_unk_index (stoi's default factory)
  return 0


_VOCAB_GLOBALS = {
    ("data.vocab", "Vocab"): TheirVocab,
    ("data.vocab", "_default_unk_index"): _default_unk_index,
    ("collections", "Counter"): collections.Counter,
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set, ("__builtin__", "set"): set,
}


class _VocabUnpickler(pickle.Unpickler):

  def find_class(self, module, name):
    if (module, name) in _VOCAB_GLOBALS:
      return _VOCAB_GLOBALS[(module, name)]
    raise pickle.UnpicklingError(f"refused to construct {module}.{name}")


def read_vocab(path: str) -> list[str]:
  """Their ``vocab.pkl``'s ``itos``, read without running code."""
  try:
    with open(path, "rb") as f:  # in memory, its lengths checked: a flipped one allocates no GiB
      data = torch_files.check_lengths(io.BytesIO(f.read()))
    vocab = _VocabUnpickler(data, encoding="latin1").load()
  except OSError as e:
    raise BadInput(f"{path}: cannot read ({e.strerror or e}); expected their vocab.pkl") from None
  except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, IndexError) as e:
    raise BadInput(f"{path}: not their vocab.pkl ({' '.join(str(e).split())[:200] or type(e).__name__}); expected a pickled data.vocab.Vocab "
                     "(itos, stoi, freqs)") from None
  itos = getattr(vocab, "itos", None)
  if not isinstance(vocab, TheirVocab) or not isinstance(itos, list) or not all(isinstance(w, str) for w in itos):
    raise BadInput(f"{path}: holds a {type(vocab).__name__}; expected a pickled data.vocab.Vocab "
                     "with itos (a list of words)")
  missing = [s for s in SPECIALS if s not in itos]
  if missing or len(set(itos)) != len(itos):
    raise BadInput(f"{path}: itos {'lacks ' + ', '.join(missing) if missing else 'repeats a word'}; "
                     f"expected the specials {', '.join(SPECIALS)} once each and unique words")
  return itos


def vocabulary(itos: list[str]):
  """jaxcap's vocabulary and, per jaxcap id, their id (a permutation)."""
  from jaxcap.data import vocab as vocab_lib
  words = [w for w in itos if w not in SPECIALS]
  clash = [w for w in words if w in vocab_lib.SPECIALS]
  if clash:
    raise BadInput(f"vocab: word {clash[0]!r} is a jaxcap special token")
  vocab = vocab_lib.Vocab(words)
  stoi = {w: i for i, w in enumerate(itos)}
  specials = {vocab_lib.PAD: "<pad>", vocab_lib.BOS: "<bos>", vocab_lib.EOS: "<eos>", vocab_lib.UNK: "<unk>"}
  theirs_of = np.array([stoi[specials.get(j, w)] for j, w in enumerate(vocab.itos)], np.int64)
  return vocab, theirs_of


# ---------------------------------------------------------------------------------------------
# Sizes, config, run directory.


def _shape(state, name, path):
  if name not in state:
    raise BadInput(f"{path}: no tensor {name!r}; expected the state_dict of their Transformer "
                     "(MemoryAugmentedEncoder + MeshedDecoder)")
  return state[name].shape


def model_fields(state: dict, path: str, heads: int, vocab_size: int) -> dict:
  """The m2 model's fields read off the tensors' shapes (module docstring)."""
  emb = _shape(state, "decoder.word_emb.weight", path)
  dim = emb[1]
  if emb[0] != vocab_size:
    raise BadInput(f"{path}: the word embedding has {emb[0]} rows, the vocabulary {vocab_size} "
                     "words; expected the vocab.pkl of this checkpoint")
  q = _shape(state, "encoder.layers.0.mhatt.attention.fc_q.weight", path)
  if q[0] != dim or dim % heads:
    raise BadInput(f"{path}: attention width {q[0]} with d_model {dim} and --heads {heads}; "
                     "expected h * d_k = d_model, divisible by the heads")
  mk = state.get("encoder.layers.0.mhatt.attention.m_k")
  n_enc = len({k.split(".")[2] for k in state if k.startswith("encoder.layers.")})
  n_dec = len({k.split(".")[2] for k in state if k.startswith("decoder.layers.")})
  return dict(name="m2", dim=int(dim), num_heads=int(heads),
              ff_dim=int(_shape(state, "decoder.layers.0.pwff.fc1.weight", path)[0]),
              num_layers=n_enc, num_dec_layers=n_dec,
              memory_slots=0 if mk is None else int(mk.shape[1]),
              max_positions=int(_shape(state, "decoder.pos_emb.weight", path)[0]) - 1,
              pad_mask="authors", positions="authors", mesh_scale="authors",
              memory_init="authors", meshed="meshed")


def run_config(fields: dict, vocab_path: str):
  from jaxcap import config_files
  config_files.ensure_configs_importable()
  from jaxcap.papers.m2.configs import m2 as m2_config
  c = m2_config.get_config("coco")
  c.model.update(fields)
  c.data.vocab_file = os.path.abspath(vocab_path)
  # Their test.py: model.beam_search(images, 20, eos, 5, out_size=1).
  c.decode.method = "beam"
  c.decode.beam_size = 5
  c.decode.max_len = 20
  # Their test.py (and train.py's validation) score each caption with its runs of one word kept
  # once (itertools.groupby): the scores of the imported run are computed the same way.
  c.caption_postprocess = "dedupe_repeats"
  c.imported_from = "aimagelab/meshed-memory-transformer"
  return c


# Their ImageDetectionsField(max_detections=50) in train.py and test.py.
MAX_DETECTIONS = 50


def their_detections(data, path: str):
  """``data`` (a config's data section) reading ``path`` (their ``coco_detections.hdf5``) as
  their loader does: the regions of ``<image_id>_features``, the first 50 kept
  (``truncate_regions``), zero rows after the real ones up to 50 (collation pads to
  ``max_regions = 50``; their ``pad_mask="authors"`` encoder then attends those rows, as theirs
  does). The folders of the default COCO data are cleared: the file replaces them."""
  data.detections_hdf5 = path
  data.att_dir = data.fc_dir = data.box_dir = ""
  data.max_regions = MAX_DETECTIONS
  data.truncate_regions = True
  return data


def run_info(feature_dim: int, vocab, config) -> dict:
  # M² reads region features only; global_dim is the dataset's field, sized like them.
  return {"feature_dim": int(feature_dim), "global_dim": int(feature_dim),
          "max_regions": int(config.data.max_regions), "max_len": int(config.data.max_len),
          "vocab_size": len(vocab), "src_vocab_size": 0, "num_attributes": 0, "grid": False,
          "seq_per_img": int(config.data.seq_per_img), "max_attributes": int(config.data.max_attributes),
          "src_max_len": 0}


def import_checkpoint(checkpoint: str, vocab_file: str, workdir: str, *, heads: int = 8,
                      data_root: str | None = None, detections_hdf5: str | None = None):
  """Writes ``workdir``, a jaxcap run of their ``checkpoint`` and ``vocab_file``, and returns it
  loaded (:func:`jaxcap.load`). Everything is checked before anything is written.
  ``detections_hdf5``: their ``coco_detections.hdf5``, read as :func:`their_detections` says."""
  from jaxcap import api, run_dir
  from jaxcap.importers import fit
  from jaxcap.models import registry
  from jaxcap.papers.m2 import convert
  from jaxcap.training import optim, steps

  if os.path.exists(workdir) and os.listdir(workdir):
    raise BadInput(f"--workdir={workdir}: exists and is not empty; expected a new run directory")
  if heads < 1:
    raise BadInput(f"--heads={heads}: expected a positive number of attention heads")
  itos = read_vocab(vocab_file)
  state = read_state_dict(checkpoint)
  vocab, theirs_of = vocabulary(itos)
  fields = model_fields(state, checkpoint, heads, len(itos))
  feature_dim = _shape(state, "encoder.fc.weight", checkpoint)[1]
  config = run_config(fields, os.path.join(workdir, run_dir.VOCAB_FILE))
  if data_root is not None:
    config.data.root = os.path.abspath(data_root)
  if detections_hdf5 is not None:
    if not os.path.isfile(detections_hdf5):
      raise BadInput(f"--detections_hdf5={detections_hdf5}: not a file; expected their "
                       "coco_detections.hdf5")
    their_detections(config.data, os.path.abspath(detections_hdf5))
  info = run_info(feature_dim, vocab, config)
  model = registry.build(config.model, info)
  try:
    variables = convert.to_variables(fit.named(state), model)
  except BadInput as e:
    raise BadInput(f"{checkpoint}: {e}") from None
  except KeyError as e:
    raise BadInput(f"{checkpoint}: no tensor {e}; expected the state_dict of their Transformer") from None
  # Their ids -> jaxcap's: embedding rows, output columns (the output layer has no bias).
  p = variables["params"]
  p["embed"]["embedding"] = p["embed"]["embedding"][theirs_of]
  p["logits_proj"]["kernel"] = p["logits_proj"]["kernel"][:, theirs_of]
  variables = fit.fitted(model, info, variables, checkpoint, "m2")
  tx, _ = optim.make_optimizer(config, 1, frozen_collections=model.frozen_collections)
  train_state = steps.create_state(variables, tx, steps.rng_key(config.seed + 1, config))
  run_dir.init_workdir(workdir, config, vocab, info)
  ckpts = run_dir.checkpoints(workdir, config)
  try:
    ckpts.save_latest(0, train_state, {})
  finally:
    ckpts.close()
  return api.load(workdir)


# ---------------------------------------------------------------------------------------------
# jaxcap-import --format m2.


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """This format's options of ``jaxcap-import`` (beside --checkpoint and --workdir)."""
  parser.add_argument("--vocab", required=True, help="Their vocab.pkl (a pickled data.vocab.Vocab).")
  parser.add_argument("--heads", type=int, default=8,
                      help="Attention heads (not in a state_dict; their default and test.py's: 8).")
  parser.add_argument("--data_root", default=None, help="The COCO data folder evaluate.py reads (default data/coco).")
  parser.add_argument("--detections_hdf5", default=None,
                      help="Their coco_detections.hdf5: the run reads its regions as their loader does "
                           "(50 per image, zero rows after the real ones, the first 50 kept).")


def run_from_args(a: argparse.Namespace):
  return import_checkpoint(a.checkpoint, a.vocab, a.workdir, heads=a.heads, data_root=a.data_root,
                           detections_hdf5=a.detections_hdf5)
