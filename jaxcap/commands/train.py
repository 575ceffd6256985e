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
from jaxcap.training import train_lib

DEFAULT_CONFIG = "configs/transformer.py:synthetic"
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config name>).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Compile the training (and SCST) step, print "
                             "parameters, FLOPs per step and per-device memory; write nothing.")


def main(argv):
  del argv  # cli.parse_flags refuses stray arguments
  spec = config_flags.get_config_filename(flags.FLAGS["config"])
  workdir = _WORKDIR.value or config_files.default_workdir(spec)
  if _DRY_RUN.value:
    train_lib.dry_run(flags.FLAGS.config, workdir)
    return
  print(f"workdir: {workdir}", flush=True)
  train_lib.train_and_evaluate(flags.FLAGS.config, workdir)


def run():
  """The program (``python train.py``, console script ``jaxcap-train``)."""
  cli.run_absl(main, configs={"config": DEFAULT_CONFIG})
