"""A sixth model is one file: a module in ``jaxcap/models`` with its registration.

The test copies the package, drops a toy captioner into ``jaxcap/models/toy.py`` (nothing else
in the copy changes), trains it two steps through ``train.py`` with the generic
``configs/base.py`` and decodes it with beam search through ``evaluate.py``: the registry finds
it by name, its fields are its config (overridden on the command line), its teacher-forced
``decode_train`` is the base class's scan of its one ``decode_step``, and the run's files load
it back in a fresh process.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests import fast_compile

REPO = Path(__file__).resolve().parents[2]

TOY = '''"""A toy captioner: a GRU started from the global image feature."""

import flax.linen as nn
import jax.numpy as jnp

from jaxcap.models import fields
from jaxcap.models.base import CaptionModel
from jaxcap.models.registry import register


@register("toy")
class Toy(CaptionModel):
  vocab_size: int
  hidden_dim: int = 64

  field_checks = {"hidden_dim": fields.POSITIVE}

  def setup(self):
    self.init_h = nn.Dense(self.hidden_dim)
    self.embed = nn.Embed(self.vocab_size, self.hidden_dim)
    self.cell = nn.GRUCell(self.hidden_dim)
    self.out = nn.Dense(self.vocab_size)

  def encode(self, batch, train=False):
    return {"h0": jnp.tanh(self.init_h(batch["global_feat"].astype(jnp.float32)))}

  def init_cache(self, enc, max_len):
    return enc["h0"]

  def decode_step(self, enc, cache, tokens, t, train=False):
    h, _ = self.cell(cache, self.embed(tokens))
    return self.out(h).astype(jnp.float32), h, {}
'''

RUN = ["--config.num_train_steps=2", "--config.eval_every_steps=2", "--config.checkpoint_every_steps=2",
       "--config.log_every_steps=1", "--config.test_after_training=False"]


@pytest.mark.slow
def test_a_toy_model_in_one_file_trains_and_decodes_with_beam_search(tmp_path):
  ignore = shutil.ignore_patterns("__pycache__")
  for name in ("jaxcap", "configs"):
    shutil.copytree(REPO / name, tmp_path / name, ignore=ignore)
  for name in ("train.py", "evaluate.py"):
    shutil.copy(REPO / name, tmp_path / name)
  (tmp_path / "jaxcap" / "models" / "toy.py").write_text(TOY)
  env = dict(os.environ, PYTHONPATH=str(tmp_path),
             XLA_FLAGS=fast_compile.FLAGS)  # see tests/conftest.py
  workdir = tmp_path / "runs" / "toy"

  def run(script, *args):
    r = subprocess.run([sys.executable, script, *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r

  run("train.py", "--config=configs/base.py:synthetic,model=toy,tiny", f"--workdir={workdir}",
      "--config.model.hidden_dim=24", *RUN)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"] == {"name": "toy", "hidden_dim": 24}
  r = run("evaluate.py", f"--workdir={workdir}", "--beam-size=3", "--split=test")
  preds = json.loads((workdir / "predictions_test.json").read_text())
  assert len(preds) == 16 and all(isinstance(p["caption"], str) for p in preds)
  assert "CIDEr" in r.stdout

  # The copy ran, not the repository's package: the toy model is nowhere else.
  assert not (REPO / "jaxcap" / "models" / "toy.py").exists()
