"""Any registered model with its module's defaults: ``configs/base.py:<dataset>,model=<name>``.

A model is one module in ``jaxcap/models``: its fields are its config (``common.model_config``),
so it trains with this file before it has a config file of its own, e.g.
``python train.py --config configs/base.py:synthetic,model=show_tell --config.model.hidden_dim=64``.
The schedule is Adam with step decay (lr 5e-4, 2e-3 CPU-sized on ``synthetic`` and ``flickr8k``,
x0.8 every 3 epochs; ``common.cpu_sized``), which suits any model; the shared Noam schedule's
``learning_rate`` is a scale factor meant for the Transformer-style configs.
"""

from jaxcap import config_common as common


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, model="transformer")
  c = common.base_config(a.dataset, a.model)
  c = common.step_decay(c, 5e-4)
  if a.dataset in ("synthetic", "flickr8k"):
    c = common.step_decay(common.cpu_sized(c), 2e-3)
  return c
