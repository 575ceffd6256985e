"""AAT's per-word figure (jaxcap/papers/aat/figures.py) and its script.

Mutant tried: drawing no patch for the attention steps fails
``test_attention_steps_one_box_per_taken_step``.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from jaxcap.papers.aat import figures
from tests.analysis.pngs import check_png as _check_png

REPO = Path(__file__).resolve().parents[3]


def test_attention_steps_png(tmp_path):
  steps = np.array([0, 2, 4])
  conf = np.full((3, 5), 0.5)
  beta = np.zeros((3, 5))
  for t, n in enumerate(steps):
    beta[t, : n + 1] = 1.0 / (n + 1)
  figures.plot_attention_steps(["a", "red", "<eos>"], steps, conf, beta,
                               out=str(tmp_path / "steps.png"), title="a red")
  _check_png(tmp_path / "steps.png")
  with pytest.raises(ValueError, match="plot_attention_steps"):
    figures.plot_attention_steps(["a"], steps, conf, beta)


def test_attention_steps_one_box_per_taken_step():
  steps = np.array([0, 2, 4])
  conf = np.full((3, 5), 0.5)
  beta = np.full((3, 5), 0.2)
  fig = figures.plot_attention_steps(["a", "red", "<eos>"], steps, conf, beta)
  taken = sorted(p.get_gid() for p in fig.axes[0].patches if p.get_gid())
  want = sorted(f"step:{t}:{n}" for t, s in enumerate(steps) for n in range(s + 1))
  assert taken == want  # slot 0 plus N(t) attention steps per word, nothing after N(t)
  assert len(fig.axes[0].texts) == len(want)


def _script(path):
  spec = importlib.util.spec_from_file_location(f"_script_{path.replace('/', '_')[:-3]}", REPO / path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.slow  # builds and decodes an (untrained) AAT model
def test_plot_attention_steps_script_random_init(tmp_path):
  out = tmp_path / "steps.png"
  _script("jaxcap/papers/aat/plot_attention_steps.py").main(["--random_init", "--out", str(out)])
  _check_png(out)
