"""The reference side of benchmarks/cpu_side_by_side.py, run by a Python with torch and the
producers' requirements (never imported by jaxcap): their own code builds, saves and times their
models (self-critical.pytorch's Transformer; with ``"model": "m2"`` the Meshed-Memory
Transformer, :func:`m2`).

  <torch python> benchmarks/side_by_side_torch.py JOB.json

JOB.json (written by cpu_side_by_side.py): ``sc_root`` (self-critical.pytorch at 4c48a33),
``features`` (an .npz of ``att`` [B, N, F] and ``fc`` [B, F]), ``threads``, ``repeats``,
``b1_images``, ``out`` (the JSON written here), and either ``checkpoint`` + ``infos`` (a model
to time) or ``build`` (``dir``, ``cfg``, ``vocab_size``, ``target_words``): a model of its
``cfg`` (configs/transformer/transformer.yml: 6 + 6 layers, d = 512) on random weights (its own
initialisation), its end token's logit made to rise with the caption's position
(:func:`_position_direction`) and its output bias set so that its greedy captions of the
features average ``target_words`` words, saved by its ``utils.save_checkpoint`` into ``dir``.

Why the rise: a random model's word distributions barely change from one step to the next, so a
constant end-token shift gives captions that end at a geometric spread of lengths under greedy
decoding and, under a beam search that sums log-probabilities (both producers' searches), at
once or never (each further word only lowers the score). A trained model's end token grows
likely as the caption grows; here a direction of the output layer's input that reads the
position (its least-squares fit, on the model's own hidden states) is added to the end token's
row, ``EOS_SLOPE`` nats per word, so both searches end captions around the calibrated length.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np


def _sc(sc_root: str):
  sys.path.insert(0, os.path.abspath(sc_root))
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "self_critical"))
  import make_import_fixture  # its eval_options: the options tools/eval.py hands the model
  return make_import_fixture


def _parse_opt(sc_root: str, argv: list[str]):
  from captioning.utils import opts
  saved = sys.argv
  sys.argv = ["train.py"] + argv
  try:
    return opts.parse_opt()
  finally:
    sys.argv = saved


def _bisect(mean_words, target: float, span: float, steps: int) -> float:
  """The end token's shift in [-span, span] at which ``mean_words(shift)`` crosses ``target``
  (more shift, shorter captions), by ``steps`` halvings."""
  lo, hi = -span, span
  for _ in range(steps):
    mid = (lo + hi) / 2
    if mean_words(mid) > target:
      lo = mid
    else:
      hi = mid
  return (lo + hi) / 2


# How much the end token's logit rises per word of the caption (a trained model's rises too).
EOS_SLOPE = 1.0


def _position_direction(torch, layer, decode) -> tuple:
  """``(w [D], b, rmse)``: the least-squares fit ``t ~ w . h_t + b`` of the position ``t``
  (1, 2, ...) on ``h_t``, the input of the output ``layer`` at each step, captured by a hook while
  ``decode()`` runs (it returns nothing; it calls ``layer`` once per step on ``[B, D]`` rows, or
  once on ``[B, T, D]``). The positional encodings reach the last layer's output linearly
  enough that the fit is near exact (its rmse is recorded)."""
  got = []
  hook = layer.register_forward_hook(lambda m, i, o: got.append(i[0].detach().double()))
  try:
    with torch.no_grad():
      decode()
  finally:
    hook.remove()
  h_BxTxD = got[0] if len(got) == 1 else torch.stack([g.reshape(g.shape[0], -1) for g in got], 1)
  b, t_len, d = h_BxTxD.shape
  x = torch.cat([h_BxTxD.reshape(-1, d), torch.ones(b * t_len, 1, dtype=torch.double)], 1)
  t = torch.arange(1, t_len + 1, dtype=torch.double).repeat(b)
  # A little ridge: the fit needs no more than the directions the data spans.
  coef = torch.linalg.solve(x.T @ x + 1e-3 * torch.eye(d + 1, dtype=torch.double), x.T @ t)
  rmse = float(((x @ coef - t) ** 2).mean().sqrt())
  return coef[:d].float(), float(coef[d]), rmse


def _eos_bias(model):
  """Its output layer's bias (the end token is row 0)."""
  for name, p in model.named_parameters():
    if name in ("logit.bias", "model.generator.proj.bias"):
      return p
  raise SystemExit("no output bias (logit.bias / model.generator.proj.bias) in the model")


def build(job: dict, torch, fixture):
  """Its model of ``cfg`` on random weights, the end bias calibrated, saved by its own code."""
  import captioning.models as sc_models
  import captioning.utils.misc as utils
  spec = job["build"]
  ckpt = spec["dir"]
  opt = _parse_opt(job["sc_root"], ["--id", "bench", "--checkpoint_path", ckpt, "--cfg", spec["cfg"]])
  words = {str(i + 1): f"w{i}" for i in range(spec["vocab_size"] - 1)}
  words[str(spec["vocab_size"])] = "UNK"  # prepro_labels.py's last word
  opt.vocab_size, opt.seq_length = spec["vocab_size"], 16  # its loader's, as tools/train.py sets them
  opt.vocab = words
  torch.manual_seed(0)
  model = sc_models.setup(opt)
  del opt.vocab
  model.eval()
  feats = np.load(job["features"])
  fc, att = torch.from_numpy(feats["fc"]), torch.from_numpy(feats["att"])
  masks = torch.ones(att.shape[:2])
  bias = _eos_bias(model)
  base = bias.data[0].item()
  proj = model.model.generator.proj
  n_fit = min(len(fc), 10)

  def never_ending_greedy():  # its greedy loop with the end token out of reach: every step runs
    bias.data[0] = base - 1e4
    try:
      model(fc[:n_fit], att[:n_fit], masks[:n_fit], opt=fixture.eval_options(opt, 1), mode="sample")
    finally:
      bias.data[0] = base

  w, b, fit_rmse = _position_direction(torch, proj, never_ending_greedy)
  with torch.no_grad():
    proj.weight[0] += EOS_SLOPE * w
  base -= EOS_SLOPE * b  # so that the shift below is the logit at position 0

  def mean_words(shift):
    with torch.no_grad():
      bias.data[0] = base + shift
      seq, _ = model(fc, att, masks, opt=fixture.eval_options(opt, 1), mode="sample")
    return float((seq > 0).sum(1).float().mean())

  shift = _bisect(mean_words, spec["target_words"], 30.0, 12)
  got = mean_words(shift)
  infos = {"iter": 0, "epoch": 0, "loader_state_dict": None, "vocab": words, "opt": opt,
           "best_val_score": 0.0}
  optimizer = utils.build_optimizer(model.parameters(), opt)
  utils.save_checkpoint(opt, model, infos, optimizer)
  # The docs' one-line conversion (docs/USAGE.md), for jaxcap's side, which has no torch.
  from safetensors.torch import save_file
  state = torch.load(os.path.join(ckpt, "model.pth"), map_location="cpu")
  save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(ckpt, "model.safetensors"))
  built = {"checkpoint": os.path.join(ckpt, "model.safetensors"), "infos": os.path.join(ckpt, "infos_bench.pkl"),
           "eos_bias_shift": shift, "eos_slope_per_word": EOS_SLOPE, "position_fit_rmse": fit_rmse,
           "calibrated_mean_words": got,
           "parameters": int(sum(p.numel() for p in model.parameters()))}
  with open(os.path.join(ckpt, "built.json"), "w") as f:  # what a later run reusing it reports
    json.dump(built, f)
  return built, model, opt


def load(job: dict, torch):
  import pickle
  import captioning.models as sc_models
  with open(job["infos"], "rb") as f:
    infos = pickle.load(f)
  opt = infos["opt"]
  opt.vocab = infos["vocab"]
  model = sc_models.setup(opt)
  del opt.vocab
  if job["checkpoint"].endswith(".safetensors"):
    from safetensors.torch import load_file
    state = load_file(job["checkpoint"])
  else:
    state = torch.load(job["checkpoint"], map_location="cpu")
  model.load_state_dict(state)
  model.eval()
  return model, opt, infos["vocab"]


def m2(job: dict) -> dict:
  """The Meshed-Memory Transformer with its authors' code (aimagelab/meshed-memory-transformer@239100b,
  ``job["m2_src"]``: its models/, utils/, data/), patched for current PyTorch as the tests' fixture
  generators patch it (tests/papers/m2/make_fixture.py): test.py's sizes (3 + 3 layers, d = 512,
  40 memory slots, d_in 2048, max_len 54), their default initialisation, then make_fixture's
  ``prepare`` (layer norms and biases moved, so that a logit can be shifted) and logit shifts:
  ``<pad>`` / ``<bos>`` / ``<unk>`` -8 (jaxcap never emits the first two) and ``<eos>`` rising
  ``EOS_SLOPE`` per word (:func:`_position_direction`, fit on the decoder run over their beam
  search's 20-word captions) from the bisection's amount, so that their beam search's captions
  average ``target_words`` words. Saved
  as their train.py saves (``torch.save`` of its dict; ``vocab.pkl`` by ``pickle.dump`` of their
  ``Vocab``), then timed: test.py's ``model.beam_search(visual, 20, eos, 5, out_size=1)``."""
  import collections
  import pickle
  m2_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "papers", "m2")
  sys.path.insert(0, m2_dir)
  import make_fixture
  import make_import_fixture
  src = os.path.abspath(job["m2_src"])
  (torch, MemoryAugmentedEncoder, MeshedDecoder, ScaledDotProductAttentionMemory, Transformer,
   _) = make_fixture._import_theirs(src)
  torch.set_num_threads(int(job["threads"]))
  vocab_mod = make_import_fixture._their_vocab_module(src)
  spec = job["build"]
  counter = collections.Counter({f"w{i}": 5 + i % 50 for i in range(spec["vocab_size"] - 4)})
  vocab = vocab_mod.Vocab(counter, specials=["<unk>", "<pad>", "<bos>", "<eos>"], min_freq=5)
  pad, bos, eos, unk = (vocab.stoi[t] for t in ("<pad>", "<bos>", "<eos>", "<unk>"))
  torch.manual_seed(0)
  encoder = MemoryAugmentedEncoder(3, 0, attention_module=ScaledDotProductAttentionMemory,
                                   attention_module_kwargs={"m": 40})
  decoder = MeshedDecoder(len(vocab), 54, 3, pad)
  model = Transformer(bos, encoder, decoder)
  make_fixture.prepare(torch, model)
  feats = np.load(job["features"])
  visual = torch.from_numpy(feats["att"])
  beam = int(job.get("beam_size", 5))
  n_fit = spec["calibration_images"]
  with torch.no_grad():  # captions that never end, the decoder's states along them
    fc0 = model.decoder.fc.weight.detach().clone()
    make_fixture._shift_logits(torch, model, {pad: -8.0, bos: -8.0, unk: -8.0, eos: -30.0})
    seq, _ = model.beam_search(visual[:n_fit], 20, eos, beam, out_size=1)
    model.decoder.fc.weight.copy_(fc0)
  assert not bool((seq == eos).any()), "the end token was out of reach"
  inputs = torch.cat([torch.full((n_fit, 1), bos, dtype=seq.dtype), seq[:, :-1]], 1)
  w, b, fit_rmse = _position_direction(torch, model.decoder.fc, lambda: model(visual[:n_fit], inputs))
  with torch.no_grad():
    model.decoder.fc.weight[eos] += EOS_SLOPE * w
    fc0 = model.decoder.fc.weight.detach().clone()

  def beam_search(v):
    with torch.no_grad():
      out, _ = model.beam_search(v, 20, eos, beam, out_size=1)
    return out

  def words(ids):  # their TextField.decode: up to the first <eos>
    caps = []
    for row in ids.tolist():
      caption = []
      for i in row:
        if vocab.itos[int(i)] == "<eos>":
          break
        caption.append(vocab.itos[int(i)])
      caps.append(" ".join(caption))
    return caps

  def mean_words(shift):
    with torch.no_grad():
      model.decoder.fc.weight.copy_(fc0)
      make_fixture._shift_logits(torch, model, {pad: -8.0, bos: -8.0, unk: -8.0, eos: shift - EOS_SLOPE * b})
    return float(np.mean([len(c.split()) for c in words(beam_search(visual[:n_fit]))]))

  shift = _bisect(mean_words, spec["target_words"], 20.0, 10)
  calibrated = mean_words(shift)
  os.makedirs(spec["dir"], exist_ok=True)
  with open(os.path.join(spec["dir"], "vocab.pkl"), "wb") as f:
    pickle.dump(vocab, f)
  torch.save({"epoch": 0, "state_dict": model.state_dict(), "best_cider": 0.0, "use_rl": False},
             os.path.join(spec["dir"], "meshed_memory_transformer.pth"))
  record = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "built": {"checkpoint": os.path.join(spec["dir"], "meshed_memory_transformer.pth"),
                      "vocab": os.path.join(spec["dir"], "vocab.pkl"), "eos_logit_shift": shift,
                      "eos_slope_per_word": EOS_SLOPE, "position_fit_rmse": fit_rmse,
                      "calibrated_mean_words": calibrated, "calibration_images": spec["calibration_images"],
                      "parameters": int(sum(p.numel() for p in model.parameters()))}}
  record["rows"] = [_time(lambda sl: words(beam_search(visual[sl])), len(visual), job, "beam", beam)]
  return record


def _time(call, b_all: int, job: dict, method: str, beam: int) -> dict:
  """``call(slice) -> captions`` timed: the first call, batch 1 (the first ``b1_images`` images,
  ``b1_repeats`` times each), the whole batch (``repeats`` times)."""
  t0 = time.perf_counter()
  call(slice(0, 1))
  first = time.perf_counter() - t0
  b1, captions_b1 = [], []
  for i in range(int(job["b1_images"])):
    for _ in range(int(job["b1_repeats"])):
      t0 = time.perf_counter()
      caps = call(slice(i, i + 1))
      b1.append(time.perf_counter() - t0)
    captions_b1 += caps
  batch = []
  for _ in range(int(job["repeats"])):
    t0 = time.perf_counter()
    captions = call(slice(0, b_all))
    batch.append(time.perf_counter() - t0)
  return {"method": method, "beam_size": beam, "first_call_s": first, "b1_s": b1,
          "b1_median_s": statistics.median(b1), "batch": b_all, "batch_s": batch,
          "batch_median_s": statistics.median(batch), "captions_b1": captions_b1, "captions": captions}


def main():
  job = json.load(open(sys.argv[1]))
  if job.get("model") == "m2":
    record = m2(job)
    with open(job["out"], "w") as f:
      json.dump(record, f)
    return
  import torch
  torch.set_num_threads(int(job["threads"]))
  fixture = _sc(job["sc_root"])
  import captioning.utils.misc as utils
  record = {"torch": torch.__version__, "threads": torch.get_num_threads()}
  if "build" in job:
    built, model, opt = build(job, torch, fixture)
    record["built"] = built
    job = dict(job, checkpoint=built["checkpoint"], infos=built["infos"])
  model, opt, vocab = load(job, torch)  # what a user's file gives: the saved checkpoint read back
  feats = np.load(job["features"])
  fc, att = torch.from_numpy(feats["fc"]), torch.from_numpy(feats["att"])
  masks = torch.ones(att.shape[:2])
  rows = []
  for beam in (1, 3):
    options = fixture.eval_options(opt, beam)

    def call(sl):
      with torch.no_grad():
        seq, _ = model(fc[sl], att[sl], masks[sl], opt=options, mode="sample")
      return utils.decode_sequence(vocab, seq)

    rows.append(_time(call, len(fc), job, "greedy" if beam == 1 else "beam", beam))
  record["rows"] = rows
  with open(job["out"], "w") as f:
    json.dump(record, f)


if __name__ == "__main__":
  main()
