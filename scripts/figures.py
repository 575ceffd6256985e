"""Figures of a trained run, drawn by :mod:`jaxcap.analysis.figures`.

``curves``: training loss, SCST reward and validation metrics from ``<workdir>/metrics.jsonl``
(resumed runs merged).

``words``: one greedily decoded caption of ``--split`` row ``--index`` with what the model's
``decode_step`` reports per word — attention over the region boxes (``aux["attention"]``, e.g.
``lstm``), ETA's gate (``aux["gbc_gate_layers"]``) and AAT's steps and confidences
(``aux["attention_steps"]``). One PNG per kind: ``<out>_attention.png``, ``<out>_gate.png``,
``<out>_steps.png``.

  python scripts/figures.py curves --workdir runs/transformer_synthetic --out curves.png
  python scripts/figures.py words --workdir runs/lstm --split test --index 0 --out lstm_test0
"""

from __future__ import annotations

import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, _HERE)


def curves(args):
  from jaxcap.analysis import figures
  figures.check_png_out(args.out, f"--out={args.out}", args.overwrite)
  figures.plot_training_curves(figures.load_metrics(args.workdir), out=args.out)
  print(args.out)
  return [args.out]


def words(args):
  from jaxcap.analysis import figures
  from jaxcap.analysis.words import FIGURE_SUFFIXES
  for suffix in FIGURE_SUFFIXES:  # before the run is loaded: any of them may be drawn
    figures.check_png_out(args.out + suffix, f"--out={args.out}: {args.out + suffix}", args.overwrite)
  import jaxcap
  from jaxcap.analysis.words import caption_aux, plot_word_figures, row_batch

  run = jaxcap.load(args.workdir)  # the best checkpoint
  config = run.config
  source = run.dataset.split(args.split)
  if not 0 <= args.index < len(source):
    raise SystemExit(f"--index {args.index}: split {args.split!r} has {len(source)} images")
  batch = row_batch(source, args.index)
  ws, aux = caption_aux(run.model, run.params, batch, run.vocab, int(config.decode.max_len))
  image_id = run.dataset.image_ids(args.split)[args.index]
  title = f"image {image_id}: {' '.join(w for w in ws if w != '<eos>')}"
  written = plot_word_figures(run.model, ws, aux, batch, args.out, title=title,
                              columns=args.columns)
  if not written:
    raise SystemExit(f"model.name={config.model.name!r} reports no per-word attention, gate or "
                     f"steps (decode aux keys: {sorted(aux)})")
  print(json.dumps({"caption": title, "written": written}))
  return written


def main(argv=None):
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=__doc__.split("\n")[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  c = sub.add_parser("curves")
  c.add_argument("--workdir", required=True)
  c.add_argument("--out", required=True)
  c.add_argument("--overwrite", action="store_true", help="Replace a PNG at --out jaxcap did not draw.")
  w = sub.add_parser("words")
  w.add_argument("--workdir", required=True)
  w.add_argument("--split", default="test")
  w.add_argument("--index", type=int, default=0, help="row of the image in the split")
  w.add_argument("--out", required=True, help="path prefix of the PNGs")
  w.add_argument("--columns", type=int, default=5, help="panels per row of the attention figure")
  w.add_argument("--overwrite", action="store_true", help="Replace PNGs at --out_* jaxcap did not draw.")
  args = ap.parse_args(argv)
  return curves(args) if args.cmd == "curves" else words(args)


if __name__ == "__main__":
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2
