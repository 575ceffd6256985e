"""Writes tests/papers/m2/fixtures/import/ with the authors' own code and save paths.

  (the venv and /tmp/m2src as in make_fixture.py, with data/ too:)
  git -C <mirror of aimagelab/meshed-memory-transformer> archive HEAD models utils data | tar -x -C /tmp/m2src
  /tmp/torchvenv/bin/python tests/papers/m2/make_import_fixture.py --src /tmp/m2src

What ``jaxcap-import --format m2`` reads, made the way their train.py makes it, at small sizes:

* ``vocab.pkl``: their ``data.vocab.Vocab(counter, specials=[...])`` as their
  ``Field.build_vocab(..., min_freq=5)`` builds it (specials ``<unk> <pad> <bos> <eos>``, their
  order), pickled with ``pickle.dump`` as their train.py saves it (test.py loads it so);
* ``meshed_memory_transformer.pth``: ``torch.save`` of their train.py's dict (rng states,
  epoch, losses, ``state_dict``, Adam's and LambdaLR's state dicts, ...) for their
  ``MeshedDecoder(len(vocab), 54, 3, vocab.stoi['<pad>'])`` (test.py's call) at small widths; ``meshed_memory_transformer_legacy.pth``: the same dict
  in the pre-1.6 format that their torch 1.1.0 (environment.yml) wrote;
* ``expected.npz`` / ``expected.json``: the features, teacher-forced log-probabilities in
  their id order, and their greedy (``model.test``) and beam (``model.beam_search(.., 20,
  eos, 5, out_size=1)``, test.py's call) captions as words (their ``TextField.decode``: up to
  the first ``<eos>``).

The model's weights are made decodable as make_fixture.py does (LayerNorms and biases moved,
logit shifts: ``<pad>``, ``<bos>`` and ``<unk>`` never win, ``<eos>`` raised). No GPU here:
``cuda_rng_state`` holds ``torch.get_rng_state()`` (the same ByteTensor type the importer ignores).
"""

import argparse
import collections
import importlib
import importlib.machinery
import json
import os
import pickle
import random
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixture  # noqa: E402  (their modules, patched for current PyTorch)

SIZES = dict(d_model=16, h=2, d_k=8, d_v=8, d_ff=32, m=4, n_enc=3, n_dec=3, max_len=54,
             d_in=16, regions=6, images=3, steps=20, beam=5)
REAL = (6, 4, 2)
# <eos> raised, as in make_fixture.py (at 3.0 every caption of this model would be empty).
EOS_SHIFT = 2.5
WORDS = ("a man dog on the with riding horse in field red ball playing grass two people "
         "standing near table").split()


def _their_vocab_module(src):
  """Their ``data.vocab`` without ``data/__init__`` (which needs spacy, h5py, ...): the class
  pickles as ``data.vocab.Vocab``, as in their runs. six / tqdm serve download helpers only."""
  for name in ("six", "six.moves", "six.moves.urllib", "six.moves.urllib.request", "tqdm"):
    if name not in sys.modules:
      try:
        importlib.import_module(name)
      except ImportError:
        sys.modules[name] = types.ModuleType(name)
        # torch's dynamo (imported by the optimiser) looks up every loaded module's spec.
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
  sys.modules["six.moves.urllib.request"].urlretrieve = None
  sys.modules["tqdm"].tqdm = None
  pkg = types.ModuleType("data")
  pkg.__path__ = [os.path.join(src, "data")]
  sys.modules["data"] = pkg
  return importlib.import_module("data.vocab")


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--src", required=True, help="their repository's files (models/, utils/, data/)")
  p.add_argument("--out", default=os.path.join(HERE, "fixtures", "import"))
  args = p.parse_args()
  src = os.path.abspath(args.src)
  (torch, MemoryAugmentedEncoder, MeshedDecoder, ScaledDotProductAttentionMemory, Transformer,
   _) = make_fixture._import_theirs(src)
  vocab_mod = _their_vocab_module(src)
  s = SIZES
  rng = np.random.default_rng(3)

  # Their Field.build_vocab: a Counter of the training tokens, specials in its order
  # (unk, pad, init, eos), min_freq=5 (train.py). Two words stay below 5 (left out).
  counter = collections.Counter()
  for i, w in enumerate(WORDS):
    counter[w] = 5 + 3 * ((i * 7) % 11)
  counter.update({"rare": 4, "zebra": 1})
  specials = list(collections.OrderedDict.fromkeys(["<unk>", "<pad>", "<bos>", "<eos>"]))
  vocab = vocab_mod.Vocab(counter, specials=specials, min_freq=5)
  pad, bos, eos, unk = (vocab.stoi[t] for t in ("<pad>", "<bos>", "<eos>", "<unk>"))

  torch.manual_seed(0)
  size_kw = dict(d_model=s["d_model"], d_k=s["d_k"], d_v=s["d_v"], h=s["h"], d_ff=s["d_ff"])
  encoder = MemoryAugmentedEncoder(s["n_enc"], 0, d_in=s["d_in"],
                                   attention_module=ScaledDotProductAttentionMemory,
                                   attention_module_kwargs={"m": s["m"]}, **size_kw)
  decoder = MeshedDecoder(len(vocab), s["max_len"], s["n_dec"], pad, **size_kw)
  model = Transformer(bos, encoder, decoder)
  make_fixture.prepare(torch, model)
  with torch.no_grad():
    make_fixture._shift_logits(torch, model, {pad: -8.0, bos: -8.0, unk: -8.0, eos: EOS_SHIFT})

  # Their train.py's optimiser and schedule; one step of zero gradients fills Adam's state
  # (exp_avg, exp_avg_sq) as a saved run has it and moves no weight (Adam's update of 0 is 0).
  def lambda_lr(s_):
    s_ += 1
    return (model.d_model ** -.5) * min(s_ ** -.5, s_ * 10000 ** -1.5)

  optim = torch.optim.Adam(model.parameters(), lr=1, betas=(0.9, 0.98))
  scheduler = torch.optim.lr_scheduler.LambdaLR(optim, lambda_lr)
  before = {k: v.clone() for k, v in model.state_dict().items()}
  for prm in model.parameters():
    prm.grad = torch.zeros_like(prm)
  optim.step()
  scheduler.step()
  assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

  feats = rng.normal(size=(s["images"], s["regions"], s["d_in"])).astype(np.float32)
  feats *= (np.arange(s["regions"])[None, :] < np.array(REAL)[:, None])[..., None]
  visual = torch.from_numpy(feats)
  t = 9
  tf_tokens = np.full((s["images"], t), pad, np.int64)
  for b, n in enumerate((9, 5, 3)):
    tf_tokens[b, 0] = bos
    tf_tokens[b, 1:n] = rng.integers(4, len(vocab), size=n - 1)
  with torch.no_grad():
    tf_lp = model(visual, torch.from_numpy(tf_tokens)).numpy()
    greedy, _ = model.test(visual, s["steps"], eos)
    beam, _ = model.beam_search(visual, s["steps"], eos, s["beam"], out_size=1)

  def words(ids):  # their TextField.decode(..., join_words=False)
    out = []
    for row in ids.tolist():
      caption = []
      for i in row:
        if vocab.itos[int(i)] == "<eos>":
          break
        caption.append(vocab.itos[int(i)])
      out.append(caption)
    return out

  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "vocab.pkl"), "wb") as f:
    pickle.dump(vocab, f)  # train.py: pickle.dump(text_field.vocab, open('vocab_%s.pkl', 'wb'))
  saved = {  # train.py's dict, key for key
      "torch_rng_state": torch.get_rng_state(),
      "cuda_rng_state": torch.get_rng_state(),  # no GPU here (module docstring)
      "numpy_rng_state": np.random.get_state(),
      "random_rng_state": random.getstate(),
      "epoch": 3,
      "val_loss": 2.5,
      "val_cider": 1.1,
      "state_dict": model.state_dict(),
      "optimizer": optim.state_dict(),
      "scheduler": scheduler.state_dict(),
      "patience": 0,
      "best_cider": 1.1,
      "use_rl": False,
  }
  torch.save(saved, os.path.join(args.out, "meshed_memory_transformer.pth"))
  # Their environment.yml pins torch 1.1.0, whose torch.save wrote the older sequential
  # format (the zip format is PyTorch >= 1.6's): the released file is most likely that one.
  torch.save(saved, os.path.join(args.out, "meshed_memory_transformer_legacy.pth"),
             _use_new_zipfile_serialization=False)
  np.savez_compressed(os.path.join(args.out, "expected.npz"), feats=feats,
                      tf_tokens=tf_tokens.astype(np.int32), tf_logprobs=tf_lp.astype(np.float32))
  meta = dict(SIZES, real_regions=list(REAL), itos=list(vocab.itos), greedy=words(greedy.numpy()),
              beam=words(beam.numpy()), source="aimagelab/meshed-memory-transformer@239100b",
              torch=torch.__version__)
  with open(os.path.join(args.out, "expected.json"), "w") as f:
    json.dump(meta, f, indent=1)
    f.write("\n")
  print("greedy", meta["greedy"], "beam", meta["beam"], sep="\n")


if __name__ == "__main__":
  main()
