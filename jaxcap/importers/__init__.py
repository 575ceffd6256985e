"""Trained models of other codebases as jaxcap runs (:mod:`jaxcap.importers.self_critical`)."""
