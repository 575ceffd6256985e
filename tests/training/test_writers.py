"""MetricWriter: metrics.jsonl lines and TensorBoard events read back by TensorBoard's own reader.

Mutants tried: writing ``step + 1`` as the event step, dropping the prefix from the TensorBoard
tag, not closing the tensorboardX writer in ``close`` (its thread then has not written the
events) — each fails a test here.
"""

import json
import math

import pytest

from jaxcap.training.writers import MetricWriter

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _scalars(logdir):
  acc = event_accumulator.EventAccumulator(str(logdir))
  acc.Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_events_read_back_with_tags_steps_values(tmp_path):
  w = MetricWriter(str(tmp_path), enabled=True)
  w.write(10, {"loss": 2.5, "lr": 1e-3}, prefix="train/")
  w.write(20, {"loss": 1.25, "lr": 2e-3}, prefix="train/")
  w.write(20, {"CIDEr": 0.75, "Bleu_4": 0.25}, prefix="val/")
  w.write(30, {"sacreBLEU": 31.5}, prefix="val/")
  w.close()
  got = _scalars(tmp_path / "tensorboard")
  # Caption scores named and scaled as the printed tables show them (CIDEr-D / BLEU-4 x100;
  # sacreBLEU is 0-100 already); other scalars as written.
  assert set(got) == {"train/loss", "train/lr", "val/CIDEr-D", "val/BLEU-4", "val/sacreBLEU"}
  assert got["train/loss"] == [(10, 2.5), (20, 1.25)]
  assert [s for s, _ in got["train/lr"]] == [10, 20]
  assert [v for _, v in got["train/lr"]] == pytest.approx([1e-3, 2e-3])
  assert got["val/CIDEr-D"] == [(20, 75.0)] and got["val/BLEU-4"] == [(20, 25.0)]
  assert got["val/sacreBLEU"] == [(30, 31.5)]
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  # metrics.jsonl keeps pycocoevalcap's keys and scale, as every JSON file does.
  assert [(l["step"], l.get("train/loss"), l.get("val/CIDEr")) for l in lines] == [
      (10, 2.5, None), (20, 1.25, None), (20, None, 0.75), (30, None, None)]


def test_non_finite_is_null_in_json(tmp_path):
  w = MetricWriter(str(tmp_path), enabled=True)
  w.write(1, {"loss": float("nan")})
  w.close()
  text = (tmp_path / "metrics.jsonl").read_text()
  assert "NaN" not in text and json.loads(text)["loss"] is None
  assert math.isnan(_scalars(tmp_path / "tensorboard")["loss"][0][1])


def test_disabled_writes_nothing(tmp_path):
  w = MetricWriter(str(tmp_path / "run"), enabled=False)
  w.write(1, {"loss": 1.0})
  w.close()
  assert not (tmp_path / "run").exists()
