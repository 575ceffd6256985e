"""Serves a trained run (or an exported artefact) over HTTP, with a web page to try it.

  jaxcap-serve --workdir runs/transformer_synthetic          # then open http://127.0.0.1:8000/
  jaxcap-serve --artefact captioner.jaxcap --port 8080 --max_batch 16 --max_wait_ms 5
  python -m jaxcap.commands.serve --workdir RUN              # the same without the console script

``POST /caption`` captions an image (runs on ``jaxcap-extract`` features; runs on bottom-up
region features with ``--weights`` = the region detector's checkpoint), a ``.npy`` feature
array or ``?example=<i>`` (a synthetic run's test image); ``GET /`` is the page, ``/health`` and
``/metadata`` describe the server (:mod:`jaxcap.serving.server`, docs/USAGE.md "Serving and the
web page"). Listens on 127.0.0.1 unless ``--host`` says otherwise (``--port 0``: a free port),
prints the page's address once it accepts requests, and stops on SIGTERM / SIGINT: exit 0.
Exit 2 on bad input (a flag, the run, the artefact, a port in use).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from jaxcap import cli
from jaxcap.errors import BadInput


def parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(prog="jaxcap-serve", description=__doc__.split("\n")[0])
  add = p.add_argument
  source = p.add_mutually_exclusive_group()
  source.add_argument("--workdir", default=None, help="A run directory written by train.py (its best checkpoint).")
  source.add_argument("--artefact", default=None, help="A file written by the jaxcap.serving exporter.")
  add("--host", default="127.0.0.1", help="Address to listen on (0.0.0.0: every interface).")
  add("--port", type=cli.nonnegative_int, default=8000, help="TCP port (0: a free one, printed).")
  add("--max_batch", type=cli.positive_int, default=8, help="Images decoded together at most.")
  add("--max_wait_ms", type=float, default=10.0,
      help="How long the first queued request waits for others to batch with (milliseconds).")
  add("--max_body_mb", type=float, default=16.0, help="Largest request body accepted (MiB).")
  add("--weights", default=None, help="With --workdir: the image backbone's weights (the .safetensors "
      "its features.json records), or for a run on bottom-up region features the region detector's "
      "pytorch_model.bin / faster_rcnn_from_caffe_attr.pkl / bua-caffe-frcn-r101*.pth (photos then go through the detector).")
  return p


def _check(a) -> None:
  if not a.workdir and not a.artefact:
    raise BadInput("--workdir or --artefact: neither given; expected a run directory "
                     "(--workdir runs/transformer_synthetic) or an artefact file (--artefact FILE)")
  if a.port > 65535:
    raise BadInput(f"--port={a.port}: expected a TCP port in [0, 65535]")
  if not 0 <= a.max_wait_ms <= 10_000:
    raise BadInput(f"--max_wait_ms={a.max_wait_ms}: expected milliseconds in [0, 10000]")
  if not 0 < a.max_body_mb <= 1024:
    raise BadInput(f"--max_body_mb={a.max_body_mb}: expected MiB in (0, 1024]")
  if a.workdir and not os.path.isdir(a.workdir):
    raise BadInput(f"--workdir={a.workdir}: not a directory; expected a run written by train.py")
  if a.artefact and not os.path.isfile(a.artefact):
    raise BadInput(f"--artefact={a.artefact}: no such file; expected an artefact file")
  if a.weights is not None and a.artefact:
    raise BadInput(f"--weights={a.weights}: an artefact carries its backbone; expected --weights with --workdir only")
  if a.weights is not None and not os.path.isfile(a.weights):
    raise BadInput(f"--weights={a.weights}: no such file; expected the backbone's or the region detector's weights")


def backend_of(a):
  """The :mod:`jaxcap.serving.server` backend of ``--workdir`` / ``--artefact``."""
  from jaxcap.serving import server
  if a.workdir:
    import jaxcap
    return server.RunBackend(jaxcap.load(a.workdir), max_batch=a.max_batch, weights=a.weights), a.workdir
  from jaxcap.serving import load
  return server.ArtefactBackend(load(a.artefact), a.artefact, max_batch=a.max_batch), a.artefact


async def serve(app, host: str, port: int, name: str) -> None:
  """Runs ``app`` until SIGTERM / SIGINT, then closes it (in-flight requests answered first)."""
  from aiohttp import web
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGTERM, signal.SIGINT):
    loop.add_signal_handler(sig, stop.set)
  runner = web.AppRunner(app, access_log=None, handle_signals=False)
  await runner.setup()
  try:
    site = web.TCPSite(runner, host, port, shutdown_timeout=5.0)
    try:
      await site.start()
    except OSError as e:
      raise BadInput(f"--host={host} --port={port}: cannot listen ({e.strerror or e}); expected a "
                       "free port on a local address (--port 0 picks one)") from None
    bound = runner.addresses[0][1] if runner.addresses else port  # --port 0: the one given
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {name} at http://{shown}:{bound}/", flush=True)
    await stop.wait()
    print("stopping", flush=True)
  finally:
    await runner.cleanup()


def main() -> int:
  a = parser().parse_args()
  _check(a)
  backend, name = backend_of(a)
  from jaxcap.serving import server
  app = server.make_app(backend, max_batch=a.max_batch, max_wait_ms=a.max_wait_ms,
                        max_body=int(a.max_body_mb * 1024 * 1024), name=name)
  asyncio.run(serve(app, a.host, a.port, name))
  return 0


def run():
  """The program (console script ``jaxcap-serve``)."""
  cli.run_script(main)


if __name__ == "__main__":
  run()
