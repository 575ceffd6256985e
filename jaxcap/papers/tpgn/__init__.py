"""Tensor Product Generation Network (Huang et al., 2018) and its Show-and-Tell baseline: page,
configs and tools in this folder (README.md)."""

from jaxcap.papers.tpgn import model, show_tell  # noqa: F401  (register the models)
