"""The Image Transformer (He et al., ACCV 2020): spatial-graph encoder + implicit decoding layer.

Variants through the config argument (``--config configs/image_transformer.py:<arg>``):

* ``synthetic`` (default): a CPU-sized run (D = 128, 4 heads, 3 spatial layers, M = 3) on the
  synthetic scenes, whose captions name relations that only the boxes reveal.
* Table 3's ablations: ``spatial_layers=1|2|3|all|none`` (which encoder layers are spatial;
  also ``1+3``), ``spatial=False`` ("w/o spatial relations": plain softmax and the mean of the
  three sub-transformers), ``M=1..4`` (sub-transformers in the decoder), ``graph_mask=softmax``
  (mask the logits instead of multiplying the weights after the softmax, eq. 6),
  ``epsilon=`` (eq. 5), ``graph=all_neighbour`` (the graph replaced by "all neighbours").
  ``baseline=True`` builds the rows literally as "AoANet baseline + spatial layers": the
  encoder layers keep AoANet's attention on attention and have no feed-forward sub-layer
  (``jaxcap/papers/image_transformer/table3.py`` uses it for every row, with M = 1 unless the row
  varies M); without it the layers follow eqs. 4 and 7 (FFN, output projection, no AoA).
  ``dim=``, ``heads=``, ``layers=`` override the sizes.
* ``flickr8k``: global Xception features (one region per image, so the graph is trivial).
* ``coco``: the paper's settings (section 4.2): bottom-up features with boxes, LSTM (and model
  width) 1024, 8 heads, 3 encoder layers, ε = 0.9, M = 3; cross-entropy for 25 epochs with Adam,
  lr 2e-3 decayed by 0.8 every 3 epochs, batch 10; then self-critical training (CIDEr-D) for
  35 more epochs; beam 3; vocabulary threshold 4 (words seen fewer than 4 times dropped).
  The SCST learning rate is not given in the paper; 2e-5 as AoANet's released scripts.

Differences of the authors' released code (wtliao/ImageTransformer, built on
husthuaan/AoANet), not followed here (the paper's text is): learning rate 2e-4 with
warm-up (Noam, ``noamopt``) instead of 2e-3, label smoothing 0.2, scheduled sampling (from
epoch 0, +0.05 every 5 epochs, up to 0.5), attention on attention in the encoder layers with
pre-norm residuals and no feed-forward sub-layer (``baseline=True`` gets the first and last),
LayerNorm on the decoder query, dropout on c_{t-1}, and M realised as M-fold wider heads whose
outputs are concatenated rather than averaged; the released code also does not clamp the box
intersection (see jaxcap/papers/image_transformer/model.py).
"""

from jaxcap import config_common as common

MODEL = "image_transformer"


def get_config(arg: str | None = None):
  # Flickr8k: dropout 0.1 and Adam 5e-4 on AoANet's schedule, the best validation CIDEr-D of
  # config_sweep.py's settings (experiments/flickr8k/README.md, "The Image Transformer").
  return build(common.parse_arg(arg, **row_args(MODEL)), MODEL, flickr8k_dropout=0.1, flickr8k_lr=5e-4)


def row_args(name: str) -> dict:
  """The config arguments of a Table 3 row with model ``name``'s defaults (the module's): its
  fields of the same names, ``M`` (num_sub) and ``baseline`` (refine_aoa, no ffn); sizes 0
  keep the dataset's."""
  d = common.model_defaults(name, "spatial_layers", "spatial", "graph_mask", "epsilon", "graph",
                            "num_sub", "refine_aoa")
  return dict(spatial_layers=d["spatial_layers"], spatial=d["spatial"], M=d["num_sub"],
              graph_mask=d["graph_mask"], epsilon=d["epsilon"], graph=d["graph"],
              baseline=d["refine_aoa"], dim=0, heads=0, layers=0)


def build(a, name: str, cpu_layers: int = 3, flickr8k_dropout: float = 0.3, flickr8k_lr: float = 1e-3):
  c = common.base_config(a.dataset, name)
  c.model.update(spatial_layers=str(a.spatial_layers), spatial=a.spatial, num_sub=a.M,
                 graph_mask=a.graph_mask, graph=a.graph, epsilon=a.epsilon,
                 refine_aoa=a.baseline, ffn=not a.baseline)
  for field, value in (("dim", a.dim), ("num_heads", a.heads), ("num_layers", a.layers)):
    if value:
      c.model[field] = value

  # Paper section 4.2: 25 cross-entropy epochs, then 35 of SCST; beam 3.
  c = common.coco_step_schedule(c, batch_size=10, learning_rate=2e-3, epochs=60)
  c.scst.start_step = common.coco_steps(25, c.batch_size)
  c.scst.learning_rate = 2e-5
  if a.dataset == "coco":
    c.data.min_word_count = 4

  if a.dataset in ("synthetic", "flickr8k"):
    c = common.step_decay(common.cpu_sized(c), 2e-3)
    c.decode.method = "greedy"  # validation at CPU sizes decodes greedily (the paper's: beam 3)
    dim = a.dim or 128
    c.model.update(dim=dim, num_heads=a.heads or 4, num_layers=a.layers or cpu_layers,
                   ff_dim=2 * dim)
  if a.dataset == "flickr8k":
    # 700 training images = 28 steps per epoch: AoANet's Flickr8k schedule (Adam x 0.8 every 10
    # epochs, 1,800 steps) at each model's dropout and rate (AoANet's: 0.3, 1e-3, kept by its sweep).
    c = common.flickr8k_step_decay(c, dropout=flickr8k_dropout, learning_rate=flickr8k_lr)
  return c
