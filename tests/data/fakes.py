"""Small on-disk datasets in the community's layouts, written by the tests themselves."""

import json
import os

import numpy as np

from jaxcap import data

WORDS = ("a", "dog", "cat", "red", "ball", "runs", "on", "the", "grass", "big", "man", "sits")


def random_refs(rng, num_refs):
  return [[WORDS[j] for j in rng.integers(0, len(WORDS), size=rng.integers(2, 9))]
          for _ in range(num_refs)]


def write_karpathy(root, *, counts=(12, 4, 4), dim=8, fc_dim=6, regions=(2, 5), refs=(5, 5),
                   seed=0, coco=True, sizes=True, att_ext=".npz"):
  """Writes dataset_coco.json + att/fc/box dirs; returns {image key: arrays} for checking."""
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.join(root, "att"), exist_ok=True)
  os.makedirs(os.path.join(root, "fc"), exist_ok=True)
  os.makedirs(os.path.join(root, "box"), exist_ok=True)
  images, truth = [], {}
  k = 0
  for split, count in zip(("train", "val", "test"), counts):
    for _ in range(count):
      key = 100 + k if coco else f"img_{k}"
      n = int(rng.integers(regions[0], regions[1] + 1))
      w, h = float(rng.integers(100, 640)), float(rng.integers(100, 480))
      feat = rng.standard_normal((n, dim)).astype(np.float32)
      fc = rng.standard_normal((fc_dim,)).astype(np.float32)
      x1 = rng.uniform(0, w / 2, n)
      y1 = rng.uniform(0, h / 2, n)
      box = np.stack([x1, y1, x1 + rng.uniform(1, w / 2, n), y1 + rng.uniform(1, h / 2, n)], -1)
      if att_ext == ".npz":
        np.savez_compressed(os.path.join(root, "att", f"{key}.npz"), feat=feat)
      else:
        np.save(os.path.join(root, "att", f"{key}.npy"), feat)
      np.save(os.path.join(root, "fc", f"{key}.npy"), fc)
      np.save(os.path.join(root, "box", f"{key}.npy"), box)
      r = random_refs(rng, int(rng.integers(refs[0], refs[1] + 1)))
      entry = {"split": split, "filepath": "val2014", "filename": f"{key}.jpg",
               "sentences": [{"tokens": t, "raw": " ".join(t)} for t in r]}
      if coco:
        entry["cocoid"] = key
      if sizes:
        entry.update(width=w, height=h)
      images.append(entry)
      truth[key] = {"feat": feat, "fc": fc, "box": box, "w": w, "h": h, "refs": r,
                    "split": split}
      k += 1
  with open(os.path.join(root, "dataset_coco.json"), "w") as f:
    json.dump({"images": images, "dataset": "coco"}, f)
  return truth


def karpathy_config(root, **overrides):
  c = data.default_data_config("karpathy")
  c.root = str(root)
  c.dataset_json = "dataset_coco.json"
  c.att_dir, c.fc_dir, c.box_dir = "att", "fc", "box"
  c.max_regions = 4
  c.min_word_count = 1
  c.update(overrides)
  return c


def synthetic_config(**overrides):
  c = data.default_data_config("synthetic_scenes")
  c.num_train, c.num_val, c.num_test = 40, 8, 8
  c.feature_dim = 16
  c.min_word_count = 1
  c.update(overrides)
  return c
