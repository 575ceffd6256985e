"""The real-data table: every captioning model on ../shared/data/flickr8k_xception, cross-entropy
then cross-entropy + SCST, test CIDEr-D / BLEU-4 / METEOR as mean ± std over seeds, beside the
nearest-neighbour caption (``configs/nearest_neighbour.py:flickr8k``, CIDEr-D 0.166).

  python experiments/flickr8k/table.py --workdir runs/flickr8k_table                  # all, 5 seeds
  python experiments/flickr8k/table.py --workdir runs/flickr8k_table --models transformer,lstm \\
      --seeds 0,1,2 --steps 600 --scst-steps 0                                      # XE only
  python experiments/flickr8k/table.py --workdir runs/flickr8k_table --report        # what is finished

Per model ``m`` and seed ``k``:

* ``<workdir>/<m>/xe/seed<k>``: ``configs/<m>.py:flickr8k`` with ``config.seed = k`` (the
  config's schedule unless ``--steps``), trained and tested on the 200 test images.
* ``<workdir>/<m>/scst/seed<k>``: the same config started from that run's best checkpoint
  (``init_from``) with self-critical training from step 0 (``scst.start_step = 0``, the
  config's ``scst`` section: CIDEr-D reward, greedy baseline, 5 samples; ``--scst-lr``,
  ``--scst-baseline``, ``--scst-samples`` override it) for ``--scst-steps`` steps (0: no SCST
  stage), validating every ``--scst-eval-every`` steps (0: the config's interval, at most half
  the steps), then its best validation checkpoint is tested. ``--xe-workdir`` starts the SCST
  stage from the cross-entropy runs of another workdir, so that SCST settings can be compared
  in workdirs of their own (``experiments/flickr8k/scst_sweep.py`` reads their validation
  curves).
* ``<workdir>/<m>/xe_more/seed<k>`` (``--stages xe,scst,xe_more``): the control for SCST's extra
  steps, a copy of the cross-entropy run resumed for ``--scst-steps`` more cross-entropy steps
  on its own schedule, validated as often as the SCST stage, its best checkpoint tested.

After each model's rows come the paired differences per seed: SCST − XE, and SCST − XE
continued when the control ran. ``--dataset synthetic`` runs the same stages on the configs'
synthetic scenes (train.py's default data) instead of Flickr8k.

A run whose workdir holds ``scores_test.json`` (written when a run finishes testing) is read
back, not retrained, so an interrupted table resumes and runs started by hand with the same
layout (``train.py --config configs/transformer.py:flickr8k --config.seed=1 --workdir
<workdir>/transformer/xe/seed1``) are used. Each model decodes the test split as its config
says (greedy for every flickr8k config). Written: ``<workdir>/table.json`` (per-seed scores and
seconds, mean, std) and ``table.md`` (mean ± std, sample standard deviation ddof = 1, scores
x100). METEOR needs Java.

Models (``MODELS``, cheapest first): the shared transformer and lstm, and the rows each paper
declares in its package (``jaxcap/papers/<paper>/__init__.py``: ``FLICKR8K_ROWS``, model -> its
place; today show_tell, tpgn, aat, aoanet, image_transformer and eta). A paper's
``flickr8k_config(model, config, workdir, dataset)`` adjusts its configs and
``flickr8k_before_run(model, config)`` prepares a run's inputs: ETA reads detected attributes, so
the script first trains the noisy-OR detector of ``jaxcap/papers/eta/train_attributes.py`` with
the config's ``detector`` section on the 700 training images and writes
``<workdir>/attributes_flickr8k/attributes.json`` (oracle attributes would read the test
references). Not in the table (``UNSUPPORTED``, with why; a paper's ``FLICKR8K_NOT_ROWS``):
nearest_neighbour (the reference row), newfc, aoa and updown (self-critical.pytorch's code's
models, for its imported checkpoints), mnmt (a translation model, multi30k text).
"""

from __future__ import annotations

import json
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:  # the checkout's jaxcap and configs/, two folders up
  sys.path.insert(0, _REPO)

from jaxcap import config_files  # noqa: E402  (after the path above)
from jaxcap.analysis import experiment  # noqa: E402



def _papers() -> dict:
  """``{paper: its package}`` of the registered papers (jaxcap.papers.PAPERS)."""
  import importlib
  from jaxcap.papers import PAPERS
  return {p: importlib.import_module(f"jaxcap.papers.{p}") for p in PAPERS}


PAPERS = _papers()
# Each row's place: cheapest first (CPU seconds per run on the flickr8k configs' schedules).
_PLACES = {"transformer": 10, "lstm": 40}
for _paper in PAPERS.values():
  _PLACES.update(getattr(_paper, "FLICKR8K_ROWS", {}))
MODELS = tuple(sorted(_PLACES, key=_PLACES.get))
UNSUPPORTED = {
    "nearest_neighbour": "the retrieval baseline: the reference row of the table",
    "newfc": "self-critical.pytorch's FC model as its code computes it, for its imported checkpoints "
             "(the table's CNN-LSTM row is show_tell)",
    "aoa": "AoANet as self-critical.pytorch's code computes it, for imported checkpoints (the "
           "table's AoANet row is aoanet, the paper's reading)",
    "updown": "Up-Down as self-critical.pytorch's code computes it, for its imported checkpoints",
}
for _paper in PAPERS.values():
  UNSUPPORTED.update(getattr(_paper, "FLICKR8K_NOT_ROWS", {}))
# model -> the package of the paper that declares it (its hooks below).
_PAPER_OF = {m: pkg for pkg in PAPERS.values()
             for m in (*getattr(pkg, "FLICKR8K_ROWS", {}), *getattr(pkg, "FLICKR8K_NOT_ROWS", {}))}


def _hook(model: str, name: str):
  return getattr(_PAPER_OF.get(model), name, None)
METRICS = (("CIDEr-D", "CIDEr"), ("BLEU-4", "Bleu_4"), ("METEOR", "METEOR"))
STAGES = ("xe", "scst", "xe_more")
STAGE_LABELS = {"xe": "XE", "scst": "XE + SCST", "xe_more": "XE continued (control)",
                "gain": "SCST − XE (paired)", "gain_more": "SCST − XE continued (paired)"}
# Paired rows (label key, minuend stage, subtrahend stage): per seed, over the seeds with both.
GAINS = (("gain", "scst", "xe"), ("gain_more", "scst", "xe_more"))


DATASETS = ("flickr8k", "synthetic")


def base_config(model: str, workdir: str, dataset: str = "flickr8k"):
  """``configs/<model>.py:<dataset>``, as the model's paper adjusts it for this table
  (``flickr8k_config``: ETA on flickr8k reads detected attributes under ``workdir``)."""
  config = config_files.load(f"{model}.py:{dataset}")
  hook = _hook(model, "flickr8k_config")
  if hook is not None:
    hook(model, config, workdir, dataset)
  return config


def before_run(model: str, config) -> None:
  """What a run of ``model`` needs made first (its paper's ``flickr8k_before_run``: ETA trains
  its attribute detector once)."""
  hook = _hook(model, "flickr8k_before_run")
  if hook is not None:
    hook(model, config)


def stage_config(model: str, stage: str, seed: int, args):
  """The config of one run; ``stage`` "scst" starts from the seed's cross-entropy run."""
  config = base_config(model, args.workdir, getattr(args, "dataset", "flickr8k"))
  config.seed = seed
  if args.steps:
    config.num_train_steps = args.steps
    config.eval_every_steps = min(config.eval_every_steps, max(1, args.steps // 2))
    config.checkpoint_every_steps = config.eval_every_steps
  if args.batch_size:
    config.batch_size = args.batch_size
  config.scst.start_step = -1
  config.scst.start_epoch = -1
  if stage in ("scst", "xe_more"):
    # SCST and its control (more cross-entropy steps) are validated, and checkpointed, alike.
    config.eval_every_steps = config.checkpoint_every_steps = (
        getattr(args, "scst_eval_every", 0) or min(config.eval_every_steps, max(1, args.scst_steps // 2)))
  if stage == "scst":
    config.init_from = run_dir(getattr(args, "xe_workdir", "") or args.workdir, model, "xe", seed)
    config.scst.start_step = 0
    if args.scst_lr:
      config.scst.learning_rate = args.scst_lr
    if getattr(args, "scst_samples", 0):
      config.scst.num_samples = args.scst_samples
    if getattr(args, "scst_baseline", ""):
      config.scst.baseline = args.scst_baseline
    config.num_train_steps = args.scst_steps
  elif stage == "xe_more":
    # The cross-entropy run resumed (a copy of its folder) for as many more steps as SCST takes.
    config.num_train_steps += args.scst_steps
  return config


def run_dir(workdir: str, model: str, stage: str, seed: int) -> str:
  return os.path.join(workdir, model, stage, f"seed{seed}")


def scores_file(run_workdir: str) -> str:
  """What a finished run leaves (its test scores); a run without it is (re)started."""
  return os.path.join(run_workdir, "scores_test.json")


def copy_xe_run(src: str, dst: str) -> None:
  """``src``'s run folder without its test results, as ``dst`` (written under a temporary name,
  then renamed, so an interrupted copy is not taken for a run)."""
  import shutil
  tmp = f"{dst}.copying"
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("scores_test*.json", "predictions_test*.json",
                                                          "run_seconds.json"))
  os.replace(tmp, dst)


def run_one(model: str, stage: str, seed: int, args) -> dict:
  """Scores (``overall``) of one run, training it unless its test scores are there."""
  workdir = run_dir(args.workdir, model, stage, seed)
  done = scores_file(workdir)
  timing = os.path.join(workdir, "run_seconds.json")
  if not os.path.exists(done):
    from jaxcap.training import train_lib
    config = stage_config(model, stage, seed, args)
    if stage == "xe_more" and not os.path.exists(workdir):
      copy_xe_run(run_dir(getattr(args, "xe_workdir", "") or args.workdir, model, "xe", seed), workdir)
    before_run(model, config)
    print(f"=== {model} {stage} seed {seed} ({config.num_train_steps} steps) -> {workdir}", flush=True)
    t0 = time.time()
    train_lib.train_and_evaluate(config, workdir)
    with open(timing, "w") as f:
      json.dump({"seconds": round(time.time() - t0, 1), "steps": int(config.num_train_steps)}, f)
  with open(done) as f:
    overall = dict(json.load(f)["overall"])
  if os.path.exists(timing):
    with open(timing) as f:
      overall.update({f"run_{k}": v for k, v in json.load(f).items()})
  return overall


def nearest_neighbour(args) -> dict:
  workdir = os.path.join(args.workdir, "nearest_neighbour")
  done = scores_file(workdir)
  if not os.path.exists(done):
    from configs import nearest_neighbour as nn_config
    from jaxcap.training import train_lib
    print(f"=== nearest_neighbour -> {workdir}", flush=True)
    train_lib.train_and_evaluate(nn_config.get_config(args.dataset), workdir)
  with open(done) as f:
    return dict(json.load(f)["overall"])


def format_table(rows: list[dict], nn: dict | None) -> str:
  out = []
  for r in rows:
    mean, std = r["mean"], r["std"]
    cells = [experiment.pm((mean[k], std[k]) if k in mean else None) for _, k in METRICS]
    steps = f"{mean['run_steps']:.0f}" if "run_steps" in mean else "-"
    secs = f"{mean['run_seconds']:.0f}" if "run_seconds" in mean else "-"
    out.append([r["model"], STAGE_LABELS[r["stage"]], r["n"], *cells, steps, secs])
  if nn:
    out.append(["nearest neighbour", "-", "-", *(f"{100 * nn[k]:.1f}" if k in nn else "-" for _, k in METRICS),
                "-", "-"])
  return experiment.markdown_table(["model", "training", "seeds", *(n for n, _ in METRICS), "steps", "s / run"],
                                   out)


def write_tables(workdir: str, rows: list[dict], nn: dict | None, seeds: list,
                 dataset: str = "flickr8k") -> str:
  table = format_table(rows, nn)
  split = "flickr8k_xception test split (200 images)" if dataset == "flickr8k" else f"{dataset} test split"
  caption = (f"{split}; mean ± std (ddof = 1) over the finished "
             f"runs of seeds {','.join(map(str, seeds))} (their number: column seeds); scores x100.")
  experiment.write_table(workdir, {"rows": rows, "nearest_neighbour": nn, "seeds": seeds}, caption, table)
  return table


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  experiment.add_overwrite(ap)
  ap.add_argument("--dataset", default="flickr8k", choices=DATASETS,
                  help="the configs' dataset argument (synthetic: the default scenes of train.py)")
  ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {list(MODELS)}")
  ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (config.seed)")
  ap.add_argument("--stages", default="xe,scst",
                  help="a subset of xe, scst, xe_more (cross-entropy continued for --scst-steps more "
                  "steps from the xe run: the control for SCST's extra steps)")
  ap.add_argument("--steps", type=int, default=0, help="cross-entropy steps (0: the config's)")
  ap.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=0,
                  help="images per step (0: the config's)")
  ap.add_argument("--scst-steps", "--scst_steps", dest="scst_steps", type=int, default=300,
                  help="SCST steps after cross-entropy (0: no SCST stage)")
  ap.add_argument("--scst-lr", "--scst_lr", dest="scst_lr", type=float, default=0.0,
                  help="SCST learning rate (0: the config's scst.learning_rate)")
  ap.add_argument("--scst-samples", "--scst_samples", dest="scst_samples", type=int, default=0,
                  help="SCST samples per image (0: the config's scst.num_samples)")
  ap.add_argument("--scst-baseline", "--scst_baseline", dest="scst_baseline", default="",
                  choices=("", "greedy", "mean"),
                  help="SCST baseline: greedy or mean (of the other samples); empty: the config's")
  ap.add_argument("--scst-eval-every", "--scst_eval_every", dest="scst_eval_every", type=int,
                  default=0, help="SCST validation (and checkpoint) interval in steps "
                  "(0: the config's, at most half the SCST steps)")
  ap.add_argument("--xe-workdir", "--xe_workdir", dest="xe_workdir", default="",
                  help="where the cross-entropy runs that SCST starts from are (<xe-workdir>/<m>/xe/"
                  "seed<k>; empty: --workdir), so SCST settings can be compared in workdirs of "
                  "their own from the same cross-entropy runs")
  ap.add_argument("--seed-major", "--seed_major", dest="seed_major", action="store_true",
                  help="loop seeds outside models (every model gets seed 0 before any gets seed 1)")
  ap.add_argument("--no-nn", "--no_nn", dest="nn", action="store_false",
                  help="skip the nearest-neighbour reference row")
  ap.add_argument("--report", action="store_true",
                  help="train nothing: the table of the finished runs among --models x --seeds")
  args = ap.parse_args(argv)
  models = experiment.parse_list(args.models, "--models")
  for m in models:
    if m in UNSUPPORTED:
      raise SystemExit(f"--models: {m} is not in this table: {UNSUPPORTED[m]}")
    if m not in MODELS:
      raise SystemExit(f"--models: unknown model {m!r}; expected a subset of {list(MODELS)}")
  seeds = experiment.parse_seeds(args.seeds)
  stages = experiment.parse_list(args.stages, "--stages")
  for s in stages:
    if s not in STAGES:
      raise SystemExit(f"--stages: unknown stage {s!r}; expected a subset of {list(STAGES)}")
  if args.scst_steps <= 0:
    stages = [s for s in stages if s not in ("scst", "xe_more")]
  experiment.check_workdir(args.workdir, args.overwrite)  # before anything trains

  nn_done = os.path.exists(scores_file(os.path.join(args.workdir, "nearest_neighbour")))
  nn = nearest_neighbour(args) if args.nn and (nn_done or not args.report) else None
  per = {(m, s): {} for m in models for s in stages}

  def run(model, seed):
    for stage in stages:  # SCST needs the same seed's cross-entropy run first.
      if args.report and not os.path.exists(scores_file(run_dir(args.workdir, model, stage, seed))):
        continue
      if stage != "xe" and "xe" not in stages and not os.path.exists(
          scores_file(run_dir(args.xe_workdir or args.workdir, model, "xe", seed))):
        print(f"--- skipping {model} {stage} seed {seed}: no finished xe run", flush=True)
        continue
      per[(model, stage)][seed] = run_one(model, stage, seed, args)
    write_tables(args.workdir, table_rows(per), nn, seeds, args.dataset)

  # Each run keeps its own scores_test.json (run_one reads it back), so no result file here.
  experiment.run_grid(models, seeds, run, seed_major=args.seed_major)
  rows = table_rows(per)
  print(write_tables(args.workdir, rows, nn, seeds, args.dataset))
  return rows


def table_rows(per: dict) -> list[dict]:
  """``{(model, stage): {seed: overall}}`` -> the table's rows (mean ± std over the seeds), each
  model's stages followed by its paired rows (:data:`GAINS`: per seed, over the seeds with both;
  their spread is the seeds' spread of the difference, not of either score)."""
  rows = []
  for m in dict.fromkeys(m for m, _ in per):
    for s in STAGES:
      d = per.get((m, s), {})
      if d:
        rows.append({"model": m, "stage": s, "seeds": {str(k): v for k, v in d.items()}, **experiment.summarize(d)})
    for label, plus, minus in GAINS:
      a, b = per.get((m, plus), {}), per.get((m, minus), {})
      both = [k for k in a if k in b]
      if both:
        gain = {k: {key: a[k][key] - b[k][key] for _, key in METRICS if key in a[k] and key in b[k]}
                for k in both}
        rows.append({"model": m, "stage": label, "seeds": {str(k): v for k, v in gain.items()},
                     **experiment.summarize(gain)})
  return rows


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
