"""How long training waits for its checkpoints: synchronous against asynchronous saves.

  python benchmarks/checkpoint_save.py                  # the Transformer at the paper's sizes, batch 10
  python benchmarks/checkpoint_save.py --config configs/aat.py:synthetic --model-as-configured

One process trains the config's model on a fixed batch for ``--steps`` steps three times, each
after the step is compiled: without checkpoints, saving the train state every ``--every`` steps
synchronously (``config.async_checkpoints=False``: the loop waits for the files), and
asynchronously (orbax writes them on a thread while the next steps run; the run waits for the
last write at its end, as ``Trainer.fit`` does). Each loop's wall time includes that final
wait; the cost of a save is ``(loop - loop without saves) / saves``. Writes one JSON
(``--out``; default ``benchmarks/results/checkpoint_save_<device>_<date>.json``). Needs the
training stack (ml_collections included).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxcap import atomic, cli, config_files  # noqa: E402
from jaxcap.training import checkpoint as ckpt_lib  # noqa: E402
from jaxcap.training import parallel, train_lib  # noqa: E402


BENCHMARK = "benchmarks/checkpoint_save.py"


def parse_args(argv=None):
  p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="configs/transformer.py:synthetic",
                 help="a config file and argument, as train.py's --config")
  p.add_argument("--model-as-configured", action="store_true",
                 help="keep the config's model sizes (default: the paper's, the model's defaults)")
  p.add_argument("--batch", type=int, default=10, help="images per step")
  p.add_argument("--steps", type=int, default=40, help="timed steps per loop")
  p.add_argument("--every", type=int, default=10, help="steps between saves")
  p.add_argument("--repeats", type=int, default=3, help="loops per mode (the median is kept)")
  p.add_argument("--dir", default="", help="where the checkpoints go (default: a temporary folder)")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  for name in ("batch", "steps", "every", "repeats"):
    if getattr(args, name) < 1:
      p.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
  if args.every > args.steps:
    p.error(f"--every: expected at most --steps ({args.steps}), got {args.every}")
  return args


def _loop(trainer, state, batch, steps: int, every: int, ckpts):
  """Seconds for ``steps`` training steps with a save every ``every`` (none: ``ckpts`` None),
  the last write waited for."""
  start = time.perf_counter()
  for i in range(steps):
    state, _ = trainer.train_step(state, batch, i)
    if ckpts is not None and (i + 1) % every == 0:
      ckpts.save_latest(int(1e6) + i, state, {"step": i})  # step numbers of their own
  if ckpts is not None:
    ckpts.wait()
  jax.block_until_ready(state)
  return time.perf_counter() - start, state


def main(argv=None):
  args = parse_args(argv)
  config = config_files.load(args.config)
  config.batch_size = args.batch
  if not args.model_as_configured:  # the model's dataclass defaults are its paper's sizes
    from jaxcap import config_common as common
    config.model = common.base_config(model=config.model.name).model
  trainer = train_lib.Trainer(config, workdir="")
  state = trainer.initial_state()
  batch = parallel.shard_batch(train_lib.sample_batch(trainer.dataset, "train", args.batch), trainer.mesh)
  _, state = _loop(trainer, state, batch, 2, args.every, None)  # compile
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  print(f"{config.model.name}: train state {nbytes / 2**20:.0f} MiB, batch {args.batch}, a save every "
        f"{args.every} of {args.steps} steps, {args.repeats} loops per mode", flush=True)
  root = tempfile.mkdtemp(prefix="jaxcap_ckpt_bench_", dir=args.dir or None)
  saves = args.steps // args.every
  rows = {}
  try:
    for mode in ("none", "sync", "async"):
      times = []
      for r in range(args.repeats):
        ckpts = None if mode == "none" else ckpt_lib.Checkpoints(
            os.path.join(root, f"{mode}{r}"), keep=2, asynchronous=mode == "async")
        try:
          seconds, state = _loop(trainer, state, batch, args.steps, args.every, ckpts)
        finally:
          if ckpts is not None:
            ckpts.close()
        times.append(seconds)
        shutil.rmtree(os.path.join(root, f"{mode}{r}"), ignore_errors=True)
      rows[mode] = {"loop_s": float(np.median(times)), "loop_s_all": times}
      print(f"{mode:>5}: {np.median(times):.3f} s for {args.steps} steps "
            f"({', '.join(f'{t:.3f}' for t in times)})", flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  base = rows["none"]["loop_s"]
  for mode in ("sync", "async"):
    rows[mode]["per_save_s"] = (rows[mode]["loop_s"] - base) / saves
  print(f"per save: sync {rows['sync']['per_save_s']:.3f} s, async {rows['async']['per_save_s']:.3f} s "
        f"({nbytes / 2**20:.0f} MiB state, step {base / args.steps:.3f} s)", flush=True)
  import run as bench_run  # the same environment record as run.py
  import orbax.checkpoint as ocp
  env = dict(bench_run.environment(), cpu_count=os.cpu_count(), orbax=ocp.__version__)
  record = {"benchmark": BENCHMARK, "environment": env, "config": args.config,
            "model": config.model.to_dict(), "state_mib": nbytes / 2**20,
            "rows": [dict(mode=m, batch=args.batch, steps=args.steps, every=args.every, saves=saves,
                          repeats=args.repeats, step_s=base / args.steps, **rows[m])
                     for m in ("none", "sync", "async")]}
  stamp = env["date"][:10]
  out = args.out or os.path.join(_HERE, "results", f"checkpoint_save_{env['device_kind'].lower().replace(' ', '_')}_{stamp}.json")
  atomic.write_json(out, record)
  print(f"wrote {out}")


if __name__ == "__main__":
  cli.run_script(main)
