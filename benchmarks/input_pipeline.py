"""Input-pipeline throughput (images/s) for 36 x 2048 float32 region batches, and the whole
training loop fed from ``.npz`` files against its step alone.

1. The training iterator (grain prefetch threads, batch assembly, validation) over an in-memory
   feature array ``[I, 36, 2048]`` and over a Karpathy-layout directory of per-image
   ``att/<id>.npz`` (key ``feat``) + ``fc/<id>.npy`` files written to a temporary dir
   (``np.savez``, and ``np.savez_compressed`` as self-critical's ``cocobu_att`` uses). Files
   are read through the page cache (just written): the CPU cost of the pipeline, not of a cold
   disk.
2. ``--loop_steps N`` (0: skipped): train.py's loop (``jaxcap.training.train_lib.Trainer.fit``:
   the iterator, sharding, the guarded training step, metric logging) for N steps of
   ``--model`` (paper-sized unless ``--set`` overrides fields) reading the uncompressed
   ``.npz`` directory, as images/s: the median of its logged windows of ``--log_every`` steps
   after the first (which compiles). Then the same jitted step alone on one batch already on
   the device; ``loop / step`` is the share of the step's speed the loop keeps. The validation
   the loop runs after its last step is stubbed (it is outside the timed windows and needs
   pycocoevalcap).

Needs grain (and ml_collections for 2.), unlike benchmarks/run.py.

  python benchmarks/input_pipeline.py [--images 600] [--batches 40] [--threads 0,1,2,4]
  python benchmarks/input_pipeline.py --threads 2 --workers 0 --loop_steps 60 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.join(_REPO, "benchmarks"))

import common  # noqa: E402
from jaxcap import atomic, data  # noqa: E402
from jaxcap.data import base, pipeline  # noqa: E402
from jaxcap.cli import nonnegative_int, positive_int, workers_int  # noqa: E402  (one-line errors for bad sizes)

N, D = 36, 2048
VAL_IMAGES = 8  # the loop validates once, after its last step


def _refs(rng, count):
  """5 captions of 10 words per image from COCO's vocabulary size (all kept: min_word_count 1),
  so the loop's output layer is COCO-sized (about 9,100 distinct words at 600 images)."""
  words = [f"w{k}" for k in range(9487)]
  return [[[words[j] for j in rng.integers(0, len(words), 10)] for _ in range(5)] for _ in range(count)]


def in_memory_dataset(images: int) -> base.CaptionDataset:
  rng = np.random.default_rng(0)
  feats = rng.standard_normal((images, N, D), dtype=np.float32)
  split = base.SplitData(image_ids=list(range(images)), refs=_refs(rng, images),
                         features=base.ArrayFeatures(feats))
  cfg = data.default_data_config("karpathy")
  cfg.min_word_count = 1
  return base.CaptionDataset({"train": split}, cfg, name="in-memory")


def write_karpathy_dir(root: str, images: int, compressed: bool) -> None:
  rng = np.random.default_rng(0)
  os.makedirs(os.path.join(root, "att"))
  os.makedirs(os.path.join(root, "fc"))
  save = np.savez_compressed if compressed else np.savez
  entries = []
  for i, refs in enumerate(_refs(rng, images)):
    save(os.path.join(root, "att", f"{i}.npz"), feat=rng.standard_normal((N, D), dtype=np.float32))
    np.save(os.path.join(root, "fc", f"{i}.npy"), rng.standard_normal((D,), dtype=np.float32))
    entries.append({"cocoid": i, "split": "val" if i >= images - VAL_IMAGES else "train",
                    "sentences": [{"tokens": t} for t in refs]})
  with open(os.path.join(root, "dataset_coco.json"), "w") as f:
    json.dump({"images": entries}, f)


def disk_data_config(root: str):
  cfg = data.default_data_config("karpathy")
  cfg.update(dict(root=root, dataset_json="dataset_coco.json", att_dir="att", fc_dir="fc",
                  min_word_count=1))
  return cfg


def measure(ds, batch: int, batches: int, **kwargs) -> float:
  it = pipeline.make_train_iterator(ds.split("train"), batch, shard_index=0, shard_count=1, **kwargs)
  next(it)  # start-up (thread pool, first epoch permutation) is not throughput
  t = time.perf_counter()
  for _ in range(batches):
    b = next(it)
    assert b["feats"].shape == (batch, N, D)
  return batches * batch / (time.perf_counter() - t)


def loop_vs_step(root: str, workdir: str, args) -> dict:
  """train.py's loop over the ``.npz`` directory ``root`` for ``args.loop_steps`` steps, and
  its jitted step alone: ``{"loop_images_per_s", "step_images_per_s", "loop_over_step"}``."""
  import jax
  from jaxcap import config_common as configs
  from jaxcap.training import parallel, train_lib

  c = configs.base_config("coco", args.model)
  c.data = disk_data_config(root)
  c.data.num_workers = args.loop_workers
  c.dtype = args.dtype
  c.batch_size = args.batch
  c.num_train_steps = args.loop_steps
  c.log_every_steps = args.log_every
  c.eval_every_steps = c.checkpoint_every_steps = args.loop_steps
  c.eval_num_images = c.eval_batch_size = VAL_IMAGES
  c.test_after_training = False
  for key, value in common.parse_overrides(args.set).items():
    c.model[key] = value
  trainer = train_lib.Trainer(c, workdir)
  trainer.validate = lambda params, step: {"CIDEr": 0.0, "Bleu_4": 0.0}
  try:
    trainer.fit()
  finally:
    trainer.close()
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rates = [line["train/images_per_sec"] for line in map(json.loads, f) if "train/images_per_sec" in line]
  if len(rates) < 2:
    raise SystemExit(f"--loop_steps: {args.loop_steps} steps gave {len(rates)} logged window(s); expected "
                     f"at least 2 (the first compiles): raise it or lower --log_every")
  loop = float(np.median(rates[1:]))
  state = trainer.initial_state()
  host = next(pipeline.make_train_iterator(trainer.dataset.split("train"), args.batch, shard_index=0,
                                           shard_count=1))
  batch = parallel.shard_batch(host, trainer.mesh)
  holder = {"state": state}

  def run():
    holder["state"], metrics = trainer.train_step(holder["state"], batch, 0)
    return metrics

  _, dt, _, _ = common.timed_windows(run, warmup=2, windows=3, steps=args.log_every)
  step = args.batch / dt
  return {"loop_images_per_s": round(loop, 2), "loop_windows": len(rates) - 1,
          "step_images_per_s": round(step, 2), "loop_over_step": round(loop / step, 3),
          "device": jax.devices()[0].device_kind}


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--images", type=positive_int, default=600)
  ap.add_argument("--batch", type=positive_int, default=50, help="images per batch / training step")
  ap.add_argument("--batches", type=positive_int, default=40)
  ap.add_argument("--threads", default="0,1,2,4")
  ap.add_argument("--workers", type=nonnegative_int, default=2, help="also try grain worker processes")
  ap.add_argument("--loop_steps", type=nonnegative_int, default=0, help="train.py's loop for this many "
                  "steps from the .npz files, against the step alone (0: skipped)")
  ap.add_argument("--log_every", type=positive_int, default=10, help="steps per timed window of the loop")
  ap.add_argument("--model", default="transformer", help="the loop's registered model")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--set", default="", help="the loop's model field overrides, e.g. dim=64,num_layers=1")
  ap.add_argument("--loop_workers", type=workers_int, default=0,
                  help="the loop's grain worker processes (data.num_workers; 0: threads of this process, "
                  "which share its GIL with the step's dispatch; -1: chosen from the host's cores)")
  ap.add_argument("--out", default="", help="also write the rows as a JSON record (device, versions, commit)")
  args = ap.parse_args(argv)
  try:
    threads = [nonnegative_int(t) for t in args.threads.split(",")]
  except argparse.ArgumentTypeError as e:
    ap.error(f"--threads: {e} (comma-separated thread counts)")
  if args.loop_steps:
    common.check_models(ap, "--model", args.model, many=False)
  if args.images - VAL_IMAGES < args.batch:
    ap.error(f"--images: expected at least --batch + {VAL_IMAGES} (the validation images), got {args.images}")
  b = args.batch
  record = None
  if args.out:
    import run as bench_run  # the same environment record and atomic writer as run.py
    record = {"benchmark": "benchmarks/input_pipeline.py", "argv": sys.argv[1:] if argv is None else list(argv),
              "environment": dict(bench_run.environment(), cpu_count=os.cpu_count()), "rows": []}

  def keep(row):
    if record is not None:
      record["rows"].append(dict(row, batch=b))
      atomic.write_json(args.out, record)

  print(f"{os.cpu_count()} CPUs; batches of {b} x {N} x {D} float32 ({b * N * D * 4 / 2**20:.1f} MiB)")
  ds = in_memory_dataset(args.images)
  for t in threads:
    r = measure(ds, b, args.batches, num_threads=t)
    keep({"source": "memory", "threads": t, "workers": 0, "images_per_s": round(r, 1)})
    print(f"in-memory            threads={t}: {r:8.0f} images/s")
  tmp = tempfile.mkdtemp(prefix="jaxcap_bench_")
  try:
    for compressed in (False, True):
      root = os.path.join(tmp, "z" if compressed else "u")
      write_karpathy_dir(root, args.images, compressed)
      ds = data.get_dataset(disk_data_config(root))
      kind = "npz compressed " if compressed else "npz            "
      source = "npz_compressed" if compressed else "npz"
      for t in threads:
        r = measure(ds, b, args.batches, num_threads=t)
        keep({"source": source, "threads": t, "workers": 0, "images_per_s": round(r, 1)})
        print(f"disk {kind} threads={t}: {r:8.0f} images/s")
      if args.workers:
        r = measure(ds, b, args.batches, num_threads=2, num_workers=args.workers)
        keep({"source": source, "threads": 2, "workers": args.workers, "images_per_s": round(r, 1)})
        print(f"disk {kind} workers={args.workers}: {r:8.0f} images/s")
    if args.loop_steps:
      r = loop_vs_step(os.path.join(tmp, "u"), os.path.join(tmp, "run"), args)
      print(f"train.py loop from npz ({args.model}, {args.dtype}, batch {b}, {args.loop_workers} workers): "
            f"{r['loop_images_per_s']:8.1f} images/s; "
            f"the step alone {r['step_images_per_s']:8.1f} images/s; loop / step {r['loop_over_step']:.2f}")
      print(json.dumps(r))
      keep(dict(r, source="train.py loop from npz", model=args.model, dtype=args.dtype, steps=args.loop_steps,
                workers=pipeline.auto_workers() if args.loop_workers < 0 else args.loop_workers,
                workers_auto=args.loop_workers < 0 or None))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
