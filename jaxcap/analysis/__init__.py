"""Analyses of trained models: figures (matplotlib), per-word decoder outputs, TPGN role vectors."""
