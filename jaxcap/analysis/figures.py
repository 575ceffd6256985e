"""Figures of a run and of a model's per-word internals (matplotlib, headless Agg).

Dimension legend: L generated words (EOS included when the caller keeps it), N regions.
A paper's own per-word figures live in its folder (``jaxcap/papers/eta/figures.py``: ETA's
gate; ``jaxcap/papers/aat/figures.py``: AAT's steps), drawn with the helpers here
(:func:`axes_or_new`, :func:`finish`, :func:`one_word_per_row`).

Every function takes plain arrays (NumPy, JAX or lists), draws on the matplotlib ``Axes`` it is
given (or on a new figure), returns the ``Figure`` and, with ``out=``, writes it as a PNG. No
pyplot: figures are ``matplotlib.figure.Figure`` objects on an Agg canvas, so nothing depends
on (or changes) the process's matplotlib backend, a notebook shows the returned figure, and a
loop of plots leaks no pyplot state.

  curves = load_metrics("runs/transformer_synthetic")           # metrics.jsonl, resumed runs merged
  plot_training_curves(curves, out="curves.png")
  plot_region_attention(words, alpha_LxN, boxes_Nx4, image_size=(640, 480), out="att.png")
  plot_box_relations(boxes_Nx4, ["query", "child", ...], out="fig3.png")   # Image Transformer
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence

import numpy as np

from jaxcap.errors import BadInput
from jaxcap.evaluation import coco_metrics

# The papers' colour conventions where they have one; otherwise matplotlib's tab10.
RELATION_COLOURS = {"query": "#dc1e1e", "parent": "#1eaa3c", "neighbour": "#286edc",
                    "child": "#e6be00", "none": "#bebebe"}


# ------------------------------------------------------------------------------------ plumbing
def new_figure(width: float, height: float, dpi: int = 100):
  """A ``Figure`` of ``width`` x ``height`` inches on an Agg canvas (no pyplot)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def png_metadata() -> dict:
  """The text chunk that marks a PNG as jaxcap's (``atomic.png_marked``: a later run may
  replace it without ``--overwrite``)."""
  from jaxcap import atomic
  from jaxcap.version import __version__
  return {atomic.PNG_MARKER: __version__}


def check_png_out(path: str, flag: str, overwrite: bool = False) -> None:
  """A PNG a program will write at ``path``: new, or one jaxcap drew (its text chunk), unless
  ``overwrite`` (``atomic.check_output``: one line naming ``flag`` and ``--overwrite``)."""
  from jaxcap import atomic
  atomic.check_output(path, flag, overwrite=overwrite, mine=atomic.png_marked,
                      what="a figure jaxcap drew")


def save_png(fig, path: str, dpi: int | None = None) -> str:
  """Writes ``fig`` as a PNG atomically (temporary file, then rename), marked as jaxcap's
  (:func:`png_metadata`); returns ``path``."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  if not isinstance(fig.canvas, FigureCanvasAgg):  # a pyplot figure of another backend
    FigureCanvasAgg(fig)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}.png"
  try:
    fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.05,
                metadata=png_metadata())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return path


def axes_or_new(ax, width: float, height: float):
  """``(fig, ax)``: the given Axes and its figure, or a new one-panel figure."""
  if ax is not None:
    return ax.figure, ax
  fig = new_figure(width, height)
  return fig, fig.add_subplot()


def finish(fig, out):
  """``fig``, written as a PNG to ``out`` first when given."""
  if out:
    save_png(fig, out)
  return fig


def one_word_per_row(words: Sequence[str], n: int, what: str) -> list[str]:
  """``words`` as strings, or a one-line BadInput naming ``what`` when they are not ``n``."""
  words = [str(w) for w in words]
  if len(words) != n:
    raise BadInput(f"{what}: expected one word per row ({n}), got {len(words)} words")
  return words


# ------------------------------------------------------------------------------- training curves
def load_metrics(path_or_records) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Reads ``metrics.jsonl`` into ``{name: (steps [n] int, values [n] float)}``, sorted by step.

  A resumed run appends from its last checkpoint, so a step can appear twice; the line written
  last wins. ``null`` / NaN / missing values (JSON has no NaN; ``MetricWriter`` writes null) are
  skipped, as are the bookkeeping keys ``step`` and ``time``.

  Args:
    path_or_records: a workdir, a ``metrics.jsonl`` path, or an iterable of its records (dicts).
  """
  if isinstance(path_or_records, (str, os.PathLike)):
    path = os.fspath(path_or_records)
    if os.path.isdir(path):
      path = os.path.join(path, "metrics.jsonl")
    records, where = [], []
    with open(path, "rb") as f:
      for k, line in enumerate(f):
        if line.strip():
          try:
            records.append(json.loads(line.decode("utf-8")))
          except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise BadInput(f"{path}: line {k + 1} is not JSON; expected one metrics record "
                             "per line") from None
          where.append(f"{path}: line {k + 1}")
  else:
    records = list(path_or_records)
    where = [f"records[{i}]" for i in range(len(records))]
  by_name: dict[str, dict[int, float]] = {}
  for rec, at in zip(records, where):
    if not isinstance(rec, dict):
      raise BadInput(f"{at}: a JSON {type(rec).__name__}; expected a metrics record (an object "
                     'such as {"step": 100, "train/loss": 2.3})')
    step = rec.get("step")
    if step is None:
      continue
    if not isinstance(step, int) or isinstance(step, bool):
      raise BadInput(f"{at}: step {step!r:.40}; expected an integer")
    for name, value in rec.items():
      if name in ("step", "time") or value is None or isinstance(value, (bool, str)):
        continue
      if not isinstance(value, (int, float)):
        raise BadInput(f"{at}: {name} is {value!r:.40}; expected a number or null")
      value = float(value)
      if math.isfinite(value):
        by_name.setdefault(name, {})[step] = value
  out = {}
  for name, points in sorted(by_name.items()):
    steps = np.array(sorted(points), np.int64)
    out[name] = (steps, np.array([points[s] for s in steps], np.float64))
  return out


def _curve_panels(curves: Mapping) -> list[tuple[str, list[str]]]:
  panels = []
  if "train/loss" in curves:  # cross-entropy, then the SCST loss once SCST starts
    panels.append(("training loss", ["train/loss"]))
  reward = [n for n in ("train/reward", "train/greedy_reward") if n in curves]
  if reward:
    panels.append(("SCST reward", reward))
  val = [n for n in curves if n.startswith("val/")]
  if val:
    panels.append(("validation", val))
  return panels


def plot_training_curves(metrics, out: str | None = None, axes=None,
                         panels: Sequence[tuple[str, Sequence[str]]] | None = None):
  """Training loss, SCST reward and validation metrics against the step; caption scores named
  and scaled as every printed table shows them (:func:`jaxcap.evaluation.coco_metrics.display`:
  ``val/CIDEr`` 0.75 drawn as CIDEr-D 75, the axis labelled x100).

  Args:
    metrics: what :func:`load_metrics` returns, or anything it reads (workdir, path, records).
    out: PNG path to write.
    axes: a sequence of Axes, one per panel (default: a new figure, panels side by side).
    panels: ``[(title, [metric names])]``; default: "training loss" (``train/loss``), "SCST
      reward" (``train/reward``, when the run used SCST) and "validation" (every ``val/*``).

  Returns:
    The Figure.
  """
  curves = metrics if isinstance(metrics, Mapping) else load_metrics(metrics)
  panels = list(panels) if panels is not None else _curve_panels(curves)
  if not panels:
    raise BadInput(f"plot_training_curves: no train/loss, train/reward or val/* metrics; got "
                     f"{sorted(curves)}")
  if axes is None:
    fig = new_figure(4.0 * len(panels), 3.0)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
  elif len(axes) < len(panels):
    raise BadInput(f"plot_training_curves: {len(panels)} panels, but {len(axes)} axes given")
  for ax, (title, names) in zip(axes, panels):
    shown = [coco_metrics.display(name.split("/", 1)[-1]) for name in names]
    scales = {scale for _, scale in shown}
    for name, (label, scale) in zip(names, shown):
      if name not in curves:
        raise BadInput(f"plot_training_curves: no metric {name!r}; have {sorted(curves)}")
      steps, values = curves[name]
      # A panel of scores alone says x100 on its axis; beside other curves, on each label.
      label += f" x{scale:g}" if scale != 1.0 and len(scales) > 1 else ""
      ax.plot(steps, values * scale, marker="o" if len(steps) < 20 else None, ms=3, label=label)
    if scales == {100.0}:
      ax.set_ylabel("score x100")
    if "train/reward" in curves and "train/loss" in names:  # where SCST's loss takes over
      ax.axvline(curves["train/reward"][0][0], color="grey", linestyle=":", linewidth=1)
      ax.text(curves["train/reward"][0][0], 1.0, " SCST", transform=ax.get_xaxis_transform(),
              va="top", fontsize=8, color="grey")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if len(names) > 1 or title == "validation":
      ax.legend(fontsize="small")
  return finish(axes[0].figure, out)


# ----------------------------------------------------------------------- attention over regions
def _image_extent(image, image_size, boxes):
  """``(image array or None, (width, height))``: the image's own size, else ``image_size``,
  else the boxes' extent (1 x 1 for normalised boxes)."""
  if image is not None:
    image = np.asarray(image)
    return image, (image.shape[1], image.shape[0])
  if image_size is not None:
    return None, tuple(image_size)
  extent = float(np.max(boxes[:, 2:], initial=1.0))
  return None, (1.0, 1.0) if extent <= 1.0 else (extent, extent)


def plot_region_attention(words: Sequence[str], attention_LxN, boxes_Nx4, *, image=None,
                          image_size: tuple[float, float] | None = None, out: str | None = None,
                          axes=None, columns: int = 4, title: str = ""):
  """Attention over the region boxes, one panel per generated word.

  Each box is filled in proportion to its weight (the word's largest weight fully opaque) and
  the most attended box is outlined in red with its weight written in it.

  Args:
    words: the L generated words.
    attention_LxN: the weights over the N regions for each word (rows need not sum to 1).
    boxes_Nx4: ``x1 y1 x2 y2`` in pixels of ``image`` / ``image_size``, or in [0, 1].
    image: an ``[H, W]`` or ``[H, W, 3]`` image drawn under the boxes (sets the canvas size).
    image_size: ``(width, height)`` of the canvas without an image (default: the boxes' extent,
      1 x 1 for normalised boxes).
    out: PNG path to write.
    axes: a sequence of at least L Axes (default: a new figure with ``columns`` per row).
    columns: panels per row of a new figure.
    title: the figure's title (a new figure only).
  """
  att = np.asarray(attention_LxN, np.float64)
  boxes = np.asarray(boxes_Nx4, np.float64)
  if att.ndim != 2 or boxes.shape != (att.shape[1], 4):
    raise BadInput(f"plot_region_attention: expected attention [L, N] and boxes [N, 4], got "
                     f"{att.shape} and {boxes.shape}")
  words = one_word_per_row(words, att.shape[0], "plot_region_attention")
  image, (width, height) = _image_extent(image, image_size, boxes)
  if axes is None:
    cols = max(1, min(columns, len(words)))
    rows = max(1, math.ceil(len(words) / cols))
    aspect = height / max(width, 1e-9)
    fig = new_figure(2.6 * cols, 2.6 * aspect * rows + (0.4 if title else 0.0))
    grid = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in grid[len(words):]:
      ax.set_axis_off()
    axes = grid
    if title:
      fig.suptitle(title)
  elif len(axes) < len(words):
    raise BadInput(f"plot_region_attention: {len(words)} words, but {len(axes)} axes given")
  from matplotlib.patches import Rectangle
  for t, (ax, word) in enumerate(zip(axes, words)):
    if image is not None:
      ax.imshow(image, extent=(0, width, height, 0), cmap="gray" if image.ndim == 2 else None)
    else:
      ax.add_patch(Rectangle((0, 0), width, height, facecolor="#f4f4f4", edgecolor="none"))
    w = att[t]
    scale = float(np.max(w)) if np.max(w) > 0 else 1.0
    best = int(np.argmax(w))
    for n in np.argsort(w):  # the most attended box drawn last, on top
      x1, y1, x2, y2 = boxes[n]
      a = float(np.clip(w[n] / scale, 0.0, 1.0))
      ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, facecolor=(1.0, 0.55, 0.0, 0.7 * a),
                             edgecolor="#d62728" if n == best else (0.2, 0.2, 0.2, 0.3 + 0.5 * a),
                             linewidth=2.0 if n == best else 0.8))
    x1, y1, x2, y2 = boxes[best]
    ax.text((x1 + x2) / 2, (y1 + y2) / 2, f"{w[best]:.2f}", ha="center", va="center",
            fontsize=8, color="black")
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)  # image coordinates: y down
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(word, fontsize=10)
  return finish(axes[0].figure, out)


# --------------------------------------------------------------- boxes coloured by a relation
def plot_box_relations(boxes_Nx4, labels: Sequence[str], out: str | None = None, ax=None,
                       colours: Mapping[str, str] | None = None, image=None,
                       image_size: tuple[float, float] | None = None, title: str = ""):
  """Region boxes coloured by a label each, with their index and a legend (the Image
  Transformer's Figure 3: a query region and its parent / neighbour / child regions).

  Args:
    boxes_Nx4: ``x1 y1 x2 y2`` in pixels of ``image`` / ``image_size``, or in [0, 1].
    labels: N labels, e.g. ``"query"``, ``"parent"``, ``"neighbour"``, ``"child"``, ``"none"``.
    colours: ``{label: colour}`` (default :data:`RELATION_COLOURS`, then tab10 for others).
    image, image_size: as in :func:`plot_region_attention`.
  """
  boxes = np.asarray(boxes_Nx4, np.float64)
  if boxes.ndim != 2 or boxes.shape[1] != 4 or len(labels) != len(boxes):
    raise BadInput(f"plot_box_relations: expected boxes [N, 4] and N labels, got "
                     f"{boxes.shape} and {len(labels)} labels")
  from matplotlib.patches import Patch, Rectangle
  colours = dict(RELATION_COLOURS if colours is None else colours)
  extra = [l for l in dict.fromkeys(labels) if l not in colours]
  tab10 = [f"C{i}" for i in range(10)]
  colours.update({l: tab10[i % 10] for i, l in enumerate(extra)})
  image, (width, height) = _image_extent(image, image_size, boxes)
  fig, ax = axes_or_new(ax, 4.2, 4.6)
  if image is not None:
    ax.imshow(image, extent=(0, width, height, 0), cmap="gray" if image.ndim == 2 else None)
  order = sorted(range(len(boxes)), key=lambda m: labels[m] == "query")  # the query on top
  for m in order:
    x1, y1, x2, y2 = boxes[m]
    query = labels[m] == "query"
    ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colours[labels[m]],
                           linewidth=3.0 if query else 1.8))
    ax.text(x1 + 0.01 * width, y1 + 0.01 * height, str(m), color=colours[labels[m]], va="top",
            fontsize=9, fontweight="bold")
  ax.set_xlim(0, width)
  ax.set_ylim(height, 0)
  ax.set_aspect("equal")
  ax.set_xticks([])
  ax.set_yticks([])
  shown = [l for l in colours if l in labels and l != "none"]
  ax.legend(handles=[Patch(facecolor=colours[l], label=l) for l in shown], loc="upper center",
            bbox_to_anchor=(0.5, -0.02), ncol=max(1, len(shown)), fontsize=8, frameon=False)
  if title:
    ax.set_title(title, fontsize=9)
  return finish(fig, out)
