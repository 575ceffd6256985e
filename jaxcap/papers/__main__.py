"""``python -m jaxcap.papers``: the model table of README.md, from the registered papers.

The shared models (jaxcap/models/) are listed here; each paper declares its own rows in its
package (``jaxcap/papers/<paper>/__init__.py``: ``MODEL_ROWS``, model -> what it is) and its
config and page are found by name, so a new paper is listed without an edit outside its folder.
README.md shows this table; tests/test_readme.py checks that every row it shows is the one
printed here.
"""

from __future__ import annotations

import importlib
import os

from jaxcap.papers import PAPERS

_FLICKR8K = "[flickr8k](experiments/flickr8k/README.md)"
# The models of jaxcap/models/ shown in the table: (name, what it is, its page).
SHARED_ROWS = (
    ("transformer", 'Vaswani et al.; the "Transformer_v" row of the ETA paper', _FLICKR8K),
    ("lstm", "Show-Attend-Tell style LSTM with soft attention (baseline, decoder fixture)", _FLICKR8K),
    ("nearest_neighbour", "retrieval baseline: caption of the closest training image (cosine on the "
     "global feature)", _FLICKR8K),
)
HEADER = "| model (`model.name`) | paper | config | page |\n| --- | --- | --- | --- |"


def rows() -> list[str]:
  """The table's rows: the shared models, then each paper's in PAPERS order."""
  out = [f"| `{name}` | {what} | `configs/{name}.py` | {page} |" for name, what, page in SHARED_ROWS]
  for paper in PAPERS:
    pkg = importlib.import_module(f"jaxcap.papers.{paper}")
    for name, what in getattr(pkg, "MODEL_ROWS", {}).items():
      config = f"jaxcap/papers/{paper}/configs/{name}.py"
      if not os.path.exists(os.path.join(os.path.dirname(pkg.__file__), "configs", f"{name}.py")):
        raise ValueError(f"jaxcap.papers.{paper}.MODEL_ROWS: {name!r} has no config file {config}; "
                         "expected one per listed model")
      out.append(f"| `{name}` | {what} | [`configs/{name}.py`]({config}) | "
                 f"[{paper}](jaxcap/papers/{paper}/README.md) |")
  return out


def table() -> str:
  return "\n".join([HEADER, *rows()])


if __name__ == "__main__":
  print(table())
