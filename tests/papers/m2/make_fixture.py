"""Writes tests/papers/m2/fixtures/authors.npz (+ authors.json) with the authors' own code.

  python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy
  git -C <mirror of aimagelab/meshed-memory-transformer> archive HEAD models utils | tar -x -C /tmp/m2src
  /tmp/torchvenv/bin/python tests/papers/m2/make_fixture.py --src /tmp/m2src

Torch is needed only here (the tests read the .npz). It imports their modules from ``--src``
(commit 239100b): builds their ``MemoryAugmentedEncoder`` / ``MeshedDecoder`` / ``Transformer``
at small sizes (their constructors take the sizes), initialises them with their
``init_weights`` (xavier), moves the LayerNorms and biases away from 1 / 0 and shifts the
PAD and BOS logits down and sets the EOS logit (the output layer has no bias: the shift goes through the last
LayerNorm's bias, see ``_shift_logits``), then records in eval mode (no dropout):

* ``state/<their state_dict name>``: every parameter and buffer, as saved by them;
* ``feats``: the features, some images with zero-padded regions (``feats_mask``);
* ``tf_tokens`` / ``tf_logprobs``: teacher-forced log-probabilities ``model(images, seq)`` of
  token sequences with BOS first and PAD after the end;
* ``greedy_tokens``: their ``model.test(visual, 20, eos)`` (argmax fed back, 20 steps);
* ``beam_tokens`` / ``beam_logprobs``: their ``model.beam_search(visual, 20, eos, 5,
  out_size=1)``, as their test.py calls it;
* ``sinusoid``: their ``sinusoid_encoding_table(max_len + 1, d_model, 0)`` (the table that
  ``init_weights`` overwrites).

The ids are jaxcap's: padding_idx = PAD = 0, bos = BOS = 1, eos = EOS = 2.
"""

import argparse
import json
import os
import sys
import types

import numpy as np

PAD, BOS, EOS = 0, 1, 2
SIZES = dict(d_model=64, h=4, d_k=16, d_v=16, d_ff=128, m=8, n_enc=3, n_dec=3, vocab=30,
             max_len=22, d_in=24, regions=10, images=4, steps=20, beam=5)
# Real regions per image: the others are all-zero rows, as their detection loader pads.
REAL = (10, 6, 3, 10)
# Logit shifts (the output layer's input is LN output, see _shift_logits): PAD / BOS never win
# (jaxcap never emits them); EOS set so that the greedy captions run to the 20 steps while one
# image's best beam ends with EOS at its third word (their finished-beam bookkeeping is exercised).
SHIFTS = {PAD: -8.0, BOS: -8.0, EOS: 3.0}
# The output layer x 3: peakier word distributions, so the beams differ from greedy decoding.
FC_SCALE = 3.0


def _import_theirs(src):
  sys.path.insert(0, src)
  try:
    import requests  # noqa: F401  (their utils imports it for a download helper only)
  except ImportError:
    sys.modules["requests"] = types.ModuleType("requests")
  import torch
  from models.beam_search import beam_search as bs_module
  from models.transformer import (MemoryAugmentedEncoder, MeshedDecoder,
                                  ScaledDotProductAttentionMemory, Transformer)
  from models.transformer.utils import sinusoid_encoding_table

  # Current PyTorch: `LongTensor / int` is true division (it floored in the PyTorch of 2020),
  # so BeamSearch.iter's `selected_idx / V` makes float beam indices that gather refuses. The
  # indices that their select() returns are given floor division; nothing else changes:
  # every other operation on them returns a plain tensor (the default would hand the subclass,
  # and its division, on to the words fed back and to everything computed from them).
  class _FloorDivIndex(torch.Tensor):
    def __truediv__(self, other):
      return torch.div(self.as_subclass(torch.Tensor), other, rounding_mode="floor")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
      with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **(kwargs or {}))

  select = bs_module.BeamSearch.select

  def floor_select(self, t, candidate_logprob, **kwargs):
    idx, lp = select(self, t, candidate_logprob, **kwargs)
    return idx.as_subclass(_FloorDivIndex), lp

  bs_module.BeamSearch.select = floor_select
  return torch, MemoryAugmentedEncoder, MeshedDecoder, ScaledDotProductAttentionMemory, Transformer, sinusoid_encoding_table


def _shift_logits(torch, model, shifts):
  """logit_w += shift_w for every non-PAD position: the output layer (no bias) reads the last
  decoder layer's ``LN(.) * pad``, i.e. ``gamma * n + beta`` with ``sum(n) = 0``; adding
  ``c * (1 / gamma)`` to row w of W adds ``c * sum(beta / gamma)`` to logit w, a constant."""
  ln = model.decoder.layers[-1].pwff.layer_norm
  u = 1.0 / ln.weight
  k = float((ln.bias / ln.weight).sum())
  assert abs(k) > 0.5, k
  for w, shift in shifts.items():
    model.decoder.fc.weight[w] += (shift / k) * u


def prepare(torch, model):
  """Their model made decodable on current PyTorch, its weights moved off their initial values
  (also make_import_fixture.py's)."""
  # Current PyTorch refuses uint8 masks in masked_fill; their running self-attention mask
  # starts as a byte tensor (it became bool once concatenated with the bool step masks in
  # 2020's PyTorch). Its default, the only thing changed, is the same zeros as bool.
  model.decoder._state_defaults["running_mask_self_attention"] = torch.zeros((1, 1, 0), dtype=torch.bool)
  model.eval()
  g = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for name, prm in model.named_parameters():
      if name.endswith("layer_norm.weight"):
        prm.copy_(1.0 + 0.2 * torch.randn(prm.shape, generator=g))
      elif name.endswith("bias"):
        # Positive mean on the LayerNorm biases: _shift_logits needs sum(beta / gamma) away from 0.
        offset = 0.1 if "layer_norm" in name else 0.0
        prm.copy_(offset + 0.1 * torch.randn(prm.shape, generator=g))
    model.decoder.fc.weight *= FC_SCALE


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--src", required=True, help="their repository's files (models/, utils/)")
  p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
  args = p.parse_args()
  (torch, MemoryAugmentedEncoder, MeshedDecoder, ScaledDotProductAttentionMemory, Transformer,
   sinusoid_encoding_table) = _import_theirs(os.path.abspath(args.src))
  s = SIZES
  torch.manual_seed(0)
  size_kw = dict(d_model=s["d_model"], d_k=s["d_k"], d_v=s["d_v"], h=s["h"], d_ff=s["d_ff"])
  encoder = MemoryAugmentedEncoder(s["n_enc"], 0, d_in=s["d_in"],
                                   attention_module=ScaledDotProductAttentionMemory,
                                   attention_module_kwargs={"m": s["m"]}, **size_kw)
  decoder = MeshedDecoder(s["vocab"], s["max_len"], s["n_dec"], PAD, **size_kw)
  model = Transformer(BOS, encoder, decoder)  # runs their init_weights (xavier, dim > 1)
  prepare(torch, model)
  with torch.no_grad():
    _shift_logits(torch, model, SHIFTS)

    rng = np.random.default_rng(2)
    feats = rng.normal(size=(s["images"], s["regions"], s["d_in"])).astype(np.float32)
    feats_mask = np.arange(s["regions"])[None, :] < np.array(REAL)[:, None]
    feats = feats * feats_mask[..., None]
    visual = torch.from_numpy(feats)

    # Teacher forcing: BOS, words (ids 3 ..), then PAD after a few lengths.
    t = 12
    words = rng.integers(3, s["vocab"], size=(s["images"], t))
    lengths = np.array([12, 7, 4, 9])
    tf_tokens = np.full((s["images"], t), PAD, np.int64)
    for b, n in enumerate(lengths):
      tf_tokens[b, 0] = BOS
      tf_tokens[b, 1:n] = words[b, 1:n]
    tf_lp = model(visual, torch.from_numpy(tf_tokens)).numpy()

    greedy, _ = model.test(visual, s["steps"], EOS)
    beam, beam_lp = model.beam_search(visual, s["steps"], EOS, s["beam"], out_size=1)

    state = {f"state/{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    sinusoid = sinusoid_encoding_table(s["max_len"] + 1, s["d_model"], 0).numpy()
  os.makedirs(args.out, exist_ok=True)
  np.savez_compressed(
      os.path.join(args.out, "authors.npz"), feats=feats, feats_mask=feats_mask,
      tf_tokens=tf_tokens.astype(np.int32), tf_logprobs=tf_lp.astype(np.float32),
      greedy_tokens=greedy.numpy().astype(np.int32), beam_tokens=beam.numpy().astype(np.int32),
      beam_logprobs=beam_lp.numpy().astype(np.float32), sinusoid=sinusoid, **state)
  meta = dict(SIZES, real_regions=list(REAL), logit_shifts={str(k): v for k, v in SHIFTS.items()},
              pad=PAD, bos=BOS, eos=EOS, source="aimagelab/meshed-memory-transformer@239100b",
              torch=torch.__version__)
  with open(os.path.join(args.out, "authors.json"), "w") as f:
    json.dump(meta, f, indent=1)
    f.write("\n")
  print("greedy", greedy.numpy(), "beam", beam.numpy(), sep="\n")


if __name__ == "__main__":
  main()
