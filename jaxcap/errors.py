"""Two kinds of error: what a user gave is wrong, or jaxcap is.

:class:`BadInput` is raised exactly where jaxcap judges something that came from outside it: a
flag, a config value, a file's bytes, an image, an HTTP request, an argument of the Python API,
an environment variable. Its message names where (the flag, field, file, tensor or key) and what
was expected. The command line prints its first line as ``error: <line>`` and exits 2
(:func:`jaxcap.cli.run_main`); the server answers it as a 4xx JSON line; a notebook catches it
alone::

  try:
    run.caption(feats)
  except jaxcap.BadInput as e:   # the features were wrong, said in one line
    ...

Anything else a program raises -- a ``ValueError`` / ``KeyError`` / ``IndexError`` from jaxcap's
own code, a dependency's or a paper's -- is a bug: it keeps its traceback and ends with
:func:`bug_line` (exit 1; a 500 for the server).

``BadInput`` is a ``ValueError``, and :class:`BadKey`, :class:`BadIndex` and :class:`BadType`
are also the built-in type a caller would catch, so code written against the built-in types
keeps working.
"""

from __future__ import annotations

EXIT_BUG = 1


def bug_words(what: str = "your input", where: str = "the traceback, the command") -> str:
  """Whose error a bug is and how to report it (the program's last line, the server's 500)."""
  from jaxcap.version import __version__
  return (f"an error in jaxcap (or in a library it calls), not in {what}; please report it to "
          f"jaxcap's issue tracker with {where} and the version (jaxcap {__version__})")


def bug_line() -> str:
  """The line that ends a bug's traceback."""
  return "error: the traceback above is " + bug_words()


class BadInput(ValueError):
  """A user's input is wrong: the message says where and what was expected (one line first)."""


class BadKey(BadInput, KeyError):
  """A key a user's file or argument lacks (or should not have); a ``KeyError`` too."""

  def __str__(self) -> str:  # KeyError's repr-quoting would print "'expected ...'"
    return str(self.args[0]) if self.args else ""


class BadIndex(BadInput, IndexError):
  """An index a user gave that is out of range; an ``IndexError`` too."""


class BadType(BadInput, TypeError):
  """A value a user gave of the wrong type; a ``TypeError`` too."""


def first_line(e: BaseException) -> str:
  """The one line of an error's message (its type's name when it has none)."""
  msg = str(e).strip()
  return msg.splitlines()[0] if msg else type(e).__name__
