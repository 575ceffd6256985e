"""Serving an exported captioner (``jaxcap-export``'s file) with jax and numpy only.

  from jaxcap import serving
  captioner = serving.load("captioner.jaxcap")   # .metadata, .caption(features), .caption_images(images)

:mod:`jaxcap.serving.artefact` reads the file; importing this package imports, of jaxcap,
only :mod:`jaxcap.errors`, :mod:`jaxcap.images` and :mod:`jaxcap.data.batch` (numpy only;
``jaxcap.data``'s other names load on first use) and :mod:`jaxcap.xla_options` (jax only), and
no flax, so a server can load it anywhere jax runs. ``pip install
.`` (jaxcap without its ``train`` extra) installs what it needs: jax, numpy, flatbuffers and
Pillow (tests/test_export.py checks both).
"""

from jaxcap.serving.artefact import Captioner, load

__all__ = ["Captioner", "load"]
