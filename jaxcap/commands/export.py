"""Writes a run's whole captioner to one file that runs with jax and numpy only.

  jaxcap-export --workdir runs/transformer_synthetic --out captioner.jaxcap
  jaxcap-export --workdir runs/mine --out mine.jaxcap --method beam --beam_size 5 --max_len 20 --weights resnet101.safetensors
  python -m jaxcap.commands.export --workdir RUN --out FILE     # the same without the console script

The file (:mod:`jaxcap.export`) holds the encoder, greedy and beam search, the image backbone when
the run has a ``features.json`` (jaxcap-extract's features) or was trained from pixels (its
trained backbone), the parameters, the vocabulary,
the decoding settings (the run's ``config.decode``, with ``--method`` / ``--beam_size`` /
``--max_len`` replacing it) and the run's identity (config hash, step). ``jaxcap.serving.load``
reads it back (no flax, no jaxcap model). Exit 0; 2 on bad input (one ``error:`` line, nothing
written).
"""

from __future__ import annotations

import argparse
import os

from jaxcap import atomic, cli
from jaxcap.errors import BadInput


def parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog="jaxcap-export", description=__doc__.split("\n")[0])
  add = p.add_argument
  add("--workdir", required=True, help="The run directory (train.py's --workdir).")
  add("--out", required=True, help="The file to write (e.g. captioner.jaxcap).")
  add("--step", type=cli.nonnegative_int, default=None, help="A checkpoint step (default: the best, else the latest).")
  add("--method", default=None, choices=("greedy", "beam"), help="The default decoding (default: the run's config.decode.method).")
  add("--beam_size", type=cli.positive_int, default=None, help="Beam search's K (default: the run's).")
  add("--max_len", type=cli.positive_int, default=None, help="Decoding steps (default: the run's).")
  add("--weights", default=None, help="The backbone's .safetensors file, when the run's features.json records one.")
  add("--no_backbone", action="store_true", help="Leave the image backbone out (features only).")
  add("--platforms", default="cpu,cuda", help="Comma-separated platforms to lower for (cpu, cuda, rocm, tpu).")
  add("--overwrite", action="store_true", help="Replace a file at --out that is not a jaxcap export.")
  return p


def is_artefact(path: str) -> bool:
  """``path`` is a file jaxcap-export wrote: a zip whose ``metadata.json`` says its format
  (``jaxcap.serving.artefact.FORMAT``, spelled here: that module imports jax)."""
  import json
  import zipfile
  with zipfile.ZipFile(path) as z:
    meta = json.loads(z.read("metadata.json"))
  return isinstance(meta, dict) and meta.get("format") == "jaxcap-captioner"


def main(argv=None) -> int:
  a = parser().parse_args(argv)
  # Bad input is refused before the run is loaded or anything is compiled or written.
  atomic.check_output(a.out, f"--out={a.out}", overwrite=a.overwrite, mine=is_artefact,
                      what="a captioner jaxcap-export wrote")
  if not os.path.isdir(a.workdir):
    raise BadInput(f"--workdir={a.workdir}: not a directory; expected a run directory train.py wrote")
  platforms = tuple(p.strip() for p in a.platforms.split(",") if p.strip())
  bad = [p for p in platforms if p not in ("cpu", "cuda", "rocm", "tpu")]
  if not platforms or bad:
    raise BadInput(f"--platforms={a.platforms}: expected a comma-separated list of cpu, cuda, rocm, tpu")
  from jaxcap import api, export  # after the checks: loading jax's models takes seconds
  run = api.load(a.workdir, a.step)
  try:
    meta = export.export(run, a.out, method=a.method, beam_size=a.beam_size, max_len=a.max_len,
                         platforms=platforms, weights=a.weights, backbone=not a.no_backbone)
  except BadInput as e:  # a decoding flag's value: refused by the flag the user typed
    typed = {f"decoding option {n}": cli.typed_flag(n) for n in ("method", "beam_size", "max_len")}
    raise cli.as_typed(e, {k: v for k, v in typed.items() if v}) from None
  size = os.path.getsize(a.out)
  dec = meta["decode"]
  print(f"wrote {a.out}: {meta['model']} step {meta['run']['step']}, config #{meta['run']['config_hash']}, "
        f"{size / 2**20:.1f} MiB, {dec['method']} (beam {dec['beam_size']}), max_len {dec['max_len']}, "
        f"{'backbone ' + str(meta['backbone']['size']) + ' px, ' if meta['backbone'] else ''}"
        f"platforms {','.join(meta['platforms'])}")
  return 0


def run():
  """The program (console script ``jaxcap-export``)."""
  cli.run_script(main)


if __name__ == "__main__":
  run()
