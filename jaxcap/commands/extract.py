"""Extracts image features from a folder of images, and optionally a Karpathy JSON of their captions.

  jaxcap-extract --images photos/ --out data/mine --backbone resnet101 --weights resnet101.safetensors
  python scripts/extract_features.py --images photos/ --out data/mine --random_weights --captions captions.json --val 2 --test 2

Writes ``<out>/fc/<stem>.npy``, ``<out>/att/<stem>.npz`` and ``<out>/features.json`` (see
:mod:`jaxcap.features.extract`); a second run extracts only what is missing. Without
``--weights`` the run is refused unless ``--random_weights`` (tests, trying the commands
offline; ``features.json`` then records ``"weights": {"random": true, "seed": ...}``).

``--captions`` takes one of:

- a JSON object ``{"<image file name>": ["caption", ...], ...}``;
- a JSON list ``[{"image": "<file name>", "caption": "..."}, ...]`` (one caption per item);
- Flickr8k's token file, one ``<file name>#<n>\\t<caption>`` per line.

It writes ``<out>/dataset_<name>.json`` in Karpathy's format (tokens lowercased by
:func:`jaxcap.data.vocab.tokenize`) for the captioned images whose features exist. Splits: a
permutation of the captioned file names (sorted, then shuffled with ``--seed``) gives the first
``--val`` images to ``val``, the next ``--test`` to ``test`` and the rest to ``train``; both 0
(the default) puts every image in ``train``. train.py evaluates on ``val``, so give ``--val``
to train on the output. A JSON list whose items also name a ``"split"`` (``train``, ``val`` or
``test``; every item, one split per image) keeps those splits instead (then ``--val`` /
``--test`` are refused): a data set's own split, e.g. :mod:`jaxcap.data.render`'s scenes.

Exit codes: 0 when every image has its features (this run's or an earlier one's) or at least
one was extracted; unreadable images are then listed at the end and left out of the dataset
JSON. 2 on bad input (one ``error:`` line), including a folder where no image could be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def parser() -> argparse.ArgumentParser:
  from jaxcap import cli
  from jaxcap.features import registry
  p = argparse.ArgumentParser(prog="jaxcap-extract", description=__doc__.split("\n")[0])
  p.add_argument("--images", required=True, help="Folder of image files (not recursive).")
  p.add_argument("--out", required=True, help="Output folder (fc/, att/, features.json, dataset_<name>.json).")
  p.add_argument("--backbone", default="resnet101", help=f"One of {', '.join(registry.names())}.")
  p.add_argument("--weights", default=None, help="The backbone's .safetensors state_dict (torchvision / timm names).")
  p.add_argument("--random_weights", action="store_true",
                 help="Random weights instead of --weights (tests and offline trials; recorded as such).")
  p.add_argument("--seed", type=int, default=0, help="Seed of --random_weights and of the split permutation.")
  p.add_argument("--size", type=cli.positive_int, default=None,
                 help="Square input side in pixels (default 448; the ViT's image_size for vit_b16).")
  p.add_argument("--att_size", type=cli.positive_int, default=None,
                 help="att grid side g (default 14; a ViT's is its patch grid).")
  p.add_argument("--batch_size", type=cli.positive_int, default=16, help="Images per batch.")
  p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="Compute dtype.")
  p.add_argument("--fields", default=None,
                 help='JSON object of backbone field overrides, e.g. \'{"width": 4, "depths": [1, 1, 1, 1]}\'.')
  p.add_argument("--captions", default=None, help="Captions file (JSON or Flickr8k token format).")
  p.add_argument("--name", default="images", help="The dataset JSON is dataset_<name>.json.")
  p.add_argument("--val", type=cli.nonnegative_int, default=0, help="Captioned images in the val split.")
  p.add_argument("--test", type=cli.nonnegative_int, default=0, help="Captioned images in the test split.")
  p.add_argument("--no_progress", action="store_true", help="No progress bar.")
  return p


# ------------------------------------------------------------------------------------ captions
SPLITS = ("train", "val", "test")


def read_captions(path: str) -> dict[str, list[str]]:
  """``{file name: [caption, ...]}`` of a captions file in one of the module docstring's formats."""
  return read_captions_and_splits(path)[0]


def read_captions_and_splits(path: str) -> tuple[dict[str, list[str]], dict[str, str] | None]:
  """``({file name: [caption, ...]}, {file name: split} or None)``: the captions and, for a JSON
  list whose items name a ``"split"``, each image's split (module docstring)."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise ValueError(f"--captions={path}: not UTF-8 text ({e}); expected JSON or Flickr8k's "
                     "<file>#<n><TAB><caption> lines") from None
  out: dict[str, list[str]] = {}
  splits: dict[str, str] | None = None
  if text.lstrip()[:1] in ("{", "["):
    try:
      data = json.loads(text)
    except ValueError as e:
      raise ValueError(f"--captions={path}: invalid JSON ({e}); expected "
                       '{"<file>": ["caption", ...]} or [{"image": ..., "caption": ...}]') from None
    if isinstance(data, dict):
      for name, caps in data.items():
        if isinstance(caps, str):
          caps = [caps]
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
          raise ValueError(f"--captions={path}: entry {name!r} is a {type(caps).__name__}; "
                           "expected a list of caption strings")
        out.setdefault(name, []).extend(caps)
    else:
      for n, item in enumerate(data):
        if not (isinstance(item, dict) and isinstance(item.get("image"), str)
                and isinstance(item.get("caption"), str)):
          raise ValueError(f"--captions={path}: item [{n}] is not an object with string "
                           "'image' and 'caption'; expected [{\"image\": ..., \"caption\": ...}]")
        out.setdefault(item["image"], []).append(item["caption"])
        has_split = "split" in item
        if n == 0:
          splits = {} if has_split else None
        elif has_split != (splits is not None):
          raise ValueError(f"--captions={path}: item [{n}] has {'a' if has_split else 'no'} 'split', "
                           f"item [0] {'none' if has_split else 'one'}; expected a split on every "
                           "item or on none")
        if splits is not None:
          split = item["split"]
          if split not in SPLITS:
            raise ValueError(f"--captions={path}: item [{n}] has split {split!r}; expected one "
                             f"of {', '.join(SPLITS)}")
          if splits.setdefault(item["image"], split) != split:
            raise ValueError(f"--captions={path}: item [{n}] puts {item['image']!r} in {split!r}, "
                             f"an earlier item in {splits[item['image']]!r}; expected one split "
                             "per image")
  else:
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      key, tab, caption = line.partition("\t")
      if not tab:
        raise ValueError(f"--captions={path}: line {n} has no tab; expected "
                         "<file>#<n><TAB><caption> (Flickr8k's token format) or a JSON file")
      out.setdefault(key.strip().split("#")[0], []).append(caption.strip())
  if not out:
    raise ValueError(f"--captions={path}: no captions; expected at least one image's captions")
  return out, splits


def karpathy_json(captions: dict[str, list[str]], names: list[str], val: int, test: int,
                  seed: int, name: str, splits: dict[str, str] | None = None) -> dict:
  """Karpathy's ``{"images": [...], "dataset": name}`` of the captioned file ``names``; their
  split is ``splits[name]`` when given, else drawn from ``val``, ``test`` and ``seed``."""
  from jaxcap.data.vocab import tokenize
  names = sorted(names)
  if splits is not None:
    split = {n: splits[n] for n in names}
  else:
    if val + test > len(names):
      raise ValueError(f"--val={val} --test={test}: {len(names)} captioned images; expected "
                       "val + test <= the captioned images")
    order = np.random.default_rng(seed).permutation(len(names))
    split = {}
    for rank, i in enumerate(order):
      split[names[i]] = "val" if rank < val else "test" if rank < val + test else "train"
  images, sentid = [], 0
  for imgid, fname in enumerate(names):
    sents = []
    for raw in captions[fname]:
      sents.append({"tokens": tokenize(raw), "raw": raw, "imgid": imgid, "sentid": sentid})
      sentid += 1
    images.append({"filename": fname, "imgid": imgid, "split": split[fname], "sentences": sents,
                   "sentids": [s["sentid"] for s in sents]})
  return {"images": images, "dataset": name}


# ----------------------------------------------------------------------------------- the program
def _record(args, module, fields: dict, size: int) -> dict:
  from jaxcap.features import extract
  if args.weights:
    weights = {"file": os.path.basename(args.weights), "sha256": extract.sha256(args.weights)}
  else:
    weights = {"random": True, "seed": args.seed}
  return {"backbone": args.backbone, "fields": fields, "size": size,
          "att_size": getattr(module, "att_size", None) or size // getattr(module, "patch", 1),
          "dtype": args.dtype, "feature_dim": int(module.feature_dim) if hasattr(module, "feature_dim") else None,
          "weights": weights}


def main() -> int:
  from jaxcap.features import extract, registry
  args = parser().parse_args()
  # Bad input first, before anything is written or compiled.
  if not os.path.isdir(args.images):
    raise ValueError(f"--images={args.images}: not a directory; expected a folder of images")
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    raise ValueError(f"--out={args.out}: is a file; expected a directory to write the features into")
  if args.backbone not in registry.BACKBONES:
    raise ValueError(f"--backbone={args.backbone}: unknown; expected one of {', '.join(registry.names())}")
  if args.weights and args.random_weights:
    raise ValueError(f"--weights={args.weights} and --random_weights: both given; expected one")
  if not args.weights and not args.random_weights:
    raise ValueError("--weights: missing; expected the backbone's .safetensors file "
                     "(or --random_weights for a trial run with random features)")
  if args.weights and not os.path.isfile(args.weights):
    raise ValueError(f"--weights={args.weights}: no such file; expected a .safetensors state_dict")
  fields = {}
  if args.fields:
    try:
      fields = json.loads(args.fields)
    except ValueError as e:
      raise ValueError(f"--fields={args.fields}: invalid JSON ({e}); expected an object such as "
                       '{"width": 4}') from None
    if not isinstance(fields, dict):
      raise ValueError(f"--fields={args.fields}: a {type(fields).__name__}; expected a JSON object")
  build_fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
  cls = registry.BACKBONES[args.backbone][0]
  if "att_size" in cls.__dataclass_fields__:
    build_fields["att_size"] = args.att_size or build_fields.get("att_size", 14)
  build_fields["dtype"] = args.dtype
  try:
    module = registry.build(args.backbone, **build_fields)
  except ValueError as e:
    raise ValueError(f"--fields: {e}") from None
  image_size = getattr(module, "image_size", None)
  size = args.size or image_size or 448
  if image_size and size != image_size:
    raise ValueError(f"--size={size}: {args.backbone} takes {image_size} x {image_size} images "
                     f"only; expected --size {image_size}")
  grid = image_size // module.patch if image_size else None
  if grid and args.att_size and args.att_size != grid:
    raise ValueError(f"--att_size={args.att_size}: {args.backbone}'s grid is its {grid} x {grid} "
                     f"patches; expected --att_size {grid} or none")
  captions, splits = read_captions_and_splits(args.captions) if args.captions else (None, None)
  if splits is not None and (args.val or args.test):
    raise ValueError(f"--val={args.val} --test={args.test}: --captions={args.captions} gives every "
                     "image's split; expected --val and --test 0 (or a captions file without splits)")
  names = extract.list_images(args.images)
  if captions is not None and not set(captions) & set(names):
    raise ValueError(f"--captions={args.captions}: names none of the {len(names)} images of "
                     f"{args.images}; expected their file names (e.g. {names[0] if names else 'x.jpg'})")

  record = _record(args, module, fields, size)
  if args.weights:
    from jaxcap.features import weights
    variables, ignored = weights.load(args.weights, module)
    print(f"{args.weights}: loaded ({ignored} tensors of the classifier / counters ignored)", flush=True)
  else:
    variables = registry.random_variables(module, seed=args.seed, size=size)
    print(f"{args.backbone}: RANDOM weights (seed {args.seed}); the features mean nothing", flush=True)
  os.makedirs(args.out, exist_ok=True)
  result = extract.run(args.images, args.out, module, variables, record, size,
                       batch_size=args.batch_size, progress=not args.no_progress)

  failed = result["failed"]
  have = result["done_before"] + result["extracted"]
  if result["extracted"]:
    rate = result["extracted"] / max(result["seconds"], 1e-9)
    print(f"extracted {result['extracted']} images in {result['seconds']:.1f} s "
          f"({rate:.2f} images/s, compilation included); {result['done_before']} done before", flush=True)
  else:
    print(f"extracted 0 images: {result['done_before']} of the {result['total']} images of "
          f"{args.images} already have features in {args.out}", flush=True)
  if failed:
    print(f"{len(failed)} unreadable image(s), skipped:", file=sys.stderr, flush=True)
    for name, reason in failed:
      print(f"  {os.path.join(args.images, name)}: {reason}", file=sys.stderr, flush=True)
  if have == 0:
    raise ValueError(f"--images={args.images}: none of the {result['total']} images could be "
                     "read; expected image files Pillow can open")
  if captions is not None:
    failed_names = {n for n, _ in failed}
    usable = [n for n in names if n in captions and n not in failed_names]
    missing = sorted(set(captions) - set(names))
    if missing:
      print(f"{len(missing)} captioned file(s) not in {args.images} (left out), e.g. {missing[0]}",
            file=sys.stderr, flush=True)
    data = karpathy_json(captions, usable, args.val, args.test, args.seed, args.name, splits)
    path = os.path.join(args.out, f"dataset_{args.name}.json")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
      json.dump(data, f)
    os.replace(tmp, path)
    counts = {s: sum(e["split"] == s for e in data["images"]) for s in ("train", "val", "test")}
    print(f"wrote {path}: {len(usable)} images ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
          f"{sum(len(e['sentences']) for e in data['images'])} captions", flush=True)
  print(f"features in {args.out} (fc/, att/ [{record['att_size']}*{record['att_size']}, D], "
        f"features.json)", flush=True)
  return 0


def run():
  """Console-script entry point (``jaxcap-extract``)."""
  from jaxcap.cli import run_script
  run_script(main)


if __name__ == "__main__":
  run()
