"""Extracts image features from a folder of images, and optionally a Karpathy JSON of their captions.

  jaxcap-extract --images photos/ --out data/mine --backbone resnet101 --weights resnet101.safetensors
  jaxcap-extract --images val2014/ --out data/cocotalk --backbone resnet101_self_critical --weights resnet101_self_critical.safetensors
  python scripts/extract_features.py --images photos/ --out data/mine --random_weights --captions captions.json --val 2 --test 2

Writes ``<out>/fc/<stem>.npy``, ``<out>/att/<stem>.npz`` and ``<out>/features.json``
(:mod:`jaxcap.features.extract`); a second run extracts only what is missing. Without
``--weights`` the run is refused unless ``--random_weights`` (tests, offline trials; recorded as
such). ``--captions`` (a JSON object ``{"<file>": [captions]}``, a JSON list ``[{"image",
"caption"[, "split"]}]`` or Flickr8k's token file: :func:`jaxcap.data.karpathy.read_captions`)
also writes ``<out>/dataset_<name>.json`` in Karpathy's format for the captioned images whose
features exist: the first ``--val`` images of a seeded permutation go to ``val``, the next
``--test`` to ``test``, the rest to ``train`` (train.py validates on ``val``), unless the list
gives every image's split. Karpathy's ``dataset_coco.json`` / ``dataset_flickr8k.json`` as
``--captions`` keeps its splits: its images are ``<images>/<filepath>/<filename>`` (COCO's
``train2014/`` and ``val2014/``), their features named by ``cocoid`` (Flickr: the file stem), as
``prepro_feats.py`` names them (:func:`jaxcap.data.karpathy.read_karpathy_captions`). ``--backbone resnet101_self_critical`` (or 50 / 152) computes
self-critical.pytorch's ``prepro_feats.py`` features exactly (its Caffe-style ResNet, each image
at its own resolution: ``--size native``, that backbone's default). Exit 0 when every image has
its features or at least one was extracted (unreadable images are listed and left out); 2 on
bad input (one ``error:`` line), including a folder where no image could be read.
"""

from __future__ import annotations

import argparse
import os
import sys

from jaxcap import atomic, cli
from jaxcap.data import karpathy
from jaxcap.errors import BadInput
from jaxcap.features import extract, registry, weights


WEIGHTS_RECIPE = "docs/USAGE.md, 'Your own images', says how to make one from torch weights"


def _size(text: str) -> int | str:
  try:
    return extract.parse_size(text)
  except BadInput:
    raise argparse.ArgumentTypeError(f"expected an integer >= 1 or {extract.NATIVE!r}, "
                                     f"got {text!r}") from None


def parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog="jaxcap-extract", description=__doc__.split("\n")[0])
  add = p.add_argument
  add("--images", required=True, help="Folder of image files (not recursive).")
  add("--out", required=True, help="Output folder (fc/, att/, features.json, dataset_<name>.json).")
  add("--backbone", default="resnet101", help=f"One of {', '.join(registry.names())}.")
  add("--weights", default=None, help="The backbone's .safetensors state_dict (torchvision / timm names).")
  add("--random_weights", action="store_true", help="Random weights instead of --weights (recorded as such).")
  add("--seed", type=int, default=0, help="Seed of --random_weights and of the split permutation.")
  add("--size", type=_size, default=None,
      help="Square input side, or 'native': each image unresized, as prepro_feats.py (default 448; "
           "native for resnet*_self_critical; a ViT's own).")
  add("--att_size", type=cli.positive_int, default=None, help="att grid side g (default 14; a ViT's patches).")
  add("--batch_size", type=cli.positive_int, default=16, help="Images per batch.")
  add("--dtype", choices=["float32", "bfloat16"], default="float32", help="Compute dtype.")
  add("--fields", default=None, help='Backbone field overrides as JSON, e.g. \'{"width": 4}\'.')
  add("--captions", default=None, help="Captions file (JSON, Flickr8k token format, or Karpathy's "
      "dataset_coco.json / dataset_flickr8k.json).")
  add("--name", default=None, help="The dataset JSON is dataset_<name>.json (default: images; a "
      "Karpathy JSON's dataset, e.g. coco).")
  add("--val", type=cli.nonnegative_int, default=0, help="Captioned images in the val split.")
  add("--test", type=cli.nonnegative_int, default=0, help="Captioned images in the test split.")
  add("--no_progress", action="store_true", help="No progress bar.")
  add("--overwrite", action="store_true", help="Write into an --out folder that holds files jaxcap did not write.")
  return p


def is_features_folder(path: str) -> bool:
  """``path`` holds an extraction (its ``features.json``, written before the folder had a
  marker: ``atomic.FOLDER_MARKER``)."""
  record = atomic.read_json(os.path.join(path, extract.RECORD_FILE))
  return isinstance(record, dict) and "backbone" in record


def _err(*lines) -> None:
  for line in lines:
    print(line, file=sys.stderr, flush=True)


def main(argv=None) -> int:
  a = parser().parse_args(argv)
  # Bad input first, before anything is written or compiled.
  if not os.path.isdir(a.images):
    raise BadInput(f"--images={a.images}: not a directory; expected a folder of images")
  if os.path.exists(a.out) and not os.path.isdir(a.out):
    raise BadInput(f"--out={a.out}: is a file; expected a directory to write the features into")
  # A read-only place or another program's folder: before the backbone is built.
  atomic.check_output(a.out, f"--out={a.out}", folder=True, overwrite=a.overwrite,
                      mine=is_features_folder, what="one jaxcap-extract wrote (to resume)")
  if bool(a.weights) == a.random_weights:
    raise BadInput(f"--weights={a.weights} and --random_weights: both given; expected one" if a.weights else
                     "--weights: missing; expected the backbone's .safetensors file "
                     f"({WEIGHTS_RECIPE}), or --random_weights for a trial run with random features")
  if a.weights and not os.path.isfile(a.weights):
    raise BadInput(f"--weights={a.weights}: no such file; expected a .safetensors state_dict "
                     f"({WEIGHTS_RECIPE})")
  module, fields, size = extract.build_backbone(a.backbone, a.fields, size=a.size,
                                                att_size=a.att_size, dtype=a.dtype)
  # Karpathy's own JSON (its splits, and COCO's images in train2014/ and val2014/), else the
  # simpler caption formats.
  given = karpathy.read_karpathy_captions(a.captions) if a.captions else None
  captions, splits = (karpathy.read_captions_and_splits(a.captions) if a.captions and given is None
                      else (None, None))
  if (splits is not None or given is not None) and (a.val or a.test):
    raise BadInput(f"--val={a.val} --test={a.test}: --captions={a.captions} gives every image's "
                     "split; expected --val and --test 0 (or a captions file without splits)")
  files = None
  if given is not None:
    files = [(rel, stem) for rel, stem in given["files"] if os.path.isfile(os.path.join(a.images, rel))]
    absent = [rel for rel, _ in given["files"] if not os.path.isfile(os.path.join(a.images, rel))]
    if not files:
      raise BadInput(f"--captions={a.captions}: none of its {len(absent)} images is under "
                       f"--images={a.images} (e.g. {os.path.join(a.images, absent[0])}); expected "
                       "the folder holding its <filepath>/<filename> (COCO: train2014/, val2014/)")
    if absent:
      _err(f"warning: {len(absent)} image(s) of --captions={a.captions} not under {a.images} "
           f"(left out), e.g. {os.path.join(a.images, absent[0])}")
  names = extract.list_images(a.images) if files is None else [rel for rel, _ in files]
  extract.check_readable(a.images, names, size)  # before any weights are made or read
  if captions is not None and not set(captions) & set(names):
    raise BadInput(f"--captions={a.captions}: names none of the {len(names)} images of {a.images}; "
                     f"expected their file names (e.g. {names[0] if names else 'x.jpg'})")
  record = extract.make_record(a.backbone, module, fields, size, a.dtype, a.weights, a.seed, a.images)
  # The files a resumed run would skip are this extraction's: checked before the weights are
  # read or made (a minute), and not again in extract.run.
  listed = files if files is not None else [(n, os.path.splitext(n)[0]) for n in names]
  extract.check_record(a.out, record)  # another extraction's features.json: said as such first
  extract.check_existing(a.out, extract.done_stems(a.out, listed), record)
  if a.weights:
    variables, ignored = weights.load(a.weights, module)
    print(f"{a.weights}: loaded ({ignored} tensors of the classifier / counters ignored)", flush=True)
  else:
    variables = registry.random_variables(module, seed=a.seed,
                                          size=None if size == extract.NATIVE else size)
    print(f"{a.backbone}: RANDOM weights (seed {a.seed}); the features mean nothing", flush=True)
  atomic.mark_folder(a.out, "jaxcap-extract")
  result = extract.run(a.images, a.out, module, variables, record, size, batch_size=a.batch_size,
                       progress=not a.no_progress, files=files, check=False)
  failed, done = result["failed"], result["done_before"]
  if result["extracted"]:
    print(f"extracted {result['extracted']} images in {result['seconds']:.1f} s "
          f"({result['extracted'] / max(result['seconds'], 1e-9):.2f} images/s, compilation "
          f"included); {done} done before", flush=True)
  else:
    print(f"extracted 0 images: {done} of the {result['total']} images of {a.images} already "
          f"have features in {a.out}", flush=True)
  if failed:
    _err(f"{len(failed)} unreadable image(s), skipped:",
         *(f"  {os.path.join(a.images, n)}: {why}" for n, why in failed))
  if done + result["extracted"] == 0:
    raise BadInput(f"--images={a.images}: none of the {result['total']} images could be read; "
                     "expected image files Pillow can open")
  if given is not None:
    skipped = {n for n, _ in failed}
    print(karpathy.write_karpathy_subset(a.out, a.name or given["dataset"] or "images", given,
                                         {stem for rel, stem in files if rel not in skipped}), flush=True)
  if captions is not None:
    print(karpathy.write_captions_json(a.out, a.name or "images", captions, names, {n for n, _ in failed}, a.val,
                                       a.test, a.seed, splits, warn=_err), flush=True)
  print(f"features in {a.out} (fc/, att/ [{record['att_size']}*{record['att_size']}, D], "
        "features.json)", flush=True)
  return 0


def run():
  """The program (``python scripts/extract_features.py``, console script ``jaxcap-extract``)."""
  cli.run_script(main)
