"""ETA's per-word figure: the gated bilateral controller's gate per generated word (matplotlib,
headless Agg, as :mod:`jaxcap.analysis.figures`).

  plot_gate(words, aux["gbc_gate"], out="gate.png")   # [L]: bars; aux["gbc_gate_layers"] [L, G]: a heat map

Dimension legend: L generated words, G gate layers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxcap.analysis import figures
from jaxcap.errors import BadInput

_BAR = "#286edc"


def plot_gate(words: Sequence[str], gate, out: str | None = None, ax=None, title: str = ""):
  """ETA's gated bilateral controller per word: how much of the semantic pathway is kept.

  Args:
    words: the L generated words.
    gate: ``[L]`` (``aux["gbc_gate"]``: the mean over channels and layers) drawn as bars, or
      ``[L, G]`` (``aux["gbc_gate_layers"]``) drawn as a layer x word heat map.
    out: PNG path to write.
    ax: the Axes to draw on (default: a new figure).
  """
  g = np.asarray(gate, np.float64)
  if g.ndim not in (1, 2):
    raise BadInput(f"plot_gate: expected gate [L] or [L, G], got shape {g.shape}")
  words = figures.one_word_per_row(words, g.shape[0], "plot_gate")
  fig, ax = figures.axes_or_new(ax, max(3.0, 0.45 * len(words) + 1.2), 2.8 if g.ndim == 1 else 1.6 + 0.3 * g.shape[1])
  x = np.arange(len(words))
  if g.ndim == 1:
    ax.bar(x, g, color=_BAR)
    ax.set_ylim(0, max(1.0, float(np.max(g, initial=0.0))))
    ax.set_ylabel("gate")
    for i, v in enumerate(g):
      ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
  else:
    im = ax.imshow(g.T, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, origin="lower")
    ax.set_yticks(np.arange(g.shape[1]), [f"layer {i + 1}" for i in range(g.shape[1])])
    ax.figure.colorbar(im, ax=ax, label="gate")
  ax.set_xticks(x, words, rotation=45, ha="right")
  ax.set_title(title or "gated bilateral controller per word")
  return figures.finish(fig, out)
