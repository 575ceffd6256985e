"""``python evaluate.py``: :mod:`jaxcap.commands.evaluate` (``jaxcap-evaluate``) from a checkout."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxcap.commands import evaluate  # noqa: E402  (after the checkout's path)

if __name__ == "__main__":
  evaluate.run()
