"""Extracts image features from a folder of images (and a Karpathy JSON of their captions).

  python scripts/extract_features.py --images photos/ --out data/mine --backbone resnet101 --weights resnet101.safetensors

The program is :mod:`jaxcap.commands.extract` (also installed as ``jaxcap-extract``); this
file runs it from a checkout without installing the package.
"""

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from jaxcap.commands import extract  # noqa: E402

if __name__ == "__main__":
  extract.run()
