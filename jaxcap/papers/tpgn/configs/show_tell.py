"""Show and Tell (Vinyals et al., 2015): the CNN-LSTM baseline of TPGN's Table 1.

* ``synthetic`` (default): CPU-sized (LSTM and embeddings 128, Adam 2e-3, 500 steps of 50
  images, the same schedule as ``configs/tpgn.py:synthetic``).
* ``flickr8k``: LSTM 512 as the paper, dropout 0.5; 1,800 steps of 25 images, Adam 1e-3 x0.8
  every 10 epochs (AoANet's Flickr8k schedule, chosen on validation:
  experiments/flickr8k/results/config_sweep_show_tell.md).
* ``coco``: LSTM 512, embeddings 512, dropout 0.5; Adam 5e-4 x0.8 every 3 epochs, batch 50,
  30 epochs, beam 3 (the same schedule as ``configs/tpgn.py:coco``; NIC itself used SGD).
"""

from jaxcap import config_common as common


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, dim=0, dropout=-1.0)
  c = common.base_config(a.dataset, "show_tell")
  if a.dim:
    c.model.hidden_dim = c.model.embed_dim = a.dim
  if a.dropout >= 0:
    c.model.dropout = a.dropout
  c = common.coco_step_schedule(c, batch_size=50, learning_rate=5e-4, epochs=30)
  if a.dataset in ("synthetic", "flickr8k"):
    c = common.run_length(common.step_decay(common.cpu_sized(c), 2e-3), 500, 250)
    c.decode.method = "greedy"  # validation at CPU sizes decodes greedily (the paper's: beam 3)
  if a.dataset == "synthetic":
    c.model.hidden_dim = c.model.embed_dim = a.dim or 128
    c.model.dropout = 0.2 if a.dropout < 0 else a.dropout
  if a.dataset == "flickr8k":
    c = common.step_decay(common.flickr8k_sized(c, num_train_steps=1800, eval_every_steps=100, dropout=None),
                          1e-3, decay_every_epochs=10)
  return c
