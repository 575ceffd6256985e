"""What every checkpoint importer checks before it writes a run: the mapped variables are the
tree (paths and shapes) the model initialises."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxcap.data import batch as batch_lib
from jaxcap.errors import BadInput
from jaxcap.models.base import shift_right


def fitted(model, info: dict, variables, checkpoint: str, name: str):
  """``variables`` as float32 arrays once their paths and shapes are those ``model.init``
  makes (traced only, nothing computed); else a one-line ``BadInput`` naming ``checkpoint``
  and the first difference."""
  batch = jax.tree.map(jnp.asarray, batch_lib.dummy(info, 2))
  abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), batch,
                                               shift_right(batch["captions"])))
  want = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_flatten_with_path(abstract)[0]}
  got = {jax.tree_util.keystr(k): np.shape(v) for k, v in jax.tree_util.tree_flatten_with_path(variables)[0]}
  if want != got:
    diff = sorted(set(want.items()) ^ set(got.items()))[0]
    raise BadInput(f"{checkpoint}: the mapped parameters do not fit jaxcap's {name} "
                     f"(first difference: {diff[0]} {diff[1]})")
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), variables)
