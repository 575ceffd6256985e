"""Tests of the embedded ``synthetic_scenes`` generator (jaxcap/data/synthetic.py).

Every property is re-derived here from the raw outputs (boxes, tokens, features) with the
test's own tables and NumPy code, rather than trusted from the generator's metadata.
"""

import time

import numpy as np
import pytest

from jaxcap.data.synthetic import SyntheticScenes
from jaxcap.data.vocab import Vocab

# The test's own lexicon (independent of the module's tables).
SHAPE_WORDS = {"circle": "circle", "disc": "circle", "square": "square", "box": "square",
               "triangle": "triangle", "star": "star", "cross": "cross",
               "diamond": "diamond"}
PLURALS = {"circles": "circle", "discs": "circle", "squares": "square", "boxes": "square",
           "triangles": "triangle", "stars": "star", "crosses": "cross",
           "diamonds": "diamond"}
COLOURS = ("red", "green", "blue", "yellow", "white", "black", "purple", "orange")
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
REL_WORDS = {"left": "left", "right": "right", "above": "above", "over": "above",
             "below": "below", "under": "below", "beneath": "below", "in": "in",
             "inside": "in"}
DE_COLOUR_STEMS = {"rot": "red", "grün": "green", "blau": "blue", "gelb": "yellow",
                   "weiß": "white", "schwarz": "black", "violett": "purple",
                   "orangefarben": "orange"}
DE_GENDER = {"kreis": "m", "stern": "m", "scheibe": "f", "raute": "f", "quadrat": "n",
             "viereck": "n", "dreieck": "n", "kreuz": "n"}


@pytest.fixture(scope="module")
def ds():
  return SyntheticScenes(num_train=1200, num_val=100, num_test=100, seed=3)


def _object_regions(scene):
  return [j for j, r in enumerate(scene["regions"]) if r["kind"] == "object"]


def _contains(outer, inner):
  return (outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2]
          and inner[3] <= outer[3])


def test_deterministic_per_seed_and_independent_of_other_splits():
  a = SyntheticScenes(num_train=50, num_val=20, num_test=20, seed=7)
  b = SyntheticScenes(num_train=50, num_val=20, num_test=20, seed=7)
  c = SyntheticScenes(num_train=50, num_val=20, num_test=20, seed=8)
  # Image i of a split must not depend on how big the other splits are.
  d = SyntheticScenes(num_train=5, num_val=20, num_test=3, seed=7)
  for split in ("train", "val", "test"):
    assert [a.captions(split, i) for i in range(20)] == [b.captions(split, i) for i in range(20)]
    assert [a.captions(split, i) for i in range(20)] != [c.captions(split, i) for i in range(20)]
  for i in range(20):
    assert a.captions_de("val", i) == d.captions_de("val", i)
    assert a.source_en("val", i) == d.source_en("val", i)
    fa, fb, fc, fd = (x.features("val", i) for x in (a, b, c, d))
    for k in fa:
      np.testing.assert_array_equal(fa[k], fb[k])
      np.testing.assert_array_equal(fa[k], fd[k])
    assert not np.array_equal(fa["grid"], fc["grid"])
  # Different images of one dataset draw different noise.
  assert not np.allclose(a.features("train", 0)["grid"], a.features("train", 1)["grid"])


def test_fields_shapes_dtypes_ranges():
  ds = SyntheticScenes(num_train=150, num_val=30, num_test=30, seed=1, feature_dim=32,
                       grid_size=5, global_dim=16, num_refs=3)
  ids = set()
  for split in ds.splits:
    assert ds.num_images(split) == {"train": 150, "val": 30, "test": 30}[split]
    for i in range(ds.num_images(split)):
      ids.add(ds.image_id(split, i))
      f = ds.features(split, i)
      assert set(f) == {"feats", "boxes", "grid", "global_feat"}
      n = f["feats"].shape[0]
      assert 2 <= n <= 10
      assert f["feats"].shape == (n, 32) and f["feats"].dtype == np.float32
      assert f["boxes"].shape == (n, 4) and f["boxes"].dtype == np.float32
      assert f["grid"].shape == (5, 5, 32) and f["grid"].dtype == np.float32
      assert f["global_feat"].shape == (16,) and f["global_feat"].dtype == np.float32
      assert all(np.isfinite(v).all() for v in f.values())
      b = f["boxes"]
      assert (b >= 0).all() and (b <= 1).all()
      assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
      scene = ds.scene(split, i)
      assert 2 <= scene["num_objects"] == len(_object_regions(scene)) <= 6
      for refs in (ds.captions(split, i), ds.captions_de(split, i)):
        assert len(refs) == 3
        for ref in refs:
          assert ref and all(isinstance(w, str) and w == w.lower() and " " not in w
                             for w in ref)
      assert ds.source_en(split, i)
      attrs = ds.attributes(split, i)
      assert attrs == sorted(set(attrs)) and set(attrs) <= set(ds.content_words())
  assert len(ids) == 210  # unique across splits


def test_bad_input_is_rejected():
  with pytest.raises(ValueError, match="num_train"):
    SyntheticScenes(num_train=-1)
  with pytest.raises(ValueError, match="attr_noise"):
    SyntheticScenes(num_train=2, attr_noise=1.5)
  ds = SyntheticScenes(num_train=3, num_val=1, num_test=1)
  with pytest.raises(ValueError, match="split"):
    ds.captions("dev", 0)
  with pytest.raises(IndexError, match="out of range"):
    ds.features("val", 1)


def test_containment_occurs_in_a_fraction_of_scenes(ds):
  n = ds.num_images("train")
  has = 0
  for i in range(n):
    boxes = ds.features("train", i)["boxes"]
    objs = _object_regions(ds.scene("train", i))
    has += any(_contains(boxes[p], boxes[q]) for p in objs for q in objs if p != q)
  assert 0.2 < has / n < 0.5


def test_relations_in_captions_agree_with_box_geometry(ds):
  seen = set()
  for i in range(ds.num_images("train")):
    scene = ds.scene("train", i)
    boxes = ds.features("train", i)["boxes"].astype(np.float64)
    objs = _object_regions(scene)
    a, _, b = scene["primary"]
    for ref in ds.captions("train", i):
      rels = [j for j, w in enumerate(ref) if w in REL_WORDS]
      assert len(rels) == 1, ref
      j = rels[0]
      rel = REL_WORDS[ref[j]]
      shapes_before = [SHAPE_WORDS[w] for w in ref[:j] if w in SHAPE_WORDS]
      shapes_after = [SHAPE_WORDS[w] for w in ref[j + 1:] if w in SHAPE_WORDS]
      if "with" in ref:  # "a B with a A inside it"
        k = ref.index("with")
        first = [SHAPE_WORDS[w] for w in ref[:k] if w in SHAPE_WORDS][-1]
        second = [SHAPE_WORDS[w] for w in ref[k:j] if w in SHAPE_WORDS][-1]
        assert rel == "in" and ref[j + 1] == "it", ref
        (sa, sb) = (second, first)
      else:
        sa, sb = shapes_before[-1], shapes_after[0]
      assert sa == scene["regions"][a]["shape"] and sb == scene["regions"][b]["shape"], ref
      ca, cb = boxes[a], boxes[b]
      dx = (ca[0] + ca[2]) / 2 - (cb[0] + cb[2]) / 2
      dy = (ca[1] + ca[3]) / 2 - (cb[1] + cb[3]) / 2
      if rel == "in":
        assert _contains(cb, ca), (ref, ca, cb)
      else:
        expected = (("left" if dx < 0 else "right") if abs(dx) >= abs(dy)
                    else ("above" if dy < 0 else "below"))
        assert rel == expected, (ref, ca, cb)
        # Salience: the described pair are the two largest objects.
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        others = [o for o in objs if o not in (a, b)]
        assert all(area[o] < min(area[a], area[b]) for o in others)
      seen.add(rel)
      # A group clause must count correctly: "and two red circles".
      if "and" in ref:
        k = ref.index("and")
        count, colour, shape = NUMBERS[ref[k + 1]], ref[k + 2], PLURALS[ref[k + 3]]
        assert colour in COLOURS
        matches = [o for o in objs if scene["regions"][o]["shape"] == shape
                   and scene["regions"][o]["colour"] == colour]
        assert len(matches) == count, ref
      if ref[0] in NUMBERS:  # "four shapes including ..."
        assert NUMBERS[ref[0]] == len(objs)
  assert seen == {"left", "right", "above", "below", "in"}


def test_source_omits_a_colour_that_german_names(ds):
  omitted = 0
  n = ds.num_images("train")
  for i in range(n):
    scene = ds.scene("train", i)
    a, _, b = scene["primary"]
    pair_colours = {scene["regions"][a]["colour"], scene["regions"][b]["colour"]}
    src = set(ds.source_en("train", i))
    for ref in ds.captions_de("train", i):
      de_colours = set()
      for w in ref:
        for stem, en in DE_COLOUR_STEMS.items():
          if w.startswith(stem) and len(w) - len(stem) <= 2:
            de_colours.add(en)
      assert pair_colours <= de_colours, ref  # German always names both colours
    if not pair_colours <= src:
      omitted += 1
  assert 0.2 < omitted / n < 0.4


def test_german_articles_and_adjectives_agree(ds):
  # Independent declension table: (case, gender) -> (article, adjective ending).
  table = {("nom", "m"): ("ein", "er"), ("nom", "f"): ("eine", "e"),
           ("nom", "n"): ("ein", "es"), ("acc", "m"): ("einen", "en"),
           ("acc", "f"): ("eine", "e"), ("acc", "n"): ("ein", "es"),
           ("dat", "m"): ("einem", "en"), ("dat", "f"): ("einer", "en"),
           ("dat", "n"): ("einem", "en")}
  articles = {"ein", "eine", "einen", "einem", "einer"}
  dative_preps = {"von", "über", "unter", "in", "mit"}
  checked = 0
  for i in range(300):
    for ref in ds.captions_de("train", i):
      for j, w in enumerate(ref):
        if w not in articles:
          continue
        prev = ref[j - 1] if j else ""
        case = "dat" if prev in dative_preps else ("acc" if prev == "gibt" else "nom")
        k = j + 1
        while ref[k] not in DE_GENDER:
          k += 1
        article, ending = table[(case, DE_GENDER[ref[k]])]
        assert w == article, ref
        for adj in ref[j + 1:k]:
          stem = adj[: len(adj) - len(ending)]
          assert adj.endswith(ending) and stem in set(DE_COLOUR_STEMS) | {"klein", "groß"}, ref
        checked += 1
  assert checked > 1000


def test_material_is_named_but_hard_to_read_from_features(ds):
  # Every reference names the material of a described object; it is an oracle attribute.
  named = 0
  for i in range(ds.num_images("train")):
    scene = ds.scene("train", i)
    a, _, b = scene["primary"]
    for r in (scene["regions"][a], scene["regions"][b]):
      if r["material"] != "plain":
        named += 1
        assert all(r["material"] in ref for ref in ds.captions("train", i))
        assert r["material"] in ds.attributes("train", i)
  assert named > 100
  # Nearest-class-mean probe on region features: shape is easy, material near chance.
  x, shape, material = [], [], []
  for i in range(ds.num_images("train")):
    f, scene = ds.features("train", i), ds.scene("train", i)
    for j in _object_regions(scene):
      x.append(f["feats"][j])
      shape.append(scene["regions"][j]["shape"])
      material.append(scene["regions"][j]["material"])
  x = np.asarray(x, np.float64)
  half = len(x) // 2

  def ncm_balanced_accuracy(labels):
    labels = np.asarray(labels)
    classes = sorted(set(labels))
    means = np.stack([x[:half][labels[:half] == c].mean(0) for c in classes])
    dist = ((x[half:, None, :] - means[None]) ** 2).sum(-1)
    pred = np.asarray(classes)[dist.argmin(1)]
    truth = labels[half:]
    return np.mean([(pred[truth == c] == c).mean() for c in classes])

  acc_shape = ncm_balanced_accuracy(shape)
  acc_material = ncm_balanced_accuracy(material)
  assert acc_shape > 0.95
  assert acc_material < 0.45  # chance is 0.25


def test_grid_and_region_features_follow_the_equations():
  # With noise 0, regions with the same (shape, colour, size, material) have identical
  # features, and every grid cell is the area-weighted sum of the region features.
  ds = SyntheticScenes(num_train=40, num_val=0, num_test=0, seed=5, noise=0.0,
                       feature_dim=16, grid_size=4, global_dim=8)
  by_identity = {}
  for i in range(40):
    f, scene = ds.features("train", i), ds.scene("train", i)
    g = 4
    cover = np.zeros((len(f["boxes"]), g, g))
    for r, (x1, y1, x2, y2) in enumerate(f["boxes"].astype(np.float64)):
      for cy in range(g):
        for cx in range(g):
          w = max(0.0, min(x2, (cx + 1) / g) - max(x1, cx / g))
          h = max(0.0, min(y2, (cy + 1) / g) - max(y1, cy / g))
          cover[r, cy, cx] = w * h * g * g
    expected = np.einsum("ryx,rd->yxd", cover, f["feats"].astype(np.float64))
    np.testing.assert_allclose(f["grid"], expected, rtol=1e-4, atol=1e-5)
    for j, reg in enumerate(scene["regions"]):
      key = tuple(sorted((k, v) for k, v in reg.items() if k != "box"))
      if key in by_identity:
        np.testing.assert_allclose(f["feats"][j], by_identity[key], rtol=1e-6)
      else:
        by_identity[key] = f["feats"][j]
  # The global feature is a fixed linear map of the mean region feature.
  means = np.stack([ds.features("train", i)["feats"].mean(0) for i in range(40)])
  globs = np.stack([ds.features("train", i)["global_feat"] for i in range(40)])
  proj, *_ = np.linalg.lstsq(means, globs, rcond=None)
  np.testing.assert_allclose(means @ proj, globs, rtol=1e-3, atol=1e-4)


def test_attributes_oracle_and_noisy(ds):
  stop = {"a", "an", "is", "of", "to", "the", "on", "there", "with", "it", "and",
          "including", "in"}
  changed = 0
  noisy_ds = SyntheticScenes(num_train=200, num_val=0, num_test=0, seed=3, attr_noise=0.3)
  for i in range(200):
    oracle = ds.attributes("train", i)
    assert oracle == sorted({w for ref in ds.captions("train", i) for w in ref} - stop)
    assert ds.attributes("train", i, noisy=True) == oracle  # attr_noise = 0
    assert noisy_ds.attributes("train", i) == oracle  # same seed, same scenes
    noisy = noisy_ds.attributes("train", i, noisy=True)
    assert noisy == noisy_ds.attributes("train", i, noisy=True)
    assert set(noisy) <= set(noisy_ds.content_words())
    changed += noisy != oracle
  assert changed > 100


def test_vocabulary_is_small_and_threshold_keeps_it(ds):
  for get, long_fraction in ((ds.captions, 0.0), (ds.captions_de, 0.03)):
    tokens = [ref for i in range(ds.num_images("train")) for ref in get("train", i)]
    vocab = Vocab.build(tokens, min_count=5)
    assert len(vocab) < 300
    assert vocab.unk_rate(tokens) < 0.002
    held_out = [ref for i in range(ds.num_images("val")) for ref in get("val", i)]
    assert vocab.unk_rate(held_out) < 0.005
    lengths = np.array([len(t) for t in tokens])
    assert np.mean(lengths > 16) <= long_fraction and lengths.max() <= 20
    assert lengths.min() >= 5


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_default_size_is_fast_to_build():
  t0 = time.perf_counter()
  ds = SyntheticScenes()
  built = time.perf_counter() - t0
  assert [ds.num_images(s) for s in ds.splits] == [10000, 500, 500]
  assert built < 20.0, built
  t0 = time.perf_counter()
  for i in range(200):
    ds.features("train", i)
  assert (time.perf_counter() - t0) / 200 < 0.005  # generous: ~0.2 ms measured


def test_every_english_word_has_its_part_of_speech(ds):
  from jaxcap.data import synthetic
  seen = set()
  for split in ds.splits:
    for i in range(ds.num_images(split)):
      for ref in ds.captions(split, i) + [ds.source_en(split, i)]:
        seen.update(ref)
  assert {synthetic.english_pos(w) for w in seen} <= set(synthetic.EN_POS.values())
  assert "X" not in {synthetic.english_pos(w) for w in seen}
  # Spot checks of the grammar's roles.
  tags = {w: synthetic.english_pos(w) for w in ("a", "an", "red", "tiny", "wooden", "circles", "box",
                                                  "left", "three", "is", "there", "it", "and",
                                                  "beneath", "inside", "including")}
  assert tags == {"a": "DET", "an": "DET", "red": "ADJ", "tiny": "ADJ", "wooden": "ADJ",
                  "circles": "NOUN", "box": "NOUN", "left": "NOUN", "three": "NUM", "is": "VERB",
                  "there": "PRON", "it": "PRON", "and": "CCONJ", "beneath": "ADP",
                  "inside": "ADP", "including": "ADP"}
  assert synthetic.english_pos("zebra") == "X"
  assert set(synthetic.SyntheticScenes.content_words()) <= set(synthetic.EN_POS)
