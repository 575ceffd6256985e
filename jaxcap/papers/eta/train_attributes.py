"""Trains the noisy-OR attribute detector and writes each image's detected attributes.

  python -m jaxcap.papers.eta.train_attributes --config configs/eta.py:synthetic --out runs/attributes

Trains on the ``train`` split's region features against the multi-hot labels of the top-K
content words (Fang et al.; see :mod:`jaxcap.papers.eta.attributes`), prints mAP and
precision@k on ``val`` next to the frequency prior (every image gets the most frequent
training words), and writes ``<out>/attributes.json`` ``{image_id: [words]}`` for every split
(what ``data.attributes="detected"`` reads from ``data.attributes_file``) and
``<out>/metrics.json``. Detector settings are the config's ``detector`` section
(``--config.detector.num_steps=...`` etc.).
"""

import copy
import os

from absl import flags
from jaxcap import atomic
from jaxcap import data as data_lib
from jaxcap.errors import BadInput
from jaxcap.papers.eta import attributes as attribute_detector



flags.DEFINE_string("out", "runs/attributes", "Output directory.")
flags.DEFINE_bool("overwrite", False, "Write into an --out folder that holds files jaxcap did not write.")


def is_attributes_folder(out: str) -> bool:
  """``out`` holds this program's two files (a folder of an earlier jaxcap, before its marker)."""
  return all(os.path.isfile(os.path.join(out, name)) for name in ("attributes.json", "metrics.json"))


def check() -> None:
  """The output folder, before the detector trains (``--only_check_args`` runs this alone)."""
  out = flags.FLAGS.out
  if os.path.exists(out) and not os.path.isdir(out):
    raise BadInput(f"--out={out}: is a file; expected a directory to write the attributes into")
  atomic.check_output(out, f"--out={out}", folder=True, overwrite=flags.FLAGS.overwrite,
                      mine=is_attributes_folder, what="one this program wrote")


def main(argv):
  del argv  # cli.parse_flags refuses stray arguments

  out = flags.FLAGS.out
  check()  # before the detector trains, not after
  config = flags.FLAGS.config
  data_config = copy.deepcopy(config.data)
  # The detector learns from the references' labels; it must not need its own output file.
  data_config.attributes = "none"
  dataset = data_lib.get_dataset(data_config)
  print(f"{dataset.name}: {len(dataset.attribute_words)} attribute words, "
        f"splits {', '.join(f'{s}={len(dataset.split(s))}' for s in dataset.splits)}", flush=True)
  det_cfg = config.get("detector") or {}
  atomic.mark_folder(out, "jaxcap.papers.eta.train_attributes")
  result = attribute_detector.run(dataset, det_cfg, flags.FLAGS.out,
                                  log=lambda s: print(s, flush=True))
  if "val" in result:
    keys = list(result["val"])
    print(f"{'':<16}" + "".join(f"{k:>14}" for k in keys))
    for name in ("val", "val_prior"):
      label = "detector" if name == "val" else "frequency prior"
      print(f"{label:<16}" + "".join(f"{result[name][k]:>14.4f}" for k in keys))
  print(f"wrote {result['path']}")


if __name__ == "__main__":
  from jaxcap.cli import run_absl
  run_absl(main, configs={"config": "configs/eta.py:synthetic"}, check=check)  # with data and detector sections
