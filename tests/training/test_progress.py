"""The training progress bar shows the loss from the first step, the SCST reward, and the
validation scores (train_lib._postfix and Trainer.fit's bar updates).

Mutants tried: updating the bar only on log steps (the old behaviour) fails
``test_fit_bar_shows_loss_reward_and_validation``; ``_postfix`` dropping the reward, or
forgetting earlier fields (validation scores vanish at the next update), fails the unit test.
"""

import pytest

from jaxcap.training import train_lib

from tests.training.test_train import tiny_config


def test_postfix_keeps_fields_and_adds_reward_and_validation():
  p = train_lib._postfix({}, {"loss": 2.34567, "lr": 1e-3, "images_per_sec": 123.4})
  assert p == {"loss": "2.346", "lr": "1.00e-03", "img_s": "123"}
  p = train_lib._postfix(p, {"val_CIDEr": 0.51234, "val_Bleu_4": 0.2})
  # Named and scaled as the tables print them, the scale in the name (the bar has no header).
  assert p["val_CIDEr-D_x100"] == "51.23" and p["val_BLEU-4_x100"] == "20.00" and p["loss"] == "2.346"
  p = train_lib._postfix(p, {"loss": -0.5, "reward": 0.75, "greedy_reward": 0.7})
  assert (p["loss"], p["reward"], p["greedy"], p["val_CIDEr-D_x100"]) == ("-0.500", "0.750", "0.700", "51.23")
  assert train_lib._postfix({}, {"val_sacreBLEU": 35.2}) == {"val_sacreBLEU": "35.20"}  # 0-100 already


class _Bar:
  mininterval = 0.0  # every step may refresh

  def __init__(self):
    self.calls, self.steps = [], 0

  def set_postfix(self, fields, refresh=True):
    self.calls.append((self.steps, dict(fields)))

  def update(self, n):
    self.steps += n

  def unpause(self):  # the clock restarts after the first step's compilation
    pass

  def write(self, msg):
    pass

  def close(self):
    pass


@pytest.mark.slow  # ~30 s of CPU: compiles the XE, SCST and decoding steps
def test_fit_bar_shows_loss_reward_and_validation(tmp_path, monkeypatch):
  bar = _Bar()
  monkeypatch.setattr(train_lib, "_progress", lambda total, initial: bar)
  # log_every_steps beyond the run: without the running-mean updates the bar would show
  # nothing until the final step.
  config = tiny_config(num_train_steps=4, log_every_steps=100, eval_every_steps=2,
                       eval_num_images=8)
  config.scst.start_step = 2
  config.scst.num_samples = 2
  config.scst.baseline = "mean"
  config.data.cache_dir = str(tmp_path / "cache")
  train_lib.Trainer(config, str(tmp_path / "run")).fit()
  first_step, first = bar.calls[0]
  assert first_step == 0 and "loss" in first  # after the first step, before any log
  # bar.steps counts finished steps: the validation after step 2 is recorded at 2.
  assert any("val_CIDEr-D_x100" in f and "val_BLEU-4_x100" in f and "reward" not in f
             for s, f in bar.calls if s == 2)
  scst = [f for s, f in bar.calls if s >= 3]  # after SCST steps 3 and 4
  assert scst and all("reward" in f and "val_CIDEr-D_x100" in f for f in scst)
  assert "lr" in bar.calls[-1][1]


def test_the_bars_rate_and_remaining_time_leave_out_the_first_steps_compilation(tmp_path, monkeypatch):
  import io
  import time
  from tqdm import tqdm
  bar = tqdm(total=100, initial=0, file=io.StringIO(), mininterval=0.0)
  monkeypatch.setattr(train_lib, "_progress", lambda total, initial: bar)
  log = train_lib._TrainLog(str(tmp_path), 100, 0, batch_size=1)
  time.sleep(0.6)  # the first step: compiling
  for _ in range(5):
    log.advance()  # then fast steps
  meter = bar.format_dict
  # Counting the compile, 5 steps in >= 0.6 s would put the remaining 95 at >= 11 s.
  assert meter["elapsed"] < 0.3 and meter["n"] == 5
  rate = meter["rate"] or meter["n"] / max(meter["elapsed"], 1e-9)
  assert (100 - 5) / rate < 5.0
  log.close()
