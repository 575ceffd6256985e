"""Helpers of the benchmark scripts."""

import os
import sys

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


def test_random_boxes_are_valid_and_every_fourth_is_inside_the_one_before():
  import jax
  boxes = common.make_batch(jax.random.PRNGKey(0), 2, 5, 9, 4, 50, 6)["boxes"]
  assert (boxes[..., 2:] >= boxes[..., :2]).all()
  for j in (1, 5):
    assert (boxes[:, j, :2] >= boxes[:, j - 1, :2]).all() and (boxes[:, j, 2:] <= boxes[:, j - 1, 2:]).all()


def test_parse_overrides_converts_numbers_and_booleans():
  assert common.parse_overrides("dim=64, dropout=0.1,share_embeddings=false,modalities=text,") == {
      "dim": 64, "dropout": 0.1, "share_embeddings": False, "modalities": "text"}


def test_matmul_flops_count_scan_bodies_length_times():
  import jax
  import jax.numpy as jnp
  x = jnp.ones((8, 16))
  w = jnp.ones((16, 16))
  one = 2 * 8 * 16 * 16

  def looped(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=7)[0]

  assert common.jaxpr_matmul_flops(jax.make_jaxpr(lambda x, w: x @ w)(x, w)) == one
  assert common.jaxpr_matmul_flops(jax.make_jaxpr(looped)(x, w)) == 7 * one
  # Inside jit and vmap too; a batched einsum counts every batch element.
  jitted = jax.jit(jax.vmap(lambda a, b: jnp.einsum("ij,jk->ik", a, b), in_axes=(0, None)))
  assert common.jaxpr_matmul_flops(jax.make_jaxpr(jitted)(jnp.ones((3, 8, 16)), w)) == 3 * one
  # A gradient adds the two backward matmuls.
  grad = jax.grad(lambda w: jnp.sum(x @ w))
  assert common.jaxpr_matmul_flops(jax.make_jaxpr(grad)(w)) == 2 * one


def test_matmul_flops_of_a_convolution():
  import jax
  x = jax.numpy.ones((2, 5, 5, 3))   # NHWC
  k = jax.numpy.ones((3, 3, 3, 4))   # HWIO
  conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), "VALID",  # noqa: E731
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  # 2 x 3 x 3 outputs x 4 features per image, each 3 x 3 x 3 multiply-adds.
  assert common.jaxpr_matmul_flops(jax.make_jaxpr(conv)(x, k)) == 2 * (2 * 3 * 3 * 4) * 27
