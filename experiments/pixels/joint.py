"""From pixels, trained jointly vs held frozen: the same random ResNet-50 (a sixteenth of its
widths) and Transformer on synthetic_scenes drawn as PNGs, its backbone either trained after
the frozen phase (ExpansionNet v2's phases) or frozen throughout (random features).

  python experiments/pixels/joint.py --workdir runs/pixels_joint            # 3 seeds x 2 rows
  python experiments/pixels/joint.py --workdir runs/pixels_joint --seeds 0 --steps 40
      [--num_train 1500 --num_val 200 --num_test 200 --size 64] [--tiny]

Rows, both ``configs/pixels.py:synthetic,root=<workdir>/scenes`` (64 px, batch 50, the
Transformer at CPU sizes, its Noam schedule; ``--steps`` steps, 1,000 by default):

  frozen  backbone.freeze_steps = the run's steps: the backbone's random weights never change
          (the run is the captioner on frozen random grid features, computed from the pixels
          at every step)
  joint   backbone.freeze_steps = 300 (scaled with --steps): held still, then trained with its
          own Adam at backbone.learning_rate 1e-4

``<workdir>/scenes`` is drawn first when missing (``jaxcap.data.render``: ``--num_train`` /
``--num_val`` / ``--num_test`` scenes of seed 0, 1,500 / 200 / 200 by default, at ``--size`` px,
64). ``--tiny``: the config's tiny sizes (tests; ``configs/pixels.py:synthetic,tiny``). Each (row, seed) trains with ``config.seed = seed`` in
``<workdir>/<row>/seed<k>`` (a finished run, one with ``scores_test.json``, is read back) and
tests its best validation checkpoint on the 200 test images, greedily. Written: ``table.md``
(mean ± std, ddof = 1, x100; joint minus frozen CIDEr-D with a paired bootstrap 95 % interval,
per test image, each row's seeds averaged) and ``table.json`` (per seed, with seconds).
"""

from __future__ import annotations

import json
import os
import time

from jaxcap import atomic, config_files
from jaxcap.analysis import experiment
from jaxcap.training import train_lib

ROWS = {"frozen": "frozen throughout (random features)", "joint": "trained after the frozen phase"}
METRICS = (("CIDEr", "CIDEr-D"), ("Bleu_4", "BLEU-4"), ("METEOR", "METEOR"), ("ROUGE_L", "ROUGE-L"))
SPLITS = dict(num_train=1500, num_val=200, num_test=200)
SIZE = 64


def row_config(row: str, scenes: str, steps: int = 0, tiny: bool = False):
  config = config_files.load(f"pixels.py:synthetic,root={scenes}" + (",tiny" if tiny else ""))
  default_steps, default_freeze = config.num_train_steps, config.backbone.freeze_steps
  if steps:
    config.num_train_steps = steps
    config.eval_every_steps = min(config.eval_every_steps, steps)
    config.checkpoint_every_steps = min(config.checkpoint_every_steps, steps)
    config.warmup_steps = min(config.warmup_steps, max(1, steps // 3))
  n = config.num_train_steps
  config.backbone.freeze_steps = n if row == "frozen" else max(1, n * default_freeze // default_steps)
  return config


def draw_scenes(out: str, splits: dict, size: int) -> None:
  from jaxcap.data import render
  from jaxcap.data.synthetic import SyntheticScenes
  if not os.path.exists(os.path.join(out, render.KARPATHY_FILE)):
    render.write_dataset(out, SyntheticScenes(seed=0, **splits), size)


def train_losses(workdir: str, cut: int) -> dict:
  """From the run's ``metrics.jsonl``: the last logged training loss up to step ``cut`` (the
  joint row's end of the frozen phase: both rows are the same run up to there) and its mean over
  the last tenth of the steps."""
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  loss = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
  if not loss:
    return {"loss_end_frozen": None, "loss_last": None}
  n = max(loss)
  at = max((s for s in loss if s <= cut), default=None)
  last = [v for s, v in loss.items() if s > n - max(1, n // 10)]
  return {"loss_end_frozen": loss.get(at), "loss_last": sum(last) / len(last)}


def main(argv=None):
  from jaxcap import cli
  ap = experiment.argument_parser(__doc__, ROWS, tuple(ROWS))
  for name, default in (*SPLITS.items(), ("size", SIZE)):
    ap.add_argument(f"--{name}", type=cli.positive_int, default=default)
  ap.add_argument("--tiny", action="store_true", help="the config's tiny sizes (tests)")
  args, rows, seeds = experiment.parse_args(ap, argv, ROWS)
  atomic.mark_folder(args.workdir, "experiments/pixels/joint.py")  # checked: its first write
  splits = {k: getattr(args, k) for k in SPLITS}
  scenes = os.path.join(args.workdir, "scenes")
  draw_scenes(scenes, splits, args.size)

  def workdir_of(row, seed):
    return os.path.join(args.workdir, row, f"seed{seed}")

  def run(row, seed):
    workdir = workdir_of(row, seed)
    config = row_config(row, scenes, args.steps, args.tiny)
    config.seed = seed
    print(f"=== {row} seed {seed} -> {workdir}", flush=True)
    start = time.time()
    scores = train_lib.train_and_evaluate(config, workdir).get("overall", {})
    return {"seed": seed, "seconds": round(time.time() - start, 1),
            "freeze_steps": config.backbone.freeze_steps, "steps": config.num_train_steps,
            **{m: scores.get(m) for m, _ in METRICS}}

  grid = experiment.run_grid(rows, seeds, run, seed_major=True,
                             result_file=lambda row, seed: os.path.join(workdir_of(row, seed), "result.json"))
  paired = {}
  if set(rows) == set(ROWS):
    paired = experiment.paired_against(
        "frozen", ["joint"], lambda row, seed: os.path.join(workdir_of(row, seed), "scores_test.json"), seeds)
  results = []
  for row in rows:
    cut = row_config("joint", scenes, args.steps, args.tiny).backbone.freeze_steps
    runs = [dict(grid[row][s], **train_losses(workdir_of(row, s), cut)) for s in seeds]
    results.append({"row": row, "backbone": ROWS[row], "config": f"configs/pixels.py:synthetic,root={scenes}",
                    "runs": runs, "joint_minus_frozen": paired.get(row),
                    "mean_std": {m: list(experiment.mean_std(r[m] for r in runs) or (None, None))
                                 for m in (*(m for m, _ in METRICS), "loss_end_frozen", "loss_last")}})
  caption = (f"synthetic_scenes as {args.size} px PNGs ({splits['num_train']} / {splits['num_val']} / "
             f"{splits['num_test']}), ResNet-50 at 1/16 width (random init) + Transformer, "
             f"cross-entropy; mean ± std (ddof = 1) over seeds {','.join(map(str, seeds))}, test "
             "split, x100; the paired column: joint minus frozen per test image (seeds averaged), "
             "paired bootstrap 95 % interval.")
  table = experiment.markdown_table(
      ["backbone", "seeds", *(h for _, h in METRICS), "CIDEr-D joint - frozen (paired 95 %)",
       "train loss, end of the frozen phase", "train loss, last tenth"],
      [[r["backbone"], len(seeds), *(experiment.pm(r["mean_std"][m]) for m, _ in METRICS),
        r["joint_minus_frozen"] or "-", experiment.pm(r["mean_std"]["loss_end_frozen"], 1.0, 3),
        experiment.pm(r["mean_std"]["loss_last"], 1.0, 3)] for r in results])
  print(f"\n{caption}\n{table}")
  experiment.write_table(args.workdir, results, caption, table)
  return results


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
