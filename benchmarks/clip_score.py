"""CLIP-S throughput on this machine: jaxcap's jitted scorer against clipscore.py's own code
(jmhessel/clipscore ``get_clip_score``, torch on the CPU) on the same image-caption pairs and
the same weights, in one run; the per-pair scores compared.

  python benchmarks/clip_score.py --pairs 5000 --torch-python /path/to/python-with-torch \\
      --clipscore-src /path/to/clipscore [--weights ViT-B-32.safetensors] [--out record.json]

Pairs: synthetic scenes drawn as PNGs (``jaxcap.data.render``, 128 px) with one of their
captions each. Weights: ``--weights`` (OpenAI-named, e.g. ``python -m jaxcap.clip.weights --random``'s)
or random weights of ViT-B/32's sizes, rounded to float16 values (openai-clip's ``build_model``
casts the weights to float16 before ``clip.load`` turns them back to float32 on the CPU, so the
torch side computes with float16-rounded weights: rounding ours the same way compares like with
like). Timed: the whole scoring of the pairs from image files and caption strings (jaxcap: its
first call, compilation included, and a second call with the images' embeddings kept; clipscore:
``get_clip_score`` with its DataLoader). ``--torch-python`` omitted: jaxcap alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
BENCHMARK = "benchmarks/clip_score.py"

from jaxcap.cli import positive_int  # noqa: E402

_TORCH_SIDE = r'''
import json, sys, time
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
import clipscore, clip
from clip.model import build_model
from safetensors.torch import load_file
args = json.load(open(sys.argv[2]))
torch.set_num_threads(args["threads"])
model = build_model(load_file(args["weights"])).float().eval()  # clip.load on the CPU
t0 = time.perf_counter()
_, per, _ = clipscore.get_clip_score(model, args["images"], args["captions"], "cpu")
seconds = time.perf_counter() - t0
np.save(args["out"], np.asarray(per, np.float64))
print(json.dumps({"seconds": seconds, "torch": torch.__version__}))
'''


def _pairs(n: int, folder: str):
  from jaxcap.data import render
  from jaxcap.data.synthetic import SyntheticScenes
  scenes = SyntheticScenes(num_train=0, num_val=0, num_test=n, seed=0)
  render.write_dataset(folder, scenes, 128, log=lambda _: None)
  images = [os.path.join(folder, "images", render.image_name("test", i)) for i in range(n)]
  captions = [" ".join(scenes.captions("test", i)[0]) for i in range(n)]
  return images, captions


def _weights(path: str | None, folder: str, size: str) -> str:
  if path:
    return path
  from safetensors.numpy import load_file, save_file
  from jaxcap.clip import model as model_lib, weights
  sizes = model_lib.VIT_B_32 if size == "vit_b32" else model_lib.ClipSizes(
      embed_dim=16, image_resolution=32, vision_layers=1, vision_width=64, vision_patch_size=16,
      transformer_width=64, transformer_layers=1, transformer_heads=1, vision_heads=1)
  out = os.path.join(folder, f"{size}_random.safetensors")
  weights.save_random(out, sizes, seed=0)
  save_file({k: v.astype(np.float16).astype(np.float32) for k, v in load_file(out).items()}, out)
  return out


def main(argv=None) -> dict:
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  p = ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--pairs", type=positive_int, default=5000)
  p.add_argument("--batch", type=positive_int, default=64, help="jaxcap's batch (clipscore: its own 64 / 256)")
  p.add_argument("--weights", default=None, help="OpenAI-named CLIP weights (.safetensors); default random ViT-B/32")
  p.add_argument("--size", choices=("vit_b32", "tiny"), default="vit_b32",
                 help="the random weights' sizes (tiny: the tests' smoke run)")
  p.add_argument("--torch-python", default=None, help="a Python with torch and openai-clip (clipscore's side)")
  p.add_argument("--clipscore-src", default=None, help="a checkout of jmhessel/clipscore (with --torch-python)")
  p.add_argument("--out", default=None, help="the JSON record (default: benchmarks/results/"
                 "clip_score_<device>_<date>.json)")
  a = p.parse_args(argv)
  if bool(a.torch_python) != bool(a.clipscore_src):
    p.error("--torch-python and --clipscore-src: expected both or neither")
  if a.weights and not os.path.isfile(a.weights):
    p.error(f"--weights={a.weights}: no such file; expected CLIP weights (.safetensors)")
  if a.clipscore_src and not os.path.isfile(os.path.join(a.clipscore_src, "clipscore.py")):
    p.error(f"--clipscore-src={a.clipscore_src}: no clipscore.py there; expected a clipscore checkout")
  import jax
  import common
  import run as bench_run  # the same environment record as run.py
  from jaxcap.clip import score
  with tempfile.TemporaryDirectory() as tmp:
    images, captions = _pairs(a.pairs, tmp)
    weights = _weights(a.weights, tmp, a.size)
    scorer = score.Scorer(weights, a.batch)
    files = dict(enumerate(images))
    preds = dict(enumerate(captions))
    t0 = time.perf_counter()
    first = scorer.score(preds, files)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    scorer.score(preds, files)
    t_kept = time.perf_counter() - t0
    ours = np.array([first["per_image"][i]["CLIP-S"] for i in range(a.pairs)])
    env = dict(bench_run.environment(), cpu_count=os.cpu_count())
    record = {"benchmark": BENCHMARK, "environment": env, "pairs": a.pairs, "batch": a.batch,
              "weights": "given" if a.weights else f"random {a.size}, float16-rounded",
              "rows": [{"scorer": "jaxcap", "call": "first (compilation included)", "seconds": t_first,
                        "pairs_per_s": a.pairs / t_first, "mean_clip_s": float(ours.mean())},
                       {"scorer": "jaxcap", "call": "again (image embeddings kept)", "seconds": t_kept,
                        "pairs_per_s": a.pairs / t_kept, "mean_clip_s": float(ours.mean())}]}
    if a.torch_python:
      spec = {"weights": weights, "images": images, "captions": captions, "out": os.path.join(tmp, "theirs.npy"),
              "threads": os.cpu_count()}
      with open(os.path.join(tmp, "spec.json"), "w") as f:
        json.dump(spec, f)
      proc = subprocess.run([a.torch_python, "-c", _TORCH_SIDE, os.path.abspath(a.clipscore_src),
                             os.path.join(tmp, "spec.json")], capture_output=True, text=True)
      if proc.returncode:
        raise RuntimeError(f"clipscore's side failed: {proc.stderr.strip().splitlines()[-1]}")
      out = json.loads(proc.stdout.strip().splitlines()[-1])
      theirs = np.load(spec["out"])
      record["rows"].append({"scorer": f"clipscore.py get_clip_score (torch {out['torch']}, CPU)",
                             "call": "one call", "seconds": out["seconds"],
                             "pairs_per_s": a.pairs / out["seconds"], "mean_clip_s": float(theirs.mean())})
      record["max_abs_diff_per_pair"] = float(np.abs(ours - theirs).max())
  print(json.dumps(record, indent=1))
  common.write_record("clip_score", record, a.out)
  return record


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)
