"""Analyses of trained models (TPGN role vectors, ...)."""
