"""AoANet (Huang et al., ICCV 2019), the Image Transformer paper's Table 3 baseline.

Dimension legend: as :mod:`jaxcap.papers.image_transformer.model`.

The Image Transformer's module with AoANet's settings: a refiner of 6 ordinary (non-spatial)
layers with attention on attention and no feed-forward sub-layer, and the AoA decoder
(eq. 10 with M = 1 sub-transformer). The Image Transformer's switches (``spatial_layers``,
``num_sub``, ...) stay available, so Table 3's rows move one setting at a time from here.
"""

from __future__ import annotations

from jaxcap.papers.image_transformer.model import ImageTransformer
from jaxcap.models.registry import register


@register("aoanet")
class AoANet(ImageTransformer):
  """AoANet: the Image Transformer's fields with AoANet's defaults."""

  num_layers: int = 6
  spatial_layers: str | int | tuple = "none"
  num_sub: int = 1
  refine_aoa: bool = True
  ffn: bool = False
