"""ETA-Transformer (Li et al., ICCV 2019): page, configs and tools in this folder (README.md)."""

import os

from jaxcap.papers.eta import model  # noqa: F401  (registers "eta")

# README.md's model table (python -m jaxcap.papers): this paper's models, each with what it is.
MODEL_ROWS = {
    "eta": "ETA-Transformer: EnTangled Attention + Gated Bilateral Controller",
}

# experiments/flickr8k/table.py: the row this paper adds (model -> its place, cheapest first).
FLICKR8K_ROWS = {"eta": 80}


def flickr8k_config(model: str, config, workdir: str, dataset: str) -> None:
  """The Flickr8k table's ETA reads detected attributes (the table's own detector, trained by
  :func:`flickr8k_before_run` under ``workdir``; oracle attributes would read the test
  references)."""
  del model
  if dataset == "flickr8k":
    config.data.attributes_file = os.path.join(workdir, "attributes_flickr8k", "attributes.json")


def flickr8k_before_run(model: str, config) -> None:
  """Trains the attribute detector once (``train_attributes.py``'s recipe with the config's
  ``detector`` section) when the run reads detected attributes that are not there yet."""
  del model
  path = config.data.attributes_file
  if config.data.attributes != "detected" or os.path.exists(path):
    return
  import copy
  from jaxcap import data as data_lib
  from jaxcap.papers.eta import attributes as attribute_detector
  data_config = copy.deepcopy(config.data)
  data_config.attributes = "none"
  dataset = data_lib.get_dataset(data_config)
  print(f"=== attribute detector -> {os.path.dirname(path)}", flush=True)
  result = attribute_detector.run(dataset, config.get("detector") or {}, os.path.dirname(path),
                                  log=lambda s: print(s, flush=True))
  if "val" in result:
    print(f"detector val: {result['val']}; frequency prior: {result.get('val_prior')}", flush=True)
