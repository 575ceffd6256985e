"""Helpers of the benchmark scripts."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import common  # noqa: E402


def test_busy_time_is_the_union_of_overlapping_intervals():
  # Two streams: [0, 10) and [5, 12) overlap, [20, 25) is apart, [21, 22) lies inside it.
  assert common.busy_time([(20, 25), (0, 10), (5, 12), (21, 22)]) == 12 + 5
  assert common.busy_time([]) == 0.0
  assert common.busy_time([(3, 3)]) == 0.0


def test_trace_summary_without_a_trace_says_so(tmp_path):
  summary = common.trace_summary(str(tmp_path))
  assert "no *.xplane.pb" in summary["note"] and common.format_trace(summary) == summary["note"]


def test_format_trace_names_busy_share_kernels_and_top_kernels():
  text = common.format_trace({"busy_pct": 62.5, "busy_ms": 5.0, "traced_ms": 8.0, "kernels": 30, "kernel_ms": 6.0,
                              "matmul_ms": 3.0, "top": [["gemm_a", 3.0, 6], ["fusion_1", 1.5, 12]]})
  assert "(62%)" in text and "30 kernels" in text and "matrix-library kernels 3.00 ms" in text
  assert text.splitlines()[2].split() == ["3.000", "50.0", "6", "gemm_a"]


def test_format_trace_adds_the_parts_and_scopes_when_attributed():
  text = common.format_trace({"busy_pct": 90.0, "busy_ms": 9.0, "traced_ms": 10.0, "kernels": 3, "kernel_ms": 10.0,
                              "matmul_ms": 4.0, "top": [["gemm_a", 4.0, 1]],
                              "by_part": {"attention": 6.0, "dropout masks": 3.0}, "unattributed_ms": 1.0,
                              "by_scope": [["bwd dec_layers_*/self_attn/mha", 5.0]]})
  assert "attention 60%, dropout masks 30%, unattributed 10%" in text
  assert text.splitlines()[-1].split() == ["5.000", "50.0", "bwd", "dec_layers_*/self_attn/mha"]


def test_part_and_scope_of_jax_name_stacks():
  fwd = ("jit(train_step)/jvp(vmap(TransformerCaptioner))/TransformerCaptioner.decode_train_grouped/"
         "TransformerCaptioner.decode_train/dec_layers_0/self_attn/mha/mha.attend_kv/bhlm,bmhd->blhd/dot_general")
  bwd = ("jit(train_step)/transpose(jvp(vmap(TransformerCaptioner)))/TransformerCaptioner.encode/encoder/"
         "layer_3/norm1/Dropout_0/jit(_bernoulli)/jit(_uniform)/vmap()/while/body/closed_call/select_n")
  assert common.part_of(fwd) == "attention"
  assert common.scope_of(fwd) == "fwd mha/attend_kv/bhlm,bmhd->blhd"
  assert common.part_of(bwd) == "dropout masks"
  assert common.scope_of(bwd) == "bwd layer_*/norm1/Dropout_*"
  assert common.part_of("jit(train_step)/jvp(vmap())/reduce_max") == "loss"
  assert common.part_of("jit(train_step)/add") == "optimizer, guard, rest"


@pytest.mark.slow
def test_a_traced_step_is_attributed_to_the_parts_of_the_model(tmp_path):
  """On XLA:CPU the traced thunks name their HLO instructions as the device kernels do on a
  GPU: every one is found in the compiled module's text, and the time lands in the model's
  parts, forward and backward."""
  import collections
  import functools

  import jax
  import ml_collections
  import numpy as np
  import optax

  from jaxcap.models import registry
  from jaxcap.models.base import shift_right
  from jaxcap.training import steps

  model = registry.build(ml_collections.ConfigDict(dict(name="transformer", dim=16, num_layers=1, num_dec_layers=1,
                                                        num_heads=2, ff_dim=24)),
                         {"vocab_size": 30, "max_len": 5, "feature_dim": 8})
  r = np.random.RandomState(0)
  batch = {"feats": r.randn(2, 4, 8).astype(np.float32), "feats_mask": np.ones((2, 4), bool),
           "captions": r.randint(4, 30, (2, 2, 6)).astype(np.int32), "valid": np.ones((2,), bool),
           "image_index": np.arange(2, dtype=np.int32)}
  tx = optax.adam(1e-4)
  state = steps.create_state(model.init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"])), tx,
                             jax.random.PRNGKey(1))
  compiled = jax.jit(functools.partial(steps.train_step, model=model, tx=tx)).lower(state, batch).compile()
  state, metrics = compiled(state, batch)
  trace = str(tmp_path)
  with jax.profiler.trace(trace):
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
  ns = collections.Counter()
  for _, start, end, op in common._trace_events(trace, device=False):
    ns[op] += end - start
  names = common.hlo_op_names(compiled.as_text())
  assert ns and not [op for op in ns if op not in names]
  got = common.attribute_kernels(ns, compiled.as_text())
  assert {"attention", "dropout masks", "feed-forward", "output logits"} <= set(got["by_part"])
  assert {s.split()[0] for s, _ in got["by_scope"]} == {"fwd", "bwd"}


def test_parse_overrides_converts_numbers_and_booleans():
  assert common.parse_overrides("dim=64, dropout=0.1,share_embeddings=false,modalities=text,") == {
      "dim": 64, "dropout": 0.1, "share_embeddings": False, "modalities": "text"}


def _compiled_text(fn, *args):
  import jax
  return jax.jit(fn).lower(*args).compile().as_text()


def test_program_kernels_counts_the_programs_kernels_and_conversions():
  import jax
  import jax.numpy as jnp
  x, w = jnp.ones((8, 4)), jnp.ones((4, 4))
  one = common.program_kernels(_compiled_text(lambda x: jnp.tanh(x).sum(), x))
  assert one == {"kernels": 1, "converts": 0}  # one reduce fusion
  # Two independent products: more kernels; bfloat16 operands: conversions among them.
  two = common.program_kernels(_compiled_text(lambda x, w: (x @ w, jnp.tanh(x.T @ x)), x, w))
  assert two["kernels"] >= 2 and two["converts"] == 0
  cast = common.program_kernels(_compiled_text(
      lambda x, w: (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32).sum(), x, w))
  assert cast["converts"] >= 1 and cast["kernels"] >= cast["converts"] + 1

  # A loop body's kernels count once, whatever the trip count; they do count.
  def loop(n):
    def f(x):
      y, _ = jax.lax.scan(lambda c, _: (jnp.sin(c) * 2 + 1, None), x, None, length=n)
      return y.sum()
    return common.program_kernels(_compiled_text(f, x))["kernels"]
  assert loop(3) == loop(30) > one["kernels"]
  assert common.program_kernels("not hlo") == {"kernels": 0, "converts": 0}
