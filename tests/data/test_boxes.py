"""jaxcap.data.batch.check_boxes: the box rule the Image Transformer relies on."""

import numpy as np
import pytest

from jaxcap.data.batch import check_boxes


def test_valid_and_degenerate_boxes_pass():
  boxes = np.array([[0.0, 0.0, 1.0, 1.0], [0.2, 0.3, 0.2, 0.6], [0.5, 0.5, 0.5, 0.5],
                    [0.1, 0.1, 1.0 + 1e-6, 0.4]], np.float32)
  np.testing.assert_array_equal(check_boxes(boxes, "img 1"), boxes)


@pytest.mark.parametrize("box,msg", [([0.0, np.nan, 1.0, 1.0], "NaN or Inf"),
                                     ([0.0, 0.0, np.inf, 1.0], "NaN or Inf"),
                                     ([0.6, 0.0, 0.5, 1.0], "x1 > x2"),
                                     ([0.0, 0.7, 0.5, 0.2], "y1 > y2"),
                                     ([0.0, 0.0, 1.5, 1.0], r"outside \[0, 1\]"),
                                     ([-0.1, 0.0, 0.5, 1.0], r"outside \[0, 1\]")])
def test_bad_boxes_are_one_line_errors(box, msg):
  boxes = np.array([[0.0, 0.0, 1.0, 1.0], box], np.float32)
  with pytest.raises(ValueError, match=msg) as e:
    check_boxes(boxes, "images/42.npy")
  assert "images/42.npy" in str(e.value) and "'boxes'" in str(e.value) and "\n" not in str(e.value)


def test_padding_rows_are_skipped():
  boxes = np.array([[[0.0, 0.0, 1.0, 1.0], [np.nan, 5.0, -1.0, 0.0]]], np.float32)
  check_boxes(boxes, "batch", mask=np.array([[True, False]]))
  with pytest.raises(ValueError):
    check_boxes(boxes, "batch")
