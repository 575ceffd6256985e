"""Trains a jaxcap model, then evaluates its best checkpoint on the test split.

  python train.py                                   # Transformer on the embedded synthetic data
  python train.py --config configs/eta.py:synthetic,variant=stacked_v --workdir runs/stacked_v
  python train.py --config configs/transformer.py:coco --config.batch_size=100 --config.dtype=bfloat16
  jaxcap-train --config configs/aat.py:synthetic    # the same, once the package is installed

The default workdir is ``runs/<config name>`` (e.g. ``runs/transformer_synthetic``). An
interrupted run resumes from its latest checkpoint when started again with the same workdir.
``--config configs/<file>.py`` is read from the current directory when it exists there, else
from the configs shipped with the package (:func:`jaxcap.cli.resolve_config_argv`).
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from jaxcap import cli as cli_lib
from jaxcap import config_files

config_files.ensure_configs_importable()

DEFAULT_CONFIG = os.path.join(config_files.configs_dir(), "transformer.py") + ":synthetic"
cli_lib.define_config("config", DEFAULT_CONFIG, "Config file (file.py:arg)")
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
  argv = cli_lib.resolve_config_argv(list(sys.argv if argv is None else argv))
  cli_lib.run_app(main, argv)


def run():
  """Console-script entry point (``jaxcap-train``)."""
  cli()


if __name__ == "__main__":
  run()
