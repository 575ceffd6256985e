"""What the bad-input corpus (tests/test_bad_inputs.py) and each paper's cases of it share.

A paper declares its cases in ``tests/papers/<paper>/shared_cases.py``: ``BAD_INPUT_MODELS``
(a key -> its config at the tiny sizes, as command-line arguments) and ``BAD_INPUT_CASES``
(cases built with :func:`C`); the corpus collects them from every registered paper.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxcap import config_files

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = f"{REPO}/configs/transformer.py:synthetic"
CONFIG = f"--config={CONFIG_FILE}"
# The three ways to name the config: train.py's default is configs/transformer.py:synthetic,
# so all three run the same config and must fail the same way.
SPELLINGS = {"config-eq": [CONFIG], "config-space": ["--config", CONFIG_FILE], "no-config": []}
NO_TEST = "--config.test_after_training=False"


def tiny_overrides(spec: str) -> list[str]:
  """``jaxcap.config_common.tiny``'s sizes as ``--config.<field>=<value>`` for the fields the
  config has (the spellings without --config run train.py's default, which no config argument
  shrinks)."""
  from jaxcap import config_common as common
  from jaxcap.models import registry
  config = config_files.load(spec)
  sizes = registry.get(config.model.name).tiny_sizes(config.model)
  out = [f"--config.{k}={v}" for k, v in common.TINY_RUN.items() if k in config]
  out += [f"--config.data.{k}={v}" for k, v in common.TINY_DATA.items() if k in config.data]
  out += [f"--config.model.{k}={v}" for k, v in sizes.items() if k in config.model]
  return out + [NO_TEST]


TINY = tiny_overrides(CONFIG_FILE)
# The models of jaxcap/models/ (each case fails before a step is compiled; the tiny sizes keep
# a check that does not fire from turning the case into a long run).
SHARED_MODELS = {
    "transformer": [CONFIG, *TINY],
    "lstm": ["--config=configs/lstm.py:synthetic,tiny", NO_TEST],
    "newfc": ["--config=configs/base.py:synthetic,model=newfc,tiny", NO_TEST],
    "aoa": ["--config=configs/base.py:synthetic,model=aoa,tiny", NO_TEST],
    "updown": ["--config=configs/base.py:synthetic,model=updown,tiny", NO_TEST],
    "nearest_neighbour": ["--config=configs/nearest_neighbour.py:synthetic,tiny", NO_TEST],
    "nearest_neighbour_multi30k": ["--config=configs/nearest_neighbour.py:multi30k,tiny", NO_TEST,
                                   "--config.data.root={tmp}/m30k", "--config.data.text_only=True"],
}


def models() -> dict:
  """Every model key of the corpus: the shared ones and each registered paper's."""
  from tests import papers
  out = dict(SHARED_MODELS)
  for k, v in papers.collected("BAD_INPUT_MODELS").items():
    if k in out:
      raise ValueError(f"BAD_INPUT_MODELS: {k!r} is a shared model's key")
    out[k] = v
  return out


def paper_cases() -> list:
  """Every registered paper's ``BAD_INPUT_CASES``, in PAPERS order."""
  from tests import papers
  return [c for mod in papers.shared_cases() for c in getattr(mod, "BAD_INPUT_CASES", [])]


def C(name, args, needle, *, script="train", data=None, mutate=None, model="transformer",
      spell="config-eq"):
  """One case: ``data`` None (synthetic), "karpathy" (the fake Karpathy dataset in tmp/data);
  ``model`` a key of :func:`models` (its config and tiny sizes); ``spell`` how the config is
  named (a key of ``SPELLINGS``, or "own" when the case's args name it)."""
  return pytest.param(script, args, needle, data, mutate, model, spell, id=name)


def write(rel, text):
  """A mutation: ``text`` written to ``tmp/rel``."""
  return lambda tmp: (tmp / rel).write_text(text)


_M30K_EN = ["a dog runs in the park", "two men play football", "a woman rides a red bike",
            "a child eats an apple", "the dog sleeps on the grass", "a man reads a book"]
_M30K_DE = ["ein hund rennt im park", "zwei männer spielen fußball",
            "eine frau fährt ein rotes rad", "ein kind isst einen apfel",
            "der hund schläft auf dem gras", "ein mann liest ein buch"]


def multi30k(tmp):
  """Multi30k's text as distributed (no image features: the shipped config is text-only)."""
  raw = tmp / "m30k" / "raw"
  raw.mkdir(parents=True)
  for stem, n in (("train", 12), ("val", 4), ("test_2016_flickr", 4)):
    for lang, lines in (("en", _M30K_EN), ("de", _M30K_DE)):
      (raw / f"{stem}.{lang}").write_text("".join(lines[i % len(lines)] + "\n" for i in range(n)))


def config_of(args):
  """The config the command line ``args`` describes (``--config=<spec>`` and
  ``--config.<field>=<value>``), built through the library (jaxcap.get_config)."""
  import jaxcap
  spec = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), CONFIG_FILE)
  overrides = {a[len("--config."):].split("=", 1)[0]: config_files.literal(a.split("=", 1)[1])
               for a in args if a.startswith("--config.")}
  return jaxcap.get_config(spec, **overrides)


def init_workdir(model, *extra):
  """A workdir as train.py leaves it when it starts (config.json, vocab.json, info.json; no
  checkpoint): evaluate.py refuses bad inputs before it loads one."""
  def mutate(tmp):
    from jaxcap import run_dir
    from jaxcap.training import train_lib
    config = config_of([a.format(tmp=tmp) for a in [*models()[model], *extra]])
    trainer = train_lib.Trainer(config, str(tmp / "wd"))
    run_dir.init_workdir(str(tmp / "wd"), config, trainer.dataset.vocab, trainer.info)
  return mutate
