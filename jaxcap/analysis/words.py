"""One generated caption with what the model reports per word, for the per-word figures.

Dimension legend: B images in the batch, T decoded positions, L words kept (up to and
including EOS), N regions.

``caption_aux(model, params, batch, vocab, max_len, row=0)`` greedily decodes ``batch`` with
``return_aux=True`` and returns row ``row``'s words and its ``decode_step`` aux cut to those
words, e.g. ``aux["attention"]`` [L, N] (every attention model: docs/DESIGN.md, section 4),
a paper's own keys (ETA's ``aux["gbc_gate_layers"]`` [L, G], AAT's ``aux["attention_steps"]``
[L]): the inputs of :mod:`jaxcap.analysis.figures` and of the model's ``word_figures``.
"""

from __future__ import annotations

import numpy as np
from jaxcap import decoding
from jaxcap.analysis import figures
from jaxcap.data import pipeline
from jaxcap.data.vocab import EOS, PAD
from jaxcap.errors import BadInput


# The PNGs plot_word_figures may write after its prefix: the attention, ETA's gate, AAT's steps
# (a model's word_figures adds its own name; a new one is added here).
FIGURE_SUFFIXES = ("_attention.png", "_gate.png", "_steps.png")


def row_batch(source, index: int) -> dict:
  """The evaluation batch of one image: row ``index`` of a split ``source``."""

  class _Row:
    def __len__(self):
      return 1

    def __getitem__(self, i):
      if i != 0:
        raise IndexError(i)
      return source[index]

    def collate(self, *args, **kwargs):
      return source.collate(*args, **kwargs)

  return next(iter(pipeline.eval_batches(_Row(), 1, num_threads=0)))


def caption_aux(model, params, batch, vocab, max_len: int, row: int = 0):
  """``(words [L], {name: array [L, ...]})`` of the greedy caption of ``batch`` row ``row``.

  EOS, when generated, is kept as the word ``"<eos>"`` (its step has aux too).
  """
  out = decoding.greedy(model, params, batch, max_len=max_len, return_aux=True)
  tokens = np.asarray(out.tokens[row])
  n = int(np.sum(tokens != PAD))
  words = [vocab.itos[int(i)] if int(i) != EOS else "<eos>" for i in tokens[:n]]
  aux = {k: np.asarray(v[row, :n]) for k, v in (out.aux or {}).items()}
  return words, aux


def plot_word_figures(model, words, aux: dict, batch: dict, out_prefix: str, *, row: int = 0,
                      title: str = "", columns: int = 6) -> list[str]:
  """Draws every per-word figure the decoder's ``aux`` supports; returns the PNG paths.

  ``<out_prefix>_attention.png`` (soft attention over the region boxes, when ``aux`` has
  ``attention`` and the batch has ``boxes``), then the model's own (its ``word_figures``:
  ETA's ``_gate.png``, AAT's ``_steps.png``). ``words`` / ``aux`` are :func:`caption_aux`'s
  for batch row ``row``.
  """
  written = []
  if "attention" in aux and "boxes" in batch:
    n = int(np.sum(np.asarray(batch["feats_mask"][row])))  # the image's real regions
    boxes = np.asarray(batch["boxes"][row])[:n]
    out = f"{out_prefix}_attention.png"
    figures.plot_region_attention(words, np.asarray(aux["attention"])[:, :n], boxes, title=title,
                                  columns=columns, out=out)
    written.append(out)
  own = getattr(model, "word_figures", None)  # the nearest neighbour draws nothing
  if own is not None:
    written += own(words, aux, out_prefix, title=title)
  return written


def plot_run_words(model, params, vocab, batch: dict, max_len: int, out_prefix: str, *,
                   index: int = 0, columns: int = 6) -> list[str]:
  """The per-word figures of the greedy caption of ``batch`` row ``index``
  (:func:`plot_word_figures`); one line when the model reports nothing to draw."""
  import jax
  import jax.numpy as jnp
  batch = jax.tree.map(jnp.asarray, batch)
  words, aux = caption_aux(model, params, batch, vocab, max_len, row=index)
  title = " ".join(w for w in words if w != "<eos>")
  written = plot_word_figures(model, words, aux, jax.device_get(batch), out_prefix, row=index,
                              title=title, columns=columns)
  if not written:
    name = getattr(model, "registry_name", type(model).__name__)
    impl = getattr(model, "attention_impl", "einsum")
    why = (f"; its attention_impl={impl!r} kernels return no weights: decode with "
           f"attention_impl='einsum' (same parameters)" if impl != "einsum" else "")
    raise BadInput(f"plot_words: model {name!r} reports no per-word attention, gate or steps "
                     f"(decode aux keys: {sorted(aux)}){why}")
  return written
