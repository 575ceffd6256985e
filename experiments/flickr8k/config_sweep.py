"""The Flickr8k configs' settings, chosen on the VALIDATION split: one model's ``:flickr8k``
config changed one choice at a time, each setting trained per seed, scored by its best
validation CIDEr-D (the checkpoint train.py keeps); the test split is never decoded.

  python experiments/flickr8k/config_sweep.py --model transformer --workdir runs/f8k_sweep \\
      [--settings "base;learning_rate*0.5;model.dropout=0.5"] [--seeds 0] [--out experiments/flickr8k/results] [--report]

A setting is ``base`` (the config as it is) or changes joined with ``+``: ``key=value`` sets a
field (dotted: ``model.dropout=0.5``; numbers, ``True`` / ``False`` and strings), ``key*f``
multiplies a numeric field (``learning_rate*0.5`` scales Adam's rate and the Noam scale alike;
``num_train_steps*1.5`` lengthens the run, the validation interval stays). A
model's default settings (``--settings`` left out) are :data:`GENERIC` plus its entry in
:data:`EXTRA`. Runs: ``<workdir>/<model>/<setting>/seed<k>`` (``config.test_after_training``
off); a finished run (``sweep.json`` there) is read back, so a sweep resumes and can be split
over processes (disjoint ``--settings``, e.g. one per core under ``taskset``), the last one
writing the whole table. Written: ``<out>/config_sweep_<model>.{md,json}``: per setting the best
validation CIDEr-D (mean ± std, ddof = 1, over the seeds), its step and the run's seconds; the
chosen setting is the highest mean among the settings run on the most seeds (the finalists).
``--report`` trains nothing: the table of the runs finished so far (a setting with fewer
finished seeds says so in its seeds column).
"""

from __future__ import annotations

import ast
import os
import re
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)

from jaxcap.analysis import experiment, figures  # noqa: E402

# One choice at a time around each config: learning rate (Adam's, or the Noam scale), dropout,
# schedule length.
GENERIC = ("base", "learning_rate*0.5", "learning_rate*2", "model.dropout=0.1", "model.dropout=0.5",
           "num_train_steps*1.5")
_SCHEDULE_FIELDS = ("schedule", "learning_rate", "decay_every_epochs", "decay_rate", "warmup_steps",
                    "num_train_steps")


def schedule_of(model: str) -> str:
  """``model``'s ``:flickr8k`` schedule as a setting (``schedule=step+learning_rate=0.001+...``)."""
  from jaxcap import config_files
  config = config_files.load(f"{model}.py:flickr8k")
  return "+".join(f"{k}={config[k]}" for k in _SCHEDULE_FIELDS)


# Per model: the schedule of the best Flickr8k row (AoANet's step decay) where a config uses
# another one; for the configs this sweep changed, the settings they had before, so that each old
# config stays one row: the Transformer's Noam schedule (ETA's old one, the same layers) at dropout
# 0.3, then the step schedule at dropout 0.3; the Image Transformer's dropout 0.3 and Adam 1e-3;
# ETA's Noam schedule and AAT's Adam 2e-3 x0.8 every 3 epochs over 1,200 steps (both now take
# AoANet's schedule); TPGN's 500 steps (it took twice as many). The LSTM's width (its config is
# 128 wide, the papers' 512).
_BEST = schedule_of("aoanet")
_ETA_OLD = "schedule=noam+learning_rate=1.0+decay_every_epochs=3+decay_rate=0.8+warmup_steps=300+num_train_steps=1200"
_AAT_OLD = "schedule=step+learning_rate=0.002+decay_every_epochs=3+decay_rate=0.8+warmup_steps=0+num_train_steps=1200"
_NOAM = _ETA_OLD + "+model.dropout=0.3"
_WIDE = "model.hidden_dim=512+model.embed_dim=512+model.att_dim=512"

EXTRA = {"transformer": (_NOAM, _NOAM + "+learning_rate*0.5", _NOAM + "+learning_rate*2", "model.dropout=0.3",
                         "model.dropout=0.3+learning_rate*0.5"),
         "image_transformer": ("model.dropout=0.3+learning_rate*2",),
         "eta": (_ETA_OLD,), "aat": (_AAT_OLD,), "tpgn": (_BEST, "num_train_steps=500"), "lstm": (_WIDE,)}


def parse_setting(text: str) -> list[tuple[str, str, object]]:
  """``"a=1+b*2"`` -> ``[("a", "=", 1), ("b", "*", 2.0)]``; ``"base"`` -> ``[]``."""
  text = text.strip()
  if text == "base":
    return []
  out = []
  for item in text.split("+"):
    m = re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*([=*])\s*(.*?)\s*", item)
    if not m or not m.group(3):
      raise SystemExit(f"--settings: {item!r} in {text!r}: expected key=value or key*factor")
    key, op, raw = m.groups()
    if op == "*":
      try:
        value = float(raw)
      except ValueError:
        raise SystemExit(f"--settings: {item!r}: the factor {raw!r} is not a number") from None
    else:
      try:
        value = ast.literal_eval(raw)
      except (ValueError, SyntaxError):
        value = raw
    out.append((key, op, value))
  return out


def apply_setting(config, setting: str):
  """``config`` with ``setting``'s changes (a field it does not have: SystemExit)."""
  for key, op, value in parse_setting(setting):
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node.get(p) if hasattr(node, "get") else None
      if node is None:
        raise SystemExit(f"--settings: {key!r}: the config has no section {p!r}")
    if leaf not in node:
      raise SystemExit(f"--settings: {key!r}: the config has no field {leaf!r}")
    if op == "*":
      old = node[leaf]
      if not isinstance(old, (int, float)) or isinstance(old, bool):
        raise SystemExit(f"--settings: {key!r} is {old!r}, not a number to multiply")
      value = type(old)(round(old * value)) if isinstance(old, int) else old * value
    with node.ignore_type():
      node[leaf] = value
  return config


def dirname(setting: str) -> str:
  """A folder name for ``setting`` (``learning_rate*0.5`` -> ``learning_rate_x0.5``)."""
  return re.sub(r"[^\w.=-]", "_", setting.strip().replace("*", "_x").replace("+", "__"))


def run_config(model: str, setting: str, seed: int, workdir: str):
  import table
  config = table.base_config(model, workdir)
  config.seed = seed
  config.test_after_training = False  # chosen on validation: the test split is not decoded
  return apply_setting(config, setting)


def sweep_file(workdir: str, model: str, setting: str, seed: int) -> str:
  """A finished run's ``sweep.json``, in its run folder ``<workdir>/<model>/<setting>/seed<k>``."""
  return os.path.join(workdir, model, dirname(setting), f"seed{seed}", "sweep.json")


def run_one(model: str, setting: str, seed: int, workdir: str) -> dict:
  """Trains one setting for one seed unless its ``sweep.json`` is there; returns it."""
  done = sweep_file(workdir, model, setting, seed)
  run = os.path.dirname(done)
  if not os.path.exists(done):
    import table
    from jaxcap.training import train_lib
    config = run_config(model, setting, seed, workdir)
    table.before_run(model, config)
    print(f"=== {model} [{setting}] seed {seed} ({config.num_train_steps} steps) -> {run}", flush=True)
    t0 = time.time()
    train_lib.train_and_evaluate(config, run)
    seconds = round(time.time() - t0, 1)
    steps, values = figures.load_metrics(run)["val/CIDEr"]
    k = int(values.argmax())
    experiment.write_json(done, {
        "setting": setting, "seed": seed, "steps": int(config.num_train_steps), "seconds": seconds,
        "val_steps": steps.tolist(), "val_CIDEr": values.tolist(), "best_step": int(steps[k]),
        "best_val_CIDEr": float(values[k]), "last_val_CIDEr": float(values[-1])})
  return experiment.read_json(done)


def summarize(results: dict) -> list[dict]:
  """``{setting: {seed: run}}`` -> rows with mean ± std of the best validation CIDEr-D."""
  rows = []
  for setting, per_seed in results.items():
    runs = list(per_seed.values())
    row = {"setting": setting, "n": len(runs), "seeds": {str(k): v for k, v in per_seed.items()}}
    for key in ("best_val_CIDEr", "last_val_CIDEr", "best_step", "seconds", "steps"):
      row[key] = experiment.mean_std(r[key] for r in runs)
    rows.append(row)
  # Among the settings run on the most seeds (the finalists): one lucky seed does not win.
  most = max((r["n"] for r in rows), default=0)
  best = max((r for r in rows if r["n"] == most), key=lambda r: r["best_val_CIDEr"][0], default=None)
  for r in rows:
    r["chosen"] = r is best
  return rows


def format_table(rows: list[dict]) -> str:
  pm = experiment.pm
  return experiment.markdown_table(
      ["setting", "seeds", "best val CIDEr-D", "at step", "last val CIDEr-D", "steps", "s / run", ""],
      [[f"`{r['setting']}`", r["n"], pm(r["best_val_CIDEr"]), f"{r['best_step'][0]:.0f}",
        pm(r["last_val_CIDEr"]), f"{r['steps'][0]:.0f}", f"{r['seconds'][0]:.0f}",
        "chosen" if r["chosen"] else ""] for r in rows])


def main(argv=None):
  import table
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", required=True, help=f"one of {list(table.MODELS)}")
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--settings", default="", help="';'-separated settings (empty: the model's defaults)")
  ap.add_argument("--seeds", default="0")
  ap.add_argument("--out", default="", help="folder for config_sweep_<model>.{md,json} (empty: --workdir)")
  ap.add_argument("--report", action="store_true",
                  help="train nothing: the table of the finished runs among --settings x --seeds")
  experiment.add_overwrite(ap)
  args = ap.parse_args(argv)
  if args.model not in table.MODELS:
    raise SystemExit(f"--model: unknown model {args.model!r}; expected one of {list(table.MODELS)}")
  seeds = experiment.parse_seeds(args.seeds)
  out = args.out or args.workdir
  for flag, path in (("--workdir", args.workdir), ("--out", out)):
    if os.path.exists(path) and not os.path.isdir(path):
      raise SystemExit(f"{flag}: {path} is a file, expected a folder")
  # Before anything trains: another program's folder, or table files this script did not write.
  experiment.check_workdir(args.workdir, args.overwrite)
  table_json = os.path.join(out, f"config_sweep_{args.model}.json")
  own = experiment.json_with_keys("model", "rows", "seeds")
  experiment.check_files(out, {os.path.basename(table_json): own,
                               f"config_sweep_{args.model}.md": experiment.beside(table_json, own)},
                         args.overwrite, "--out" if args.out else "--workdir")
  settings = ([s.strip() for s in args.settings.split(";") if s.strip()] if args.settings
              else list(GENERIC) + list(EXTRA.get(args.model, ())))
  base = run_config(args.model, "base", 0, args.workdir).to_dict()
  for s in list(settings):  # every setting is checked against the config before anything trains
    if s != "base" and run_config(args.model, s, 0, args.workdir).to_dict() == base:
      print(f"--- {s}: the config as it is (base), not run twice", flush=True)
      settings.remove(s)
  if not settings:  # nothing left to train or report: not an error
    print("--- every setting is the config as it is: nothing to run", flush=True)
    return []
  results = {s: {} for s in settings}

  def run(setting, seed):
    if args.report and not os.path.exists(sweep_file(args.workdir, args.model, setting, seed)):
      return None
    results[setting][seed] = run_one(args.model, setting, seed, args.workdir)
    return results[setting][seed]

  experiment.run_grid(settings, seeds, run)
  results = {s: r for s, r in results.items() if r}
  if not results:
    raise SystemExit(f"--report: no finished run of {settings} x seeds {seeds} under "
                     f"{os.path.join(args.workdir, args.model)}")
  rows = summarize(results)
  md = format_table(rows)
  caption = (f"`configs/{args.model}.py:flickr8k`, one change at a time; best validation CIDEr-D "
             f"(the validation split, x100) over the run's validations, mean ± std (ddof = 1) over the "
             f"finished seeds among {','.join(map(str, seeds))} (column seeds); the test split is not decoded.")
  experiment.write_json(os.path.join(out, f"config_sweep_{args.model}.json"),
                        {"model": args.model, "rows": rows, "seeds": seeds})
  experiment.write_text(os.path.join(out, f"config_sweep_{args.model}.md"), f"{caption}\n\n{md}\n")
  print(md)
  return rows


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
