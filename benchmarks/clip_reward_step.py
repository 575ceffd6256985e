"""The self-critical step with the CLIP-S reward against the same step with CIDEr-D alone.

  python benchmarks/clip_reward_step.py [--config configs/transformer.py:synthetic] [--batch 50]
      [--clip vit_b32|tiny] [--train_images 500] [--steps 5] [--set dim=512,...] [--out record.json]

One Trainer of the config (SCST from step 0, its own ``scst.num_samples`` and baseline) on the
synthetic scenes; the training images drawn as PNGs (``jaxcap.data.render --names image_id``,
128 px) and embedded once by a CLIP of random weights (``--clip``: ViT-B/32's sizes, or the tests'
tiny one); then the one jitted SCST step timed on one fixed batch, ``--steps`` times after its
compilation, with ``scst.clip_weight=0`` (CIDEr-D) and with ``scst.clip_weight=2, cider_weight=0``
(CLIP-Caption-Reward's reward), and the ratio. The CLIP step runs the text tower on the
``(n + 1) B`` captions of the step (samples and greedy baselines); the images' embeddings are
read from the table computed before. Writes one JSON (``--out``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
for _p in (_REPO, _HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)
BENCHMARK = "benchmarks/clip_reward_step.py"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxcap import cli, config_files  # noqa: E402


def _time(step, state, batch, steps: int) -> tuple[float, float]:
  """(compile + first step seconds, best of ``steps`` steps in ms)."""
  t0 = time.perf_counter()
  state, metrics = step(state, batch, 0)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - t0
  best = float("inf")
  for i in range(steps):
    t0 = time.perf_counter()
    state, metrics = step(state, batch, i + 1)
    jax.block_until_ready(metrics)
    best = min(best, time.perf_counter() - t0)
  return first, best * 1e3


def main(argv=None) -> dict:
  p = cli.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/transformer.py:synthetic")
  p.add_argument("--batch", type=cli.positive_int, default=None, help="default: the config's")
  p.add_argument("--clip", choices=("vit_b32", "tiny"), default="vit_b32")
  p.add_argument("--train_images", type=cli.positive_int, default=None,
                 help="training images drawn and embedded (default: the config's; the step does not depend on it)")
  p.add_argument("--steps", type=cli.positive_int, default=5)
  p.add_argument("--set", default="", help="model fields over the config's, e.g. the paper-sized "
                 "Transformer: dim=512,num_layers=6,num_dec_layers=6,num_heads=8,ff_dim=2048")
  p.add_argument("--out", default=None, help="the JSON record (default: benchmarks/results/"
                 "clip_reward_step_<device>_<date>.json)")
  a = p.parse_args(argv)
  from jaxcap.clip import model as model_lib, weights
  from jaxcap.data import pipeline, render
  from jaxcap.data.synthetic import SyntheticScenes
  import common
  import run as bench_run  # the same environment record as run.py
  from jaxcap.training import parallel, scst, train_lib
  config = config_files.load(a.config.removeprefix("configs/"))
  if config.data.name != "synthetic_scenes":
    p.error(f"--config={a.config}: expected a synthetic_scenes config (its images are drawn here)")
  if a.batch:
    config.batch_size = a.batch
  if a.train_images:
    config.data.num_train = a.train_images
  config.scst.start_step = 0
  overrides = common.parse_overrides(a.set)
  unknown = sorted(set(overrides) - set(config.model))
  if unknown:
    p.error(f"--set: {', '.join(unknown)} is not a field of the config's model; expected some of "
            f"{', '.join(sorted(config.model))}")
  config.model.update(overrides)
  sizes = model_lib.VIT_B_32 if a.clip == "vit_b32" else model_lib.ClipSizes(
      embed_dim=16, image_resolution=32, vision_layers=1, vision_width=64, vision_patch_size=16,
      transformer_width=64, transformer_layers=1, transformer_heads=1, vision_heads=1)
  with tempfile.TemporaryDirectory() as tmp:
    d = config.data
    scenes = SyntheticScenes(num_train=d.num_train, num_val=0, num_test=0, seed=d.seed)
    render.write_dataset(os.path.join(tmp, "scenes"), scenes, 128, log=lambda _: None, names="image_id")
    weights.save_random(os.path.join(tmp, "clip.safetensors"), sizes)
    config.data.cache_dir = os.path.join(tmp, "cache")
    rows = []
    for name, clip_weight, cider_weight in (("cider", 0.0, 1.0), ("clip", 2.0, 0.0)):
      config.scst.clip_weight, config.scst.cider_weight = clip_weight, cider_weight
      config.scst.clip_model = os.path.join(tmp, "clip.safetensors")
      config.scst.clip_images = os.path.join(tmp, "scenes", "images")
      trainer = train_lib.Trainer(config, os.path.join(tmp, f"run_{name}"))
      t0 = time.perf_counter()
      step = scst.make_scst_step(trainer)
      build = time.perf_counter() - t0
      it = pipeline.make_train_iterator(trainer.dataset.split("train"), config.batch_size, seed=0)
      batch = parallel.shard_batch(next(it), trainer.mesh)
      first, ms = _time(step, trainer.initial_state(), batch, a.steps)
      rows.append({"reward": name, "build_s": build, "compile_and_first_step_s": first, "step_ms": ms})
  env = dict(bench_run.environment(), cpu_count=os.cpu_count())
  record = {"benchmark": BENCHMARK, "environment": env, "config": a.config, "batch": config.batch_size,
            "train_images": config.data.num_train,
            "num_samples": config.scst.num_samples, "baseline": config.scst.baseline, "clip": a.clip,
            "model": {k: v for k, v in config.model.items() if not isinstance(v, dict)},
            "steps": a.steps, "rows": rows, "clip_over_cider": rows[1]["step_ms"] / rows[0]["step_ms"]}
  print(json.dumps(record, indent=1))
  common.write_record("clip_reward_step", record, a.out)
  return record


if __name__ == "__main__":
  cli.run_script(main)
