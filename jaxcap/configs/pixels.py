"""From pixels, trained end to end (jaxcap/models/pixels.py): a backbone feeding the Transformer,
both trained, the backbone held still first (ExpansionNet v2's phases: features, then joint).

``--config configs/pixels.py:coco`` reads Karpathy's COCO images (``data/coco``: the folders
``train2014/`` and ``val2014/`` that dataset_coco.json's ``filepath`` names) at 224 px into
ViT-B/16 (``--config.backbone.weights=vit_b16.safetensors``: timm's augreg weights, as
``jaxcap-extract`` reads them; random without), the paper-sized Transformer on its 14 x 14
patches; cross-entropy at the Transformer's Noam schedule, the backbone frozen for the first
5 epochs (``freeze_steps``), then trained with Adam 3e-5 (ExpansionNet v2's joint rate).

``:synthetic`` reads the synthetic scenes drawn as PNGs (``python -m jaxcap.data.render --out
runs/scenes_px --size 64``; ``root=<folder>`` elsewhere) at 64 px into a ResNet-50 of random
weights at a sixteenth of its widths, the Transformer at CPU sizes (configs/transformer.py), the
backbone frozen for the first 300 of 1,000 steps: sized for a 2-core CPU.

Sharded: ``--config.sharding=fsdp`` splits the parameters and Adam's moments over the devices
(``mesh.data``); ``--config.backbone.remat=True`` recomputes the backbone's activations in the
backward pass; ``--config.dtype=bfloat16`` computes in bfloat16 (float32 parameters).
"""

import os

from jaxcap import config_common as common
from jaxcap.data import default_data_config
from jaxcap.errors import BadInput

CPU_SIZES = dict(dim=128, num_layers=2, num_dec_layers=2, num_heads=4, ff_dim=512)


def get_config(arg: str | None = None):
  a = common.parse_arg(arg, root="")
  if a.dataset not in ("synthetic", "coco"):
    raise BadInput(f"config argument dataset: configs/pixels.py reads images of 'synthetic' "
                     f"(drawn by jaxcap.data.render) or 'coco'; got {a.dataset!r}")
  c = common.base_config(a.dataset, "transformer")
  c.learning_rate = 1.0  # the Noam schedule's scale (configs/transformer.py)
  d = default_data_config("karpathy")
  d.attributes = "none"
  d.grid = True
  if a.dataset == "synthetic":
    d.root = a.root or os.path.join("runs", "scenes_px")
    d.dataset_json = "dataset_synthetic_scenes.json"
    d.images_dir = "images"
    d.image_size = 64
    c.data = d
    c = common.cpu_sized(c)
    c.model.update(CPU_SIZES)
    c.backbone.name = "resnet50"
    c.backbone.fields = '{"width": 4, "att_size": 4}'
    c.backbone.freeze_steps = 300
    c.backbone.learning_rate = 1e-4
  else:
    d.root = a.root or os.path.join("data", "coco")
    d.dataset_json = "dataset_coco.json"
    d.images_dir = "."
    d.image_size = 224
    c.data = d
    c.backbone.name = "vit_b16"
    c.backbone.freeze_steps = common.coco_steps(5, c.batch_size)
    c.backbone.learning_rate = 3e-5
  c.decode.max_len = c.data.max_len
  return c
