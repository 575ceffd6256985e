"""Multimodal attention NMT (Caglayan et al., 2016): page, configs and tools in this folder
(README.md)."""

from jaxcap.papers.mnmt import model  # noqa: F401  (registers "mnmt")
