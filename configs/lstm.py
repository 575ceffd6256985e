"""Show-Attend-Tell style LSTM captioner with soft attention over regions (a recurrent baseline).

``--config configs/lstm.py:synthetic`` is CPU-sized; ``:coco`` uses 512-wide layers and
self-critical.pytorch's usual schedule (Adam 5e-4, x0.8 every 3 epochs).
"""

from configs import common


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
  return c
