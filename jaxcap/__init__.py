"""jaxcap: attention-based captioning and multimodal translation models in JAX/Flax.

The Python API (:mod:`jaxcap.api`, imported on first use so that ``import jaxcap.models...``
stays light)::

  run = jaxcap.load("runs/transformer_synthetic")   # config, vocab, info, model, params
  run.caption(features)                             # -> list of captions
  run.evaluate(split="test")                        # -> score dict
  run.ablate(force_gate=1.0)                        # same parameters, changed model
  jaxcap.load_ensemble(["runs/a", "runs/b"])        # several runs decoded as one
  jaxcap.score(references, predictions)             # pycocoevalcap metrics
  jaxcap.get_config("eta.py:synthetic"), jaxcap.train(config, workdir)
  jaxcap.dry_run(config)                            # compiles the steps: will it fit?
  jaxcap.import_checkpoint("model.pth", "infos.pkl", "runs/sc")  # a self-critical.pytorch model
  except jaxcap.BadInput: ...     # what you gave was wrong, said in one line (BadKey/BadIndex/BadType too)
"""

from jaxcap.version import __version__  # noqa: F401  (the package's version)

_API = ("load", "load_ensemble", "score", "train", "dry_run", "get_config", "Run")
_ERRORS = ("BadInput", "BadKey", "BadIndex", "BadType")  # jaxcap.errors: what a user gave is wrong


def __getattr__(name):
  if name in _API:
    from jaxcap import api
    return getattr(api, name)
  if name in _ERRORS:
    from jaxcap import errors
    return getattr(errors, name)
  if name == "import_checkpoint":
    from jaxcap.importers import self_critical
    return self_critical.import_checkpoint
  raise AttributeError(f"module 'jaxcap' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_API) + list(_ERRORS) + ["import_checkpoint"])
