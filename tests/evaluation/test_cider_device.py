"""Device CIDEr-D (jaxcap/evaluation/cider_device.py) against the host scorer, per caption.

Real references (COCO Karpathy test, Flickr8k): each image's first reference and random other
images' captions are scored against the image's remaining references, in corpus mode (also
against pycocoevalcap's ``Cider``) and both training modes, with empty captions, captions at
the length limit, repeated n-grams and an image left with one reference (padding).
Mutants tried on cider_device.py, each failing every test here: no length penalty (``delta``
forced to 0), an idf that ignores the document frequencies (``log(num_images)`` for every
n-gram), tf-idf weights on every slot of a repeated n-gram instead of its first slot only.
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
import pytest
import jax.numpy as jnp

from jaxcap.evaluation import cider, cider_device

PAD, EOS = 0, 2
ROOT = Path(__file__).resolve().parents[2]
MAX_LEN = 16
NUM_IMAGES = 60


def _data_file(*parts) -> Path:
  # The shared data sits beside the worktrees (../shared) or one level up.
  for base in (ROOT.parent, ROOT.parent.parent):
    p = base.joinpath("shared", "data", *parts)
    if p.exists():
      return p
  pytest.skip(f"real data absent: {'/'.join(parts)}")


def _normalise(text: str) -> list[str]:
  return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def _load(name: str) -> list[list[list[str]]]:
  """Per image, its reference captions as word lists (the first NUM_IMAGES images)."""
  if name == "coco":
    with open(_data_file("coco_karpathy_test", "captions_karpathy_test2014.json")) as f:
      data = json.load(f)
    by_image = collections.defaultdict(list)
    for ann in data["annotations"]:
      by_image[ann["image_id"]].append(_normalise(ann["caption"]))
    return [by_image[i] for i in sorted(by_image)[:NUM_IMAGES]]
  with open(_data_file("flickr8k_xception", "dataset_flickr8k.json")) as f:
    data = json.load(f)
  return [[s["tokens"] for s in im["sentences"]] for im in data["images"][:NUM_IMAGES]]


def _case(name: str, seed: int = 0):
  """``(cands [N, T] ids with EOS, image [N], refs per image as id arrays, vocab_size)``."""
  images = _load(name)
  words = sorted({w for refs in images for r in refs for w in r})
  ids = {w: i + 4 for i, w in enumerate(words)}
  enc = lambda ws: np.asarray([ids[w] for w in ws], np.int32)
  rng = np.random.default_rng(seed)
  cand_words, image = [], []
  refs = []
  for i, image_refs in enumerate(images):
    keep = image_refs[1:] if i != 1 else image_refs[1:2]  # image 1: one reference (padding)
    refs.append([enc(r) for r in keep])
    cand_words.append(image_refs[0])
    image.append(i)
    for j in rng.choice(len(images), size=3, replace=False):  # other images' captions
      cand_words.append(images[j][int(rng.integers(len(images[j])))])
      image.append(i)
  rep = [words[0]] * MAX_LEN
  for i, extra in enumerate([[], rep, rep[:5], [words[1], words[2]] * 8, images[0][1] * 3]):
    cand_words.append(extra)  # empty, repeated n-grams, at / over the length limit
    image.append(i)
  cands = np.zeros((len(cand_words), MAX_LEN), np.int32)
  for k, ws in enumerate(cand_words):
    x = enc(ws)[:MAX_LEN]
    cands[k, :len(x)] = x
    if len(x) < MAX_LEN:
      cands[k, len(x)] = EOS
  cands[-1, 3:] = PAD  # an all-PAD tail straight after words: no EOS emitted
  cands = np.concatenate([cands, np.zeros((1, MAX_LEN), np.int32)])  # all PAD
  image.append(2)
  return cands, np.asarray(image, np.int32), refs, len(words) + 4


def _device(cands, image, refs, table, options, vocab_size, width):
  refs_IxRxL, nref_I = cider_device.pad_references(refs, width)
  return np.asarray(cider_device.score(jnp.asarray(cands), jnp.asarray(image),
                                       jnp.asarray(refs_IxRxL), jnp.asarray(nref_I), table,
                                       vocab_size=vocab_size, options=options))


@pytest.mark.parametrize("name", ["coco", "flickr8k"])
@pytest.mark.parametrize("mode", ["corpus", "jaxcap", "self_critical"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_device_matches_host_on_real_references(name, mode, tmp_path):
  cands, image, refs, v = _case(name)
  if mode == "corpus":
    host = cider.CiderD(v)
    table = cider_device.corpus_table(refs, v)
    options = cider_device.Options(count_eos=False)
    width = max(len(r) for rs in refs for r in rs)
    host_refs = refs
  elif mode == "jaxcap":
    host_refs = [[r[:MAX_LEN] for r in rs] for rs in refs]  # train_references_ids()
    host = cider.CiderD.for_training(host_refs, str(tmp_path), v, log=lambda *_: None)
    table, options = cider_device.training_table(host)
    width = MAX_LEN
  else:
    host_refs = refs  # full captions: train_references_ids(full=True)
    host = cider.CiderD.for_training(host_refs, str(tmp_path), v, compat="self_critical",
                                     max_len=MAX_LEN, log=lambda *_: None)
    table, options = cider_device.training_table(host)
    width = MAX_LEN
  want = host.score(cands, image, host.prepare_refs(host_refs))
  got = _device(cands, image, refs if mode != "jaxcap" else host_refs, table, options, v, width)
  assert len(got) >= 240 and got.dtype == np.float32
  assert np.abs(want).max() > 1.0 and (want == 0).any()  # real overlaps and empty captions
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_corpus_mode_matches_pycocoevalcap():
  coco_cider = pytest.importorskip("pycocoevalcap.cider.cider")
  images = _load("flickr8k")
  words = sorted({w for refs in images for r in refs for w in r})
  ids = {w: i + 4 for i, w in enumerate(words)}
  refs = [[np.asarray([ids[w] for w in r], np.int32) for r in rs[1:]] for rs in images]
  cands = np.zeros((len(images), MAX_LEN), np.int32)
  for i, rs in enumerate(images):
    x = [ids[w] for w in rs[0]][:MAX_LEN - 1]
    cands[i, :len(x)] = x
  v = len(words) + 4
  got = _device(cands, np.arange(len(images), dtype=np.int32), refs,
                cider_device.corpus_table(refs, v), cider_device.Options(count_eos=False), v,
                max(len(r) for rs in refs for r in rs))
  text = lambda row: " ".join(words[i - 4] for i in row if i >= 4)
  _, want = coco_cider.Cider().compute_score(
      {i: [" ".join(r) for r in rs[1:]] for i, rs in enumerate(images)},
      {i: [text(cands[i])] for i in range(len(images))})
  np.testing.assert_allclose(got, np.asarray(want), rtol=0, atol=1e-6)


def test_table_keys_are_exact_at_the_largest_vocabulary():
  v = 55107  # the host scorer's limit ((V + 1)^4 < 2^63), below the device's 65535
  refs = [[np.asarray([v - 1, v - 2, v - 1, v - 2, 4], np.int32)], [np.asarray([4, 5], np.int32)]]
  cands = np.asarray([[v - 1, v - 2, v - 1, EOS], [v - 2, v - 1, 5, EOS], [4, 5, EOS, PAD]],
                     np.int32)
  image = np.asarray([0, 0, 1], np.int32)
  host = cider.CiderD(v, count_eos=True)
  hr = host.prepare_refs(refs)
  table = cider_device.table_from_doc_freq(hr.df)
  got = _device(cands, image, refs, table, cider_device.Options(), v, 5)
  np.testing.assert_allclose(got, host.score(cands, image, hr), rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match="vocab_size 65536 too large"):
    cider_device.check_vocab_size(cider_device.MAX_VOCAB + 1)
