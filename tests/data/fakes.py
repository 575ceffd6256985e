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


def write_cocotalk(root, *, counts=(6, 2, 2), **kwargs):
  """self-critical.pytorch's ``cocotalk.json`` + ``cocotalk_label.h5`` (16-word label rows, image
  100's first word written as its UNK) beside a Karpathy layout; returns its truth."""
  import h5py
  truth = write_karpathy(root, counts=counts, **kwargs)
  words = sorted({w for t in truth.values() for r in t["refs"] for w in r})
  ix_to_word = {str(i + 1): w for i, w in enumerate(words)}
  ix_to_word[str(len(words) + 1)] = "UNK"
  w2i = {w: int(i) for i, w in ix_to_word.items()}
  rows, start, end, images = [], [], [], []
  for key, t in truth.items():
    start.append(len(rows) + 1)
    for r in t["refs"]:
      row = np.zeros(16, np.uint32)
      ids = [w2i[w] for w in r][:16]
      if key == 100:  # self-critical writes rare words as UNK
        ids[0] = w2i["UNK"]
      row[:len(ids)] = ids
      rows.append(row)
    end.append(len(rows))
    images.append({"split": t["split"], "id": key, "file_path": f"x/{key}.jpg",
                   "width": t["w"], "height": t["h"]})
  with open(os.path.join(root, "cocotalk.json"), "w") as f:
    json.dump({"ix_to_word": ix_to_word, "images": images}, f)
  with h5py.File(os.path.join(root, "cocotalk_label.h5"), "w") as f:
    f["labels"] = np.stack(rows)
    f["label_start_ix"] = np.array(start, np.uint32)
    f["label_end_ix"] = np.array(end, np.uint32)
    f["label_length"] = np.array([min(len(r), 16) for t in truth.values() for r in t["refs"]])
  return truth


def write_coco_layout(root, *, counts=(6, 2, 2), cocotalk=False, **kwargs):
  """The README's COCO layout (``dataset_coco.json``, ``cocobu_att/``, ``cocobu_fc/``,
  ``cocobu_box/``; with ``cocotalk``, also ``cocotalk.json`` + ``cocotalk_label.h5``)."""
  os.makedirs(root, exist_ok=True)
  truth = (write_cocotalk if cocotalk else write_karpathy)(root, counts=counts, **kwargs)
  for src, dst in (("att", "cocobu_att"), ("fc", "cocobu_fc"), ("box", "cocobu_box")):
    os.symlink(os.path.join(root, src), os.path.join(root, dst))
  return truth
