"""Trains a jaxcap model, then evaluates its best checkpoint on the test split.

  python train.py                                   # Transformer on the embedded synthetic data
  python train.py --config configs/eta.py:synthetic,variant=stacked_v --workdir runs/stacked_v
  python train.py --config configs/transformer.py:coco --config.batch_size=100 --config.dtype=bfloat16
  python train.py --config configs/transformer.py:coco --config.batch_size=100 --dry_run   # will it fit?
  jaxcap-train --config configs/aat.py:synthetic    # the same, once the package is installed

The default workdir is ``runs/<config name>`` (e.g. ``runs/transformer_synthetic``). An
interrupted run resumes from its latest checkpoint when started again with the same workdir.
The library entry point is :func:`jaxcap.training.train_lib.train_and_evaluate` (``jaxcap.train``).
"""

from absl import flags
from ml_collections import config_flags

from jaxcap import cli, config_files
from jaxcap.errors import BadInput
from jaxcap.models import registry
from jaxcap.training import train_lib, validation

DEFAULT_CONFIG = "configs/transformer.py:synthetic"
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config name>).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Compile the training (and SCST) step, print "
                             "parameters, FLOPs per step and per-device memory; write nothing.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Write into a --workdir that is no run directory "
                               "but holds files of the names training writes (metrics.jsonl, ...).")


def _workdir() -> str:
  spec = config_flags.get_config_filename(flags.FLAGS["config"])
  return _WORKDIR.value or config_files.default_workdir(spec)


def check() -> None:
  """The checks the run makes before it builds anything (``--only_check_args`` runs them
  alone): the config's values and their relations, and a workdir it can write (a dry run
  writes nothing, and needs a model with a training step to compile)."""
  config = flags.FLAGS.config
  validation.check_config(config)
  if _DRY_RUN.value:
    if not getattr(registry.get(config.model.name), "trainable", True):
      raise BadInput(f"config field model.name: {config.model.name!r} has no training step to "
                       "compile; expected a trainable model")
  else:
    validation.check_workdir_writable(_workdir(), _OVERWRITE.value)


def main(argv):
  del argv  # cli.parse_flags refuses stray arguments
  check()
  workdir = _workdir()
  if _DRY_RUN.value:
    train_lib.dry_run(flags.FLAGS.config, workdir)
    return
  # The run prints "workdir: <path>" once its checks have passed, before it writes there: a
  # refused value or file is the only output.
  train_lib.train_and_evaluate(flags.FLAGS.config, workdir, overwrite=_OVERWRITE.value)


def run():
  """The program (``python train.py``, console script ``jaxcap-train``)."""
  cli.run_absl(main, configs={"config": DEFAULT_CONFIG}, check=check)
