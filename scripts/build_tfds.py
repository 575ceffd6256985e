"""Builds the TFDS (array_record, no TensorFlow) version of a config's dataset.

  python scripts/build_tfds.py --config configs/transformer.py:flickr8k --out data/tfds
  python train.py --config configs/transformer.py:flickr8k \\
      --config.data.format=tfds --config.data.tfds_dir=data/tfds

Reads the layout the config names (``data.format=raw`` fields: Karpathy JSON + feature dirs,
cocotalk, Multi30k, or synthetic_scenes) with jaxcap's reader and writes
``<out>/jaxcap_<data.name>/1.0.0``. The build goes to a temporary directory that is renamed
into place at the end, so a failed build leaves nothing; an existing build is kept unless
``--overwrite``. Training on the result gives the same batches as on the raw layout.
"""

import copy
import os
import sys
import time

from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

flags.DEFINE_string("out", "data/tfds", "TFDS data dir to write into.")
flags.DEFINE_bool("overwrite", False, "Replace an existing build.")


def main(argv):
  del argv  # cli.parse_flags refuses stray arguments
  from jaxcap.cli import run_main
  from jaxcap.data import tfds_builders

  def build():
    data_config = copy.deepcopy(flags.FLAGS.config.data)
    data_config.format = "raw"
    t0 = time.time()
    path = tfds_builders.build(data_config, flags.FLAGS.out, overwrite=flags.FLAGS.overwrite)
    print(f"{path} ({time.time() - t0:.1f}s); train with --config.data.format=tfds "
          f"--config.data.tfds_dir={flags.FLAGS.out}", flush=True)

  return run_main(build)


if __name__ == "__main__":
  from jaxcap.cli import run_absl
  run_absl(main, configs={"config": "configs/transformer.py:synthetic"})  # whose data is built
