"""ETA's per-word figure (jaxcap/papers/eta/figures.py): a valid, non-blank PNG for the mean
gate [L] and the per-layer gate [L, G]; a word count that does not match is one line."""

import numpy as np
import pytest

from jaxcap.papers.eta import figures
from tests.analysis.pngs import check_png as _check_png


def test_gate_png_1d_and_2d(tmp_path):
  words = ["a", "red", "cube", "<eos>"]
  figures.plot_gate(words, [0.2, 0.8, 0.5, 0.1], out=str(tmp_path / "gate.png"))
  _check_png(tmp_path / "gate.png")
  figures.plot_gate(words, np.linspace(0, 1, 12).reshape(4, 3), out=str(tmp_path / "gate2.png"))
  _check_png(tmp_path / "gate2.png")
  with pytest.raises(ValueError, match="one word per row"):
    figures.plot_gate(words[:2], [0.1, 0.2, 0.3])
