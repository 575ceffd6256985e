"""``python train.py``: :mod:`jaxcap.commands.train` (``jaxcap-train``) from a checkout."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxcap.commands import train  # noqa: E402  (after the checkout's path)

if __name__ == "__main__":
  train.run()
