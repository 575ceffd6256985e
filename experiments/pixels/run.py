"""From pixels to captions, offline: synthetic_scenes drawn as PNG files, ResNet-50 features with
random weights extracted by jaxcap-extract, a Transformer trained on them by train.py unchanged,
and ``Run.caption_images`` on the test PNGs, scored beside the nearest-neighbour caption on the
same features (and, for context, the same Transformer on the scenes' own region features).

  python experiments/pixels/run.py --workdir runs/pixels                 # 3 seeds (~30 min here)
  python experiments/pixels/run.py --workdir runs/pixels --seeds 0 --no-context --steps 300
  python experiments/pixels/run.py --workdir runs/pixels --report        # the finished runs' table

Stages, each a command the script prints and records (``results.json``), each skipped when its
output is there (an interrupted run resumes):

1. ``<workdir>/scenes``: ``python -m jaxcap.data.render`` draws the ``--num_train`` /
   ``--num_val`` / ``--num_test`` scenes (synthetic_scenes seed 0) as ``--size`` px PNGs and
   writes ``captions.json`` with their five references and their split.
2. ``<workdir>/features``: ``scripts/extract_features.py`` (``jaxcap-extract``) with
   ``--backbone resnet50 --random_weights`` (``--fields`` overrides the architecture, e.g. a tiny
   one in tests) at ``--size`` px, ``--att_size`` grid; the captions' splits are kept.
3. ``<workdir>/nearest_neighbour``: ``train.py --config configs/nearest_neighbour.py:coco`` on
   those features: the first caption of the training image whose ``fc`` feature is nearest
   (cosine), scored on the test split by train.py.
4. ``<workdir>/pixels/seed<k>``: ``train.py --config configs/transformer.py:coco,size=small`` on
   those features (the data flags point ``:coco`` at ``att/`` + ``fc/`` as a grid, no boxes)
   with the shared schedule flags below and ``--config.seed=k``; then ``jaxcap.load`` of the run
   and ``run.caption_images`` on the test PNG paths (the recorded backbone recomputes the
   features from the pixels), scored with ``jaxcap.score`` against the test references
   (``captions_images.json``, ``scores_images.json``); the captions are compared with train.py's
   own test predictions on the extracted files.
5. ``--context`` (default on): ``<workdir>/regions/seed<k>``: ``train.py --config
   configs/transformer.py:synthetic`` with the same split sizes and schedule flags, on the
   scenes' embedded region features (the same test scenes and references), and
   ``<workdir>/regions_nearest_neighbour``.

Shared schedule flags of both Transformer rows: batch 50, ``--steps`` steps, Noam warm-up 300 at
scale ``--learning_rate``, validation on every val image every ``--eval_every`` steps (the best
checkpoint is tested), greedy decoding, d = 128, 2 + 2 layers, 4 heads, FFN 512, dropout 0.3,
words seen fewer than 2 times UNK; ``--override KEY=VALUE`` (repeatable) appends
``--config.KEY=VALUE`` to both (tests shrink the model so).

Written: ``<workdir>/results.json`` (every command with its seconds, every seed's scores, mean ±
std with the sample standard deviation, ddof = 1, and what the captions name: the test images
whose caption names the described pair's colours, shapes and relation), ``<workdir>/table.md``
(scores x100) and ``<workdir>/commands.json`` (the seconds of each command run, kept when a
later invocation resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:  # the checkout's jaxcap and configs/, two folders up
  sys.path.insert(0, _REPO)

from jaxcap import atomic  # noqa: E402  (after the path above)
from jaxcap.analysis import experiment  # noqa: E402

METRICS = (("CIDEr-D", "CIDEr"), ("BLEU-4", "Bleu_4"))
ROWS = ("pixels", "regions")


def parser() -> argparse.ArgumentParser:
  from jaxcap import cli
  ap = cli.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  experiment.add_overwrite(ap)
  ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (config.seed)")
  ap.add_argument("--steps", type=cli.positive_int, default=900, help="training steps per Transformer run")
  ap.add_argument("--eval_every", "--eval-every", dest="eval_every", type=cli.positive_int, default=150,
                  help="validate and checkpoint every this many steps")
  ap.add_argument("--learning_rate", "--learning-rate", dest="learning_rate", type=float, default=1.0,
                  help="Noam scale factor")
  ap.add_argument("--num_train", type=cli.positive_int, default=1500)
  ap.add_argument("--num_val", type=cli.positive_int, default=200)
  ap.add_argument("--num_test", type=cli.positive_int, default=200)
  ap.add_argument("--size", type=cli.positive_int, default=128, help="image side in pixels (render and extract)")
  ap.add_argument("--att_size", type=cli.positive_int, default=4, help="att grid side g (g*g regions)")
  ap.add_argument("--fields", default=None, help="jaxcap-extract --fields (backbone field overrides, JSON)")
  ap.add_argument("--batch_size", type=cli.positive_int, default=50, help="images per training step")
  ap.add_argument("--override", action="append", default=[],
                  help="KEY=VALUE: --config.KEY=VALUE for both Transformer rows (repeatable)")
  ap.add_argument("--no-context", "--no_context", dest="context", action="store_false",
                  help="skip the rows on the embedded region features")
  ap.add_argument("--report", action="store_true", help="run nothing: the table of what is finished")
  return ap


# ------------------------------------------------------------------------------------- commands
def paths(workdir: str) -> dict:
  w = lambda *p: os.path.join(workdir, *p)
  return {"scenes": w("scenes"), "images": w("scenes", "images"), "captions": w("scenes", "captions.json"),
          "features": w("features"), "nn": w("nearest_neighbour"), "regions_nn": w("regions_nearest_neighbour")}


def run_dir(workdir: str, row: str, seed: int) -> str:
  return os.path.join(workdir, row, f"seed{seed}")


def render_cmd(args, p) -> list[str]:
  return ["python", "-m", "jaxcap.data.render", "--out", p["scenes"], "--size", str(args.size),
          "--num_train", str(args.num_train), "--num_val", str(args.num_val), "--num_test", str(args.num_test)]


def extract_cmd(args, p) -> list[str]:
  cmd = ["python", "scripts/extract_features.py", "--images", p["images"], "--out", p["features"],
         "--backbone", "resnet50", "--random_weights", "--size", str(args.size), "--att_size",
         str(args.att_size), "--captions", p["captions"], "--name", "scenes", "--no_progress"]
  return cmd + (["--fields", args.fields] if args.fields else [])


def data_flags(args, p) -> list[str]:
  """``:coco`` pointed at jaxcap-extract's output: the grid cells as regions, no box files."""
  return [f"--config.data.root={p['features']}", "--config.data.dataset_json=dataset_scenes.json",
          "--config.data.att_dir=att", "--config.data.fc_dir=fc", "--config.data.box_dir=",
          "--config.data.grid=True", f"--config.data.max_regions={args.att_size ** 2}"]


def schedule_flags(args, seed: int) -> list[str]:
  flags = [f"--config.seed={seed}", f"--config.batch_size={args.batch_size}",
           f"--config.num_train_steps={args.steps}", f"--config.eval_every_steps={args.eval_every}",
           f"--config.checkpoint_every_steps={args.eval_every}", "--config.warmup_steps=300",
           f"--config.learning_rate={args.learning_rate}", f"--config.eval_num_images={args.num_val}",
           "--config.log_every_steps=50", "--config.decode.method=greedy", "--config.model.dim=128",
           "--config.model.num_layers=2", "--config.model.num_dec_layers=2", "--config.model.num_heads=4",
           "--config.model.ff_dim=512", "--config.model.dropout=0.3", "--config.data.min_word_count=2"]
  return flags + [f"--config.{kv}" for kv in args.override]


def split_flags(args) -> list[str]:
  return [f"--config.data.num_train={args.num_train}", f"--config.data.num_val={args.num_val}",
          f"--config.data.num_test={args.num_test}"]


def train_cmd(args, p, row: str, seed: int, workdir: str) -> list[str]:
  if row == "pixels":
    return (["python", "train.py", "--config", "configs/transformer.py:coco,size=small", *data_flags(args, p),
             *schedule_flags(args, seed), "--workdir", workdir])
  return (["python", "train.py", "--config", "configs/transformer.py:synthetic", *split_flags(args),
           *schedule_flags(args, seed), "--workdir", workdir])


def nn_cmd(args, p, row: str) -> list[str]:
  if row == "pixels":
    return ["python", "train.py", "--config", "configs/nearest_neighbour.py:coco", *data_flags(args, p),
            "--workdir", p["nn"]]
  return ["python", "train.py", "--config", "configs/nearest_neighbour.py:synthetic", *split_flags(args),
          "--workdir", p["regions_nn"]]


def show(cmd: list[str]) -> str:
  return " ".join(shlex.quote(c) for c in cmd)


def timings_file(workdir: str) -> str:
  return os.path.join(workdir, "commands.json")


def execute(cmd: list[str], workdir: str) -> float:
  """Runs ``cmd`` from the repository's root (``python`` is this interpreter), its output passed
  through; records its seconds in ``<workdir>/commands.json``; returns them. A failure is one
  line, exit 2."""
  print(f"$ {show(cmd)}", flush=True)
  argv = [sys.executable if cmd[0] == "python" else cmd[0], *cmd[1:]]
  t0 = time.time()
  proc = subprocess.run(argv, cwd=_REPO)
  seconds = round(time.time() - t0, 1)
  if proc.returncode != 0:
    raise SystemExit(f"{show(cmd)}: exit code {proc.returncode}; expected 0 (its output is above)")
  path = timings_file(workdir)
  timings = experiment.read_json(path) if os.path.exists(path) else {}
  timings[show(cmd)] = seconds
  experiment.write_json(path, timings)
  return seconds


def all_commands(args, p, seeds: list, rows: list) -> list[str]:
  """Every command of the table, in the order they run."""
  cmds = [render_cmd(args, p), extract_cmd(args, p)] + [nn_cmd(args, p, row) for row in rows]
  cmds += [train_cmd(args, p, row, seed, run_dir(args.workdir, row, seed)) for seed in seeds for row in rows]
  return [show(c) for c in cmds]


# -------------------------------------------------------------------------------------- stages
def references_of_test(p) -> dict:
  """``{png file name: [reference, ...]}`` of the test split of the rendered captions."""
  refs: dict = {}
  for item in experiment.read_json(p["captions"]):
    if item["split"] == "test":
      refs.setdefault(item["image"], []).append(item["caption"])
  return dict(sorted(refs.items()))


def caption_pngs(workdir: str, p) -> dict:
  """``Run.caption_images`` on the test PNG paths, scored; compared with train.py's own test
  captions of the extracted files (``predictions_test.json``)."""
  import jaxcap
  refs = references_of_test(p)
  names = list(refs)
  run = jaxcap.load(workdir)
  t0 = time.time()
  captions = run.caption_images([os.path.join(p["images"], n) for n in names], batch_size=50,
                                method=run.config.decode.method, beam_size=run.config.decode.beam_size)
  seconds = time.time() - t0
  if len(captions) != len(names):
    raise SystemExit(f"caption_images: {len(captions)} captions for {len(names)} files; expected one each")
  experiment.write_json(os.path.join(workdir, "captions_images.json"),
                        [{"image": n, "caption": c} for n, c in zip(names, captions)])
  scores = jaxcap.score(refs, dict(zip(names, captions)), metrics=("Bleu", "CIDEr"))["overall"]
  result = {k: float(v) for k, v in scores.items()}
  own = {d["image_id"]: d["caption"] for d in experiment.read_json(os.path.join(workdir, "predictions_test.json"))}
  stems = [os.path.splitext(n)[0] for n in names]
  result.update(images=len(names), caption_images_seconds=round(seconds, 1),
                distinct_captions=len(set(captions)),
                same_as_train_py=sum(own.get(s) == c for s, c in zip(stems, captions)),
                train_py_test_CIDEr=float(experiment.read_json(
                    os.path.join(workdir, "scores_test.json"))["overall"]["CIDEr"]))
  return result


def run_transformer(args, p, row: str, seed: int) -> dict:
  workdir = run_dir(args.workdir, row, seed)
  if not os.path.exists(os.path.join(workdir, "scores_test.json")):
    seconds = execute(train_cmd(args, p, row, seed, workdir), args.workdir)
    experiment.write_json(os.path.join(workdir, "run_seconds.json"), {"seconds": seconds})
  timing = os.path.join(workdir, "run_seconds.json")
  extra = {"train_seconds": experiment.read_json(timing)["seconds"]} if os.path.exists(timing) else {}
  if row == "pixels":
    return {**caption_pngs(workdir, p), **extra, "steps": args.steps}
  overall = experiment.read_json(os.path.join(workdir, "scores_test.json"))["overall"]
  return {**{k: float(v) for k, v in overall.items()}, **extra, "steps": args.steps}


def run_nn(args, p, row: str) -> dict:
  workdir = p["nn"] if row == "pixels" else p["regions_nn"]
  done = os.path.join(workdir, "scores_test.json")
  if not os.path.exists(done):
    execute(nn_cmd(args, p, row), args.workdir)
  return {k: float(v) for k, v in experiment.read_json(done)["overall"].items()}


def prepare(args, p) -> None:
  if not os.path.exists(p["captions"]):
    execute(render_cmd(args, p), args.workdir)
  if not os.path.exists(os.path.join(p["features"], "dataset_scenes.json")):
    execute(extract_cmd(args, p), args.workdir)


# ------------------------------------------------------------------------- what the captions name
HITS = (("A colour", "A_colour"), ("A shape", "A_shape"), ("B colour", "B_colour"),
        ("B shape", "B_shape"), ("relation", "relation"))


def primary_words(args) -> list[dict]:
  """Per test scene, the words that name its described pair ``A rel B`` (any synonym)."""
  from jaxcap.data import synthetic
  scenes = synthetic.SyntheticScenes(num_train=args.num_train, num_val=args.num_val, num_test=args.num_test)
  out = []
  for i in range(args.num_test):
    sc = scenes.scene("test", i)
    a, rel, b = sc["primary"]
    words = {}
    for key, r in (("A", sc["regions"][a]), ("B", sc["regions"][b])):
      words[f"{key}_colour"] = {r["colour"]}
      words[f"{key}_shape"] = {w for pair in synthetic.EN_SHAPE[r["shape"]] for w in pair}
    words["relation"] = {w for phrase in synthetic.EN_REL[rel] for w in phrase} - {"of", "to", "the", "on"}
    out.append(words)
  return out


def scene_index(image_id) -> int:
  """The test scene of an image id: ``test_00012`` (the PNGs' stems) or synthetic_scenes' int id."""
  if isinstance(image_id, str) and image_id.startswith("test_"):
    return int(image_id[len("test_"):].split(".")[0])
  return int(image_id) % 10_000_000


def hits(predictions: dict, words: list[dict]) -> dict:
  """The fraction of the test images whose caption names each of :data:`HITS`."""
  counts = {k: 0 for _, k in HITS}
  for image_id, caption in predictions.items():
    tokens = set(caption.split())
    for _, k in HITS:
      counts[k] += bool(tokens & words[scene_index(image_id)][k])
  return {k: v / max(len(predictions), 1) for k, v in counts.items()}


def predictions_of(workdir: str) -> dict | None:
  """``{image id: caption}`` of a finished run: its ``caption_images`` captions (the pixel rows),
  else train.py's test predictions."""
  images = os.path.join(workdir, "captions_images.json")
  if os.path.exists(images):
    return {d["image"]: d["caption"] for d in experiment.read_json(images)}
  own = os.path.join(workdir, "predictions_test.json")
  if os.path.exists(own):
    return {d["image_id"]: d["caption"] for d in experiment.read_json(own)}
  return None


def row_hits(args, results: dict, words: list[dict]) -> dict:
  """``{row: {"mean", "std"}}`` of :func:`hits` over each row's finished seeds (one run for the
  nearest-neighbour rows)."""
  out = {}
  p = paths(args.workdir)
  for row in ROWS:
    per = {}
    for seed in (results.get(row) or {}):
      preds = predictions_of(run_dir(args.workdir, row, seed))
      if preds:
        per[seed] = hits(preds, words)
    if per:
      out[row] = experiment.summarize(per)
    preds = predictions_of(p["nn"] if row == "pixels" else p["regions_nn"])
    if preds:
      out[f"nn_{row}"] = experiment.summarize({0: hits(preds, words)})
  return out


# --------------------------------------------------------------------------------------- table
ROW_NAMES = {"pixels": "Transformer, ResNet-50 (random) grid of the PNGs, caption_images",
             "nn_pixels": "nearest neighbour, ResNet-50 (random) fc of the PNGs",
             "regions": "Transformer, embedded region features (context)",
             "nn_regions": "nearest neighbour, embedded global feature (context)"}


def format_table(results: dict, nn: dict, named: dict) -> str:
  def named_cells(key):
    h = named.get(key)
    return [f"{100 * h['mean'][k]:.0f}" if h else "-" for _, k in HITS]

  out = []
  for row in ROWS:
    per = results.get(row) or {}
    if per:
      s = experiment.summarize(per)
      cells = [experiment.pm((s["mean"][k], s["std"][k]) if k in s["mean"] else None) for _, k in METRICS]
      out.append([ROW_NAMES[row], s["n"], *cells, *named_cells(row)])
    if f"nn_{row}" in nn:
      out.append([ROW_NAMES[f"nn_{row}"], "-", *(f"{100 * nn[f'nn_{row}'][k]:.1f}" for _, k in METRICS),
                  *named_cells(f"nn_{row}")])
  return experiment.markdown_table(["row", "seeds", *(n for n, _ in METRICS), *(f"{n} %" for n, _ in HITS)], out)


def write(args, results: dict, nn: dict, seeds: list, rows: list, words: list[dict]) -> str:
  named = row_hits(args, results, words)
  path = timings_file(args.workdir)
  timings = experiment.read_json(path) if os.path.exists(path) else {}
  log = [{"command": c, "seconds": timings.get(c)} for c in all_commands(args, paths(args.workdir), seeds, rows)]
  table = format_table(results, nn, named)
  payload = {"settings": {k: v for k, v in vars(args).items() if k != "report"}, "seeds": seeds,
             "rows": {row: {"seeds": {str(k): v for k, v in per.items()}, **experiment.summarize(per)}
                      for row, per in results.items() if per},
             "nearest_neighbour": nn, "named": named, "commands": log}
  caption = (f"Test split ({args.num_test} rendered scenes, 5 references each); mean ± std "
             f"(ddof = 1) over seeds {','.join(map(str, seeds))} ({args.steps} steps each); scores x100. "
             "The % columns: test images whose caption names the described pair's colour / shape "
             "(any synonym) and relation, mean over the seeds.")
  experiment.write_table(args.workdir, payload, caption, table, json_name="results.json")
  return table


def main(argv=None):
  args = parser().parse_args(argv)
  seeds = experiment.parse_seeds(args.seeds)
  for kv in args.override:
    if "=" not in kv:
      raise SystemExit(f"--override={kv}: expected KEY=VALUE, e.g. model.dim=32")
  if args.fields:
    try:
      json.loads(args.fields)
    except ValueError:
      raise SystemExit(f"--fields={args.fields}: invalid JSON; expected an object such as "
                       '{"width": 4}') from None
  experiment.check_workdir(args.workdir, args.overwrite)  # before anything renders or trains
  if not args.report:
    atomic.mark_folder(args.workdir, "experiments/pixels/run.py")  # its scenes come first
  if not os.path.isabs(args.workdir):  # the commands run from the repository's root
    args.workdir = os.path.relpath(os.path.abspath(args.workdir), _REPO)
  os.chdir(_REPO)
  p = paths(args.workdir)
  words = primary_words(args)
  rows = [r for r in ROWS if r == "pixels" or args.context]
  if not args.report:
    os.makedirs(args.workdir, exist_ok=True)
    prepare(args, p)
  nn: dict = {}
  for row in rows:
    done = os.path.exists(os.path.join(p["nn"] if row == "pixels" else p["regions_nn"], "scores_test.json"))
    if done or not args.report:
      nn[f"nn_{row}"] = run_nn(args, p, row)

  def one(row, seed):
    if args.report and not os.path.exists(os.path.join(run_dir(args.workdir, row, seed), "scores_test.json")):
      return None
    print(f"=== {row} seed {seed} -> {run_dir(args.workdir, row, seed)}", flush=True)
    return run_transformer(args, p, row, seed)

  results = experiment.run_grid(rows, seeds, one,
                                result_file=lambda r, s: os.path.join(run_dir(args.workdir, r, s), "result.json"),
                                seed_major=True, after=lambda res: write(args, res, nn, seeds, rows, words))
  table = write(args, results, nn, seeds, rows, words)
  print(table)
  return results


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)
