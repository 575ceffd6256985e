"""The vanilla Transformer captioner (the ETA paper's "Transformer_v" row).

``--config configs/transformer.py:synthetic`` (the default of train.py) is sized for a 2-core
CPU; ``:flickr8k`` reads ../shared/data/flickr8k_xception (global features only); ``:coco``
is the paper-sized run on Karpathy COCO with bottom-up features (``:cocotalk``: the same with
self-critical.pytorch's cocotalk.json + cocotalk_label.h5).

``size=small`` (``:coco,size=small``, ``:cocotalk,size=small``) sizes the model and the schedule
for a few hundred to a few thousand images (``common.small_sized``): d = 256, 3 + 3 layers,
batch 16, 2,000 steps, Noam warm-up 300; the cocotalk vocabulary stays cocotalk's.
"""

from configs import common


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, size="paper")
  if a.size not in ("paper", "small"):
    raise ValueError(f"config argument size: expected 'paper' or 'small', got {a.size!r}")
  c = common.base_config(a.dataset, "transformer")
  c.batch_size = 50
  c.learning_rate = 1.0  # the Noam schedule's scale factor: lr = scale * d^-0.5 * min(...)
  c.warmup_steps = 20000
  if a.dataset in ("synthetic", "flickr8k"):
    c = common.cpu_sized(c)
    c.model.dim = 128
    c.model.num_layers = 2
    c.model.num_dec_layers = 2
    c.model.num_heads = 4
    c.model.ff_dim = 512
  if a.size == "small":
    c = common.small_sized(c)
    c.model.dim = 256
    c.model.num_layers = 3
    c.model.num_dec_layers = 3
    c.model.num_heads = 8
    c.model.ff_dim = 1024
    c.model.dropout = 0.3
  if a.dataset == "flickr8k":
    c.num_train_steps = 1200
    c.eval_every_steps = 200
    c.checkpoint_every_steps = 200
    c.batch_size = 25
    c.model.dropout = 0.3
    c.data.min_word_count = 3
  return c
