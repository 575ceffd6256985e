"""How far whole training runs on different meshes drift apart: one config trained by train.py on
1 device, then on 8 forced host devices replicated and under FSDP, every step's loss logged.

  python benchmarks/mesh_drift.py [--config configs/pixels.py:synthetic] [--steps 60] [--batch 48]
      [--devices 8] [--scenes DIR] [--workdir DIR] [--set=--config.field=value ...] [--out record.json]

One step from the same state agrees across these meshes to float rounding
(tests/training/test_sharding.py); a whole run does not stay that close, because each mesh splits
the batch's sums another way and Adam's normalised steps magnify the difference step after step.
This measures the curve: per step, each run's loss and its relative difference from the 1-device
run's (``|loss_8 - loss_1| / loss_1``), and the first step where that exceeds 1e-5, 1e-3 and 1e-2.

The default config is USAGE's from-pixels one (``configs/pixels.py:synthetic``: a ResNet-50 at a
sixteenth of its widths on 64 px scenes, the CPU-sized Transformer); its scenes are rendered into
``--scenes`` (``python -m jaxcap.data.render --size 64``) when that folder has none. ``--batch``
must split over ``--devices`` (the config's 50 does not split over 8: 48 in every run).
``--set`` passes a train.py flag to every run (e.g. ``--set=--config.backbone.freeze_steps=0``).
The runs are train.py processes (``XLA_FLAGS=--xla_force_host_platform_device_count``); no
validation or test scoring. On a CPU the forced devices give the numerics of 8 devices, not
their speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)
BENCHMARK = "benchmarks/mesh_drift.py"
THRESHOLDS = (1e-5, 1e-3, 1e-2)


def _parse(argv):
  from jaxcap import cli
  p = cli.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/pixels.py:synthetic",
                 help="train.py's --config (configs/pixels.py:synthetic alone gets root=--scenes)")
  p.add_argument("--steps", type=cli.positive_int, default=60)
  p.add_argument("--batch", type=cli.positive_int, default=48, help="global images per step, in every run")
  p.add_argument("--devices", type=cli.positive_int, default=8, help="forced host devices of the sharded runs")
  p.add_argument("--scenes", default="", help="the rendered scenes (default: <workdir>/scenes)")
  p.add_argument("--workdir", default="", help="where the runs are written (default: a temporary folder, removed)")
  p.add_argument("--set", action="append", default=[], help="a train.py flag given to every run, as "
                 "--set=--config.<field>=<value> (repeated for several)")
  p.add_argument("--out", default="", help="the record (default benchmarks/results/mesh_drift_<device>_<date>.json)")
  args = p.parse_args(argv)
  if args.batch % args.devices:
    p.error(f"--batch {args.batch} does not split over --devices {args.devices}: give a multiple of it")
  bad = [s for s in args.set if not s.startswith("--config.")]
  if bad:
    p.error(f"--set takes train.py's --config.<field>=<value> flags; got {bad[0]!r}")
  return args


def _losses(workdir: str) -> dict[int, float]:
  """``{step: loss}`` from a run's metrics.jsonl (the lines with a training loss)."""
  out = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if row.get("train/loss") is not None:
        out[int(row["step"])] = float(row["train/loss"])
  return out


def _train(args, config: str, workdir: str, devices: int, sharding: str) -> dict[int, float]:
  # the caller's XLA flags kept (the tests' fast-compile ones among them), its device count replaced
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env = dict(os.environ, XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
             JAX_PLATFORMS="cpu")
  cmd = [sys.executable, os.path.join(_REPO, "train.py"), "--config", config, "--workdir", workdir,
         f"--config.batch_size={args.batch}", f"--config.num_train_steps={args.steps}",
         "--config.log_every_steps=1", f"--config.eval_every_steps={args.steps}",
         f"--config.checkpoint_every_steps={args.steps}", "--config.test_after_training=False",
         f"--config.sharding={sharding}", *args.set]
  print(f"{devices} device(s), {sharding}: {' '.join(cmd[1:])}", flush=True)
  done = subprocess.run(cmd, env=env, cwd=_REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  if done.returncode == 2:  # train.py refused what it was given (a --set flag, the config): its one line
    from jaxcap.errors import BadInput
    raise BadInput(f"train.py on {devices} device(s): {done.stderr.strip().splitlines()[-1]}")
  if done.returncode:  # a bug's traceback is the end of its stderr
    raise RuntimeError(f"train.py on {devices} device(s), {sharding}, exit {done.returncode}:\n"
                       + done.stderr[-4000:])
  return _losses(workdir)


def drift(base: dict[int, float], other: dict[int, float]) -> dict:
  """Per step ``|other - base| / base`` over the steps both logged, and the first step past each
  of :data:`THRESHOLDS` (None where it never is)."""
  steps = sorted(set(base) & set(other))
  rel = [abs(other[s] - base[s]) / abs(base[s]) for s in steps]
  first = {f"{t:g}": next((s for s, r in zip(steps, rel) if r > t), None) for t in THRESHOLDS}
  return {"steps": steps, "relative": rel, "first_step_over": first, "max_relative": max(rel)}


def main(argv=None):
  args = _parse(argv)
  import shutil
  from run import environment
  from jaxcap import atomic
  root = args.workdir or tempfile.mkdtemp(prefix="jaxcap_mesh_drift_")
  try:
    config = args.config
    if config == "configs/pixels.py:synthetic":  # its scenes (a config naming root= brings its own)
      scenes = args.scenes or os.path.join(root, "scenes")
      if not os.path.isdir(os.path.join(scenes, "images")):
        subprocess.run([sys.executable, "-m", "jaxcap.data.render", "--out", scenes, "--size", "64"],
                       check=True, cwd=_REPO, stdout=subprocess.DEVNULL)
      config += f",root={os.path.abspath(scenes)}"
    runs = {"1 device": _train(args, config, os.path.join(root, "d1"), 1, "replicated"),
            f"{args.devices} devices replicated": _train(args, config, os.path.join(root, "rep"), args.devices,
                                                         "replicated"),
            f"{args.devices} devices fsdp": _train(args, config, os.path.join(root, "fsdp"), args.devices, "fsdp")}
  finally:
    if not args.workdir:
      shutil.rmtree(root, ignore_errors=True)
  base = runs["1 device"]
  if len(base) < args.steps:
    raise RuntimeError(f"the 1-device run logged {len(base)} losses for {args.steps} steps")
  rows = []
  for name, losses in runs.items():
    row = {"run": name, "losses": [losses[s] for s in sorted(losses)]}
    if name != "1 device":
      row["drift"] = drift(base, losses)
      d = row["drift"]
      print(f"{name}: max relative difference {d['max_relative']:.2e}; first step over "
            + ", ".join(f"{k}: {v}" for k, v in d["first_step_over"].items()), flush=True)
    rows.append(row)
  env = dict(environment(), device_count=args.devices, cpu_count=os.cpu_count())
  record = {"benchmark": BENCHMARK, "environment": env, "argv": list(argv if argv is not None else sys.argv[1:]),
            "config": args.config, "steps": args.steps,
            "batch": args.batch, "set": args.set, "rows": rows}
  out = args.out or os.path.join(_HERE, "results", f"mesh_drift_{env['device_kind'].lower().replace(' ', '_')}_"
                                 f"{env['date'][:10]}.json")
  atomic.write_json(out, record)
  print(f"wrote {out}")


if __name__ == "__main__":
  from jaxcap import cli
  cli.run_script(main)
