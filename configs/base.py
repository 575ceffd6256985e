"""Any registered model with its module's defaults: ``configs/base.py:<dataset>,model=<name>``.

A model is one module in ``jaxcap/models``: its fields are its config (``common.model_config``),
so it trains with this file before it has a config file of its own, e.g.
``python train.py --config configs/base.py:synthetic,model=show_tell --config.model.hidden_dim=64``.
The schedule is the shared one (``common.base_config``), CPU-sized on ``synthetic`` and
``flickr8k`` (``common.cpu_sized``).
"""

from configs import common


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, model="transformer")
  c = common.base_config(a.dataset, a.model)
  if a.dataset in ("synthetic", "flickr8k"):
    c = common.cpu_sized(c)
  return c
