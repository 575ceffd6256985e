"""What every checkpoint importer checks before it writes a run: the mapped variables are the
tree (paths and shapes) the model initialises."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.data import batch as batch_lib
from jaxcap.errors import BadInput
from jaxcap.models.base import shift_right


class Named(np.ndarray):
  """An array that remembers which tensor of the user's file it was made from: views, transposes,
  reshapes, row selections and arithmetic keep ``source``, so that a shape found wrong after the
  mapping is named as the file names it (``decoder.layers.0.fc.weight``), not only by the jaxcap
  parameter it became."""

  def __array_finalize__(self, obj):
    self.source = getattr(obj, "source", None)
    self.source_shape = getattr(obj, "source_shape", None)


def named(state: dict) -> dict:
  """``state`` with every array a :class:`Named` view carrying its key."""
  out = {}
  for key, value in state.items():
    if isinstance(value, np.ndarray):
      value = value.view(Named)
      value.source, value.source_shape = key, tuple(value.shape)
    out[key] = value
  return out


def fitted(model, info: dict, variables, checkpoint: str, name: str):
  """``variables`` as float32 arrays once their paths and shapes are those ``model.init``
  makes (traced only, nothing computed); else a one-line ``BadInput`` naming ``checkpoint``,
  the first difference and, where the importer read the file through :func:`named`, the
  file's tensor it came from."""
  batch = jax.tree.map(jnp.asarray, batch_lib.dummy(info, 2))
  abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), batch,
                                               shift_right(batch["captions"])))
  want = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_flatten_with_path(abstract)[0]}
  leaves = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(variables)[0]}
  got = {k: np.shape(v) for k, v in leaves.items()}
  if want != got:
    path = sorted(set(want.items()) ^ set(got.items()))[0][0]
    source = getattr(leaves.get(path), "source", None)
    if source is not None and path in want:
      raise BadInput(f"{checkpoint}: tensor {source!r} {list(leaves[path].source_shape)} "
                     f"does not fit jaxcap's {name}: it becomes {path} {list(got[path])}, expected "
                     f"{list(want[path])}")
    found = f"{list(got[path])}" if path in got else "absent"
    expected = f"{list(want[path])}" if path in want else "none"
    raise BadInput(f"{checkpoint}: the mapped parameters do not fit jaxcap's {name} "
                     f"(first difference: {path}: expected {expected}, found {found})")
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x), jnp.float32), variables)
