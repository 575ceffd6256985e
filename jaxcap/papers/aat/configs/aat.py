"""AAT: Adaptive Attention Time on an Up-Down decoder (Huang et al., NeurIPS 2019).

Variants through the config argument (``--config configs/aat.py:<arg>``):

* ``synthetic`` (default): the CPU-sized adaptive run (M_min = 0, M_max = 4) on the synthetic
  dataset; ``synthetic,attention=base`` and ``synthetic,attention=recurrent,steps=4`` are the
  other rows of the paper's Table 1; ``max_steps=``, ``min_steps=``, ``epsilon=``,
  ``time_cost_weight=`` (lambda), ``heads=`` select the rest. Switches for the released code's
  departures from the paper (defaults: the paper; see the model docstring's "Deviations and
  choices"): ``norm_h1=True`` (LayerNorm on h1), ``norm_query=True`` (LayerNorm on the
  attention query), ``attention_out_proj=False`` (no W^O in the multi-head attention),
  ``embed_relu=True`` (ReLU on the word embedding).
* ``flickr8k``: the synthetic run's model on global Xception features, trained with AoANet's
  Flickr8k schedule (Adam 1e-3 x 0.8 every 10 epochs, 1,800 steps, dropout 0.3), chosen on
  validation over the CPU-sized Adam 2e-3 x 0.8 every 3 epochs for 1,200 steps it had
  (experiments/flickr8k/README.md, "AAT").
* ``coco``: the paper's settings (section 4.1): d = 1024, epsilon = 1e-4, lambda = 1e-4,
  M_min = 0, M_max = 4, batch 10, Adam 1e-4 x 0.8 every 2 epochs for 25 epochs of
  cross-entropy with scheduled sampling (+0.05 every 3 epochs), then 15 epochs of SCST at 1e-5.
  8 heads as the authors' released code (the paper's text says 4: ``coco,heads=4``).
"""

from jaxcap import config_common as common

# The row's switches: model fields of the same names, whose defaults (the module's) are the
# paper's settings; the released code's departures from the paper are among them, off by
# default (see the model's docstring).
ROW_FIELDS = ("attention", "steps", "min_steps", "max_steps", "epsilon", "time_cost_weight",
              "norm_h1", "norm_query", "attention_out_proj", "embed_relu")


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, heads=0, **common.model_defaults("aat", *ROW_FIELDS))
  c = common.base_config(a.dataset, "aat")
  c.model.update({f: a[f] for f in ROW_FIELDS})
  if a.heads:
    c.model.num_heads = a.heads

  # Paper section 4.1: 25 cross-entropy epochs with scheduled sampling, then 15 of SCST; Table 1
  # reports beam 2.
  c = common.coco_step_schedule(c, batch_size=10, learning_rate=1e-4, epochs=40,
                                decay_every_epochs=2, beam_size=2)
  c.scst.start_step = common.coco_steps(25, c.batch_size)
  c.scst.learning_rate = 1e-5
  c.scheduled_sampling.update(start_epoch=0, increase_every_epochs=3, increase_prob=0.05,
                              max_prob=0.25)

  if a.dataset in ("synthetic", "flickr8k"):
    c = common.step_decay(common.cpu_sized(c), 2e-3)
    c.decode.method = "greedy"  # validation at CPU sizes decodes greedily (the paper's: beam 2)
    c.model.update(dim=128, num_heads=a.heads or 4, dropout=0.1)
  if a.dataset == "flickr8k":
    c = common.flickr8k_step_decay(c)
  return c
