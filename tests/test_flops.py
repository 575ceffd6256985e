"""FLOPs counted from the jaxpr (jaxcap.flops)."""

from jaxcap import flops


def test_matmul_flops_count_scan_bodies_length_times():
  import jax
  import jax.numpy as jnp
  x = jnp.ones((8, 16))
  w = jnp.ones((16, 16))
  one = 2 * 8 * 16 * 16

  def looped(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=7)[0]

  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(lambda x, w: x @ w)(x, w)) == one
  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(looped)(x, w)) == 7 * one
  # A while loop's body counts the caller's bound of trips (its count is known only as it runs).
  def until(x, w):
    return jax.lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w)), (0, x))[1]

  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(until)(x, w)) == one
  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(until)(x, w), while_trips=5) == 5 * one
  # Inside jit and vmap too; a batched einsum counts every batch element.
  jitted = jax.jit(jax.vmap(lambda a, b: jnp.einsum("ij,jk->ik", a, b), in_axes=(0, None)))
  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(jitted)(jnp.ones((3, 8, 16)), w)) == 3 * one
  # A gradient adds the two backward matmuls.
  grad = jax.grad(lambda w: jnp.sum(x @ w))
  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(grad)(w)) == 2 * one


def test_matmul_flops_of_a_convolution():
  import jax
  x = jax.numpy.ones((2, 5, 5, 3))   # NHWC
  k = jax.numpy.ones((3, 3, 3, 4))   # HWIO
  conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), "VALID",  # noqa: E731
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  # 2 x 3 x 3 outputs x 4 features per image, each 3 x 3 x 3 multiply-adds.
  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(conv)(x, k)) == 2 * (2 * 3 * 3 * 4) * 27
