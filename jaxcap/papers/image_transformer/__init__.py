"""Image Transformer (He et al., 2020) and its AoANet baseline: page, configs and tools in this
folder (README.md)."""

from jaxcap.papers.image_transformer import aoanet, model  # noqa: F401  (register the models)

# README.md's model table (python -m jaxcap.papers): this paper's models, each with what it is.
MODEL_ROWS = {
    "image_transformer": "Image Transformer: spatial-graph encoder (parent / neighbour / child from the boxes) + implicit decoding layer",
    "aoanet": "AoANet (attention on attention), the Image Transformer paper's baseline",
}

# experiments/flickr8k/table.py: the rows this paper adds (model -> its place, cheapest first).
FLICKR8K_ROWS = {"aoanet": 60, "image_transformer": 70}
