"""AAT's per-word figure: the attention steps taken for each generated word, with their
confidences and weights (the paper's Figure 3 without the image; matplotlib, headless Agg, as
:mod:`jaxcap.analysis.figures`).

  plot_attention_steps(words, aux["attention_steps"], aux["confidences"], aux["beta"], out="steps.png")

Dimension legend: L generated words, S step slots (slot 0 = the non-visual step h1, then
n = 1 .. M_max).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxcap.analysis import figures
from jaxcap.errors import BadInput

_NON_VISUAL, _VISUAL = "#f58c1e", "#286edc"  # orange h1 slot, blue attention steps


def plot_attention_steps(words: Sequence[str], steps, confidences, beta, out: str | None = None,
                         ax=None, title: str = ""):
  """AAT's attention steps per word (the paper's Figure 3 without the image).

  One row per word, one column per step slot: slot 0 (orange) is the non-visual step h1, slots
  1 .. N(t) (blue) the attention steps taken; each is shaded by its normalised weight and shows
  ``confidence / weight`` (p_{t,n} / beta_{t,n}). Slots after N(t) stay empty.

  Args:
    words: the L generated words.
    steps: ``[L]`` int, N(t) (``aux["attention_steps"]``).
    confidences: ``[L, S]``, p_{t,n} (``aux["confidences"]``).
    beta: ``[L, S]``, the normalised weights (``aux["beta"]``).
    out: PNG path to write.
    ax: the Axes to draw on (default: a new figure).
  """
  steps = np.asarray(steps).astype(np.int64)
  conf = np.asarray(confidences, np.float64)
  beta = np.asarray(beta, np.float64)
  if beta.ndim != 2 or conf.shape != beta.shape or steps.shape != (beta.shape[0],):
    raise BadInput(f"plot_attention_steps: expected steps [L], confidences and beta [L, S]; "
                     f"got {steps.shape}, {conf.shape}, {beta.shape}")
  words = figures.one_word_per_row(words, beta.shape[0], "plot_attention_steps")
  n_words, n_slots = beta.shape
  fig, ax = figures.axes_or_new(ax, 1.6 + 1.1 * n_slots, 0.9 + 0.32 * n_words)
  from matplotlib.colors import to_rgb
  from matplotlib.patches import Rectangle
  for t in range(n_words):
    for n in range(n_slots):
      if n > steps[t]:
        ax.add_patch(Rectangle((n + 0.05, t + 0.1), 0.9, 0.8, fill=False, edgecolor="#cccccc"))
        continue
      colour = np.array(to_rgb(_NON_VISUAL if n == 0 else _VISUAL))
      weight = float(np.clip(beta[t, n], 0.0, 1.0))
      fill = 1.0 - 0.6 * weight * (1.0 - colour)  # tinted towards white: the text stays readable
      ax.add_patch(Rectangle((n + 0.05, t + 0.1), 0.9, 0.8, facecolor=fill, edgecolor=colour,
                             gid=f"step:{t}:{n}"))
      ax.text(n + 0.5, t + 0.5, f"{conf[t, n]:.2f}/{beta[t, n]:.2f}", ha="center", va="center",
              fontsize=7)
  ax.set_xlim(0, n_slots)
  ax.set_ylim(n_words, 0)
  ax.set_xticks(np.arange(n_slots) + 0.5, ["h1 (n=0)"] + [f"step {n}" for n in range(1, n_slots)],
                fontsize=8)
  ax.xaxis.tick_top()
  ax.set_yticks(np.arange(n_words) + 0.5, words)
  ax.tick_params(length=0)
  for side in ax.spines.values():
    side.set_visible(False)
  ax.set_title(title or "attention steps: confidence / weight", fontsize=9)
  return figures.finish(fig, out)
