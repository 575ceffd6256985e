"""A small registry: models are found by ``config.model.name``."""

from __future__ import annotations

from typing import Any, Callable

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
    raise ValueError(f"config field model.name: unknown model {name!r}; expected one of {sorted(_MODELS)}")
  return _MODELS[name]


def build(model_config, info: dict):
  """Builds the model named by ``model_config.name`` for a dataset described by ``info``."""
  cls = get(model_config.name)
  return cls.from_config(model_config, info)


def _import_all():
  # Importing the modules runs their @register decorators.
  import importlib
  for mod in ("transformer", "nearest_neighbour", "lstm", "eta", "aat", "image_transformer", "mnmt", "tpgn",
              "show_tell"):
    try:
      importlib.import_module(f"jaxcap.models.{mod}")
    except ModuleNotFoundError as e:
      if e.name != f"jaxcap.models.{mod}":
        raise
