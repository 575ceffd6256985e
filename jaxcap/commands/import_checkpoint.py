"""Imports a checkpoint of another codebase (default self-critical.pytorch) as a jaxcap run directory.

  jaxcap-import --checkpoint model-best.pth --infos infos_tf-best.pkl --workdir runs/sc_transformer
  jaxcap-import --checkpoint model.safetensors --infos infos_fc.pkl --workdir runs/sc_fc --dataset cocotalk
  python -m jaxcap.commands.import_checkpoint ...     # the same without the console script

Writes ``<workdir>/config.json``, ``vocab.json``, ``info.json`` and an orbax checkpoint at the
run's iteration (:mod:`jaxcap.importers.self_critical`: the models it maps and how), then
prints the run's model, parameter count and the commands that use it. ``--dataset`` / ``--data_root``
set the data ``evaluate.py`` reads (default ``coco``: Karpathy's dataset_coco.json with bottom-up
features under ``data/coco``). A ``.pth`` needs torch; without it, convert it once to
``.safetensors`` (docs/USAGE.md). Exit 0; 2 on bad input (one ``error:`` line, nothing written).

``--format`` names the codebase: ``self_critical`` (the default, the options above) or a
format a paper declares (``IMPORTERS = {"<format>": "<module>"}`` in
``jaxcap/papers/<paper>/__init__.py``, collected over :data:`jaxcap.papers.PAPERS`). Such a
module provides ``FORMAT_HELP`` (one line), ``add_arguments(parser)`` (its options beside
``--checkpoint`` / ``--workdir``) and ``run_from_args(args)`` (writes the run, returns it
loaded; one-line ``BadInput`` on bad input). ``jaxcap-import --format FORMAT --help`` lists
that format's options.
"""

from __future__ import annotations

import argparse
import importlib
import os

import jax
import numpy as np

from jaxcap import cli
from jaxcap.features import record as record_lib
from jaxcap.importers import self_critical


DEFAULT_FORMAT = "self_critical"


def paper_importers() -> dict[str, str]:
  """``{format: module}`` the paper packages declare (their ``IMPORTERS``)."""
  from jaxcap import papers
  out = {}
  for paper in papers.PAPERS:
    declared = getattr(importlib.import_module(f"jaxcap.papers.{paper}"), "IMPORTERS", {})
    for name, module in declared.items():
      if name == DEFAULT_FORMAT or name in out:
        raise ValueError(f"jaxcap/papers/{paper}/__init__.py: import format {name!r} is declared twice")
      out[name] = module
  return out


def _format_arg(p: argparse.ArgumentParser, formats) -> None:
  p.add_argument("--format", default=DEFAULT_FORMAT, choices=(DEFAULT_FORMAT, *sorted(formats)),
                 help=f"The checkpoint's codebase (default {DEFAULT_FORMAT}: self-critical.pytorch); "
                      "--format FORMAT --help lists its options.")


def paper_parser(fmt: str, module) -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog=f"jaxcap-import --format {fmt}", description=module.FORMAT_HELP)
  _format_arg(p, [fmt])
  p.add_argument("--checkpoint", required=True, help="The checkpoint file.")
  p.add_argument("--workdir", required=True, help="The run directory to write (new or empty).")
  module.add_arguments(p)
  return p


def parser(formats=()) -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog="jaxcap-import", description=__doc__.split("\n")[0])
  add = p.add_argument
  _format_arg(p, formats)
  add("--checkpoint", required=True, help="self-critical.pytorch's model.pth, or model.safetensors.")
  add("--infos", required=True, help="Its infos_<id>.pkl (options and vocabulary).")
  add("--workdir", required=True, help="The run directory to write (new or empty).")
  add("--dataset", default="coco", choices=("coco", "cocotalk"), help="The run's data section.")
  add("--data_root", default=None, help="That data's folder (default data/coco).")
  add("--features", default=None,
      help="The features.json of the extractor that made the model's features (jaxcap-extract "
           "--backbone resnet101_self_critical): lets evaluate.py --images caption image files.")
  return p


def main() -> int:
  formats = paper_importers()
  pre = cli.ArgumentParser(add_help=False)
  _format_arg(pre, formats)
  fmt = pre.parse_known_args()[0].format
  if fmt != DEFAULT_FORMAT:
    return _main_paper(fmt, importlib.import_module(formats[fmt]))
  a = parser(formats).parse_args()
  run = self_critical.import_checkpoint(a.checkpoint, a.infos, a.workdir, dataset=a.dataset,
                                        data_root=a.data_root, features=a.features)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.params))
  print(f"imported {run.config.model.name} ({count:,} parameters, step {run.step}, "
        f"{len(run.vocab)} words) into {a.workdir}")
  print(f"  caption:  python -c \"import jaxcap; print(jaxcap.load('{a.workdir}').caption(FEATURES))\""
        "   (FEATURES: your [B, N, F] region or [B, F] global features)")
  # Only commands that run as printed: evaluate.py needs the run's data, and a record of random
  # backbone weights needs (and takes) no weights file.
  data = run.config.data
  dataset_json = data.get("dataset_json", "")
  path = dataset_json if os.path.isabs(dataset_json) else os.path.join(data.root, dataset_json)
  if a.features is None and dataset_json and not os.path.isfile(path):
    print(f"  evaluate: no {a.dataset} data at {data.root} ({path} missing); import again with "
          "--data_root naming it (docs/USAGE.md), then python evaluate.py --workdir "
          f"{a.workdir} --split test")
  elif a.features is None:
    print(f"  evaluate: python evaluate.py --workdir {a.workdir} --split test")
  if a.features:
    weights = "" if record_lib.is_random(record_lib.read(a.features)) else " --weights WEIGHTS.safetensors"
    print(f"  photos:   python evaluate.py --workdir {a.workdir} --images PHOTOS_DIR --out captions.json{weights}")
  return 0


def _main_paper(fmt: str, module) -> int:
  a = paper_parser(fmt, module).parse_args()
  run = module.run_from_args(a)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.params))
  print(f"imported {run.config.model.name} ({count:,} parameters and constants, step {run.step}, "
        f"{len(run.vocab)} words) from {fmt} into {a.workdir}")
  print(f"  caption:  python -c \"import jaxcap; print(jaxcap.load('{a.workdir}').caption(FEATURES))\""
        "   (FEATURES: your [B, N, F] region features)")
  return 0


def run():
  """The program (console script ``jaxcap-import``)."""
  cli.run_script(main)


if __name__ == "__main__":
  run()
