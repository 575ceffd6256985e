"""``jaxcap.data.render``: synthetic_scenes drawn as pixels, and the folder jaxcap-extract reads.

Colours, boxes and masks are checked from the pixels with the test's own colour table, not the
module's, so a renderer that drew the wrong colour or outside the box would fail.
"""

import json

import numpy as np
import pytest
from PIL import Image

from jaxcap.data import karpathy
from jaxcap.data import render
from jaxcap.data.synthetic import SHAPES, SyntheticScenes

# The test's own colours, near the renderer's (a tolerance of 30 per channel).
RGB = {"red": (215, 35, 35), "green": (40, 160, 50), "blue": (40, 70, 215),
       "yellow": (235, 215, 40), "white": (245, 245, 245), "black": (20, 20, 20),
       "purple": (130, 50, 170), "orange": (245, 135, 25)}


def obj(shape="square", colour="red", material="plain", box=(0.25, 0.25, 0.75, 0.75), size="large"):
  return {"kind": "object", "shape": shape, "colour": colour, "size": size,
          "material": material, "box": box}


def scene(*regions):
  return {"regions": list(regions), "primary": (0, "left", 1), "group": None,
          "num_objects": len(regions)}


def near(img, rgb, tol=30):
  return np.all(np.abs(img.astype(int) - np.asarray(rgb)) <= tol, axis=-1)


@pytest.fixture(scope="module")
def scenes():
  return SyntheticScenes(num_train=12, num_val=3, num_test=3, seed=0)


def test_rendering_is_deterministic_and_uint8(scenes):
  a = render.render(scenes, "train", 5, 64)
  assert a.shape == (64, 64, 3) and a.dtype == np.uint8
  assert np.array_equal(a, render.render(scenes, "train", 5, 64))
  # The same image of a fresh generator with other split sizes: the same scene, the same pixels.
  other = SyntheticScenes(num_train=30, num_val=1, num_test=1, seed=0)
  assert np.array_equal(a, render.render(other, "train", 5, 64))
  # Different images differ.
  assert not np.array_equal(a, render.render(scenes, "train", 6, 64))


@pytest.mark.parametrize("colour", sorted(RGB))
def test_an_object_puts_its_colour_inside_its_box_only(colour):
  box = (0.3, 0.2, 0.7, 0.6)
  img = render.render_scene(scene(obj("square", colour, box=box)), 40)
  hit = near(img, RGB[colour])
  ys, xs = np.nonzero(hit)
  assert hit.sum() >= 0.8 * (0.4 * 40) ** 2  # the box is filled
  assert xs.min() >= 0.3 * 40 - 1 and xs.max() <= 0.7 * 40 and ys.min() >= 0.2 * 40 - 1 and ys.max() <= 0.6 * 40
  others = [c for c in RGB if c != colour]
  assert not any(near(img, RGB[c]).any() for c in others)


def test_every_object_of_a_generated_scene_shows_its_colour_in_its_box(scenes):
  for split, i in (("train", 0), ("train", 3), ("val", 1), ("test", 2)):
    sc = scenes.scene(split, i)
    img = render.render_scene(sc, 128)
    for r in sc["regions"]:
      if r["kind"] != "object":
        continue
      x1, y1, x2, y2 = (int(round(v * 128)) for v in r["box"])
      inside = near(img[y1:y2, x1:x2], RGB[r["colour"]]).sum()
      assert inside >= 3, (split, i, r)


@pytest.mark.parametrize("material", ["plain", "wooden", "metal", "glass"])
def test_materials_keep_the_colour_on_half_the_object_and_differ(material):
  big = (0.1, 0.1, 0.9, 0.9)
  img = render.render_scene(scene(obj("square", "blue", material, big)), 64, supersample=1)
  inner = img[8:56, 8:56]
  share = near(inner, RGB["blue"], tol=2).mean()
  assert (share == 1.0) if material == "plain" else (0.45 <= share < 0.9), share
  plain = render.render_scene(scene(obj("square", "blue", "plain", big)), 64, supersample=1)
  assert np.array_equal(img, plain) == (material == "plain")


def test_different_shapes_give_different_masks():
  box = (0.1, 0.1, 0.9, 0.9)
  masks = {s: render.shape_mask(s, box, 64) for s in SHAPES}
  for s, m in masks.items():
    assert 0.2 * 64 * 64 < m.sum() <= (0.8 * 64) ** 2 + 1, s  # inside the box, not empty
    ys, xs = np.nonzero(m)
    assert xs.min() >= 6 and xs.max() <= 58 and ys.min() >= 6 and ys.max() <= 58, s
  names = sorted(masks)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      differ = (masks[a] != masks[b]).mean()
      assert differ > 0.02, (a, b, differ)
  # A few geometric facts of the test's own: a square fills its box, a circle misses the corners,
  # a triangle is wider at the bottom, a cross is empty at the corners but full at the centre.
  assert masks["square"][7:57, 7:57].all()
  assert not masks["circle"][7:10, 7:10].any() and masks["circle"][32, 32]
  assert masks["triangle"][55].sum() > 3 * masks["triangle"][12].sum()
  assert not masks["cross"][8:20, 8:20].any() and masks["cross"][28:36, 28:36].all()
  assert not masks["diamond"][8:14, 8:14].any() and masks["diamond"][32, 8:56].sum() > 40


def test_background_regions_are_grey_textures_under_the_objects():
  bg = {"kind": "background", "texture": 0, "box": (0.0, 0.0, 1.0, 1.0)}
  img = render.render_scene(scene(bg, obj("circle", "red", box=(0.4, 0.4, 0.6, 0.6))), 64,
                            supersample=1)
  grey = img[:20, :20].astype(int)
  assert np.all(grey[..., 0] == grey[..., 1]) and len(np.unique(grey)) == 2  # two greys
  assert near(img, RGB["red"]).sum() > 10  # the object is drawn over its background
  stripes = render.render_scene(scene(dict(bg, texture=1)), 64, supersample=1)
  assert not np.array_equal(stripes, img) and len(np.unique(stripes[:20, :20])) == 2


def test_write_dataset_is_a_folder_jaxcap_extract_reads_with_its_splits(scenes, tmp_path):
  counts = render.write_dataset(str(tmp_path), scenes, 32, log=lambda s: None)
  assert counts == {"train": 12, "val": 3, "test": 3}
  names = sorted(p.name for p in (tmp_path / "images").iterdir())
  assert len(names) == 18 and names[0] == "test_00000.png" and "train_00011.png" in names
  with Image.open(tmp_path / "images" / "val_00001.png") as im:
    assert im.mode == "RGB" and im.size == (32, 32)
    assert np.array_equal(np.asarray(im), render.render(scenes, "val", 1, 32))
  captions, splits = karpathy.read_captions_and_splits(str(tmp_path / "captions.json"))
  assert set(captions) == set(names) and all(len(c) == 5 for c in captions.values())
  assert captions["train_00002.png"] == [" ".join(c) for c in scenes.captions("train", 2)]
  assert splits["val_00002.png"] == "val" and splits["test_00000.png"] == "test"
  data = karpathy.karpathy_json(captions, names, 0, 0, 0, "scenes", splits)
  assert {e["filename"]: e["split"] for e in data["images"]} == {n: n.split("_")[0] for n in names}
  # A second call draws nothing new (the files are kept).
  before = (tmp_path / "images" / "train_00000.png").stat().st_mtime_ns
  render.write_dataset(str(tmp_path), scenes, 32, log=lambda s: None)
  assert (tmp_path / "images" / "train_00000.png").stat().st_mtime_ns == before
  assert json.loads((tmp_path / "captions.json").read_text())[0]["split"] in ("train", "val", "test")


def test_bad_sizes_shapes_and_materials_are_one_line():
  with pytest.raises(ValueError, match="size=4: expected an int >= 8"):
    render.render_scene(scene(obj()), 4)
  with pytest.raises(ValueError, match="shape 'blob': expected one of circle"):
    render.shape_mask("blob", (0, 0, 1, 1), 16)
  with pytest.raises(ValueError, match="material 'gold': expected one of plain"):
    render.render_scene(scene(obj(material="gold")), 16)
