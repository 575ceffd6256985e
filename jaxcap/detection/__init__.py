"""The bottom-up-attention Faster R-CNN detector (issue 71; work in progress, not registered)."""
