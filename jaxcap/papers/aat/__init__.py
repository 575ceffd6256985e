"""Adaptive Attention Time (Huang et al., NeurIPS 2019): page, configs and tools in this folder
(README.md)."""

from jaxcap.papers.aat import model  # noqa: F401  (registers "aat")
