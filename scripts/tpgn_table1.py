"""TPGN's Table 1 on the synthetic dataset: TPGN vs the CNN-LSTM (Show and Tell) baseline over seeds.

  python scripts/tpgn_table1.py --workdir runs/tpgn_table1 [--seeds 0,1,2] [--steps 600]
      [--rows tpgn,show_tell]

Each (row, seed) trains ``configs/<row>.py:synthetic`` with ``seed=<seed>`` (initialisation and
batch order; the dataset is the same) in ``<workdir>/<row>_s<seed>`` (a finished run is only
tested again) and tests its best checkpoint on the test split (greedy decoding). The table
prints mean ± sample std over seeds of CIDEr-D, BLEU-4, METEOR and ROUGE-L (x100) and is
written to ``<workdir>/table1.json``. ``scripts/tpgn_roles.py --workdir <workdir>/tpgn_s0`` then
gives the role-cluster tables of one TPGN run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS = {"show_tell": "CNN-LSTM (Show and Tell)", "tpgn": "TPGN"}
METRICS = ("CIDEr", "Bleu_4", "METEOR", "ROUGE_L")


def mean_std(values):
  v = np.asarray([x for x in values if x is not None], np.float64)
  if v.size == 0:
    return None, None
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--rows", default="show_tell,tpgn")
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--steps", type=int, default=0, help="training steps per run (0: the config's)")
  args = ap.parse_args(argv)
  from jaxcap.training import train_lib

  seeds = [int(s) for s in args.seeds.split(",")]
  results = []
  for row in args.rows.split(","):
    if row not in ROWS:
      raise SystemExit(f"--rows: unknown row {row!r}; expected a subset of {list(ROWS)}")
    cfg_mod = importlib.import_module(f"configs.{row}")
    runs = []
    for seed in seeds:
      config = cfg_mod.get_config("synthetic")
      config.seed = seed
      if args.steps:
        config.num_train_steps = args.steps
        config.eval_every_steps = min(config.eval_every_steps, args.steps)
        config.checkpoint_every_steps = min(config.checkpoint_every_steps, args.steps)
      workdir = os.path.join(args.workdir, f"{row}_s{seed}")
      print(f"=== {ROWS[row]} seed {seed} -> {workdir}", flush=True)
      scores = train_lib.train_and_evaluate(config, workdir).get("overall", {})
      runs.append({"seed": seed, **{m: scores.get(m) for m in METRICS}})
    summary = {m: mean_std([r[m] for r in runs]) for m in METRICS}
    results.append({"row": row, "model": ROWS[row], "config": f"configs/{row}.py:synthetic",
                    "steps": args.steps or cfg_mod.get_config("synthetic").num_train_steps,
                    "runs": runs, "mean_std": summary})
  print(f"\n{'model':<26} | " + " | ".join(f"{m:>13}" for m in METRICS) + f" | seeds {seeds}")
  for r in results:
    cells = []
    for m in METRICS:
      mu, sd = r["mean_std"][m]
      cells.append("      -      " if mu is None else f"{100 * mu:5.1f} ± {100 * sd:4.1f}")
    print(f"{r['model']:<26} | " + " | ".join(f"{c:>13}" for c in cells))
  os.makedirs(args.workdir, exist_ok=True)
  path = os.path.join(args.workdir, "table1.json")
  with open(path + ".tmp", "w") as f:
    json.dump(results, f, indent=1)
  os.replace(path + ".tmp", path)
  return results


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
