"""Rough edges a new user hit, checked against the README, Makefile and configs.

Mutants tried: dropping ``$(ARGS)`` from the Makefile's train target, and ``size=small`` keeping
the paper's warm-up, each fail a test here.
"""

import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name):
  with open(os.path.join(REPO, name)) as f:
    return f.read()


def test_readme_says_how_to_use_the_venv_and_make_passes_args():
  readme = _read("README.md")
  assert "source .venv/bin/activate" in readme and ".venv/bin/python train.py" in readme
  m = re.search(r'make train ARGS="([^"]+)"', readme)
  assert m, "the README shows make train ARGS=..."
  train_rule = re.search(r"^train:.*\n\t(.+)$", _read("Makefile"), re.M).group(1)
  assert train_rule.strip() == "$(PY) train.py $(ARGS)"


def test_small_coco_config_is_sized_for_a_small_dataset():
  from configs import transformer
  paper, small = transformer.get_config("coco"), transformer.get_config("coco,size=small")
  assert (paper.batch_size, paper.warmup_steps, paper.data.min_word_count) == (50, 20000, 5)
  assert (small.batch_size, small.warmup_steps, small.num_train_steps) == (16, 300, 2000)
  assert small.data.min_word_count == 2 and small.model.dim == 256
  assert small.warmup_steps < small.num_train_steps // 4 and small.batch_size % 8 == 0
  assert small.data.dataset_json == "dataset_coco.json"
  assert "configs/transformer.py:coco,size=small" in _read("README.md")
  with pytest.raises(ValueError, match="config argument size"):
    transformer.get_config("coco,size=tiny")
