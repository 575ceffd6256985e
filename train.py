"""Trains a jaxcap model, then evaluates its best checkpoint on the test split.

  python train.py                                   # Transformer on the embedded synthetic data
  python train.py --config configs/eta.py:synthetic,variant=stacked_v --workdir runs/stacked_v
  python train.py --config configs/transformer.py:coco --config.batch_size=100 --config.dtype=bfloat16

The default workdir is ``runs/<config name>`` (e.g. ``runs/transformer_synthetic``). An
interrupted run resumes from its latest checkpoint when started again with the same workdir.
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_REPO = os.path.dirname(os.path.abspath(__file__))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

DEFAULT_CONFIG = os.path.join(_REPO, "configs", "transformer.py") + ":synthetic"
config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "Config file (file.py:arg).", lock_config=True)
if "workdir" not in flags.FLAGS:  # evaluate.py defines the same flag (both load in one test process)
  flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config name>).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from jaxcap.cli import default_workdir, run_main
  from jaxcap.training import train_lib
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir or default_workdir(_config_argument())
  print(f"workdir: {workdir}", flush=True)
  return run_main(lambda: train_lib.train_and_evaluate(config, workdir))


def _config_argument() -> str:
  """The ``--config`` value as given: ``path/file.py[:arg]``."""
  name = config_flags.get_config_filename(flags.FLAGS["config"])
  if ":" in name:
    return name
  value = flags.FLAGS["config"].serialize().split("=", 1)[-1]  # older ml_collections
  return name + (":" + value.split(":", 1)[1] if ":" in value else "")


def cli(argv=None):
  """The command line (``python train.py ...``); ``argv`` for in-process use. Exits."""
  from jaxcap.cli import run_app
  run_app(main, argv)


if __name__ == "__main__":
  cli()
