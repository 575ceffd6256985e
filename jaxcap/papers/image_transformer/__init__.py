"""Image Transformer (He et al., 2020) and its AoANet baseline: page, configs and tools in this
folder (README.md)."""

from jaxcap.papers.image_transformer import aoanet, model  # noqa: F401  (register the models)
