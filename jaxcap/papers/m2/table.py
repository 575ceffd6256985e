"""M²'s CPU-sized table: the Meshed-Memory Transformer against the Transformer, and each of its two
ideas taken away (the memory slots; the meshed cross-attention), on the synthetic scenes or on
Flickr8k (../shared/data/flickr8k_xception).

  python -m jaxcap.papers.m2.table --workdir runs/m2_table [--dataset synthetic|flickr8k]
      [--seeds 0,1,2] [--steps N] [--rows transformer,m2,m2_m0,m2_last]

Rows (cross-entropy only at CPU sizes, our choice: the rows vary the encoder and the cross-attention,
not the training; the paper's Table 1 ablates them after SCST on COCO):

  transformer  configs/transformer.py:<dataset>                    the Transformer (the baseline)
  m2           configs/m2.py:<dataset>,memory_slots=40             M², the paper's m = 40
  m2_m0        configs/m2.py:<dataset>,memory_slots=0              no memory slots
  m2_last      configs/m2.py:<dataset>,memory_slots=40,meshed=last  cross-attention to the last
                                                                   encoder layer only

Every row has the same CPU sizes (configs/transformer.py's ``CPU_SIZES``: 2 + 2 layers, width
128) and schedule (``:flickr8k``: the Flickr8k step decay of the other papers' rows). Each
(row, seed) trains with ``config.seed = seed`` in ``<workdir>/<row>/seed<k>`` (a finished run,
one with ``scores_test.json``, is read back, so an interrupted table resumes) and tests its best
validation checkpoint on the test split, decoding greedily. Printed and written to
``<workdir>/table.md``: mean ± std (ddof = 1) over the seeds of CIDEr-D, BLEU-4, METEOR and
ROUGE-L (x100), and each row's CIDEr-D minus the Transformer's with a paired bootstrap 95 %
interval (per test image, the row's seeds averaged); ``<workdir>/table.json`` holds the
per-seed values.
"""

from __future__ import annotations

import os

from jaxcap import config_files
from jaxcap.analysis import experiment
from jaxcap.evaluation import files
from jaxcap.training import train_lib

ROWS = {
    "transformer": ("transformer.py", "", "Transformer"),
    "m2": ("m2.py", ",memory_slots=40", "M² (m = 40, meshed)"),
    "m2_m0": ("m2.py", ",memory_slots=0", "M², no memory (m = 0)"),
    "m2_last": ("m2.py", ",memory_slots=40,meshed=last", "M², last-layer cross-attention"),
}
DATASETS = ("synthetic", "flickr8k")
METRICS = (("CIDEr", "CIDEr-D"), ("Bleu_4", "BLEU-4"), ("METEOR", "METEOR"), ("ROUGE_L", "ROUGE-L"))


def row_config(row: str, dataset: str, steps: int = 0):
  """The config of ``row`` on ``dataset``: the file's, cross-entropy only, ``steps`` if set."""
  path, extra, _ = ROWS[row]
  config = config_files.load(f"{path}:{dataset}{extra}")
  config.scst.start_step = -1
  config.scst.start_epoch = -1
  if steps:
    config.num_train_steps = steps
    config.eval_every_steps = min(config.eval_every_steps, steps)
    config.checkpoint_every_steps = min(config.checkpoint_every_steps, steps)
  return config


def main(argv=None):
  ap = experiment.argument_parser(__doc__, ROWS, tuple(ROWS))
  ap.add_argument("--dataset", default="synthetic", choices=DATASETS)
  args, rows, seeds = experiment.parse_args(ap, argv, ROWS)

  def workdir_of(row, seed):
    return os.path.join(args.workdir, row, f"seed{seed}")

  def run(row, seed):
    workdir = workdir_of(row, seed)
    scores_file = os.path.join(workdir, "scores_test.json")
    if os.path.exists(scores_file):
      scores = files.load_scores(scores_file).get("overall", {})
    else:
      config = row_config(row, args.dataset, args.steps)
      config.seed = seed
      print(f"=== {ROWS[row][2]} seed {seed} -> {workdir}", flush=True)
      scores = train_lib.train_and_evaluate(config, workdir).get("overall", {})
    return {"seed": seed, **{m: scores.get(m) for m, _ in METRICS}}

  grid = experiment.run_grid(rows, seeds, run, seed_major=True)  # every row of seed 0 first
  paired = {}
  if "transformer" in rows and len(rows) > 1:
    paired = experiment.paired_against(
        "transformer", [r for r in rows if r != "transformer"],
        lambda row, seed: os.path.join(workdir_of(row, seed), "scores_test.json"), seeds)
  results = []
  for row in rows:
    runs = [grid[row][s] for s in seeds]
    path, extra, label = ROWS[row]
    results.append({
        "row": row, "model": label, "config": f"configs/{path}:{args.dataset}{extra}",
        "steps": row_config(row, args.dataset, args.steps).num_train_steps, "runs": runs,
        "mean_std": {m: list(experiment.mean_std(r[m] for r in runs) or (None, None)) for m, _ in METRICS},
        "cider_minus_transformer": paired.get(row)})
  caption = (f"{args.dataset}, cross-entropy only; mean ± std (ddof = 1) over seeds "
             f"{','.join(map(str, seeds))}, scores x100; the paired column: the row's seeds averaged "
             "per test image, minus the Transformer's, with a paired bootstrap 95 % interval.")
  table = experiment.markdown_table(
      ["model", "seeds", *(h for _, h in METRICS), "CIDEr-D - Transformer (paired 95 %)"],
      [[r["model"], len(seeds), *(experiment.pm(r["mean_std"][m]) for m, _ in METRICS),
        r["cider_minus_transformer"] or "-"] for r in results])
  print(f"\n{caption}\n{table}")
  experiment.write_table(args.workdir, results, caption, table)
  return results


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
