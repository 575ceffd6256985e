"""Multi30k: real aligned text, memory-mapped per-line features, alignment errors."""

import gzip
import os

import numpy as np
import pytest

from jaxcap import data
from jaxcap.data import multi30k, pipeline
from jaxcap.data.vocab import EOS, UNK, tokenize


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_real_text_counts_and_alignment(shared_data):
  c = data.default_data_config("multi30k")
  c.root, c.text_only = str(shared_data / "multi30k"), True
  ds = data.get_dataset(c)
  assert [len(ds.split(s)) for s in ("train", "val", "test")] == [29000, 1014, 1000]
  en = multi30k.read_lines(str(shared_data / "multi30k/raw/val.en.gz"))
  de = multi30k.read_lines(str(shared_data / "multi30k/raw/val.de.gz"))
  names = multi30k.read_lines(str(shared_data / "multi30k/image_splits/val.txt"))
  refs = ds.references("val")
  for i in (0, 500, 1013):
    iid = ds.image_ids("val")[i]
    assert iid == os.path.splitext(names[i])[0]
    assert refs[iid] == [" ".join(tokenize(de[i]))]
    ex = ds.split("val")[i]
    want = [ds.src_vocab.stoi.get(w, UNK) for w in tokenize(en[i])][:40] + [EOS]
    np.testing.assert_array_equal(ex["src"][:len(want)], want)
    assert ex["feats"].shape == (1, 1)  # text only


def _write(root, n=6, rows=None, cells=(14, 14)):
  rng = np.random.default_rng(0)
  os.makedirs(root / "raw")
  for stem in ("train", "val", "test_2016_flickr"):
    for lang, word in (("en", "a dog"), ("de", "ein hund")):
      with gzip.open(root / "raw" / f"{stem}.{lang}.gz", "wt", encoding="utf-8") as f:
        f.write("".join(f"{word} {k} number {k % 2}\n" for k in range(n)))
    feats = np.lib.format.open_memmap(root / f"{stem}.npy", mode="w+", dtype=np.float32,
                                      shape=(rows or n,) + cells + (8,))
    feats[:] = rng.standard_normal(feats.shape)
    feats.flush()
  return root


def test_memmapped_features_rows_align(tmp_path):
  root = _write(tmp_path)
  c = data.default_data_config("multi30k")
  c.root, c.features_npy, c.min_word_count = str(root), "{split}.npy", 1
  ds = data.get_dataset(c)
  assert ds.info["grid"] and ds.info["feature_dim"] == 8 and ds.info["max_regions"] == 196
  arr = np.load(root / "val.npy")
  b = next(pipeline.eval_batches(ds.split("val"), 6))
  np.testing.assert_array_equal(b["feats"], arr.reshape(6, 196, 8))
  np.testing.assert_allclose(b["boxes"][0, 15], [1 / 14, 1 / 14, 2 / 14, 2 / 14], rtol=1e-6)
  assert ds.vocab.decode(b["captions"][3, 0]) == "ein hund 3 number 1"
  assert ds.src_vocab.decode(b["src"][3]) == "a dog 3 number 1"
  assert isinstance(ds.split("val").data.features.feats, np.memmap)


def test_feature_rows_must_match_lines(tmp_path):
  root = _write(tmp_path, rows=5)
  c = data.default_data_config("multi30k")
  c.root, c.features_npy = str(root), "{split}.npy"
  with pytest.raises(ValueError, match=r"train\.npy: features have shape \[5, 14, 14, 8\], expected \[6, 196, C\]"):
    data.get_dataset(c)


def test_misaligned_text(tmp_path):
  root = _write(tmp_path)
  with gzip.open(root / "raw" / "val.de.gz", "wt") as f:
    f.write("ein\nzwei\n")
  c = data.default_data_config("multi30k")
  c.root, c.text_only = str(root), True
  with pytest.raises(ValueError, match=r"val\.de\.gz: 2 lines, expected 6"):
    data.get_dataset(c)


@pytest.mark.parametrize("file, lines, needle", [
    ("test_2016_flickr.de.gz", "a\nb\n\nc\nd\ne\n",
     r"test_2016_flickr\.de\.gz: line 3 \(split 'test', image 2\): caption 0 is empty"),
    ("val.en.gz", "a\nb\nc\n\nd\ne\n",
     r"val\.en\.gz: line 4 \(split 'val', image 3\): the source sentence is empty, expected at least"),
])
def test_a_blank_line_names_its_file_and_line(tmp_path, file, lines, needle):
  """A blank target line is an empty caption, a blank source line an empty source sentence."""
  root = _write(tmp_path)
  with gzip.open(root / "raw" / file, "wt") as f:
    f.write(lines)
  c = data.default_data_config("multi30k")
  c.root, c.text_only = str(root), True
  with pytest.raises(ValueError, match=rf"^{root}/raw/" + needle):
    data.get_dataset(c)


def test_features_required_unless_text_only(tmp_path):
  c = data.default_data_config("multi30k")
  c.root = str(_write(tmp_path))
  with pytest.raises(ValueError, match="field 'features_npy' is empty"):
    data.get_dataset(c)
