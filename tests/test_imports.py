"""The ``jaxcap`` package has no import cycle.

Every ``import`` / ``from ... import`` naming a ``jaxcap`` module, at module level or inside a
function, is an edge from the importing module to the module it names (``from jaxcap.a import
b`` names ``jaxcap.a.b`` when that is a module, else ``jaxcap.a``). Parent packages a statement
implicitly runs are not edges: a package's ``__init__`` importing its own submodules would
otherwise be a cycle by construction.
"""

from __future__ import annotations

import ast
import os

import pytest

import jaxcap

ROOT = os.path.dirname(jaxcap.__file__)


def _modules(root: str = ROOT) -> dict[str, str]:
  """``{dotted module name: path}`` of every module of the package."""
  base = os.path.dirname(root)
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
    for f in sorted(filenames):
      if not f.endswith(".py"):
        continue
      rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].split(os.sep)
      if rel[-1] == "__init__":
        rel = rel[:-1]
      out[".".join(rel)] = os.path.join(dirpath, f)
  return out


def _resolve(name: str, modules) -> str | None:
  """``name`` or its longest prefix that is a module of the package."""
  while name and name not in modules:
    name = name.rpartition(".")[0]
  return name or None


def import_graph(modules=None) -> dict[str, set[str]]:
  """``{module: {modules it imports}}`` over the package's modules."""
  modules = modules or _modules()
  graph = {}
  for mod, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    edges = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        if node.level:
          parts = package.split(".")
          parent = ".".join(parts[:len(parts) - node.level + 1])
          base = f"{parent}.{node.module}" if node.module else parent
        else:
          base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
      else:
        continue
      for name in names:
        if name == "jaxcap" or name.startswith("jaxcap."):
          target = _resolve(name, modules)
          if target is not None and target != mod:
            edges.add(target)
    graph[mod] = edges
  return graph


def find_cycle(graph) -> list[str] | None:
  """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  stack: list[str] = []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_graph_sees_function_level_imports():
  graph = import_graph()
  assert "jaxcap.api" in graph["jaxcap"]  # jaxcap.__getattr__ imports it on first use
  assert "jaxcap.data.vocab" in graph["jaxcap.api"]


def test_find_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle():
  cycle = find_cycle(import_graph())
  if cycle:
    pytest.fail("import cycle in jaxcap: " + " -> ".join(cycle))
