"""Writes the fixture that tests/importers/test_self_critical.py reads: small self-critical.pytorch
models on random weights, saved by that code's own training path, with the outputs of that
code's own forward pass, step function, greedy search and beam search.

Needs torch, safetensors, six, h5py, lmdbdict, pycocoevalcap and self-critical.pytorch's source at
commit 4c48a33 (the code the importer follows), which this script imports, never copies:

    git clone https://github.com/ruotianluo/self-critical.pytorch /tmp/sc
    git -C /tmp/sc checkout 4c48a33
    pip install torch safetensors six h5py lmdbdict pycocoevalcap pyyaml
    python scripts/self_critical/make_import_fixture.py --sc_root /tmp/sc

What its code does, done here by its code:

- a dataset in its prepro format (``cocotalk.json`` with ``ix_to_word`` and the images' splits,
  ``cocotalk_label.h5`` with captions of ``seq_length`` = 16 words, ``.npy`` fc and ``.npz``
  att feature folders), read by its ``DataLoader`` (which sets ``opt.vocab_size`` and
  ``opt.seq_length`` as its ``tools/train.py`` does, pads each batch's regions and gives
  ``att_masks``, and ``fc_feats`` of width 0 to a Transformer, which does not use them);
- ``opt`` from its ``opts.parse_opt`` (its defaults: ``max_length`` 20, ``seq_per_img`` 5);
- ``infos`` as ``tools/train.py`` builds it (``iter``, ``epoch``, ``vocab``, ``opt``, its
  loader's ``state_dict()``, ``best_val_score`` = pycocoevalcap's CIDEr, a numpy float64);
- saved by its ``utils.save_checkpoint`` (``model.pth`` by ``torch.save(model.state_dict())``
  in torch's zip format, ``infos_<id>.pkl`` by ``misc.pickle_dump``: protocol 2);
- for the Transformer also the ``.pth`` of older torch (``_use_new_zipfile_serialization=False``)
  and of a ``torch.nn.DataParallel`` wrapper's ``state_dict`` (names prefixed ``module.``).

For each model it writes to ``--out/<name>/``: ``model.pth``, ``model.safetensors`` (the docs'
one-line conversion of it), ``infos_<name>.pkl`` and ``expected.npz``: for each of two
batches ``b`` of 24 test images, its loader's ``fc_feats_b``, ``att_feats_b``, ``att_masks_b``
(all ones where it gives None) and ``labels_b`` ``[B*5, 18]``, and its model's outputs:
``logprobs_b`` (teacher forcing, ``[B*5, 18, V+1]``), ``forced_b`` (20 word ids) and
``steplogprobs_b`` (its ``get_logprobs_state`` fed BOS then ``forced_b``: 20 positions, past
the training captions' 18), ``greedy_b`` and ``beam3_b`` (``[B, 20]``, 0 = end / padding: its
``_sample`` with eval.py's default options, ``suppress_UNK`` 1, beam size 1 and 3).

Weights are random (fixed seeds), layer norms and biases moved away from their initial values so
that a missed or misplaced tensor changes the outputs; the region embedding's bias is small and
the last 8 images' features are 1e-5 times the others, so that the layer norms' epsilon matters;
the end token's output bias is lowered by 2, so that decoded captions also reach ``max_length``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

WORDS = ["a", "man", "dog", "on", "the", "grass", "with", "red", "ball", "is", "running",
         "of", "two", "people", "UNK"]
NUM_TEST, NUM_TRAIN, BATCH = 48, 4, 24
SEQ_LENGTH = 16  # the label file's width: captions of up to 16 words, as COCO's prepro makes
MAX_LENGTH = 20  # opts' default decoding length
STEPS = 20
FC_DIM, ATT_DIM, MAX_REGIONS = 12, 10, 7
SMALL_FROM = 40  # test images from this index have features 1e-5 times the others

MODELS = {
    # The Transformer never reads fc features (its loader gives it none): fc_feat_size is left at
    # opts' 2048, unlike its att_feat_size.
    "transformer": ["--caption_model", "transformer", "--num_layers", "2", "--input_encoding_size", "16",
                    "--rnn_size", "24", "--drop_prob_lm", "0.1", "--fc_feat_size", "2048"],
    "newfc": ["--caption_model", "newfc", "--input_encoding_size", "14", "--rnn_size", "18",
              "--drop_prob_lm", "0.5"],
    # An FC model on ResNet-101's 2048-wide features: docs/USAGE.md's photo-to-caption trial
    # imports it and captions images through jaxcap-extract's resnet101_self_critical.
    "newfc_resnet101": ["--caption_model", "newfc", "--input_encoding_size", "14", "--rnn_size", "18",
                        "--fc_feat_size", "2048", "--att_feat_size", "2048"],
    # The Transformer on 16-wide regions, the width of the region detector's fixture
    # (tests/detection/fixtures/d16): docs/USAGE.md's photo-to-caption trial imports it and
    # captions photos through that detector. Its fc width is its regions' too, as bottom-up
    # features have it (cocobu_fc is the regions' mean), though the Transformer reads none.
    "transformer_d16": ["--caption_model", "transformer", "--num_layers", "2", "--input_encoding_size", "16",
                        "--rnn_size", "24", "--drop_prob_lm", "0.1", "--fc_feat_size", "16",
                        "--att_feat_size", "16"],
    # AoA's options exist only in its yml (configs/aoa.yml): its own settings, smaller.
    "aoa": ["--cfg", "{sc_root}/configs/aoa.yml", "--set_cfgs", "input_encoding_size", "12",
            "rnn_size", "16", "num_heads", "2", "--att_hid_size", "16", "--drop_prob_lm", "0.2"],
    "aoa_ff": ["--cfg", "{sc_root}/configs/aoa.yml", "--set_cfgs", "input_encoding_size", "12",
               "rnn_size", "16", "num_heads", "4", "use_ff", "1", "refine_aoa", "0",
               "multi_head_scale", "2", "--att_hid_size", "16"],
    # UpDown as its configs/updown/updown.yml sets it, smaller.
    "updown": ["--cfg", "{sc_root}/configs/updown/updown.yml", "--set_cfgs", "input_encoding_size", "14",
               "rnn_size", "18", "--att_hid_size", "11", "--drop_prob_lm", "0.5"],
}
# Smaller random weights for the AoA models: at the others' gain their six refiner layers and
# the fed-back context make some images' log-probabilities ill-conditioned (float32 and float64
# runs of its own code then differ by 1e-3 at late positions); CONDITIONING checks it.
GAINS = {"aoa": 1.2, "aoa_ff": 1.0}
# Its own float32 outputs must equal its float64 ones within a third of the tests' tolerance
# (1e-5 absolute + 1e-5 relative), so that the tests' comparison with jaxcap's float32 tests the
# equations, not rounding amplified by the random weights.
CONDITIONING = 3e-6
# The Transformer's extra .pth files: (file, how torch.save writes it).
PTH_VARIANTS = {"model_legacy.pth": "legacy", "model_dataparallel.pth": "dataparallel"}


def write_dataset(root: str, rng) -> dict:
  """A dataset in self-critical's prepro format (scripts/prepro_labels.py and prepro_feats.py's
  outputs); returns the option values that point its DataLoader at it."""
  import h5py
  n = NUM_TEST + NUM_TRAIN
  images, labels, start, end = [], [], [], []
  for d in ("fc", "att"):
    os.makedirs(os.path.join(root, d))
  for i in range(n):
    images.append({"split": "test" if i < NUM_TEST else "train", "id": 1000 + i,
                   "file_path": f"val2014/img{i}.jpg"})
    scale = 1e-5 if SMALL_FROM <= i < NUM_TEST else 1.0
    regions = int(rng.integers(2, MAX_REGIONS + 1)) if i % 6 else MAX_REGIONS
    np.save(os.path.join(root, "fc", f"{1000 + i}.npy"),
            (rng.normal(size=FC_DIM) * scale).astype(np.float32))
    np.savez_compressed(os.path.join(root, "att", f"{1000 + i}.npz"),
                        feat=(rng.normal(size=(regions, ATT_DIM)) * scale).astype(np.float32))
    start.append(len(labels) + 1)  # 1-based, as prepro_labels.py writes them
    for k in range(5):
      words = SEQ_LENGTH if (i + k) % 7 == 0 else int(rng.integers(3, SEQ_LENGTH))
      row = np.zeros(SEQ_LENGTH, np.uint32)
      row[:words] = rng.integers(1, len(WORDS) + 1, size=words)
      labels.append(row)
    end.append(len(labels))
  with open(os.path.join(root, "cocotalk.json"), "w") as f:
    json.dump({"ix_to_word": {str(i + 1): w for i, w in enumerate(WORDS)}, "images": images}, f)
  with h5py.File(os.path.join(root, "cocotalk_label.h5"), "w") as f:
    f.create_dataset("labels", data=np.stack(labels))
    f.create_dataset("label_start_ix", data=np.array(start, np.uint32))
    f.create_dataset("label_end_ix", data=np.array(end, np.uint32))
  return {"input_json": os.path.join(root, "cocotalk.json"), "input_label_h5": os.path.join(root, "cocotalk_label.h5"),
          "input_fc_dir": os.path.join(root, "fc"), "input_att_dir": os.path.join(root, "att")}


def parse_sc_opt(sc_root: str, argv: list[str], data: dict, checkpoint_path: str, name: str):
  from captioning.utils import opts
  saved = sys.argv
  sys.argv = (["train.py", "--id", name, "--batch_size", str(BATCH), "--checkpoint_path", checkpoint_path,
               "--fc_feat_size", str(FC_DIM), "--att_feat_size", str(ATT_DIM)]
              + [f"--{k}={v}" for k, v in data.items()] + [a.format(sc_root=sc_root) for a in argv])
  try:
    opt = opts.parse_opt()
  finally:
    sys.argv = saved
  return opt


def randomise(model, torch, seed: int, gain: float = 2.0) -> None:
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      scale = gain / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.3
      if name in ("att_embed.0.bias",):  # regions of near-constant embedding: the epsilon matters
        scale = 1e-5
      p.copy_(torch.randn(p.shape, generator=g) * scale
              + (1.0 if name.endswith(("a_2", "weight")) and p.dim() == 1 else 0.0))
      if name in ("logit.bias", "model.generator.proj.bias"):
        p[0] -= 2.0  # a less likely end token: decoded captions run to max_length too


def eval_options(opt, beam_size: int) -> dict:
  """The options tools/eval.py hands the model (its eval and diversity defaults, the model's
  own options copied over, ``--beam_size``), as eval_utils.eval_split passes them on."""
  from captioning.utils import opts
  p = argparse.ArgumentParser()
  opts.add_eval_options(p)
  opts.add_diversity_opts(p)
  kwargs = vars(p.parse_args(["--beam_size", str(beam_size)]))
  for key, value in vars(opt).items():
    kwargs.setdefault(key, value)
  kwargs["sample_n"] = 1  # eval_split's tmp_eval_kwargs
  return kwargs


def outputs(model, torch, batch: dict, rng, opt) -> dict:
  """Its model's outputs on one of its loader's batches."""
  fc, att, masks, labels = batch["fc_feats"], batch["att_feats"], batch["att_masks"], batch["labels"]
  labels = labels.reshape(-1, labels.shape[-1])
  forced = rng.integers(1, opt.vocab_size + 1, size=(fc.shape[0], STEPS))
  with torch.no_grad():
    logprobs = model(fc, att, labels, masks)
    p_fc, p_att, pp_att, p_masks = model._prepare_feature(fc, att, masks)
    state = model.init_hidden(fc.shape[0])
    it = torch.zeros(fc.shape[0], dtype=torch.long)  # BOS
    steps = []
    for t in range(STEPS):
      lp, state = model.get_logprobs_state(it, p_fc, p_att, pp_att, p_masks, state)
      steps.append(lp.numpy())
      it = torch.from_numpy(forced[:, t])
    greedy, _ = model(fc, att, masks, opt=eval_options(opt, 1), mode="sample")
    beam3, _ = model(fc, att, masks, opt=eval_options(opt, 3), mode="sample")
  return {"logprobs": logprobs.numpy(), "forced": forced, "steplogprobs": np.stack(steps, 1),
          "greedy": greedy.numpy(), "beam3": beam3.numpy()}


def check_conditioning(name: str, model, torch, batch: dict, out: dict) -> None:
  """Its model in float64 on the same inputs and words: teacher-forced and step log-probabilities
  within CONDITIONING of its float32 ones at every position the tests compare."""
  import copy
  m64 = copy.deepcopy(model).double()
  d = lambda x: None if x is None else (x.double() if x.is_floating_point() else x)
  fc, att, masks = d(batch["fc_feats"]), d(batch["att_feats"]), d(batch["att_masks"])
  labels = batch["labels"].reshape(-1, batch["labels"].shape[-1])
  with torch.no_grad():
    tf = m64(fc, att, labels, masks).numpy()
    p_fc, p_att, pp_att, p_masks = m64._prepare_feature(fc, att, masks)
    state, it, steps = m64.init_hidden(fc.shape[0]), torch.zeros(fc.shape[0], dtype=torch.long), []
    state = [s.double() for s in state] if isinstance(state, (list, tuple)) and state and torch.is_tensor(state[0]) else state
    for t in range(STEPS):
      lp, state = m64.get_logprobs_state(it, p_fc, p_att, pp_att, p_masks, state)
      steps.append(lp.numpy())
      it = torch.from_numpy(out["forced"][:, t])
  length = (labels[:, 1:] > 0).sum(1).numpy() + 1
  keep = np.arange(tf.shape[1])[None, :] < length[:, None]
  ratio = lambda a64, a32: np.abs(a64 - a32) / (CONDITIONING * (1 + np.abs(a64)))
  worst = max(ratio(tf, out["logprobs"]).max(-1)[keep].max(), ratio(np.stack(steps, 1), out["steplogprobs"]).max())
  if worst > 1:
    raise SystemExit(f"{name}: its float32 and float64 log-probabilities differ by {worst:.2f} x "
                     f"{CONDITIONING} (absolute + relative); lower its gain in GAINS")
  print(f"{name}: float32 vs float64 log-probabilities within {worst:.2f} x {CONDITIONING} (absolute + relative)")


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
  from pycocoevalcap.cider.cider import Cider
  import captioning.models as sc_models
  import captioning.utils.misc as utils
  from captioning.data.dataloader import DataLoader

  tmp = tempfile.mkdtemp()
  try:
    data = write_dataset(os.path.join(tmp, "data"), np.random.default_rng(0))
    for name in args.models.split(","):
      k = list(MODELS).index(name)  # each model's own seed, whichever are written
      torch.manual_seed(k)
      np.random.seed(k)  # its samplers shuffle with numpy's global state
      ckpt_dir = os.path.join(tmp, name)
      opt = parse_sc_opt(args.sc_root, MODELS[name], data, ckpt_dir, name)
      if opt.fc_feat_size != FC_DIM:  # its own global features, of its width
        fc_dir = os.path.join(tmp, f"fc_{opt.fc_feat_size}")
        os.makedirs(fc_dir, exist_ok=True)
        rng = np.random.default_rng(k)
        for f in sorted(os.listdir(data["input_fc_dir"])):
          np.save(os.path.join(fc_dir, f), rng.normal(size=opt.fc_feat_size).astype(np.float32))
        opt.input_fc_dir = fc_dir
      if opt.att_feat_size != ATT_DIM and name.startswith("transformer"):  # its regions, of its width
        att_dir = os.path.join(tmp, f"att_{opt.att_feat_size}")
        os.makedirs(att_dir, exist_ok=True)
        rng = np.random.default_rng(1000 + k)
        for f in sorted(os.listdir(data["input_att_dir"])):
          old = np.load(os.path.join(data["input_att_dir"], f))["feat"]  # the same regions per image
          scale = 1e-5 if np.abs(old).max() < 1e-3 else 1.0  # and the small images small
          np.savez_compressed(os.path.join(att_dir, f), feat=(rng.normal(size=(len(old), opt.att_feat_size))
                                                              * scale).astype(np.float32))
        opt.input_att_dir = att_dir
      # tools/train.py, up to its first save:
      loader = DataLoader(opt)
      opt.vocab_size = loader.vocab_size
      opt.seq_length = loader.seq_length
      infos = {"iter": 0, "epoch": 0, "loader_state_dict": None, "vocab": loader.get_vocab()}
      infos["opt"] = opt
      opt.vocab = loader.get_vocab()
      model = sc_models.setup(opt)
      del opt.vocab
      randomise(model, torch, seed=100 + k, gain=GAINS.get(name, 2.0))
      optimizer = utils.build_optimizer(model.parameters(), opt)
      loader.get_batch("train")  # a training step's batch moves its train sampler
      model.eval()
      rng = np.random.default_rng(10 + k)
      expected, predictions, refs = {}, {}, {}
      for b in range(NUM_TEST // BATCH):
        batch = loader.get_batch("test")
        out = outputs(model, torch, batch, rng, opt)
        check_conditioning(name, model, torch, batch, out)
        masks = batch["att_masks"]
        expected.update({f"fc_feats_{b}": batch["fc_feats"].numpy(), f"att_feats_{b}": batch["att_feats"].numpy(),
                         f"att_masks_{b}": (np.ones(batch["att_feats"].shape[:2], np.float32) if masks is None
                                            else masks.numpy()),
                         f"labels_{b}": batch["labels"].reshape(-1, batch["labels"].shape[-1]).numpy()})
        expected.update({f"{key}_{b}": v for key, v in out.items()})
        for info, seq, gts in zip(batch["infos"], out["greedy"], batch["gts"]):
          predictions[info["id"]] = [utils.decode_sequence(loader.get_vocab(), torch.from_numpy(seq[None]))[0]]
          refs[info["id"]] = utils.decode_sequence(loader.get_vocab(), torch.from_numpy(gts.astype(np.int64)))
      cider, _ = Cider().compute_score(refs, predictions)  # eval_utils' lang_stats['CIDEr']
      infos["iter"], infos["epoch"] = 1234, 3
      infos["loader_state_dict"] = loader.state_dict()
      infos["best_val_score"] = cider
      utils.save_checkpoint(opt, model, infos, optimizer, {"val_result_history": {1234: {
          "loss": 2.5, "lang_stats": {"CIDEr": cider}, "predictions": []}}})
      out_dir = os.path.join(args.out, name)
      os.makedirs(out_dir, exist_ok=True)
      for f in ("model.pth", f"infos_{name}.pkl"):
        shutil.copy(os.path.join(ckpt_dir, f), os.path.join(out_dir, f))
      # The docs' one-line conversion, for the tests that run without torch.
      state = torch.load(os.path.join(out_dir, "model.pth"), map_location="cpu")
      save_file({key: v.contiguous() for key, v in state.items()}, os.path.join(out_dir, "model.safetensors"))
      if name == "transformer":
        torch.save(model.state_dict(), os.path.join(out_dir, "model_legacy.pth"),
                   _use_new_zipfile_serialization=False)
        torch.save(torch.nn.DataParallel(model).state_dict(), os.path.join(out_dir, "model_dataparallel.pth"))
      np.savez_compressed(os.path.join(out_dir, "expected.npz"), **expected)
      print(name, "params", sum(v.numel() for v in state.values()), "CIDEr", cider,
            "greedy[0]", expected["greedy_0"][0].tolist(), "beam3[0]", expected["beam3_0"][0].tolist())
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
