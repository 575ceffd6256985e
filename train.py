"""Trains a jaxcap model, then evaluates its best checkpoint on the test split.

  python train.py                                   # Transformer on the embedded synthetic data
  python train.py --config configs/eta.py:synthetic,variant=stacked_v --workdir runs/stacked_v
  python train.py --config configs/transformer.py:coco --config.batch_size=100 --config.dtype=bfloat16

The program is :mod:`jaxcap.commands.train` (also installed as ``jaxcap-train``); this file
runs it from a checkout without installing the package.
"""

import os
import sys

_REPO = os.path.dirname(os.path.abspath(__file__))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from jaxcap.commands.train import *  # noqa: E402,F401,F403  (defines the flags)
from jaxcap.commands.train import run  # noqa: E402

if __name__ == "__main__":
  run()
