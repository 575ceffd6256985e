"""Meshed-Memory Transformer (Cornia et al., CVPR 2020): page, configs and tools in this folder
(README.md)."""

from jaxcap.papers.m2 import model  # noqa: F401  (registers "m2")

# README.md's model table (python -m jaxcap.papers): this paper's model, with what it is.
MODEL_ROWS = {
    "m2": "Meshed-Memory Transformer (M²): memory-augmented encoder + meshed decoder (gated "
          "cross-attention to every encoder layer)",
}

# experiments/flickr8k/table.py: the row this paper adds (model -> its place, cheapest first).
FLICKR8K_ROWS = {"m2": 75}

# jaxcap-import --format m2: the authors' released checkpoint (importer.py).
IMPORTERS = {"m2": "jaxcap.papers.m2.importer"}
