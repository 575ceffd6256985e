"""Input-pipeline throughput (images/s) for 36 x 2048 float32 region batches of 50 images.

Measures the training iterator (grain prefetch threads, batch assembly, validation) over
  1. an in-memory feature array ``[I, 36, 2048]``;
  2. a Karpathy-layout directory of per-image ``att/<id>.npz`` (key ``feat``) + ``fc/<id>.npy``
     files written to a temporary dir (``np.savez``, and ``np.savez_compressed`` as
     self-critical's ``cocobu_att`` uses). Files are read through the page cache (just
     written), i.e. this is the CPU cost of the pipeline, not of a cold disk.

Usage: python benchmarks/input_pipeline.py [--images 600] [--batches 40] [--threads 0,1,2]
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxcap import data  # noqa: E402
from jaxcap.data import base, pipeline  # noqa: E402
from jaxcap.cli import nonnegative_int, positive_int  # noqa: E402  (one-line errors for bad sizes)

N, D, B = 36, 2048, 50


def _refs(rng, count):
  words = [f"w{k}" for k in range(200)]
  return [[[words[j] for j in rng.integers(0, 200, 10)] for _ in range(5)] for _ in range(count)]


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
    entries.append({"cocoid": i, "split": "train",
                    "sentences": [{"tokens": t} for t in refs]})
  with open(os.path.join(root, "dataset_coco.json"), "w") as f:
    json.dump({"images": entries}, f)


def disk_dataset(root: str) -> base.CaptionDataset:
  cfg = data.default_data_config("karpathy")
  cfg.update(dict(root=root, dataset_json="dataset_coco.json", att_dir="att", fc_dir="fc",
                  min_word_count=1))
  return data.get_dataset(cfg)


def measure(ds, batches: int, **kwargs) -> float:
  it = pipeline.make_train_iterator(ds.split("train"), B, shard_index=0, shard_count=1, **kwargs)
  next(it)  # start-up (thread pool, first epoch permutation) is not throughput
  t = time.perf_counter()
  for _ in range(batches):
    b = next(it)
    assert b["feats"].shape == (B, N, D)
  return batches * B / (time.perf_counter() - t)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--images", type=positive_int, default=600)
  ap.add_argument("--batches", type=positive_int, default=40)
  ap.add_argument("--threads", default="0,1,2,4")
  ap.add_argument("--workers", type=nonnegative_int, default=2, help="also try grain worker processes")
  args = ap.parse_args()
  try:
    threads = [nonnegative_int(t) for t in args.threads.split(",")]
  except argparse.ArgumentTypeError as e:
    ap.error(f"--threads: {e} (comma-separated thread counts)")
  print(f"{os.cpu_count()} CPUs; batches of {B} x {N} x {D} float32 "
        f"({B * N * D * 4 / 2**20:.1f} MiB)")
  ds = in_memory_dataset(args.images)
  for t in threads:
    print(f"in-memory            threads={t}: {measure(ds, args.batches, num_threads=t):8.0f} images/s")
  tmp = tempfile.mkdtemp(prefix="jaxcap_bench_")
  try:
    for compressed in (False, True):
      root = os.path.join(tmp, "z" if compressed else "u")
      write_karpathy_dir(root, args.images, compressed)
      ds = disk_dataset(root)
      kind = "npz compressed " if compressed else "npz            "
      for t in threads:
        print(f"disk {kind} threads={t}: {measure(ds, args.batches, num_threads=t):8.0f} images/s")
      if args.workers:
        r = measure(ds, args.batches, num_threads=2, num_workers=args.workers)
        print(f"disk {kind} workers={args.workers}: {r:8.0f} images/s")
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
