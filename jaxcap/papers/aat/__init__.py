"""Adaptive Attention Time (Huang et al., NeurIPS 2019): page, configs and tools in this folder
(README.md)."""

from jaxcap.papers.aat import model  # noqa: F401  (registers "aat")

# README.md's model table (python -m jaxcap.papers): this paper's models, each with what it is.
MODEL_ROWS = {
    "aat": "Adaptive Attention Time on an Up-Down decoder",
}

# experiments/flickr8k/table.py: the row this paper adds (model -> its place, cheapest first).
FLICKR8K_ROWS = {"aat": 50}
