"""Multimodal attention NMT (Caglayan et al., 2016): page, configs and tools in this folder
(README.md)."""

from jaxcap.papers.mnmt import model  # noqa: F401  (registers "mnmt")

# README.md's model table (python -m jaxcap.papers): this paper's models, each with what it is.
MODEL_ROWS = {
    "mnmt": "Multimodal attention NMT (Caglayan et al. 2016): bi-GRU + image grid, conditional GRU, MNMT1-8 / NMT / IMGTXT (English → German)",
}

# experiments/flickr8k/table.py: not a row of the captioning table, and why.
FLICKR8K_NOT_ROWS = {
    "mnmt": "a multimodal translation model (multi30k source sentences), not a captioner"}
