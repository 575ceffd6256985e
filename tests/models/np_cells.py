"""NumPy readings of flax's recurrent cells, shared by the papers' float64 references."""

import numpy as np


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def lstm(p, x, h, c):
  """flax's ``LSTMCell`` equations (input kernels without bias, hidden kernels with bias):
  ``(h', c')`` of input ``x`` and state ``(h, c)`` with the cell's parameters ``p``."""
  gate = lambda g: x @ p["i" + g]["kernel"] + h @ p["h" + g]["kernel"] + p["h" + g]["bias"]
  i, f, g, o = sigmoid(gate("i")), sigmoid(gate("f")), np.tanh(gate("g")), sigmoid(gate("o"))
  c = f * c + i * g
  return o * np.tanh(c), c
