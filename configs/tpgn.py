"""TPGN: the Tensor Product Generation Network (Huang et al., NAACL 2018), global features.

Variants through the config argument (``--config configs/tpgn.py:<arg>``):

* ``synthetic`` (default): CPU-sized run on ``synthetic_scenes``' global feature (d = 16,
  Adam 2e-3 with x0.8 every 3 epochs, 500 steps of 50 images); ``d=25`` gives the paper's size.
* ``flickr8k``: ``../shared/data/flickr8k_xception`` (1000-d Xception class probabilities, 700
  training images): d = 25 as the paper, dropout 0.3 (the tiny split overfits), 500 steps of 25
  images (18 epochs; sized for a 2-core CPU).
* ``coco``: the paper's settings (sections 4-5.2): d = 25 (Ŝ 25 x 25, u_t and f_t 625-d),
  2048-d ResNet-152 global feature (``cocobu_fc``), W_e from GloVe when ``glove=<file>`` is given
  (then fixed, as the paper: ``train_embedding=False``), else learned. The paper gives no
  optimiser, learning rate or batch size ("TensorFlow default settings"): Adam 5e-4 x0.8 every
  3 epochs, batch 50, 30 epochs, beam 3 are this config's choices (self-critical.pytorch's usual
  cross-entropy schedule), not the paper's.

Other arguments: ``lexical=learned|tied`` (how W_x is resolved, see jaxcap/models/tpgn.py),
``glove=<path>`` (a GloVe-format text file for W_e), ``dropout=``.
"""

from configs import common

# Karpathy COCO training split: 113,287 images; at 50 images per step.
_COCO_STEPS_PER_EPOCH = 2266


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, d=0, lexical="learned", glove="", dropout=-1.0)
  c = common.base_config(a.dataset, "tpgn")
  # The paper keeps its GloVe W_e fixed; without GloVe, W_e is learned.
  c.model.update(lexical=a.lexical, glove_path=a.glove, train_embedding=not a.glove)
  if a.d:
    c.model.d = a.d
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
    c.model.d = a.d or 16
    c.learning_rate = 2e-3
    c.warmup_steps = 0
    c.num_train_steps = 500
    c.eval_every_steps = 250
    c.checkpoint_every_steps = 250
    c.decode.method = "greedy"
  if a.dataset == "flickr8k":
    c.model.d = a.d or 25
    c.model.dropout = 0.3 if a.dropout < 0 else a.dropout
    c.num_train_steps = 500
    c.eval_every_steps = 100
    c.checkpoint_every_steps = 100
    c.batch_size = 25
    c.data.min_word_count = 3
  return c
