"""Draws AAT's attention steps for one generated caption as a PNG (the paper's Figure 3,
without the image).

One row per generated word: the orange box is the non-visual step (slot 0, ``h1_t``), the blue
boxes are the attention steps ``n = 1 .. N(t)``; each box shows ``confidence/weight``
(``p_{t,n}`` / normalised ``beta_{t,n}``) and is filled in proportion to the weight. Slots
beyond ``N(t)`` stay empty.

  python scripts/plot_attention_steps.py --workdir /tmp/aat_run --split test --index 0 \\
      --out attention_steps.png
  python scripts/plot_attention_steps.py --random_init --out /tmp/steps.png   # untrained demo

Needs no plotting library: a 5x7 bitmap font, a numpy rasteriser and a zlib PNG writer.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import zlib

import numpy as np

# 5x7 glyphs, one string of 7 rows per character ('#' = ink).
_FONT_ROWS = {
    "a": ".....|.....|.###.|....#|.####|#...#|.####", "b": "#....|#....|####.|#...#|#...#|#...#|####.",
    "c": ".....|.....|.###.|#....|#....|#...#|.###.", "d": "....#|....#|.####|#...#|#...#|#...#|.####",
    "e": ".....|.....|.###.|#...#|#####|#....|.###.", "f": "..##.|.#..#|.#...|###..|.#...|.#...|.#...",
    "g": ".....|.####|#...#|#...#|.####|....#|.###.", "h": "#....|#....|#.##.|##..#|#...#|#...#|#...#",
    "i": "..#..|.....|.##..|..#..|..#..|..#..|.###.", "j": "...#.|.....|..##.|...#.|...#.|#..#.|.##..",
    "k": "#....|#....|#..#.|#.#..|##...|#.#..|#..#.", "l": ".##..|..#..|..#..|..#..|..#..|..#..|.###.",
    "m": ".....|.....|##.#.|#.#.#|#.#.#|#...#|#...#", "n": ".....|.....|#.##.|##..#|#...#|#...#|#...#",
    "o": ".....|.....|.###.|#...#|#...#|#...#|.###.", "p": ".....|.....|####.|#...#|####.|#....|#....",
    "q": ".....|.....|.####|#...#|.####|....#|....#", "r": ".....|.....|#.##.|##..#|#....|#....|#....",
    "s": ".....|.....|.####|#....|.###.|....#|####.", "t": ".#...|.#...|###..|.#...|.#...|.#..#|..##.",
    "u": ".....|.....|#...#|#...#|#...#|#..##|.##.#", "v": ".....|.....|#...#|#...#|#...#|.#.#.|..#..",
    "w": ".....|.....|#...#|#...#|#.#.#|#.#.#|.#.#.", "x": ".....|.....|#...#|.#.#.|..#..|.#.#.|#...#",
    "y": ".....|.....|#...#|#...#|.####|....#|.###.", "z": ".....|.....|#####|...#.|..#..|.#...|#####",
    "0": ".###.|#...#|#..##|#.#.#|##..#|#...#|.###.", "1": "..#..|.##..|..#..|..#..|..#..|..#..|.###.",
    "2": ".###.|#...#|....#|...#.|..#..|.#...|#####", "3": "#####|...#.|..#..|...#.|....#|#...#|.###.",
    "4": "...#.|..##.|.#.#.|#..#.|#####|...#.|...#.", "5": "#####|#....|####.|....#|....#|#...#|.###.",
    "6": "..##.|.#...|#....|####.|#...#|#...#|.###.", "7": "#####|....#|...#.|..#..|.#...|.#...|.#...",
    "8": ".###.|#...#|#...#|.###.|#...#|#...#|.###.", "9": ".###.|#...#|#...#|.####|....#|...#.|.##..",
    ".": ".....|.....|.....|.....|.....|.##..|.##..", "/": ".....|....#|...#.|..#..|.#...|#....|.....",
    "-": ".....|.....|.....|#####|.....|.....|.....", ":": ".....|.##..|.##..|.....|.##..|.##..|.....",
    "=": ".....|.....|#####|.....|#####|.....|.....", "'": ".##..|..#..|.#...|.....|.....|.....|.....",
    "<": "...#.|..#..|.#...|#....|.#...|..#..|...#.", ">": ".#...|..#..|...#.|....#|...#.|..#..|.#...",
    "(": "...#.|..#..|.#...|.#...|.#...|..#..|...#.", ")": ".#...|..#..|...#.|...#.|...#.|..#..|.#...",
    "?": ".###.|#...#|....#|...#.|..#..|.....|..#..", " ": ".....|.....|.....|.....|.....|.....|.....",
}
FONT = {c: np.array([[ch == "#" for ch in row] for row in rows.split("|")], bool)
        for c, rows in _FONT_ROWS.items()}
GLYPH_W, GLYPH_H = 6, 8  # advance: 5x7 glyph plus one pixel of spacing

WHITE = np.array([255, 255, 255], np.uint8)
BLACK = np.array([0, 0, 0], np.uint8)
GREY = np.array([190, 190, 190], np.uint8)
ORANGE = np.array([245, 140, 30], np.uint8)
BLUE = np.array([40, 110, 220], np.uint8)


def draw_text(img, x: int, y: int, text: str, color=BLACK) -> None:
  """Writes ``text`` (lowercased; unknown characters as '?') with its top-left at (x, y)."""
  for i, ch in enumerate(text.lower()):
    glyph = FONT.get(ch, FONT["?"])
    x0 = x + i * GLYPH_W
    region = img[y:y + 7, x0:x0 + 5]
    h, w = region.shape[:2]
    region[glyph[:h, :w]] = color


def draw_box(img, x: int, y: int, w: int, h: int, outline, fill=None) -> None:
  if fill is not None:
    img[y:y + h, x:x + w] = fill
  img[y, x:x + w] = outline
  img[y + h - 1, x:x + w] = outline
  img[y:y + h, x] = outline
  img[y:y + h, x + w - 1] = outline


def render(words, steps, confidences, beta, title: str = "", scale: int = 2) -> np.ndarray:
  """The figure as an ``[H, W, 3]`` uint8 image.

  Args:
    words: the generated words (EOS included as "<eos>" if wanted), length L.
    steps: int ``[L]``, N(t) per word.
    confidences: float ``[L, S]``, p_{t,n} (slot 0 = the non-visual step).
    beta: float ``[L, S]``, normalised weights.
    title: a line above the table.
    scale: integer pixel upscaling.
  """
  steps = np.asarray(steps)
  confidences = np.asarray(confidences, np.float64)
  beta = np.asarray(beta, np.float64)
  n_words, n_slots = beta.shape
  if confidences.shape != beta.shape or steps.shape != (n_words,) or len(words) != n_words:
    raise ValueError(f"render: expected words [L], steps [L], confidences/beta [L, S]; got "
                     f"{len(words)}, {steps.shape}, {confidences.shape}, {beta.shape}")
  word_w = GLYPH_W * max([len(w) for w in words] + [6]) + 8
  box_w, box_h, gap = GLYPH_W * 9 + 6, 16, 4
  top = 2 * (GLYPH_H + 4) + 6
  width = max(word_w + n_slots * (box_w + gap) + 6, GLYPH_W * len(title) + 12)
  height = top + n_words * (box_h + gap) + 6
  img = np.empty((height, width, 3), np.uint8)
  img[:] = WHITE
  draw_text(img, 6, 4, title)
  y_head = 4 + GLYPH_H + 6
  draw_text(img, 6, y_head, "word")
  for n in range(n_slots):
    label = "h1 (n=0)" if n == 0 else f"step {n}"
    draw_text(img, word_w + n * (box_w + gap) + 3, y_head, label)
  for t, word in enumerate(words):
    y = top + t * (box_h + gap)
    draw_text(img, 6, y + (box_h - 7) // 2, word)
    for n in range(n_slots):
      x = word_w + n * (box_w + gap)
      if n > steps[t]:
        draw_box(img, x, y, box_w, box_h, GREY)
        continue
      color = ORANGE if n == 0 else BLUE
      weight = float(np.clip(beta[t, n], 0.0, 1.0))
      # Tint towards white so that the text stays readable on a weight of 1.
      fill = (WHITE - 0.6 * weight * (WHITE.astype(np.float64) - color)).astype(np.uint8)
      draw_box(img, x, y, box_w, box_h, color, fill)
      draw_text(img, x + 3, y + (box_h - 7) // 2, f"{confidences[t, n]:.2f}/{beta[t, n]:.2f}")
  return np.repeat(np.repeat(img, scale, axis=0), scale, axis=1)


def png_bytes(img: np.ndarray) -> bytes:
  """Encodes an ``[H, W, 3]`` uint8 image as an 8-bit RGB PNG (filter 0 on every row)."""
  img = np.ascontiguousarray(img, np.uint8)
  if img.ndim != 3 or img.shape[2] != 3:
    raise ValueError(f"png_bytes: expected an [H, W, 3] uint8 image, got shape {img.shape}")
  h, w, _ = img.shape
  raw = np.concatenate([np.zeros((h, 1), np.uint8), img.reshape(h, w * 3)], axis=1).tobytes()

  def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

  header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
  return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
          + chunk(b"IEND", b""))


def write_png(path: str, img: np.ndarray) -> None:
  """Writes atomically (temporary file, then rename)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(png_bytes(img))
  os.replace(tmp, path)


def caption_aux(model, params, batch, vocab, max_len: int):
  """Greedy caption of the first image of ``batch`` with its per-word aux (cut after EOS)."""
  from jaxcap import decoding
  from jaxcap.data.vocab import EOS, PAD
  out = decoding.greedy(model, params, batch, max_len=max_len, return_aux=True)
  tokens = np.asarray(out.tokens[0])
  n = int(np.sum(tokens != PAD))
  words = [vocab.itos[int(i)] if int(i) != EOS else "<eos>" for i in tokens[:n]]
  aux = {k: np.asarray(v[0, :n]) for k, v in out.aux.items()}
  return words, aux


class _Row:
  """One row of a split source, as a source of length 1."""

  def __init__(self, source, index: int):
    self.source, self.index = source, index

  def __len__(self):
    return 1

  def __getitem__(self, i):
    if i != 0:
      raise IndexError(i)
    return self.source[self.index]

  def collate(self, *args, **kwargs):
    return self.source.collate(*args, **kwargs)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", help="a training workdir (config.json, vocab.json, checkpoints)")
  ap.add_argument("--random_init", action="store_true",
                  help="no workdir: an untrained configs/aat.py:synthetic model (a demo)")
  ap.add_argument("--split", default="test")
  ap.add_argument("--index", type=int, default=0, help="row of the image in the split")
  ap.add_argument("--out", default="attention_steps.png")
  args = ap.parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  import ml_collections
  from jaxcap.data import pipeline
  from jaxcap.training import train_lib

  if args.random_init:
    from configs import aat as aat_config
    config = aat_config.get_config("synthetic")
    trainer = train_lib.Trainer(config, "/nonexistent-unused")
    params = trainer.initial_state().params
  elif args.workdir:
    path = os.path.join(args.workdir, "config.json")
    try:
      with open(path) as f:
        config = ml_collections.ConfigDict(json.load(f))
    except (OSError, ValueError) as e:
      raise SystemExit(f"{path}: expected the JSON config written by training ({e})")
    trainer = train_lib.Trainer(config, args.workdir)
    params = trainer.load().params
  else:
    raise SystemExit("give --workdir (a trained run) or --random_init")
  if getattr(trainer.model, "registry_name", "") != "aat":
    raise SystemExit(f"model.name={trainer.model.registry_name!r}: this script draws AAT's attention steps")
  source = trainer.dataset.split(args.split)
  if not 0 <= args.index < len(source):
    raise SystemExit(f"--index {args.index}: split {args.split!r} has {len(source)} images")
  batch = next(iter(pipeline.eval_batches(_Row(source, args.index), 1, num_threads=0)))
  words, aux = caption_aux(trainer.model, params, batch, trainer.dataset.vocab,
                           int(config.decode.max_len))
  image_id = trainer.dataset.image_ids(args.split)[args.index]
  title = f"image {image_id}: {' '.join(w for w in words if w != '<eos>')}"
  img = render(words, aux["attention_steps"], aux["confidences"], aux["beta"], title=title)
  write_png(args.out, img)
  print(f"{args.out}: {len(words)} words, attention steps {aux['attention_steps'].tolist()}")


if __name__ == "__main__":
  main()
