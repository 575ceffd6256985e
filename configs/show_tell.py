"""Show and Tell (Vinyals et al., 2015): the CNN-LSTM baseline of TPGN's Table 1.

* ``synthetic`` (default): CPU-sized (LSTM and embeddings 128, Adam 2e-3, 500 steps of 50
  images, the same schedule as ``configs/tpgn.py:synthetic``).
* ``flickr8k``: LSTM 512 as the paper, dropout 0.5, 500 steps of 25 images (as
  ``configs/tpgn.py:flickr8k``).
* ``coco``: LSTM 512, embeddings 512, dropout 0.5; Adam 5e-4 x0.8 every 3 epochs, batch 50,
  30 epochs, beam 3 (the same schedule as ``configs/tpgn.py:coco``; NIC itself used SGD).
"""

from configs import common

_COCO_STEPS_PER_EPOCH = 2266


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, dim=0, dropout=-1.0)
  c = common.base_config(a.dataset, "show_tell")
  if a.dim:
    c.model.hidden_dim = c.model.embed_dim = a.dim
  if a.dropout >= 0:
    c.model.dropout = a.dropout
  c.batch_size = 50
  c.learning_rate = 5e-4
  c.schedule = "step"
  c.decay_every_epochs = 3
  c.decay_rate = 0.8
  c.warmup_steps = 0
  c.adam_b2 = 0.999
  c.adam_eps = 1e-8
  c.num_train_steps = 30 * _COCO_STEPS_PER_EPOCH
  c.eval_every_steps = 3000
  c.checkpoint_every_steps = 3000
  c.decode.method = "beam"
  c.decode.beam_size = 3
  if a.dataset in ("synthetic", "flickr8k"):
    c = common.cpu_sized(c)
    c.learning_rate = 2e-3
    c.warmup_steps = 0
    c.num_train_steps = 500
    c.eval_every_steps = 250
    c.checkpoint_every_steps = 250
    c.decode.method = "greedy"
  if a.dataset == "synthetic":
    c.model.hidden_dim = c.model.embed_dim = a.dim or 128
    c.model.dropout = 0.2 if a.dropout < 0 else a.dropout
  if a.dataset == "flickr8k":
    c.num_train_steps = 500
    c.eval_every_steps = 100
    c.checkpoint_every_steps = 100
    c.batch_size = 25
    c.data.min_word_count = 3
  return c
