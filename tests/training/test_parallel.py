"""parallel.DevicePrefetch: the loader's batches, in order, on the mesh, with the loader's state
at the last batch handed out (what a checkpoint must resume from)."""

import time

import numpy as np
import pytest
import jax

from jaxcap.training import parallel


class _Counting:
  """A loader whose k-th batch holds k; its state is the number of batches taken; it fails at
  batch ``fail_at``."""

  def __init__(self, fail_at=None):
    self.next, self.fail_at = 0, fail_at

  def __iter__(self):
    return self

  def __next__(self):
    if self.next == self.fail_at:
      raise ValueError(f"batch {self.next}: bad file")
    batch = {"x": np.full((8, 3), self.next, np.float32)}
    self.next += 1
    return batch

  def get_state(self):
    return {"position": self.next}


def test_batches_in_order_on_the_mesh_and_the_state_of_the_last_one_handed_out():
  mesh = parallel.make_mesh(jax.devices())
  it = parallel.DevicePrefetch(_Counting(), mesh, size=2)
  try:
    assert it.get_state() == {"position": 0}
    for k in range(5):
      host, device = next(it)
      assert host["x"][0, 0] == k and isinstance(device["x"], jax.Array)
      assert device["x"].sharding == parallel.batch_sharding(mesh)
      np.testing.assert_array_equal(np.asarray(device["x"]), host["x"])
      # the loader is ahead (buffered batches), the state is not
      assert it.get_state() == {"position": k + 1}
    deadline = time.time() + 10
    while it._it.next < 5 + 2 and time.time() < deadline:  # the thread fills its 2 places
      time.sleep(0.01)
    assert it._it.next >= 7 and it.get_state() == {"position": 5}
  finally:
    it.close()
  assert not it._thread.is_alive()


def test_a_loader_error_is_raised_by_the_next_that_would_return_its_batch():
  it = parallel.DevicePrefetch(_Counting(fail_at=3), parallel.make_mesh(jax.devices()), size=4)
  assert [int(next(it)[0]["x"][0, 0]) for _ in range(3)] == [0, 1, 2]
  with pytest.raises(ValueError, match="batch 3: bad file"):
    next(it)
  assert it.get_state() == {"position": 3} and not it._thread.is_alive()
