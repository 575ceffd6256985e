"""Image features from pixels: Flax backbones (torchvision's ResNet-50/101/152, timm's ViT-B/16)
and the loader of the weights users download themselves.

Dimension legend:
  B batch (images), H, W image size, g the ``att`` grid side, D feature width.

  module = jaxcap.features.build("resnet101")          # or resnet50, resnet152, vit_b16,
                                                       # resnet101_self_critical (prepro_feats')
  variables, _ = jaxcap.features.load("resnet101.safetensors", module)
  extract = jaxcap.features.make_extract(module)
  feats = extract(variables, images_BxHxWx3_uint8)     # {"fc": [B, D], "att": [B, g, g, D]}

Nothing is downloaded at run time.
"""

from jaxcap.features.registry import BACKBONES, build, make_extract, names, random_variables
from jaxcap.features.weights import load, from_state_dict, name_map

__all__ = ["BACKBONES", "build", "make_extract", "names", "random_variables", "load",
           "from_state_dict", "name_map"]
