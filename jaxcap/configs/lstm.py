"""Show-Attend-Tell style LSTM captioner with soft attention over regions (a recurrent baseline).

``--config configs/lstm.py:synthetic`` is CPU-sized; ``:flickr8k`` the same with Adam 1.6e-2
(chosen on validation: experiments/flickr8k/config_sweep.py, results/config_sweep_lstm.md; the
x0.8 decay every 3 epochs brings it under 1e-4 by the end); ``:coco`` uses 512-wide layers and
self-critical.pytorch's usual schedule (Adam 5e-4, x0.8 every 3 epochs).
"""

from jaxcap import config_common as common


def get_config(arg: str | None = None):
  a = common.parse_arg(arg)
  c = common.base_config(a.dataset, "lstm")
  c.schedule = "step"
  c.learning_rate = 5e-4
  c.decay_every_epochs = 3
  c.decay_rate = 0.8
  c.batch_size = 50
  if a.dataset in ("synthetic", "flickr8k"):
    c = common.cpu_sized(c)
    c.model.hidden_dim = c.model.embed_dim = c.model.att_dim = 128
    c.model.dropout = 0.2
    c.learning_rate = 2e-3
  if a.dataset == "flickr8k":
    c.learning_rate = 8 * 2e-3  # 8x the synthetic rate: the best of 2e-3 x {0.5 .. 16} on validation
  return c
