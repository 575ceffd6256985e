"""TPGN's Table 1 on the synthetic dataset: TPGN vs the CNN-LSTM (Show and Tell) baseline over seeds.

  python -m jaxcap.papers.tpgn.table1 --workdir runs/tpgn_table1 [--seeds 0,1,2] [--steps 600]
      [--rows tpgn,show_tell]

Each (row, seed) trains ``configs/<row>.py:synthetic`` with ``seed=<seed>`` (initialisation and
batch order; the dataset is the same) in ``<workdir>/<row>_s<seed>`` (a finished run is only
tested again) and tests its best checkpoint on the test split (greedy decoding). The table
prints mean ± sample std (ddof = 1) over seeds of CIDEr-D, BLEU-4, METEOR and ROUGE-L (x100),
written to ``<workdir>/table.md`` and, with the per-seed values, ``<workdir>/table1.json``.
``jaxcap/papers/tpgn/roles.py --workdir <workdir>/tpgn_s0`` then gives the role-cluster tables of one TPGN run.
"""

from __future__ import annotations

import os


from jaxcap import config_files
from jaxcap.analysis import experiment
from jaxcap.training import train_lib

ROWS = {"show_tell": "CNN-LSTM (Show and Tell)", "tpgn": "TPGN"}
METRICS = ("CIDEr", "Bleu_4", "METEOR", "ROUGE_L")


def main(argv=None):
  ap = experiment.argument_parser(__doc__, ROWS, ("show_tell", "tpgn"))
  args, rows, seeds = experiment.parse_args(ap, argv, ROWS)

  def run(row, seed):
    config = config_files.load(f"{row}.py:synthetic")
    config.seed = seed
    if args.steps:
      config.num_train_steps = args.steps
      config.eval_every_steps = min(config.eval_every_steps, args.steps)
      config.checkpoint_every_steps = min(config.checkpoint_every_steps, args.steps)
    workdir = os.path.join(args.workdir, f"{row}_s{seed}")
    print(f"=== {ROWS[row]} seed {seed} -> {workdir}", flush=True)
    scores = train_lib.train_and_evaluate(config, workdir).get("overall", {})
    return {"seed": seed, **{m: scores.get(m) for m in METRICS}}

  grid = experiment.run_grid(rows, seeds, run)
  results = []
  for row in rows:
    runs = [grid[row][s] for s in seeds]
    summary = {m: list(experiment.mean_std(r[m] for r in runs) or (None, None)) for m in METRICS}
    steps = args.steps or config_files.load(f"{row}.py:synthetic").num_train_steps
    results.append({"row": row, "model": ROWS[row], "config": f"configs/{row}.py:synthetic", "steps": steps,
                    "runs": runs, "mean_std": summary})
  caption = f"Mean ± std (ddof = 1) over seeds {','.join(map(str, seeds))}, scores x100."
  table = experiment.markdown_table(
      ["model", "seeds", "CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L"],
      [[r["model"], len(seeds), *(experiment.pm(r["mean_std"][m]) for m in METRICS)] for r in results])
  print(f"\n{caption}\n{table}")
  experiment.write_table(args.workdir, results, caption, table, json_name="table1.json")
  return results


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
