"""How a command-line value becomes a config value (one function, no dependency: the config
files' helpers, the config loader and the benchmarks' flag parsers share it)."""


def literal(text: str):
  """A command-line value as the config field takes it: an int, a float, ``true`` / ``false``
  (any case) as a bool, else the string."""
  for typ in (int, float):
    try:
      return typ(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)
