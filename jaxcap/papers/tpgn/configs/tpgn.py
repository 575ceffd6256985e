"""TPGN: the Tensor Product Generation Network (Huang et al., NAACL 2018), global features.

Variants through the config argument (``--config configs/tpgn.py:<arg>``):

* ``synthetic`` (default): CPU-sized run on ``synthetic_scenes``' global feature (d = 16,
  Adam 2e-3 with x0.8 every 3 epochs, 500 steps of 50 images); ``d=25`` gives the paper's size.
* ``flickr8k``: ``../shared/data/flickr8k_xception`` (1000-d Xception class probabilities, 700
  training images): d = 25 as the paper, dropout 0.3 (the tiny split overfits), 1,000 steps of
  25 images (36 epochs; chosen on validation over 500).
* ``coco``: the paper's settings (sections 4-5.2): d = 25 (Ŝ 25 x 25, u_t and f_t 625-d),
  2048-d ResNet-152 global feature (``cocobu_fc``), W_e from GloVe when ``glove=<file>`` is given
  (then fixed, as the paper: ``train_embedding=False``), else learned. The paper gives no
  optimiser, learning rate or batch size ("TensorFlow default settings"): Adam 5e-4 x0.8 every
  3 epochs, batch 50, 30 epochs, beam 3 are this config's choices (self-critical.pytorch's usual
  cross-entropy schedule), not the paper's.

Other arguments: ``lexical=learned|tied`` (how W_x is resolved, see jaxcap/papers/tpgn/model.py),
``glove=<path>`` (a GloVe-format text file for W_e), ``dropout=``.
"""

from jaxcap import config_common as common


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, d=0, lexical="learned", glove="", dropout=-1.0)
  c = common.base_config(a.dataset, "tpgn")
  # The paper keeps its GloVe W_e fixed; without GloVe, W_e is learned.
  c.model.update(lexical=a.lexical, glove_path=a.glove, train_embedding=not a.glove)
  if a.d:
    c.model.d = a.d
  if a.dropout >= 0:
    c.model.dropout = a.dropout

  # Not the paper's (it gives none): self-critical.pytorch's cross-entropy schedule.
  c = common.coco_step_schedule(c, batch_size=50, learning_rate=5e-4, epochs=30)

  if a.dataset in ("synthetic", "flickr8k"):
    c = common.run_length(common.step_decay(common.cpu_sized(c), 2e-3), 500, 250)
    c.decode.method = "greedy"  # validation at CPU sizes decodes greedily (the paper's: beam 3)
    c.model.d = a.d or 16
  if a.dataset == "flickr8k":
    c = common.flickr8k_sized(c, num_train_steps=1000, eval_every_steps=100,
                              dropout=0.3 if a.dropout < 0 else a.dropout)
    c.model.d = a.d or 25
  return c
