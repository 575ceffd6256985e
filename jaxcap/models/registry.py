"""A small registry: models are found by ``config.model.name``.

A model registers itself (``@register("name")``) in a module of ``jaxcap.models`` (the shared
baselines) or of a paper's folder (``jaxcap/papers/<paper>/``, listed in
:data:`jaxcap.papers.PAPERS`); the registry imports them all when it is first asked for a name.
"""

from __future__ import annotations

from typing import Any, Callable

from jaxcap.errors import BadInput

_MODELS: dict[str, Callable[..., Any]] = {}


def register(name: str):
  """Class decorator: ``@register("transformer")``."""

  def wrap(cls):
    if name in _MODELS and _MODELS[name] is not cls:
      raise ValueError(f"model name {name!r} is registered twice")
    _MODELS[name] = cls
    cls.registry_name = name
    return cls

  return wrap


def names() -> list[str]:
  _import_all()
  return sorted(_MODELS)


def get(name: str):
  _import_all()
  if name not in _MODELS:
    raise BadInput(f"config field model.name: unknown model {name!r}; expected one of {sorted(_MODELS)}")
  return _MODELS[name]


def build(model_config, info: dict):
  """Builds the model named by ``model_config["name"]`` (a ConfigDict or a plain mapping) for a
  dataset described by ``info``
  (the config checked against the module's fields: :func:`jaxcap.models.fields.build`)."""
  from jaxcap.models import fields
  return fields.build(get(model_config["name"]), model_config, info)


_imported = False


def _import_all():
  # Importing the package's modules runs their @register decorators.
  global _imported
  if _imported:
    return
  _imported = True
  import importlib
  import pkgutil
  import jaxcap.models as package
  from jaxcap.papers import PAPERS
  for info in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f"{package.__name__}.{info.name}")
  for paper in PAPERS:  # each paper package imports its model modules
    importlib.import_module(f"jaxcap.papers.{paper}")
