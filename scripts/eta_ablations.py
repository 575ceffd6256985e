"""CPU-sized Table-5 comparison of the ETA-Transformer ablations on the synthetic dataset.

  python scripts/eta_ablations.py --workdir runs/eta_ablations
  python scripts/eta_ablations.py --variants eta,stacked_v --steps 300 --batch_size 20

Trains and tests one model per row through ``jaxcap.training.train_lib.train_and_evaluate``
(``configs/eta.py:<dataset>,variant=...``), then prints CIDEr-D, BLEU-4, METEOR and ROUGE-L
(x100, as in the paper's tables) and writes ``<workdir>/table.json`` and ``table.md``. A row
whose workdir already holds ``scores.json`` from a finished run is read back, not retrained,
so an interrupted comparison resumes. Rows:

  transformer_v, transformer_s, late_fusion, parallel, stacked_v, stacked_s, eta,
  eta_oracle (the paper's ETA^oracle: trained on the default noisy / detected attributes,
  tested on the ground-truth ones), eta_oracle_all (trained and tested on the ground truth,
  what eta_oracle meant before issue 17),
  and any ``eta_gbc_<f>`` (Table 6) or ``<variant>_noenc_v`` / ``_noenc_s`` (Table 4).
"""

import json
import os
import sys
import time

from absl import app, flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

DEFAULT_ROWS = ("transformer_v", "transformer_s", "parallel", "stacked_v", "stacked_s", "eta",
                "eta_oracle")
METRICS = (("CIDEr-D", "CIDEr"), ("BLEU-4", "Bleu_4"), ("METEOR", "METEOR"), ("ROUGE-L", "ROUGE_L"))

flags.DEFINE_string("workdir", "runs/eta_ablations", "Parent directory of the per-row runs.")
flags.DEFINE_string("variants", ",".join(DEFAULT_ROWS), "Comma-separated rows (see above).")
flags.DEFINE_string("dataset", "synthetic", "Dataset argument of configs/eta.py.")
flags.DEFINE_string("extra", "", "Extra config arguments for every row, e.g. 'attributes=detected'.")
flags.DEFINE_integer("steps", None, "Override num_train_steps (eval/checkpoint every steps/2).")
flags.DEFINE_integer("batch_size", None, "Override batch_size (images per step).")
flags.DEFINE_integer("eval_num_images", None, "Override eval_num_images (validation subset).")


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


def run_row(row: str, workdir: str) -> dict:
  from configs import eta as eta_config
  from jaxcap.training import train_lib
  config = eta_config.get_config(row_arg(row, flags.FLAGS.dataset, flags.FLAGS.extra))
  if flags.FLAGS.steps:
    config.num_train_steps = flags.FLAGS.steps
    config.eval_every_steps = max(1, flags.FLAGS.steps // 2)
    config.checkpoint_every_steps = config.eval_every_steps
    config.warmup_steps = min(config.warmup_steps, max(1, flags.FLAGS.steps // 3))
  if flags.FLAGS.batch_size:
    config.batch_size = flags.FLAGS.batch_size
  if flags.FLAGS.eval_num_images:
    config.eval_num_images = flags.FLAGS.eval_num_images
  done = os.path.join(workdir, "scores.json")
  if os.path.exists(done):
    with open(done) as f:
      return json.load(f)
  t0 = time.time()
  result = train_lib.train_and_evaluate(config, workdir)
  overall = dict(result.get("overall", {}))
  overall["train_seconds"] = time.time() - t0
  os.makedirs(workdir, exist_ok=True)
  tmp = f"{done}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(overall, f, indent=1)
  os.replace(tmp, done)
  return overall


def format_table(rows: dict) -> str:
  header = "| model | " + " | ".join(name for name, _ in METRICS) + " |"
  lines = [header, "|" + "---|" * (len(METRICS) + 1)]
  for row, scores in rows.items():
    cells = [f"{100 * scores[key]:.1f}" if key in scores else "-" for _, key in METRICS]
    lines.append(f"| {row} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  rows = [r.strip() for r in flags.FLAGS.variants.split(",") if r.strip()]
  results = {}
  for row in rows:
    print(f"=== {row}: configs/eta.py:{row_arg(row, flags.FLAGS.dataset, flags.FLAGS.extra)}",
          flush=True)
    results[row] = run_row(row, os.path.join(flags.FLAGS.workdir, row))
    print(format_table({row: results[row]}), flush=True)
  table = format_table(results)
  print(table)
  os.makedirs(flags.FLAGS.workdir, exist_ok=True)
  for name, text in (("table.json", json.dumps(results, indent=1)), ("table.md", table + "\n")):
    path = os.path.join(flags.FLAGS.workdir, name)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
  app.run(main)
