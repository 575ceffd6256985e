"""The SCST settings sweep of the Flickr8k table, read on the VALIDATION split only.

Each setting is a ``table.py`` workdir of its own whose SCST stage starts from the same
cross-entropy runs (``--xe-workdir``), e.g.

  python experiments/flickr8k/table.py --workdir runs/scst_sweep/lr1e-4_greedy \\
      --xe-workdir runs/flickr8k_table --models aoanet --seeds 0 --stages scst \\
      --scst-steps 600 --scst-lr 1e-4 --scst-eval-every 50 --no-nn
  python experiments/flickr8k/scst_sweep.py --sweep runs/scst_sweep --xe-workdir runs/flickr8k_table \\
      --model aoanet --seed 0 --out experiments/flickr8k/results

This script trains nothing: per setting (a subfolder of ``--sweep``) it reads
``<setting>/<model>/scst/seed<k>/metrics.jsonl`` and writes ``scst_sweep.{md,json}`` (validation
CIDEr-D of the cross-entropy start, of every SCST validation, the best one and its step) and
``scst_sweep.png`` (SCST training reward and validation CIDEr-D against the SCST step; step 0 is
the cross-entropy checkpoint SCST starts from, its best validation score). Test scores are not
read: the settings are chosen on validation.
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from jaxcap import atomic  # noqa: E402
from jaxcap.analysis import experiment, figures  # noqa: E402
from jaxcap.evaluation import coco_metrics  # noqa: E402


def xe_start(xe_workdir: str, model: str, seed: int) -> tuple[int, float]:
  """(step, validation CIDEr-D) of the cross-entropy run's best checkpoint (SCST's start)."""
  steps, values = figures.load_metrics(os.path.join(xe_workdir, model, "xe", f"seed{seed}"))["val/CIDEr"]
  k = int(values.argmax())
  return int(steps[k]), float(values[k])


def read_setting(path: str, model: str, seed: int) -> dict | None:
  run = os.path.join(path, model, "scst", f"seed{seed}")
  if not os.path.exists(os.path.join(run, "metrics.jsonl")):
    return None
  curves = figures.load_metrics(run)
  if "val/CIDEr" not in curves:
    return None
  steps, values = curves["val/CIDEr"]
  k = int(values.argmax())
  out = {"val_steps": steps.tolist(), "val_CIDEr": values.tolist(),
         "best_step": int(steps[k]), "best_val_CIDEr": float(values[k])}
  if "train/reward" in curves:
    out["reward_steps"], out["reward"] = (a.tolist() for a in curves["train/reward"])
  return out


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sweep", required=True, help="folder of setting workdirs (table.py --workdir each)")
  ap.add_argument("--xe-workdir", "--xe_workdir", dest="xe_workdir", required=True)
  ap.add_argument("--model", default="aoanet")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", required=True, help="folder for scst_sweep.{md,json,png}")
  experiment.add_overwrite(ap)
  args = ap.parse_args(argv)
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    raise SystemExit(f"--out: {args.out} is a file; expected a folder for scst_sweep.{{md,json,png}}")
  table_json = os.path.join(args.out, "scst_sweep.json")
  own = experiment.json_with_keys("model", "seed", "settings")
  experiment.check_files(args.out, {"scst_sweep.json": own, "scst_sweep.md": experiment.beside(table_json, own),
                                    "scst_sweep.png": atomic.png_marked}, args.overwrite)
  if not os.path.isdir(args.sweep):
    raise SystemExit(f"--sweep: {args.sweep} is not a directory; expected the folder of the sweep's "
                     "table.py workdirs")
  settings = {}
  for name in sorted(os.listdir(args.sweep)):
    s = read_setting(os.path.join(args.sweep, name), args.model, args.seed)
    if s:
      settings[name] = s
  if not settings:
    raise SystemExit(f"--sweep: no finished SCST validation in {args.sweep}/*/{args.model}/scst/seed{args.seed}; "
                     "expected table.py --stages scst workdirs there")
  xe_step, xe_val = xe_start(args.xe_workdir, args.model, args.seed)

  rows = [["XE start (step 0)", "-", f"{100 * xe_val:.1f}", "-", "-"]]
  for name, s in sorted(settings.items(), key=lambda kv: -kv[1]["best_val_CIDEr"]):
    every = dict(zip(s["val_steps"], s["val_CIDEr"]))
    at = ", ".join(f"{100 * every[k]:.1f}" for k in (150, 300, 600) if k in every)
    rows.append([name, s["val_steps"][-1], f"{100 * s['best_val_CIDEr']:.1f}", s["best_step"], at])
  table = experiment.markdown_table(
      ["setting", "steps run", "best val CIDEr-D", "at step", "val CIDEr-D at 150, 300, 600"], rows)
  caption = (f"{args.model} seed {args.seed}, SCST from the cross-entropy run's best checkpoint (step "
             f"{xe_step}); validation split (100 images), greedy decoding, CIDEr-D x100.")
  experiment.write_json(os.path.join(args.out, "scst_sweep.json"),
                        {"model": args.model, "seed": args.seed, "xe_best_step": xe_step,
                         "xe_best_val_CIDEr": xe_val, "settings": settings})
  experiment.write_text(os.path.join(args.out, "scst_sweep.md"), f"{caption}\n\n{table}\n")

  fig = figures.new_figure(9.0, 3.2)
  ax_r, ax_v = fig.subplots(1, 2)
  name, scale = coco_metrics.display("CIDEr")  # as the table: CIDEr-D x100
  for setting, s in settings.items():
    if "reward" in s:
      ax_r.plot(s["reward_steps"], s["reward"], label=setting)
    ax_v.plot([0] + s["val_steps"], [scale * v for v in [xe_val] + s["val_CIDEr"]], marker="o", ms=3,
              label=setting)
  ax_r.set_title("SCST training reward (sample CIDEr-D)")
  ax_v.set_title(f"validation {name} x{scale:g} (100 images)")
  for ax in (ax_r, ax_v):
    ax.set_xlabel("SCST step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
  figures.save_png(fig, os.path.join(args.out, "scst_sweep.png"))
  print(f"{caption}\n\n{table}")


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)
