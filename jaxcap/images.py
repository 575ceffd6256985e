"""Image files and arrays as the uint8 RGB pixels every jaxcap reader sees.

One definition for the feature extractor (:mod:`jaxcap.features.extract`, which imports flax
through :mod:`jaxcap.features`), ``Run.caption_images``, ``evaluate.py --images`` and the exported
captioner (:mod:`jaxcap.serving.artefact`, which runs with jax and numpy only): this module
imports numpy and, when a function runs, Pillow, nothing else.

:func:`read_image`: Pillow, ``ImageOps.exif_transpose`` (a phone photo's orientation tag), any
mode -> RGB (grayscale repeated, alpha dropped, 16-bit and float images scaled), then resized to
``size x size`` with bilinear filtering (Pillow's, antialiased when shrinking), aspect ratio not
kept; at ``size`` :data:`NATIVE` the stored pixels as they are (self-critical.pytorch's
``prepro_feats.py``: no resize, no orientation tag).
"""

from __future__ import annotations

import sys

import numpy as np

from jaxcap.errors import BadInput

NATIVE = "native"  # ``size`` of images read at their own resolution

# What a refusal to caption image files names (evaluate.py --images, Run.caption_images,
# jaxcap-serve and its page, an export): the runs that can. The default run (make train) learns
# from the synthetic scenes' embedded features, which no backbone computes from pixels.
IMAGE_RUNS = ("runs that caption image files: one trained on jaxcap-extract's features "
              "(docs/USAGE.md, 'Your own images') or from pixels (on the drawn scenes: python -m "
              "jaxcap.data.render --out runs/scenes_px --size 64, then python train.py --config "
              "configs/pixels.py:synthetic --workdir runs/pixels_scenes)")


def read_image(path: str, size: int | str, exif: bool | None = None) -> np.ndarray:
  """``[S, S, 3]`` uint8 RGB of the image file at ``path``, or ``[H, W, 3]`` as stored when
  ``size`` is :data:`NATIVE` (see the module docstring). ``exif``: apply the orientation tag
  (default: unless ``size`` is NATIVE; the region detector reads unresized photos upright, as the
  Caffe original's ``cv2.imread`` does)."""
  from PIL import Image, ImageOps
  with opened(path, path) as img:
    img.load()
    if (size != NATIVE) if exif is None else exif:  # prepro_feats' skimage.io.imread ignores the tag
      img = ImageOps.exif_transpose(img)
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
      img = _high_depth_to_rgb(img, path)
    elif img.mode != "RGB":
      # Palette / alpha images through RGBA so that transparency becomes its colour, not noise.
      img = img.convert("RGBA").convert("RGB") if img.mode in ("P", "PA", "LA") else img.convert("RGB")
    if size == NATIVE:
      return np.asarray(img, dtype=np.uint8)
    return _square(img, size, path)


def opened(file, what: str):
  """``PIL.Image.open(file)``, refused in one ``BadInput`` line naming ``what`` when its header
  declares more pixels than ``PIL.Image.MAX_IMAGE_PIXELS`` (about 89 million), before any pixel
  is decoded: Pillow itself only warns up to twice its limit, then decodes them all."""
  from PIL import Image
  limit = Image.MAX_IMAGE_PIXELS
  try:
    img = Image.open(file)
  except Image.DecompressionBombError as e:  # over twice the limit: Pillow's refusal, from the header
    raise BadInput(f"{what}: {unreadable_reason(e)}; expected an image of at most {limit:,} "
                   "pixels") from None
  if limit and img.size[0] * img.size[1] > limit:
    w, h = img.size
    img.close()
    raise BadInput(f"{what}: {w}x{h} pixels ({w * h:,}); expected an image of at most {limit:,} "
                   "pixels (PIL.Image.MAX_IMAGE_PIXELS)")
  return img


def _high_depth_to_rgb(img, path: str):
  """A 16-bit, 32-bit integer or float grayscale image as 8-bit RGB, its range scaled (Pillow's
  own conversion clips at 255: a 16-bit photo would read as almost white). 16-bit: / 257; 32-bit
  integers within [0, 65535] as 16-bit; floats within [0, 1] x 255 or within [0, 255] as they
  are; anything else is refused in one line."""
  from PIL import Image
  x = np.asarray(img)
  lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
  if img.mode.startswith("I;16") or (img.mode == "I" and 0 <= lo and hi <= 65535):
    gray = np.round(x.astype(np.float64) / 257.0)
  elif img.mode == "F" and 0 <= lo and hi <= 1:
    gray = np.round(x.astype(np.float64) * 255.0)
  elif img.mode == "F" and 0 <= lo and hi <= 255:
    gray = np.round(x.astype(np.float64))
  else:
    raise BadInput(f"{path}: a {img.mode} image with values in [{lo:g}, {hi:g}]; expected 8- or "
                     "16-bit pixels (or 32-bit ones within [0, 65535], floats within [0, 1] or [0, 255])")
  return Image.fromarray(gray.astype(np.uint8), "L").convert("RGB")


def unreadable_reason(e: Exception) -> str:
  """The first line of what Pillow raised for an unreadable file (its type when empty)."""
  return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# An image side below this is half a cell of a stride-32 backbone's feature grid: upscaled to
# the input size it holds almost nothing to caption, which is said, not hidden.
SMALL_SIDE = 16


def _square(img, size: int, what: str) -> np.ndarray:
  from PIL import Image
  if min(img.size) < SMALL_SIDE:
    print(f"warning: {what}: {img.size[0]}x{img.size[1]} pixels, upscaled to {size}x{size} "
          f"(an image side under {SMALL_SIDE} pixels holds little to caption)", file=sys.stderr, flush=True)
  return np.asarray(img.resize((size, size), Image.BILINEAR), dtype=np.uint8)


def image_array(array, size: int | str, what: str = "image") -> np.ndarray:
  """``[S, S, 3]`` uint8 of a uint8 RGB ``[H, W, 3]`` array: as it is when already ``S x S`` (or
  ``size`` is :data:`NATIVE`), else resized as :func:`read_image` resizes a file's pixels;
  one-line ``BadInput`` for another shape or dtype."""
  from PIL import Image
  x = np.asarray(array)
  if x.ndim != 3 or x.shape[-1] != 3 or x.dtype != np.uint8 or min(x.shape[:2]) < 1:
    raise BadInput(f"{what}: expected a uint8 RGB array [H, W, 3] (or an image file path), "
                     f"got {x.dtype} {list(x.shape)}")
  if size == NATIVE or x.shape[:2] == (size, size):
    return x
  return _square(Image.fromarray(x, "RGB"), size, what)


def read_many(images, read_file, read_array, *, skip_unreadable: bool = False):
  """``(arrays, kept)`` of one or a list of image file paths and / or arrays: each path through
  ``read_file(path)``, each array through ``read_array(item, i)``; ``kept`` the indices into
  ``images`` that ``arrays`` holds. A missing or unreadable file is a one-line ``BadInput``, or
  with ``skip_unreadable`` one ``warning:`` line on stderr (as ``jaxcap-extract`` reports it)
  and left out; a directory, a bad array or no readable image at all is always an error."""
  import os  # noqa: PLC0415
  if isinstance(images, (str, os.PathLike)) or (isinstance(images, np.ndarray) and images.ndim == 3):
    images = [images]
  out, kept, skipped = [], [], []
  for i, item in enumerate(images):
    if isinstance(item, (str, os.PathLike)):
      path = os.fspath(item)
      if os.path.isdir(path):
        raise BadInput(f"{path}: a directory; expected an image file (a folder's images: "
                       "evaluate.py --images DIR, or a list of their paths)")
      try:
        if not os.path.isfile(path):
          raise BadInput(f"{path}: no such file; expected an image file")
        try:
          out.append(read_file(path))
        except Exception as e:  # noqa: BLE001 - Pillow raises many kinds for a damaged file
          raise BadInput(f"{path}: unreadable image ({unreadable_reason(e)}); expected an image "
                         "file Pillow can open") from None
      except BadInput as e:
        if not skip_unreadable:
          raise
        skipped.append(path)
        # The reason without the "expected ..." tail: the line says what was done instead.
        print(f"warning: {str(e).split('; expected')[0]}; skipped", file=sys.stderr, flush=True)
        continue
    else:
      out.append(read_array(item, i))
    kept.append(i)
  if not out:
    if skipped:
      raise BadInput(f"images: none of the {len(skipped)} image files could be read (first, "
                     f"{skipped[0]}); expected image files Pillow can open")
    raise BadInput("images: empty; expected at least one image path or array")
  return out, kept

