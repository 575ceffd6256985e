"""The Image Transformer paper's Table 3 (ablations) on the synthetic scenes.

Rows (cross-entropy only, as the paper's Table 3; greedy decoding of the test split):

  aoanet     configs/aoanet.py:synthetic                       the AoANet baseline
  layer1     configs/image_transformer.py:synthetic,baseline=True,M=1,spatial_layers=1
  layer2     ... spatial_layers=2          layer3   ... spatial_layers=3
  all        ... spatial_layers=all        no_rel   ... spatial_layers=all,spatial=False
  M2 / M3 / M4  ... spatial_layers=all,M=2|3|4
  it         configs/image_transformer.py:synthetic  (not in Table 3: eqs. 4 and 7 as written,
             FFN and W_O instead of AoA in the encoder, M = 3)

``baseline=True`` keeps AoANet's encoder layers (attention on attention, no feed-forward
sub-layer), so each "+layer k" row is the baseline with layer k replaced by a spatial-graph
layer, as the paper describes its rows; every row has 3 encoder layers (the baseline too, so
that the rows differ only in what the paper varies).

Each row is trained for every seed (``--seeds``) in ``<workdir>/<row>/seed<k>``; a finished run
is resumed (only tested again). Printed: CIDEr-D, BLEU-4, METEOR, ROUGE-L as mean ± std over the
seeds (sample std, ddof = 1), and the relation accuracy: the fraction of test images whose caption names the relation
of the references (left / right / above / below / in; synonyms grouped) — the relations are
in the boxes only, so this is what the spatial graph can help with. The table is also written
to ``<workdir>/table.md`` and, with the per-seed values, ``<workdir>/table3.json``.

  python -m jaxcap.papers.image_transformer.table3 --workdir /tmp/it_table3 --steps 300 --dim 64
"""

from __future__ import annotations

import collections
import json
import os


from jaxcap import config_files
from jaxcap import data as data_lib
from jaxcap.analysis import experiment
from jaxcap.training import train_lib

_IT = "configs/image_transformer.py"
_B = "synthetic,baseline=True,M=1"
ROWS = {
    "aoanet": ("configs/aoanet.py", "synthetic", "baseline (AoA)"),
    "layer1": (_IT, _B + ",spatial_layers=1", "baseline+layer1"),
    "layer2": (_IT, _B + ",spatial_layers=2", "baseline+layer2"),
    "layer3": (_IT, _B + ",spatial_layers=3", "baseline+layer3"),
    "all": (_IT, _B + ",spatial_layers=all", "baseline+layer1,2,3"),
    "no_rel": (_IT, _B + ",spatial_layers=all,spatial=False", "+layer1,2,3 w/o spatial rel."),
    "M2": (_IT, "synthetic,baseline=True,M=2", "+layer1,2,3 (M=2)"),
    "M3": (_IT, "synthetic,baseline=True,M=3", "+layer1,2,3 (M=3)"),
    "M4": (_IT, "synthetic,baseline=True,M=4", "+layer1,2,3 (M=4)"),
    "it": (_IT, "synthetic", "image transformer (eqs. 4, 7)"),
}
DEFAULT_ROWS = ("aoanet", "layer1", "layer2", "layer3", "all", "no_rel", "M2", "M3", "M4")
METRICS = (("CIDEr", "CIDEr-D"), ("Bleu_4", "BLEU-4"), ("METEOR", "METEOR"), ("ROUGE_L", "ROUGE-L"))

# Relation words of the synthetic grammar (jaxcap/data/synthetic.py), grouped by meaning.
RELATIONS = {"left": "left", "right": "right", "above": "above", "over": "above", "below": "below",
             "under": "below", "beneath": "below", "in": "in", "inside": "in"}


def relation_of(caption: str):
  """The first relation word's class, or None."""
  for w in caption.split():
    if w in RELATIONS:
      return RELATIONS[w]
  return None


def relation_accuracy(predictions: dict, references: dict) -> float:
  """Fraction of images whose caption's relation equals the references' majority relation."""
  hits = total = 0
  for image_id, caption in predictions.items():
    refs = [r for r in (relation_of(c) for c in references[image_id]) if r is not None]
    if not refs:
      continue
    want = collections.Counter(refs).most_common(1)[0][0]
    hits += relation_of(caption) == want
    total += 1
  return hits / max(total, 1)


def load_config(path: str, arg: str):
  return config_files.load(f"{path}:{arg}")


_DATASETS = {}


def _dataset(data_config):
  """One dataset per data config for the whole table (the scenes are generated once)."""
  key = data_config.to_json()
  if key not in _DATASETS:
    _DATASETS[key] = data_lib.get_dataset(data_config)
  return _DATASETS[key]


def run_row(key, seed, args):
  path, arg, _ = ROWS[key]
  if args.dim:
    arg += f",dim={args.dim}"
  config = load_config(path, arg)
  config.seed = seed
  if args.steps:
    config.num_train_steps = args.steps
    config.eval_every_steps = args.steps
    config.checkpoint_every_steps = args.steps
  if args.batch:
    config.batch_size = args.batch
  if args.test_images:
    config.data.num_test = args.test_images
  config.eval_num_images = args.eval_images
  workdir = os.path.join(args.workdir, key, f"seed{seed}")
  print(f"=== {key} seed {seed} ({path}:{arg}) -> {workdir}", flush=True)
  dataset = _dataset(config.data)
  trainer = train_lib.Trainer(config, workdir, dataset=dataset)
  try:
    trainer.fit()
    state = trainer.load()
  finally:
    trainer.close()  # its checkpoint managers, before the next row opens its own
  scores = trainer.test(state.params, config.test_split, step=int(state.step))
  with open(os.path.join(workdir, f"predictions_{config.test_split}.json")) as f:
    preds = {p["image_id"]: p["caption"] for p in json.load(f)}
  out = {m: scores.get("overall", {}).get(m) for m, _ in METRICS}
  out["relation_acc"] = relation_accuracy(preds, dataset.references(config.test_split))
  return out, f"{path}:{arg}"


def main(argv=None):
  ap = experiment.argument_parser(__doc__, ROWS, DEFAULT_ROWS)
  ap.add_argument("--dim", type=int, default=0, help="model width (0: the config's 128)")
  ap.add_argument("--batch", type=int, default=0, help="images per step (0: the config's 50)")
  experiment.add_split_sizes(ap, eval_images=250)
  args, rows, seeds = experiment.parse_args(ap, argv, ROWS)
  configs, results = {}, []

  def run(key, seed):
    scores, configs[key] = run_row(key, seed, args)
    return scores

  def after(grid):
    results[:] = [summarize(key, [per_seed[s] for s in seeds], configs[key], seeds)
                  for key, per_seed in grid.items() if len(per_seed) == len(seeds)]
    experiment.write_json(os.path.join(args.workdir, "table3.json"), results)

  experiment.run_grid(rows, seeds, run, after=after)
  table = format_table(results)
  caption = f"Mean ± std (ddof = 1) over seeds {','.join(map(str, seeds))}, scores x100."
  print(f"\n{caption}\n{table}")
  experiment.write_table(args.workdir, results, caption, table, json_name="table3.json")
  return results


def summarize(key, runs, config, seeds) -> dict:
  """One row of table3.json: its runs and ``[mean, std]`` (ddof = 1) per metric (None: no value)."""
  row = {"row": key, "model": ROWS[key][2], "config": config, "seeds": seeds, "runs": runs}
  for m in [m for m, _ in METRICS] + ["relation_acc"]:
    pair = experiment.mean_std(r[m] for r in runs)
    row[m] = list(pair) if pair else None
  return row


def format_table(results) -> str:
  heads = [h for _, h in METRICS] + ["relation acc."]
  return experiment.markdown_table(
      ["model", "seeds", *heads],
      [[r["model"], len(r["runs"]), *(experiment.pm(r[m]) for m in [m for m, _ in METRICS] + ["relation_acc"])]
       for r in results])

if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
