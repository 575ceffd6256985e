"""Serving an exported captioner (``jaxcap-export``'s file) with jax and numpy only.

  from jaxcap import serving
  captioner = serving.load("captioner.jaxcap")   # .metadata, .caption(features), .caption_images(images)

:mod:`jaxcap.serving.artefact` reads the file; importing this package imports nothing else
(no flax, no jaxcap model module), so a server can load it anywhere jax runs.
"""

from jaxcap.serving.artefact import Captioner, load

__all__ = ["Captioner", "load"]
