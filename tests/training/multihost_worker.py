"""A few training steps on one fixed global batch, in any process/device layout (test helper).

``run(config, dataset, mesh, rows)`` feeds this process's ``rows`` of the global batch (the
first ``GLOBAL_BATCH`` training images) and returns the per-step losses and the final
parameters. (Real multi-process runs are tested through ``train.py`` itself in
tests/training/test_multihost.py.)
"""

import json
import os
import sys

import numpy as np
import jax

GLOBAL_BATCH = 16
NUM_STEPS = 3


def tiny_config():
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from configs import transformer as transformer_config
  c = transformer_config.get_config("synthetic")
  c.data.num_train, c.data.num_val, c.data.num_test = 32, 8, 8
  c.model.dim, c.model.num_layers, c.model.num_dec_layers = 32, 1, 1
  c.model.num_heads, c.model.ff_dim = 4, 64
  c.model.dropout = 0.3  # large enough that a layout-dependent mask would show in the loss
  c.batch_size = GLOBAL_BATCH
  c.warmup_steps = 2
  return c


def global_batch(dataset):
  from jaxcap.data import pipeline
  return next(iter(pipeline.eval_batches(dataset.split("train"), GLOBAL_BATCH, num_threads=0)))


def run(config, dataset, mesh, rows, *more_rows):
  """``(losses, params)`` of NUM_STEPS steps from this process's ``rows``; with ``more_rows``,
  a list of them, one per row order (compiled once)."""
  from jaxcap.models import registry
  from jaxcap.training import optim, parallel, steps, train_lib
  model = registry.build(config.model, dict(dataset.info))
  batch = global_batch(dataset)
  tx, _ = optim.make_optimizer(config, 1)
  params = train_lib.init_params(model, batch, config.seed, mesh)
  repl, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  state = jax.device_put(steps.create_state(params, tx, jax.random.PRNGKey(1)), repl)
  step = jax.jit(lambda s, b: steps.train_step(s, b, model=model, tx=tx), in_shardings=(repl, data),
                 out_shardings=(repl, repl), compiler_options={"xla_backend_optimization_level": 0})
  host = lambda tree: jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)
  out = []
  for r in (rows, *more_rows):
    local = parallel.shard_batch({k: v[r] for k, v in batch.items()}, mesh)
    s, losses = state, []
    for _ in range(NUM_STEPS):
      s, metrics = step(s, local)
      m = host(metrics)
      losses.append(float(m["loss_sum"] / m["token_count"]))
    flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(host(s.params))}
    out.append((losses, flat))
  return out if more_rows else out[0]
