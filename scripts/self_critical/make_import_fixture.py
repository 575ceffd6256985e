"""Writes the fixture that tests/importers/test_self_critical.py reads: small self-critical.pytorch
models on random weights, saved as that code saves them, with the outputs of that code's own
forward pass, greedy search and beam search.

Needs torch, safetensors and six, and self-critical.pytorch's source at commit 4c48a33 (the code
the importer follows), which this script imports, never copies:

    git clone https://github.com/ruotianluo/self-critical.pytorch /tmp/sc
    git -C /tmp/sc checkout 4c48a33
    python scripts/self_critical/make_import_fixture.py --sc_root /tmp/sc

For each model (``transformer``, ``newfc``, ``aoa``, and ``aoa_ff``: AoA with its other refiner
switches) it writes to ``--out``:

- ``<name>/model.safetensors`` (the ``state_dict``, as the docs' one-line conversion writes it)
  and ``<name>/infos_<name>.pkl`` (``opt``, ``vocab`` and training counters, pickled as
  self-critical's ``train.py`` pickles them);
- ``<name>/expected.npz``: the inputs (``fc_feats``, ``att_feats``, ``att_masks``, teacher-forced
  ``labels``) and self-critical's outputs: ``logprobs`` of teacher forcing ``[B*S, L, V+1]``,
  ``greedy`` and ``beam3`` token sequences ``[B, max_length]`` (0 = end / padding).

The weights are random (fixed seeds), with layer norms, biases and batch statistics moved
away from their initial values so that a missed or misplaced tensor changes the outputs.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys

import numpy as np

WORDS = ["a", "man", "dog", "on", "the", "grass", "with", "red", "ball", "is", "running",
         "of", "two", "people", "UNK"]
NUM_IMAGES, SEQ_PER_IMG, LENGTH = 3, 2, 9
FC_DIM, ATT_DIM, NUM_REGIONS = 12, 10, 5
MAX_LENGTH = 8

MODELS = {
    # The Transformer and AoA never read the global feature: as in the published checkpoints
    # (2048 both), its width is the regions' (a posted region array's mean stands in for it).
    "transformer": ["--caption_model", "transformer", "--num_layers", "2", "--input_encoding_size", "16",
                    "--rnn_size", "24", "--drop_prob_lm", "0.1", "--fc_feat_size", str(ATT_DIM)],
    "newfc": ["--caption_model", "newfc", "--input_encoding_size", "14", "--rnn_size", "18",
              "--drop_prob_lm", "0.5"],
    # An FC model on ResNet-101's 2048-wide features: docs/USAGE.md's photo-to-caption trial
    # imports it and captions images through jaxcap-extract's resnet101_self_critical.
    "newfc_resnet101": ["--caption_model", "newfc", "--input_encoding_size", "14", "--rnn_size", "18",
                        "--fc_feat_size", "2048", "--att_feat_size", "2048"],
    # AoA's options exist only in its yml (configs/aoa.yml): its own settings, smaller.
    "aoa": ["--cfg", "{sc_root}/configs/aoa.yml", "--set_cfgs", "input_encoding_size", "12",
            "rnn_size", "16", "num_heads", "2", "--att_hid_size", "16", "--drop_prob_lm", "0.2",
            "--fc_feat_size", str(ATT_DIM)],
    "aoa_ff": ["--cfg", "{sc_root}/configs/aoa.yml", "--set_cfgs", "input_encoding_size", "12",
               "rnn_size", "16", "num_heads", "4", "use_ff", "1", "refine_aoa", "0",
               "multi_head_scale", "2", "--att_hid_size", "16", "--fc_feat_size", str(ATT_DIM)],
}


def parse_sc_opt(sc_root: str, argv: list[str]):
  from captioning.utils import opts
  saved = sys.argv
  sys.argv = ["train.py", "--id", "fixture", "--max_length", str(MAX_LENGTH),
              "--fc_feat_size", str(FC_DIM), "--att_feat_size", str(ATT_DIM)] + [
                  a.format(sc_root=sc_root) for a in argv]
  try:
    opt = opts.parse_opt()
  finally:
    sys.argv = saved
  opt.vocab_size = len(WORDS)
  opt.vocab = {str(i + 1): w for i, w in enumerate(WORDS)}
  opt.seq_length = 16
  return opt


def randomise(model, torch, seed: int, gain: float = 2.0) -> None:
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      scale = gain / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.3
      p.copy_(torch.randn(p.shape, generator=g) * scale
              + (1.0 if name.endswith(("a_2", "weight")) and p.dim() == 1 else 0.0))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--sc_root", required=True, help="self-critical.pytorch checked out at 4c48a33")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                               "importers", "fixtures", "self_critical"))
  p.add_argument("--models", default=",".join(MODELS))
  args = p.parse_args(argv)
  sys.path.insert(0, os.path.abspath(args.sc_root))
  import torch
  from safetensors.torch import save_file
  import captioning.models as sc_models

  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  fc = rng.normal(size=(NUM_IMAGES, FC_DIM)).astype(np.float32)
  att = rng.normal(size=(NUM_IMAGES, NUM_REGIONS, ATT_DIM)).astype(np.float32)
  masks = np.zeros((NUM_IMAGES, NUM_REGIONS), np.float32)
  for i, n in enumerate([NUM_REGIONS, 3, 4]):  # padded regions: the masks must matter
    masks[i, :n] = 1
    att[i, n:] = 0
  labels = np.zeros((NUM_IMAGES * SEQ_PER_IMG, LENGTH), np.int64)  # [0, w1 .. wn, 0 ...]
  for r in range(labels.shape[0]):
    n = int(rng.integers(3, LENGTH - 1))
    labels[r, 1:n + 1] = rng.integers(1, len(WORDS) + 1, size=n)
  for name in args.models.split(","):
    k = list(MODELS).index(name)  # each model's own seed, whichever are written
    opt = parse_sc_opt(args.sc_root, MODELS[name])
    fc_in = fc
    if opt.fc_feat_size != FC_DIM:  # its own global features, of its width
      fc_in = np.random.default_rng(k).normal(size=(NUM_IMAGES, opt.fc_feat_size)).astype(np.float32)
    model = sc_models.setup(opt)
    # A smaller gain for the deep AoA refiner with feed-forward layers keeps its activations (and
    # so float32's rounding in either code) small.
    randomise(model, torch, seed=100 + k, gain=1.4 if name == "aoa_ff" else 2.0)
    model.eval()
    t = lambda x: torch.from_numpy(x)
    with torch.no_grad():
      logprobs = model(t(fc_in), t(att), t(labels), t(masks))
      greedy, _ = model(t(fc_in), t(att), t(masks), opt={"sample_method": "greedy", "beam_size": 1},
                        mode="sample")
      beam3, _ = model(t(fc_in), t(att), t(masks), opt={"sample_method": "greedy", "beam_size": 3,
                                                       "sample_n": 1, "suppress_UNK": 1}, mode="sample")
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    state = {key: v.contiguous() for key, v in model.state_dict().items()}
    save_file(state, os.path.join(out, "model.safetensors"))
    del opt.vocab  # train.py saves it beside opt, in infos["vocab"]
    infos = {"opt": opt, "vocab": {str(i + 1): w for i, w in enumerate(WORDS)}, "iter": 1234,
             "epoch": 3, "best_val_score": np.float64(1.126), "split_ix": {"train": [0, 1]}}
    with open(os.path.join(out, f"infos_{name}.pkl"), "wb") as f:
      pickle.dump(infos, f)
    np.savez(os.path.join(out, "expected.npz"), fc_feats=fc_in, att_feats=att, att_masks=masks,
             labels=labels, logprobs=logprobs.numpy(), greedy=greedy.numpy(), beam3=beam3.numpy())
    print(name, "params", sum(v.numel() for v in state.values()), "greedy", greedy.numpy().tolist(),
          "beam3", beam3.numpy().tolist())


if __name__ == "__main__":
  main()
