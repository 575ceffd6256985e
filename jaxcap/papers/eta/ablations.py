"""CPU-sized Table-5 comparison of the ETA-Transformer ablations on the synthetic dataset.

  python -m jaxcap.papers.eta.ablations --workdir runs/eta_ablations                  # seeds 0,1,2
  python -m jaxcap.papers.eta.ablations --variants eta,stacked_v --steps 300 --batch_size 20 --seeds 0,1,2,3

Trains and tests one model per row and seed through
``jaxcap.training.train_lib.train_and_evaluate`` (``configs/eta.py:<dataset>,variant=...``,
``config.seed = k``) in ``<workdir>/<row>/seed<k>``, then prints CIDEr-D, BLEU-4, METEOR and
ROUGE-L (x100, as in the paper's tables) as mean ± std over the seeds (sample standard
deviation, ddof = 1) and writes ``<workdir>/table.json`` (per-seed scores, mean and std per
row) and ``table.md``. A run whose workdir already holds ``scores.json`` from a finished run is
read back, not retrained, so an interrupted comparison resumes. Rows:

  transformer_v, transformer_s, late_fusion, parallel, stacked_v, stacked_s, eta,
  eta_oracle (the paper's ETA^oracle: trained on the default noisy / detected attributes,
  tested on the ground-truth ones), eta_oracle_all (trained and tested on the ground truth,
  what eta_oracle meant in jaxcap's first tables),
  and any ``eta_gbc_<f>`` (Table 6) or ``<variant>_noenc_v`` / ``_noenc_s`` (Table 4).
"""

import os
import time

from absl import flags


from jaxcap.analysis import experiment
from jaxcap.papers.eta.configs import eta as eta_config
from jaxcap.training import train_lib

DEFAULT_ROWS = ("transformer_v", "transformer_s", "parallel", "stacked_v", "stacked_s", "eta",
                "eta_oracle")
METRICS = (("CIDEr-D", "CIDEr"), ("BLEU-4", "Bleu_4"), ("METEOR", "METEOR"), ("ROUGE-L", "ROUGE_L"))

flags.DEFINE_string("workdir", "runs/eta_ablations", "Parent directory of the per-row runs.")
flags.DEFINE_bool("overwrite", False, "Write into a --workdir that holds files jaxcap did not write.")
flags.DEFINE_string("variants", ",".join(DEFAULT_ROWS), "Comma-separated rows (see above).")
flags.DEFINE_string("dataset", "synthetic", "Dataset argument of configs/eta.py.")
flags.DEFINE_string("extra", "", "Extra config arguments for every row, e.g. 'attributes=detected'.")
flags.DEFINE_integer("steps", None, "Override num_train_steps (eval/checkpoint every steps/2).")
flags.DEFINE_integer("batch_size", None, "Override batch_size (images per step).")
flags.DEFINE_integer("eval_num_images", None, "Override eval_num_images (validation subset).")
flags.DEFINE_integer("test_images", None, "Override data.num_test (synthetic test split size).")
flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds (config.seed); one run per row and seed.")


def row_arg(row: str, dataset: str, extra: str) -> str:
  """The ``configs/eta.py`` argument of one row."""
  parts = [dataset]
  if row == "eta_oracle":
    parts += ["variant=eta", "attributes=oracle"]
  elif row == "eta_oracle_all":
    parts += ["variant=eta", "attributes=oracle_all"]
  elif row.startswith("eta_gbc_"):
    parts += ["variant=eta", f"gbc={row[len('eta_gbc_'):]}"]
  elif row.endswith("_noenc_v") or row.endswith("_noenc_s"):
    parts += [f"variant={row[:-8]}",
              "visual_encoder=False" if row.endswith("_v") else "semantic_encoder=False"]
  else:
    parts.append(f"variant={row}")
  if extra:
    parts.append(extra)
  return ",".join(parts)


def run_row(row: str, workdir: str, seed: int = 0) -> dict:
  """Trains and tests one row for one seed: its overall test scores and training seconds."""
  config = eta_config.get_config(row_arg(row, flags.FLAGS.dataset, flags.FLAGS.extra))
  config.seed = seed
  if flags.FLAGS.steps:
    config.num_train_steps = flags.FLAGS.steps
    config.eval_every_steps = max(1, flags.FLAGS.steps // 2)
    config.checkpoint_every_steps = config.eval_every_steps
    config.warmup_steps = min(config.warmup_steps, max(1, flags.FLAGS.steps // 3))
  if flags.FLAGS.batch_size:
    config.batch_size = flags.FLAGS.batch_size
  if flags.FLAGS.eval_num_images:
    config.eval_num_images = flags.FLAGS.eval_num_images
  if flags.FLAGS.test_images:
    config.data.num_test = flags.FLAGS.test_images
  t0 = time.time()
  result = train_lib.train_and_evaluate(config, workdir)
  overall = dict(result.get("overall", {}))
  overall["train_seconds"] = time.time() - t0
  return overall


def format_table(rows: dict, paired: dict | None = None) -> str:
  """Markdown table of ``{row: summarize(...)}``: mean ± std (x100) per metric; with
  ``paired`` (:func:`jaxcap.analysis.experiment.paired_against`), a column of each row's CIDEr-D
  difference from the first row, paired by test image."""
  out = []
  for row, summary in rows.items():
    mean, std = summary["mean"], summary["std"]
    cells = [experiment.pm((mean[key], std[key]) if key in mean else None) for _, key in METRICS]
    secs = f"{mean['train_seconds']:.0f}" if "train_seconds" in mean else "-"
    extra = [paired.get(row, "-")] if paired is not None else []
    out.append([row, summary["n"], *cells, *extra, secs])
  head = ["model", "seeds", *(name for name, _ in METRICS)]
  if paired is not None:
    head.append(f"CIDEr-D - {next(iter(rows))} (paired 95 %)")
  return experiment.markdown_table([*head, "train s"], out)


def main(argv):
  del argv  # cli.parse_flags refuses stray arguments
  rows = experiment.parse_list(flags.FLAGS.variants, "--variants")
  seeds = experiment.parse_seeds(flags.FLAGS.seeds)
  workdir = flags.FLAGS.workdir
  experiment.check_workdir(workdir, flags.FLAGS.overwrite)  # before any row trains
  results, summaries = {}, {}

  def run(row, seed):
    print(f"=== {row} seed {seed}: configs/eta.py:{row_arg(row, flags.FLAGS.dataset, flags.FLAGS.extra)}", flush=True)
    return run_row(row, os.path.join(workdir, row, f"seed{seed}"), seed)

  def after(grid):
    for row, per_seed in grid.items():
      if len(per_seed) == len(seeds) and row not in summaries:  # the row just finished
        arg = row_arg(row, flags.FLAGS.dataset, flags.FLAGS.extra)
        summaries[row] = experiment.summarize(per_seed)
        results[row] = {"config": f"configs/eta.py:{arg}", "seeds": {str(k): v for k, v in per_seed.items()},
                        **summaries[row]}
        print(format_table({row: summaries[row]}), flush=True)
        write_tables(workdir, results, summaries, seeds, rows)

  experiment.run_grid(rows, seeds, run, after=after,
                      result_file=lambda row, seed: os.path.join(workdir, row, f"seed{seed}", "scores.json"))
  print(format_table(summaries, _paired(workdir, rows, seeds)))


def _paired(workdir: str, rows: list, seeds: list) -> dict | None:
  """The rows score the same test images: each one's CIDEr-D minus the first row's, paired."""
  if len(rows) < 2:
    return None
  return experiment.paired_against(rows[0], rows[1:], lambda row, seed: os.path.join(
      workdir, row, f"seed{seed}", "scores_test.json"), seeds)


def write_tables(workdir: str, results: dict, summaries: dict, seeds: list, rows: list) -> None:
  caption = (f"Mean ± std (ddof = 1) over seeds {','.join(map(str, seeds))}, scores x100; the "
             "paired column: the row's seeds averaged per test image, minus the first row's, "
             "with a paired bootstrap 95 % interval.")
  experiment.write_table(workdir, results, caption, format_table(summaries, _paired(workdir, rows, seeds)))

if __name__ == "__main__":
  from jaxcap.cli import run_absl
  run_absl(main)  # bad input: one line, exit 2
