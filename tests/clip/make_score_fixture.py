"""Writes tests/clip/fixtures/scores.npz: per-caption CLIP-S / RefCLIP-S from clipscore.py's own
functions (jmhessel/clipscore: ``extract_all_captions``, ``get_clip_score``,
``get_refonlyclipscore`` and main's harmonic mean) and PAC-S / RefPAC-S from pacscore's
(aimagelab/pacscore: ``PACScore``, ``RefPACScore`` and compute_metrics.py's harmonic mean), on the
same embeddings. Their text side runs a model's ``encode_text`` on ``clip.tokenize`` ids: a stand-in
model (a fixed random embedding of every token id, summed over the 77 positions) gives embeddings
whose cosines spread over [-1, 1]; the formulas are what the fixture pins (the towers are pinned
by make_fixtures.py).

  git clone https://github.com/jmhessel/clipscore /tmp/cssrc
  git clone https://github.com/aimagelab/pacscore /tmp/pacsrc
  pip install torch==2.14.1 torchvision==0.29.1 openai-clip scikit-learn ftfy regex "setuptools<81"
  python tests/clip/make_score_fixture.py --clipscore-src /tmp/cssrc --pacscore-src /tmp/pacsrc
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

CAPTIONS = ["a man riding a horse", "two dogs on the grass", "a plate of food", "a red bus",
            "a cat sleeping on a sofa", "people walking in the rain", "a bowl of fruit",
            "a train at the station", "a child with a kite", "a boat on a lake",
            "a very long caption " + "that goes on " * 30, "a man riding a horse"]
REFERENCES = [["a person rides a horse", "a horse and its rider"], ["dogs playing"],
              ["food on a plate", "a dinner plate", "a meal", "some food", "a dish"],
              ["a bus on the street", "a red double decker"], ["a cat on a couch"],
              ["pedestrians in the rain", "umbrellas on a street", "a rainy day"],
              ["fruit in a bowl"], ["a train arriving", "a railway platform"],
              ["a kid flying a kite", "a kite in the sky"], ["a boat", "a lake with a boat", "water"],
              ["a long sentence"], ["a man riding a horse"]]


class StandIn(torch.nn.Module):
  """``encode_text``: a fixed random embedding of each id, summed; the ids every caption shares
  (padding, start and end of text, the prefix's) embed to 0, so that cosines spread."""

  def __init__(self, dim=8, seed=0):
    super().__init__()
    import clip
    g = torch.Generator().manual_seed(seed)
    self.table = torch.randn(49408, dim, generator=g)
    self.table[clip.tokenize("A photo depicts")[0].long()] = 0

  def encode_text(self, tokens):
    return self.table[tokens.long()].sum(1)


def load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--clipscore-src", required=True)
  ap.add_argument("--pacscore-src", required=True)
  a = ap.parse_args()
  sys.path.insert(0, a.clipscore_src)  # its generation_eval_utils
  cs = load(os.path.join(a.clipscore_src, "clipscore.py"), "clipscore")
  sys.path.insert(0, a.pacscore_src)
  pac = load(os.path.join(a.pacscore_src, "evaluation", "pac_score", "pac_score.py"), "pac_score")
  model = StandIn()
  rng = np.random.default_rng(0)
  images = rng.standard_normal((len(CAPTIONS), 8)).astype(np.float32)
  out = {"images": images}
  # Their text embeddings (their prefix, their tokenisation): what a scorer is fed.
  out["captions"] = cs.extract_all_captions(CAPTIONS, model, "cpu", num_workers=0)
  flat = [r for refs in REFERENCES for r in refs]
  out["references"] = cs.extract_all_captions(flat, model, "cpu", num_workers=0)
  out["owner"] = np.array([i for i, refs in enumerate(REFERENCES) for _ in refs])
  # clipscore.py: CLIP-S and RefCLIP-S as its main combines them.
  _, per_it, cand_feats = cs.get_clip_score(model, images, CAPTIONS, "cpu")
  _, per_tt = cs.get_refonlyclipscore(model, REFERENCES, cand_feats, "cpu")
  per_tt = np.asarray(per_tt)
  out["clip_s"] = per_it
  out["refclip_s"] = 2 * per_it * per_tt / (per_it + per_tt)
  # pacscore: PAC-S (w = 2.0) and RefPAC-S as compute_metrics.py combines them.
  _, pac_it, pac_cand, lens = pac.PACScore(model, None, images, CAPTIONS, "cpu", w=2.0)
  _, pac_tt = pac.RefPACScore(model, REFERENCES, pac_cand, "cpu", torch.tensor(lens))
  pac_tt = np.asarray(pac_tt)
  out["pac_s"] = pac_it
  out["refpac_s"] = 2 * pac_it * pac_tt / (pac_it + pac_tt)
  np.savez_compressed(os.path.join(HERE, "fixtures", "scores.npz"), **out)
  print({k: np.round(v[:4], 4) for k, v in out.items() if k.endswith("_s")})


if __name__ == "__main__":
  main()
