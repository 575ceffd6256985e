"""The vanilla Transformer captioner (the ETA paper's "Transformer_v" row).

``--config configs/transformer.py:synthetic`` (the default of train.py) is sized for a 2-core
CPU; ``:flickr8k`` reads ../shared/data/flickr8k_xception (global features only) and trains with
Adam 1e-3 x 0.8 every 10 epochs for 1,800 steps at dropout 0.1 (chosen on validation over the
Noam schedule and dropout 0.3 it had: experiments/flickr8k/README.md, "Choosing a config on
validation"); ``:coco``
is the paper-sized run on Karpathy COCO with bottom-up features (``:cocotalk``: the same with
self-critical.pytorch's cocotalk.json + cocotalk_label.h5).

``size=small`` (``:coco,size=small``, ``:cocotalk,size=small``) sizes the model and the schedule
for a few hundred to a few thousand images (``common.small_sized``): d = 256, 3 + 3 layers,
batch 16, 2,000 steps, Noam warm-up 300; the cocotalk vocabulary stays cocotalk's.
"""

from jaxcap import config_common as common
from jaxcap.errors import BadInput

# The model sizes of the CPU-sized runs (synthetic, flickr8k; ETA's as well) and of size=small.
CPU_SIZES = dict(dim=128, num_layers=2, num_dec_layers=2, num_heads=4, ff_dim=512)
SMALL_SIZES = dict(dim=256, num_layers=3, num_dec_layers=3, num_heads=8, ff_dim=1024, dropout=0.3)


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, size="paper")
  if a.size not in ("paper", "small"):
    raise BadInput(f"config argument size: expected 'paper' or 'small', got {a.size!r}")
  c = common.base_config(a.dataset, "transformer")
  # Batch 50 and the Noam schedule's 20,000 warm-up steps: base_config's defaults.
  c.learning_rate = 1.0  # the Noam schedule's scale factor: lr = scale * d^-0.5 * min(...)
  if a.dataset in ("synthetic", "flickr8k"):
    c = common.cpu_sized(c)
    c.model.update(CPU_SIZES)
  if a.size == "small":
    c = common.small_sized(c)
    c.model.update(SMALL_SIZES)
  if a.dataset == "flickr8k":
    # AoANet's schedule and dropout 0.1: the best validation CIDEr-D of config_sweep.py's settings.
    c = common.flickr8k_step_decay(c, dropout=0.1)
  return c
