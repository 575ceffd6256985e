"""The AAT paper's Table 1 on the synthetic dataset: base, recurrent (2 and 4 steps) and
adaptive (M_max = 4) attention, each trained with ``configs/aat.py:synthetic,...`` and tested
on the test split; prints CIDEr-D and the average number of attention steps per word (greedy
decoding, counted over the generated words and EOS).

  python scripts/aat_table1.py --workdir /tmp/aat_table1 [--steps 1500] [--rows base,adaptive]

``--rows ...,adaptive_ln`` adds a row that is not in the paper: adaptive with the released
code's LayerNorm on h1 (``norm_h1=True``). Each row trains in its own sub-directory (a finished
run is resumed, i.e. only tested again).
The table is also written to ``<workdir>/table1.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS = {
    "base": ("synthetic,attention=base", "Base", 1, 1),
    "recurrent2": ("synthetic,attention=recurrent,steps=2", "Recurrent", 2, 2),
    "recurrent4": ("synthetic,attention=recurrent,steps=4", "Recurrent", 4, 4),
    "adaptive": ("synthetic", "Adaptive", 0, 4),
    # Not in the paper's table: the released code's LayerNorm on h1 (``norm_h1``).
    "adaptive_ln": ("synthetic,norm_h1=True", "Adaptive+LN h1", 0, 4),
}
DEFAULT_ROWS = ("base", "recurrent2", "recurrent4", "adaptive")


def average_steps(trainer, params, split: str) -> float:
  """Mean N(t) over the generated tokens (words and EOS) of greedy decoding on ``split``."""
  from jaxcap import decoding
  from jaxcap.data import pipeline
  from jaxcap.data.vocab import PAD
  import jax
  total = count = 0.0
  for batch in pipeline.eval_batches(trainer.dataset.split(split), trainer.eval_batch_size, num_threads=0):
    valid = np.asarray(batch.pop("valid"))
    batch = {k: v for k, v in batch.items() if k in ("feats", "feats_mask", "boxes", "global_feat")}
    out = decoding.greedy(trainer.model, params, jax.device_put(batch),
                          max_len=int(trainer.config.decode.max_len), return_aux=True)
    tokens = np.asarray(out.tokens)
    steps = np.asarray(out.aux["attention_steps"])
    mask = (tokens != PAD) & valid[:, None]
    total += float(np.sum(steps * mask))
    count += float(np.sum(mask))
  return total / max(count, 1.0)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma-separated subset of {list(ROWS)}")
  ap.add_argument("--steps", type=int, default=0, help="training steps per row (0: the config's)")
  args = ap.parse_args(argv)
  from configs import aat as aat_config
  from jaxcap.training import train_lib

  results = []
  for key in args.rows.split(","):
    if key not in ROWS:
      raise SystemExit(f"--rows: unknown row {key!r}; expected a subset of {list(ROWS)}")
    arg, name, lo, hi = ROWS[key]
    config = aat_config.get_config(arg)
    if args.steps:
      config.num_train_steps = args.steps
    workdir = os.path.join(args.workdir, key)
    print(f"=== {name} ({arg}) -> {workdir}", flush=True)
    scores = train_lib.train_and_evaluate(config, workdir)
    trainer = train_lib.Trainer(config, workdir)
    params = trainer.load().params
    avg = average_steps(trainer, params, config.test_split)
    overall = scores.get("overall", {})
    results.append({"row": key, "model": name, "min": lo, "max": hi, "avg_steps": round(avg, 2),
                    "CIDEr": overall.get("CIDEr"), "METEOR": overall.get("METEOR"),
                    "Bleu_4": overall.get("Bleu_4"), "config": f"configs/aat.py:{arg}"})
  print("\nAttention model | min | max | avg. steps | CIDEr-D | METEOR | BLEU-4")
  for r in results:
    fmt = lambda v: "   -  " if v is None else f"{100 * v:6.1f}"
    print(f"{r['model']:<15} | {r['min']:>3} | {r['max']:>3} | {r['avg_steps']:>10.2f} | "
          f"{fmt(r['CIDEr'])}  | {fmt(r['METEOR'])} | {fmt(r['Bleu_4'])}")
  os.makedirs(args.workdir, exist_ok=True)
  path = os.path.join(args.workdir, "table1.json")
  with open(path + ".tmp", "w") as f:
    json.dump(results, f, indent=1)
  os.replace(path + ".tmp", path)
  return results


if __name__ == "__main__":
  main()
