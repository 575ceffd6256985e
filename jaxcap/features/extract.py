"""Features of a folder of images, written in self-critical.pytorch's feature-dir layout.

Dimension legend:
  B batch (images), S the square input side (``size``), g the ``att`` grid side, D feature width.

``run(images_dir, out_dir, module, variables, record)`` reads every image file of
``images_dir`` (not recursive; the extensions of :data:`IMAGE_EXTENSIONS`) and writes

- ``<out>/fc/<stem>.npy``: ``[D]`` float32 (``np.save``, as ``prepro_feats.py``);
- ``<out>/att/<stem>.npz``: key ``feat``, the ``g x g`` grid flattened row-major to
  ``[g*g, D]`` float32 (``np.savez_compressed``, as ``prepro_feats.py``), which
  :mod:`jaxcap.data.karpathy` reads as regions (``data.grid=True`` gives them grid boxes);
- ``<out>/features.json``: the backbone name, its field overrides, ``size``, ``att_size``,
  ``dtype`` and the weights (file name + sha256, or ``random`` + seed), written before the
  first feature file so that features of different backbones never share a folder.

Each file is written to a temporary name and renamed (``os.replace``): an interrupted run
leaves no half-written file, and a second run skips the images whose ``fc`` and ``att`` files
both exist (resumable). ``<stem>`` is the file name without its extension, the key
:func:`jaxcap.data.karpathy.image_key` gives an entry without ``cocoid``.

Reading (:func:`read_image`): Pillow, ``ImageOps.exif_transpose`` (a phone photo's
orientation tag), any mode -> RGB (grayscale repeated, alpha dropped), then resized to
``size x size`` with bilinear filtering (Pillow's, antialiased when shrinking), aspect ratio not
kept: a fixed square is what lets the images go through in batches with one compiled program,
and the ``att`` grid is adaptive-average-pooled to ``g x g`` either way.

``size`` :data:`NATIVE` (``--size native``, the default of the ``resnet*_self_critical``
backbones) reads each image as self-critical.pytorch's ``prepro_feats.py`` does
(``skimage.io.imread``): the stored pixels, NO EXIF orientation applied and NO resize, grayscale
repeated to RGB; each image is extracted at its own resolution, images of one size together
(the folder is visited in order of size, read from the file headers, so that each size compiles
at most twice: a full batch and the rest). An alpha channel, on which ``prepro_feats.py`` fails,
is dropped. A file Pillow cannot read is reported (a warning line naming it) and skipped; the
others continue.

This module imports no other part of jaxcap but :mod:`jaxcap.atomic`, :mod:`jaxcap.errors` and :mod:`jaxcap.images` (``jaxcap.features`` is
the bottom import layer).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zipfile
from typing import Callable

import numpy as np

from jaxcap import atomic
from jaxcap.errors import BadInput
# The pixels: one definition, shared with readers that must not import flax.
from jaxcap.images import NATIVE, image_array, read_image, unreadable_reason  # noqa: F401
from jaxcap.features import registry

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
RECORD_FILE = "features.json"


def list_images(images_dir: str) -> list[str]:
  """The image file names of ``images_dir`` (by extension, case-insensitive), sorted; one-line
  ``BadInput`` when two share a stem (their features would share a file)."""
  if not os.path.isdir(images_dir):
    raise BadInput(f"--images={images_dir}: not a directory; expected a folder of images")
  names = sorted(n for n in os.listdir(images_dir)
                 if n.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(images_dir, n)))
  seen: dict[str, str] = {}
  for n in names:
    stem = os.path.splitext(n)[0]
    if stem in seen:
      raise BadInput(f"{os.path.join(images_dir, n)}: same name as {seen[stem]} without the "
                       "extension; expected one image per file-name stem (the features are "
                       "named <stem>.npy / <stem>.npz)")
    seen[stem] = n
  return names


def parse_size(value, what: str = "--size") -> int | str:
  """``size`` as an int >= 1 or :data:`NATIVE`; one-line ``BadInput`` naming ``what``."""
  if value == NATIVE:
    return NATIVE
  try:
    size = int(value)
  except (TypeError, ValueError):
    size = 0
  if size < 1 or isinstance(value, bool) or (isinstance(value, float) and value != size):
    raise BadInput(f"{what}={value}: expected an int >= 1 (the square input side) or {NATIVE!r}")
  return size


def header_size(path: str) -> tuple[int, int]:
  """``(width, height)`` from the file's header (nothing decoded); ``(0, 0)`` when unreadable
  (the read reports it)."""
  from PIL import Image
  try:
    with Image.open(path) as img:
      return tuple(img.size)
  except Exception:  # pylint: disable=broad-except  (Pillow raises many kinds)
    return (0, 0)


def check_readable(images_dir: str, names: list[str], size: int) -> None:
  """One line when ``images_dir`` holds no image file, or none that can be read (tried in order
  until one reads: the others are reported as they are extracted)."""
  if not names:
    raise BadInput(f"--images={images_dir}: no image files ({', '.join(IMAGE_EXTENSIONS)}); "
                     "expected a folder of images")
  reasons = []
  for name in names:
    try:
      read_image(os.path.join(images_dir, name), size)
      return
    except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
      reasons.append(f"{name}: {unreadable_reason(e)}")
  raise BadInput(f"--images={images_dir}: none of the {len(names)} images could be read (first, "
                   f"{reasons[0]}); expected image files Pillow can open")








def build_backbone(name: str, fields_json: str | None = None, *, size: int | str | None = None,
                   att_size: int | None = None, dtype: str = "float32"):
  """The backbone ``name`` with its field overrides (a JSON object), checked: ``(module,
  fields, size)``; one ``BadInput`` line naming the flag (``--backbone``, ``--fields``,
  ``--size``, ``--att_size``) and what was expected. ``size`` None is the backbone's default:
  :data:`NATIVE` for ``registry.NATIVE_BY_DEFAULT``, a ViT's own side, else 448."""
  if name not in registry.BACKBONES:
    raise BadInput(f"--backbone={name}: unknown; expected one of {', '.join(registry.names())}")
  fields = {}
  if fields_json:
    try:
      fields = json.loads(fields_json)
    except ValueError as e:
      raise BadInput(f"--fields={fields_json}: invalid JSON ({e}); expected an object such as "
                       '{"width": 4}') from None
    if not isinstance(fields, dict):
      raise BadInput(f"--fields={fields_json}: a {type(fields).__name__}; expected a JSON object")
  build = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
  if "att_size" in registry.BACKBONES[name][0].__dataclass_fields__:
    build["att_size"] = att_size or build.get("att_size", 14)
  try:
    module = registry.build(name, **dict(build, dtype=dtype))
  except BadInput as e:
    raise BadInput(f"--fields: {e}") from None
  image_size = getattr(module, "image_size", None)
  size = size or image_size or (NATIVE if name in registry.NATIVE_BY_DEFAULT else 448)
  if image_size and size != image_size:
    raise BadInput(f"--size={size}: {name} takes {image_size} x {image_size} images only; "
                     f"expected --size {image_size}")
  grid = image_size // module.patch if image_size else None
  if grid and att_size and att_size != grid:
    raise BadInput(f"--att_size={att_size}: {name}'s grid is its {grid} x {grid} patches; "
                     f"expected --att_size {grid} or none")
  return module, fields, size


# Recorded for provenance, not settings: a resumed extraction may name them differently.
PROVENANCE = ("images",)


def make_record(name: str, module, fields: dict, size: int | str, dtype: str, weights: str | None,
                seed: int, images: str | None = None) -> dict:
  """What ``features.json`` records of an extraction (read back by :mod:`jaxcap.features.record`);
  ``images``: the folder the images were read from (absolute; ``evaluate.py --clip_weights``
  finds the run's images there)."""
  return {**({"images": os.path.abspath(images)} if images else {}), "backbone": name, "fields": fields, "size": size,
          "att_size": getattr(module, "att_size", None) or (size // module.patch
                                                             if hasattr(module, "patch") else None),
          "dtype": dtype, "feature_dim": int(module.feature_dim) if hasattr(module, "feature_dim") else None,
          "weights": ({"file": os.path.basename(weights), "sha256": sha256(weights)} if weights
                      else {"random": True, "seed": seed})}


def features_of(extract: Callable, variables, images_BxSxSx3: np.ndarray, batch_size: int):
  """``(fc [B, D], att [B, g*g, D])`` float32 of images in batches of ``batch_size`` (the last
  padded with copies of its last image: one compiled shape); ``att`` cells row-major, as the
  ``.npz`` files hold them."""
  fcs, atts = [], []
  for start in range(0, len(images_BxSxSx3), batch_size):
    chunk = images_BxSxSx3[start:start + batch_size]
    n = len(chunk)
    if n < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - n, axis=0)])
    feats = extract(variables, chunk)
    att_BxgxgxD = np.asarray(feats["att"], np.float32)[:n]
    fcs.append(np.asarray(feats["fc"], np.float32)[:n])
    atts.append(att_BxgxgxD.reshape(n, -1, att_BxgxgxD.shape[-1]))
  return np.concatenate(fcs), np.concatenate(atts)


def sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def read_json(path: str, expected: str):
  """The JSON file at ``path``; one-line ``BadInput`` naming it and ``expected`` otherwise."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError, RecursionError) as e:  # RecursionError: arrays nested past the stack
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise BadInput(f"{path}: unreadable ({first}); expected {expected}") from None


def check_record(out_dir: str, record: dict) -> bool:
  """Whether ``out_dir`` has a ``features.json``; one-line ``BadInput`` when it records
  features of another backbone, size, grid, dtype or weights (a mixed folder would train
  silently)."""
  path = os.path.join(out_dir, RECORD_FILE)
  if not os.path.exists(path):
    return False
  old = read_json(path, "the features.json of an earlier run, or an --out without one")
  for key in list(record) + sorted(set(old) - set(record)):
    if key not in PROVENANCE and old.get(key) != record.get(key):
      raise BadInput(f"{path}: the features there have {key}={old.get(key)!r}, this run "
                       f"{record.get(key)!r}; expected the same settings to resume, or another --out")
  return True


def write_record(out_dir: str, record: dict) -> None:
  """Writes ``features.json`` unless it is there (:func:`check_record`: the same settings)."""
  if check_record(out_dir, record):
    return
  path = os.path.join(out_dir, RECORD_FILE)
  atomic.write_with(path, lambda f: f.write((json.dumps(record, indent=1) + "\n").encode()))


def _array_header(f) -> tuple[tuple, np.dtype]:
  """``(shape, dtype)`` from an open ``.npy`` stream's header, without reading the array."""
  version = np.lib.format.read_magic(f)
  read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
          else np.lib.format.read_array_header_2_0)
  shape, _, dtype = read(f)
  return tuple(shape), dtype


def file_header(path: str, key: str | None = None) -> tuple[tuple, np.dtype]:
  """``(shape, dtype)`` of a ``.npy`` file, or of the array ``key`` of a ``.npz`` file, read from
  the header; one-line ``BadInput`` naming the file when it is not one."""
  try:
    if key is None:
      with open(path, "rb") as f:
        return _array_header(f)
    with zipfile.ZipFile(path) as z, z.open(key + ".npy") as f:
      return _array_header(f)
  except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    what = f"a .npz file with the array {key!r}" if key else "a .npy file"
    raise BadInput(f"{path}: unreadable ({first}); expected {what}") from None


def done_stems(out_dir: str, files: list[tuple[str, str]]) -> list[str]:
  """The stems of ``files`` (``[(image path, stem)]``) whose ``fc`` and ``att`` files are both in
  ``out_dir``: what a resumed run skips."""
  return [stem for _, stem in files
          if os.path.exists(os.path.join(out_dir, "fc", stem + ".npy"))
          and os.path.exists(os.path.join(out_dir, "att", stem + ".npz"))]


def check_existing(out_dir: str, stems: list[str], record: dict) -> None:
  """The ``fc`` / ``att`` files of ``stems`` already in ``out_dir`` are what this extraction
  writes (``record``'s width ``feature_dim``, ``att_size`` squared cells, float32): a resumed run
  skips them, so a foreign file would be trained on. One-line ``BadInput`` naming the first
  that is not."""
  width, g = record.get("feature_dim"), record.get("att_size")
  fc_want = None if width is None else (int(width),)
  att_want = None if width is None or g is None else (int(g) * int(g), int(width))
  for stem in stems:
    for path, key, want, form in ((os.path.join(out_dir, "fc", stem + ".npy"), None, fc_want, "[D]"),
                                  (os.path.join(out_dir, "att", stem + ".npz"), "feat", att_want,
                                   "[g*g, D]")):
      shape, dtype = file_header(path, key)
      if (want is not None and shape != want) or len(shape) != len(form.split(",")) \
          or dtype != np.float32:
        expected = f"[{', '.join(map(str, want))}]" if want is not None else form
        raise BadInput(f"{path}: features of shape {list(shape)} {dtype}, this extraction "
                         f"({record.get('backbone')}) writes {expected} float32; expected the "
                         "same extraction's files to resume (remove the others), or another --out")


def _save_npy(array) -> Callable:
  return lambda f: np.save(f, array)


def _save_npz(array) -> Callable:
  return lambda f: np.savez_compressed(f, feat=array)


def run(images_dir: str, out_dir: str, module, variables, record: dict, size: int | str,
        batch_size: int = 16, progress: bool = True, log=None,
        files: list[tuple[str, str]] | None = None, check: bool = True) -> dict:
  """Extracts the features of every image of ``images_dir`` not done yet; returns
  ``{"total", "done_before", "extracted", "failed": [(name, reason)], "seconds"}``.
  ``files``: ``[(path under images_dir, feature file stem)]`` to extract instead of the folder's
  image files named by their stems (a Karpathy JSON's ``train2014/<file>`` named by its
  ``cocoid``: :func:`jaxcap.data.karpathy.read_karpathy_captions`). With ``size``
  :data:`NATIVE` a batch holds images of one size only, and is not padded. ``check``: the files
  already there are checked (:func:`check_existing`; False where the caller did)."""
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  if files is None:
    files = [(n, os.path.splitext(n)[0]) for n in list_images(images_dir)]
  names, stems = [n for n, _ in files], dict(files)
  if not names:
    raise BadInput(f"--images={images_dir}: no image files ({', '.join(IMAGE_EXTENSIONS)}); "
                     "expected a folder of images")
  fc_dir, att_dir = os.path.join(out_dir, "fc"), os.path.join(out_dir, "att")
  done = set(done_stems(out_dir, files))
  todo = [n for n in names if stems[n] not in done]
  if check:
    # The files a resumed run skips are this extraction's, or the run is refused (before
    # anything is written): another width or grid in the folder would be trained on silently.
    check_record(out_dir, record)
    check_existing(out_dir, sorted(done), record)
  # A killed extraction leaves the file it was writing as <stem>.npz.<random>.tmp; this
  # extraction owns the folder, so they go now (said: nothing is removed unannounced).
  left = [p for d in (out_dir, fc_dir, att_dir) for p in atomic.remove_leftovers(d)]
  if left:
    log(f"removed {len(left)} temporary file(s) a stopped extraction left (e.g. {left[0]})")
  os.makedirs(fc_dir, exist_ok=True)
  os.makedirs(att_dir, exist_ok=True)
  write_record(out_dir, record)
  if size == NATIVE:  # same-size images next to each other: fewer compiled shapes
    todo.sort(key=lambda n: header_size(os.path.join(images_dir, n)))
  result = {"total": len(names), "done_before": len(names) - len(todo), "extracted": 0,
            "failed": [], "seconds": 0.0}
  if not todo:
    return result
  extract = registry.make_extract(module)
  bar = None
  if progress:
    from tqdm import tqdm
    bar = tqdm(total=len(todo), unit="img", file=sys.stderr, dynamic_ncols=True)
  start = time.perf_counter()

  def flush(batch):
    if not batch:
      return
    n = len(batch)
    fc_BxD, att_BxCxD = features_of(extract, variables, np.stack([img for _, img in batch]),
                                    n if size == NATIVE else batch_size)
    for k, (name, _) in enumerate(batch):
      stem = stems[name]
      atomic.write_with(os.path.join(att_dir, stem + ".npz"), _save_npz(att_BxCxD[k]))
      atomic.write_with(os.path.join(fc_dir, stem + ".npy"), _save_npy(fc_BxD[k]))
    result["extracted"] += n
    if bar is not None:
      bar.update(n)
    batch.clear()

  batch: list = []
  try:
    for name in todo:
      path = os.path.join(images_dir, name)
      try:
        img = read_image(path, size)
      except Exception as e:  # pylint: disable=broad-except  (Pillow raises many kinds)
        reason = unreadable_reason(e)
        result["failed"].append((name, reason))
        msg = f"warning: {path}: unreadable image ({reason}); skipped"
        (bar.write(msg, file=sys.stderr) if bar is not None else log(msg))
        if bar is not None:
          bar.update(1)
        continue
      if batch and img.shape != batch[0][1].shape:  # only with size NATIVE
        flush(batch)
      batch.append((name, img))
      if len(batch) == batch_size:
        flush(batch)
    flush(batch)
  finally:
    if bar is not None:
      bar.close()
  result["seconds"] = time.perf_counter() - start
  return result
