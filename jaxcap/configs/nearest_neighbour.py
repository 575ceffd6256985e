"""Nearest-neighbour retrieval baseline: the first caption of the closest training image
(cosine on the global feature). ``python train.py --config configs/nearest_neighbour.py:flickr8k``."""

from jaxcap import config_common as common


def get_config(arg: str | None = None):
  a = common.parse_arg(arg)
  c = common.base_config(a.dataset, "nearest_neighbour")
  c.num_train_steps = 0
  return c
