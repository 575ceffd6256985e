"""Meshed-Memory Transformer (Cornia et al., CVPR 2020): page, configs and tools in this folder
(README.md)."""

from jaxcap.papers.m2 import model  # noqa: F401  (registers "m2")
