"""Nearest-neighbour retrieval baseline (no parameters).

For each test image, the first reference caption of the training image whose global feature
is closest by cosine similarity (the reference point of ../shared/data/README.md: 0.166
CIDEr-D on the Flickr8k test split). Every run can be compared with it under the same
evaluation code: ``python train.py --config configs/nearest_neighbour.py:<dataset>``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxcap.models import fields
from jaxcap.models.registry import register


def _normalise(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@register("nearest_neighbour")
@dataclasses.dataclass
class NearestNeighbour:
  """Cosine nearest neighbour on ``global_feat``; ``trainable = False`` tells train.py to fit.

  Attributes:
    chunk: test images compared at once.
  """

  chunk: int = 1024
  train_feats: np.ndarray | None = dataclasses.field(default=None, init=False, repr=False)
  train_captions: list | None = dataclasses.field(default=None, init=False, repr=False)

  trainable = False
  field_checks = {"chunk": fields.Check(fields.POSITIVE.test,
                                        "a positive int (test images compared at once)")}

  @classmethod
  def tiny_sizes(cls, model_config) -> dict:
    """Nothing to shrink: the ``tiny`` config argument keeps ``chunk``."""
    del model_config
    return {}

  def required_inputs(self) -> tuple[str, ...]:
    return ("image",)

  @staticmethod
  def _global_feats(dataset, split):
    source = dataset.split(split)
    return np.stack([source[i]["global_feat"] for i in range(len(source))])

  def fit(self, dataset) -> "NearestNeighbour":
    self.train_feats = _normalise(self._global_feats(dataset, "train"))
    refs = dataset.references("train")
    self.train_captions = [refs[i][0] for i in dataset.image_ids("train")]
    return self

  def neighbours(self, feats: np.ndarray) -> np.ndarray:
    q = _normalise(feats)
    out = []
    for s in range(0, len(q), self.chunk):
      out.append(np.argmax(q[s:s + self.chunk] @ self.train_feats.T, axis=1))
    return np.concatenate(out) if out else np.zeros((0,), np.int64)

  def predict(self, dataset, split: str) -> dict:
    if self.train_feats is None:
      raise ValueError("nearest_neighbour: call fit(dataset) before predict")
    nn_index = self.neighbours(self._global_feats(dataset, split))
    return {iid: self.train_captions[j] for iid, j in zip(dataset.image_ids(split), nn_index)}
