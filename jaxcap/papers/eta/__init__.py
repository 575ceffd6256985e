"""ETA-Transformer (Li et al., ICCV 2019): page, configs and tools in this folder (README.md)."""

from jaxcap.papers.eta import model  # noqa: F401  (registers "eta")
