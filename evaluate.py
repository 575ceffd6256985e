"""Evaluates a checkpoint, or scores any captioner's predictions file.

  python evaluate.py --workdir runs/transformer_synthetic [--split test] [--step N] [--beam-size 3]
  python evaluate.py --predictions P.json --references R.json --out S.json

The program is :mod:`jaxcap.commands.evaluate` (also installed as ``jaxcap-evaluate``); this
file runs it from a checkout without installing the package.
"""

import os
import sys

_REPO = os.path.dirname(os.path.abspath(__file__))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from jaxcap.commands.evaluate import *  # noqa: E402,F401,F403  (defines the flags)
from jaxcap.commands.evaluate import run  # noqa: E402

if __name__ == "__main__":
  run()
