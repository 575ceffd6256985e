"""AoANet (Huang et al., ICCV 2019), the Image Transformer paper's baseline (Table 3, first row).

A refiner of ordinary multi-head attention layers with attention on attention (AoA) and no
feed-forward sub-layer, and the AoA decoder (an LSTM whose attention output passes through
``GLU(W [att; h] + b)``), i.e. the Image Transformer's model with no spatial layer and M = 1
(``jaxcap/papers/image_transformer/model.py``, registered ``aoanet``).

* ``synthetic`` (default): CPU-sized (D = 128, 4 heads, 3 refiner layers — the Image
  Transformer's depth, so that Table 3's rows differ only in the spatial layers and M).
* ``flickr8k``: global Xception features (one region).
* ``coco``: the Image Transformer paper's training settings (it trains the baseline with its
  own schedule: lr 2e-3 x 0.8 every 3 epochs, batch 10, 25 XE epochs) with AoANet's 6 refiner
  layers, D = 1024, 8 heads. AoANet's released scripts use lr 2e-4 with decay 0.8 every 3
  epochs, label smoothing 0.2, scheduled sampling, pre-norm residuals and dropout 0.3 on the
  AoA input; see configs/image_transformer.py.

Arguments as configs/image_transformer.py (``spatial_layers=``, ``M=``, ``dim=``, ``heads=``,
``layers=`` ...), with AoANet's defaults (``spatial_layers=none``, ``M=1``, ``baseline=True``).
"""

from jaxcap import config_common as common
from jaxcap.papers.image_transformer.configs import image_transformer


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, **image_transformer.row_args("aoanet"))
  return image_transformer.build(a, "aoanet", cpu_layers=3)
