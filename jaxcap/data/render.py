"""``synthetic_scenes`` drawn as image files: pixels for ``jaxcap-extract``.

Dimension legend:
  S the image side in pixels (``size``), R = S * ``supersample`` the side it is drawn at.

``render_scene(scene, size)`` draws one scene of :meth:`SyntheticScenes.scene` as ``[S, S, 3]``
uint8 RGB, a pure function of the scene (no randomness: image ``i`` of a split is the same
picture on every host and in every run). The boxes are the scene's own (unit square, y down);
each is drawn at ``R x R`` and box-filtered down to ``S x S`` (antialiased edges):

- the canvas: mid grey :data:`CANVAS_RGB`;
- background regions first, each box filled with its texture (:data:`TEXTURES`: 0 a grey
  checkerboard, 1 grey vertical stripes), never an object colour;
- then the objects, largest box first (a container under the object inside it), each its
  ``shape`` inscribed in its box (the box's aspect kept): circle an ellipse, square the box,
  triangle pointing up, star five-pointed, cross a plus of bars 1/3 of the box, diamond the
  box's edge midpoints; in its ``colour`` (:data:`COLOUR_RGB`) with its ``material`` as a
  pattern of that colour and a contrasting shade of it (lighter for dark colours, darker for
  light ones): plain solid, wooden horizontal stripes, metal diagonal stripes, glass a
  lattice of dots. Half or more of a textured object's pixels keep the plain colour. The
  pattern's period is ``max(2, round(S / 32))`` output pixels (4 at 128 px).

The ``size`` category is the box's side (``SyntheticScenes`` draws large boxes larger), so it
shows as the drawn area. Captions are the scene's references (``SyntheticScenes.captions``).

``write_dataset(out, scenes, size)`` writes ``<out>/images/<split>_<i:05d>.png`` for every image
of every split and ``<out>/captions.json``, a list ``[{"image", "caption", "split"}]`` (one item
per reference) that ``jaxcap-extract --captions`` reads, keeping the dataset's splits, and
``<out>/dataset_synthetic_scenes.json``, the same in Karpathy's format, which a run from pixels
reads (``data.name=karpathy``, ``data.images_dir=<out>/images``):

  python -m jaxcap.data.render --out runs/pixels/scenes --num_train 1500 --num_val 200 --num_test 200 --size 128
"""

from __future__ import annotations

import json
import os

import numpy as np

from jaxcap.data.synthetic import COLOURS, MATERIALS, SHAPES, SPLITS, SyntheticScenes
from jaxcap.errors import BadInput

CANVAS_RGB = (128, 128, 128)
COLOUR_RGB = {
    "red": (215, 35, 35), "green": (40, 160, 50), "blue": (40, 70, 215),
    "yellow": (235, 215, 40), "white": (245, 245, 245), "black": (20, 20, 20),
    "purple": (130, 50, 170), "orange": (245, 135, 25),
}
# Background textures: two greys each, so that no texture pixel has an object's colour.
TEXTURES = (("checkerboard", (96, 96, 96), (160, 160, 160)),
            ("vertical stripes", (104, 104, 104), (152, 152, 152)))
SUPERSAMPLE = 2
CAPTIONS_FILE = "captions.json"
KARPATHY_FILE = "dataset_synthetic_scenes.json"
IMAGES_DIR = "images"

assert set(COLOUR_RGB) == set(COLOURS)


def image_name(split: str, i: int) -> str:
  """The PNG file name of image ``i`` of ``split`` (``train_00012.png``); its stem is the image
  id the Karpathy reader gives the extracted features."""
  return f"{split}_{i:05d}.png"


def _period(size: int) -> int:
  return max(2, int(round(size / 32)))


def shape_mask(shape: str, box, side: int) -> np.ndarray:
  """``[side, side]`` bool: ``shape`` inscribed in ``box`` (x1, y1, x2, y2 in the unit square)."""
  from PIL import Image, ImageDraw
  if shape not in SHAPES:
    raise BadInput(f"shape {shape!r}: expected one of {', '.join(SHAPES)}")
  x1, y1, x2, y2 = (float(v) * side for v in box)
  cx, cy, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
  img = Image.new("L", (side, side), 0)
  draw = ImageDraw.Draw(img)

  def rect(a, b, c, d):  # ImageDraw's end coordinates are inclusive: c - 1 keeps it in the box
    return (a, b, max(a, c - 1), max(b, d - 1))

  if shape == "circle":
    draw.ellipse(rect(x1, y1, x2, y2), fill=255)
  elif shape == "square":
    draw.rectangle(rect(x1, y1, x2, y2), fill=255)
  elif shape == "triangle":
    draw.polygon([(x1, y2 - 1), (x2 - 1, y2 - 1), (cx, y1)], fill=255)
  elif shape == "diamond":
    draw.polygon([(cx, y1), (x2 - 1, cy), (cx, y2 - 1), (x1, cy)], fill=255)
  elif shape == "cross":
    draw.rectangle(rect(x1, cy - hh / 3, x2, cy + hh / 3), fill=255)
    draw.rectangle(rect(cx - hw / 3, y1, cx + hw / 3, y2), fill=255)
  else:  # star: five points, inner radius 0.45 of the outer, the first point up
    angles = -np.pi / 2 + np.arange(10) * np.pi / 5
    radius = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
    draw.polygon([(cx + (hw - 0.5) * r * np.cos(a), cy + (hh - 0.5) * r * np.sin(a))
                  for a, r in zip(angles, radius)], fill=255)
  return np.asarray(img) > 127


def _contrast(rgb) -> np.ndarray:
  """A shade of ``rgb`` that stands out from it: darker for light colours, lighter for dark."""
  c = np.asarray(rgb, np.float32)
  luminance = (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) / 255
  return c * 0.5 if luminance > 0.35 else c * 0.5 + 0.5 * 255


def _pattern(kind: str, side: int, period: int) -> np.ndarray:
  """``[side, side]`` bool: where a pattern of period ``period`` pixels takes its second shade."""
  yy, xx = np.mgrid[0:side, 0:side]
  half = max(1, period // 2)
  if kind in ("plain",):
    return np.zeros((side, side), bool)
  if kind == "wooden":
    return (yy // half) % 2 == 1
  if kind == "metal":
    return ((xx + yy) // half) % 2 == 1
  if kind == "glass":
    return ((xx % period) < half) & ((yy % period) < half)
  if kind == "checkerboard":
    return ((xx // period + yy // period) % 2) == 1
  if kind == "vertical stripes":
    return (xx // half) % 2 == 1
  raise ValueError(f"pattern {kind!r}: unknown")


def render_scene(scene: dict, size: int, supersample: int = SUPERSAMPLE) -> np.ndarray:
  """``[size, size, 3]`` uint8 RGB of a :meth:`SyntheticScenes.scene` (module docstring)."""
  from PIL import Image
  if not isinstance(size, (int, np.integer)) or size < 8:
    raise BadInput(f"size={size!r}: expected an int >= 8 (pixels)")
  side = int(size) * int(supersample)
  period = _period(int(size)) * int(supersample)
  canvas = np.empty((side, side, 3), np.float32)
  canvas[:] = CANVAS_RGB
  patterns: dict[str, np.ndarray] = {}

  def pattern(kind):
    if kind not in patterns:
      patterns[kind] = _pattern(kind, side, period)
    return patterns[kind]

  regions = scene["regions"]
  for r in regions:
    if r["kind"] != "object":
      name, first, second = TEXTURES[int(r["texture"]) % len(TEXTURES)]
      mask = shape_mask("square", r["box"], side)
      alt = pattern(name)
      canvas[mask & ~alt] = first
      canvas[mask & alt] = second
  objects = [r for r in regions if r["kind"] == "object"]
  area = lambda r: (r["box"][2] - r["box"][0]) * (r["box"][3] - r["box"][1])
  for r in sorted(objects, key=area, reverse=True):  # stable: ties keep the scene's order
    if r["material"] not in MATERIALS:
      raise BadInput(f"material {r['material']!r}: expected one of {', '.join(MATERIALS)}")
    mask = shape_mask(r["shape"], r["box"], side)
    rgb = COLOUR_RGB[r["colour"]]
    alt = pattern(r["material"])
    canvas[mask & ~alt] = rgb
    canvas[mask & alt] = _contrast(rgb)
  img = Image.fromarray(np.round(canvas).astype(np.uint8), "RGB")
  if supersample > 1:
    img = img.reduce(int(supersample))  # box filter: each output pixel averages its R/S square
  return np.asarray(img, dtype=np.uint8)


def render(scenes: SyntheticScenes, split: str, i: int, size: int) -> np.ndarray:
  """Image ``i`` of ``split`` of ``scenes`` as ``[size, size, 3]`` uint8."""
  return render_scene(scenes.scene(split, i), size)


def write_dataset(out: str, scenes: SyntheticScenes, size: int, log=print,
                  names: str = "split_index") -> dict:
  """Writes ``<out>/images/*.png`` and ``<out>/captions.json`` (module docstring); a PNG that
  exists is kept (a second call renders only what is missing). ``names="image_id"`` names each
  PNG by the synthetic dataset's own image id (``20000012.png``: test image 12), the id its runs'
  predictions carry (for ``evaluate.py --clip_images``). Returns ``{split: images}``."""
  from PIL import Image
  images = os.path.join(out, IMAGES_DIR)
  os.makedirs(images, exist_ok=True)
  items, counts, drawn = [], {}, 0
  for split in SPLITS:
    counts[split] = scenes.num_images(split)
    for i in range(counts[split]):
      name = image_name(split, i) if names == "split_index" else f"{scenes.image_id(split, i)}.png"
      path = os.path.join(images, name)
      if not os.path.exists(path):
        tmp = f"{path}.tmp{os.getpid()}.png"
        Image.fromarray(render(scenes, split, i, size), "RGB").save(tmp)
        os.replace(tmp, path)
        drawn += 1
      items.extend({"image": name, "caption": " ".join(c), "split": split}
                   for c in scenes.captions(split, i))
  path = os.path.join(out, CAPTIONS_FILE)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:  # one item per line
    f.write("[\n" + ",\n".join(json.dumps(item) for item in items) + "\n]\n")
  os.replace(tmp, path)
  # The same captions as Karpathy's dataset JSON, for a run from pixels (data.images_dir=<out>/images).
  from jaxcap import atomic
  from jaxcap.data import karpathy
  captions, splits = {}, {}
  for item in items:
    captions.setdefault(item["image"], []).append(item["caption"])
    splits[item["image"]] = item["split"]
  atomic.write_json(os.path.join(out, KARPATHY_FILE),
                    karpathy.karpathy_json(captions, list(captions), 0, 0, 0, "synthetic_scenes", splits))
  log(f"wrote {images}: {sum(counts.values())} PNGs of {size} x {size} px ({drawn} drawn now; "
      f"{', '.join(f'{k} {v}' for k, v in counts.items())}) and {path} ({len(items)} captions)")
  return counts


def is_rendered(out: str) -> bool:
  """``out`` holds what :func:`write_dataset` writes (a folder of an earlier jaxcap, before
  ``atomic.FOLDER_MARKER``): ``captions.json`` of ``{"image", "caption", "split"}`` items."""
  with open(os.path.join(out, CAPTIONS_FILE)) as f:
    items = json.load(f)
  return isinstance(items, list) and all(isinstance(i, dict) and set(i) == {"image", "caption", "split"}
                                         for i in items)


def main(argv=None) -> int:
  from jaxcap import cli  # the program's arguments only: the data layer imports no command line
  p = cli.ArgumentParser(prog="python -m jaxcap.data.render",
                              description="synthetic_scenes as PNG files + captions.json for jaxcap-extract.")
  p.add_argument("--out", required=True, help="Output folder (images/, captions.json).")
  p.add_argument("--size", type=cli.positive_int, default=128, help="Image side in pixels.")
  p.add_argument("--num_train", type=cli.nonnegative_int, default=1500)
  p.add_argument("--num_val", type=cli.nonnegative_int, default=200)
  p.add_argument("--num_test", type=cli.nonnegative_int, default=200)
  p.add_argument("--seed", type=int, default=0, help="synthetic_scenes seed (the scenes, not the drawing).")
  p.add_argument("--names", choices=("split_index", "image_id"), default="split_index",
                 help="PNG names: <split>_<i>.png (jaxcap-extract's keys) or the synthetic dataset's "
                      "image ids (its runs' predictions: evaluate.py --clip_images).")
  p.add_argument("--overwrite", action="store_true",
                 help="Write into an --out folder that holds files jaxcap did not write.")
  args = p.parse_args(argv)
  if args.size < 8:
    raise BadInput(f"--size={args.size}: expected at least 8 pixels")
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    raise BadInput(f"--out={args.out}: is a file; expected a directory")
  from jaxcap import atomic
  atomic.check_output(args.out, f"--out={args.out}", folder=True, overwrite=args.overwrite,
                      mine=is_rendered, what="one this program wrote")
  atomic.mark_folder(args.out, "jaxcap.data.render")
  scenes = SyntheticScenes(num_train=args.num_train, num_val=args.num_val,
                           num_test=args.num_test, seed=args.seed)
  write_dataset(args.out, scenes, args.size, names=args.names)
  return 0


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)
