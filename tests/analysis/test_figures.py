"""jaxcap.analysis.figures: every figure function writes a valid, non-blank PNG (tiny inputs).

The PNG checks read the file back independently of matplotlib's writer: the 8-byte signature,
the IHDR width / height, and the decoded pixels (matplotlib.image.imread) holding more than the
background colour. ``load_metrics`` is checked against hand-written metrics.jsonl lines.

Mutants tried: ``load_metrics`` keeping the first of two lines with the same step (a resumed
run) fails ``test_load_metrics_resumed_run_and_nulls``; outlining box 0 instead of the most
attended box fails ``test_region_attention_marks_the_most_attended_box``; not calling savefig
(``finish`` ignoring ``out``) fails every test that writes a PNG.
"""

import json

import numpy as np
import pytest

from jaxcap.analysis import figures
from tests.analysis.pngs import check_png as _check_png


def _metrics_file(tmp_path):
  lines = [
      {"step": 10, "time": 1.0, "train/loss": 3.0, "train/lr": 1e-3},
      {"step": 20, "time": 2.0, "train/loss": 2.0, "train/lr": 2e-3},
      {"step": 20, "time": 2.1, "val/CIDEr": 0.1, "val/Bleu_4": 0.05},
      {"step": 30, "time": 3.0, "train/loss": 9.9, "train/lr": None},  # NaN written as null
      # resumed from the step-20 checkpoint: steps 30.. again, the later lines win
      {"step": 30, "time": 9.0, "train/loss": 1.5, "train/lr": 3e-3},
      {"step": 40, "time": 9.5, "train/loss": 1.25, "train/reward": 0.4, "train/greedy_reward": 0.3},
      {"step": 40, "time": 9.6, "val/CIDEr": 0.3, "val/Bleu_4": 0.1},
  ]
  path = tmp_path / "metrics.jsonl"
  path.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
  return path


def test_load_metrics_resumed_run_and_nulls(tmp_path):
  _metrics_file(tmp_path)
  m = figures.load_metrics(tmp_path)  # the workdir
  assert set(m) == {"train/loss", "train/lr", "val/CIDEr", "val/Bleu_4", "train/reward",
                    "train/greedy_reward"}
  steps, loss = m["train/loss"]
  assert steps.tolist() == [10, 20, 30, 40] and loss.tolist() == [3.0, 2.0, 1.5, 1.25]
  assert m["train/lr"][0].tolist() == [10, 20, 30] and m["train/lr"][1][2] == 3e-3
  assert m["val/CIDEr"][0].tolist() == [20, 40]
  assert m["train/reward"][1].tolist() == [0.4]
  (tmp_path / "bad.jsonl").write_text('{"step": 1}\nnot json\n')
  with pytest.raises(ValueError, match="bad.jsonl: line 2"):
    figures.load_metrics(tmp_path / "bad.jsonl")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_training_curves_png(tmp_path):
  path = _metrics_file(tmp_path)
  fig = figures.plot_training_curves(path, out=str(tmp_path / "curves.png"))
  _check_png(tmp_path / "curves.png")
  assert [ax.get_title() for ax in fig.axes] == ["training loss", "SCST reward", "validation"]
  # The validation scores as every printed table shows them: CIDEr-D / BLEU-4, x100.
  val = fig.axes[2]
  assert [line.get_label() for line in val.get_lines()] == ["BLEU-4", "CIDEr-D"]
  assert [line.get_ydata().tolist() for line in val.get_lines()] == [[5.0, 10.0], [10.0, 30.0]]
  assert val.get_ylabel() == "score x100" and fig.axes[0].get_ylabel() == ""
  assert [t.get_text() for t in val.get_legend().get_texts()] == ["BLEU-4", "CIDEr-D"]
  with pytest.raises(ValueError, match="no train/loss"):
    figures.plot_training_curves({"train/lr": (np.array([1]), np.array([1.0]))})


def test_region_attention_png_and_given_image(tmp_path):
  words = ["a", "red", "cube"]
  att = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.0, 0.1, 0.9]])
  boxes = np.array([[10, 10, 60, 50], [40, 30, 90, 70], [5, 60, 30, 78]], float)
  figures.plot_region_attention(words, att, boxes, image_size=(100, 80),
                                out=str(tmp_path / "att.png"), title="test")
  _check_png(tmp_path / "att.png")
  image = np.random.default_rng(0).uniform(size=(80, 100, 3))
  figures.plot_region_attention(words[:2], att[:2], boxes / [100, 80, 100, 80], image=image,
                                out=str(tmp_path / "att_img.png"))
  _check_png(tmp_path / "att_img.png")
  with pytest.raises(ValueError, match="plot_region_attention"):
    figures.plot_region_attention(words, att[:, :2], boxes)


def test_region_attention_marks_the_most_attended_box():
  att = np.array([[0.1, 0.7, 0.2]])
  boxes = np.array([[0, 0, 0.3, 0.3], [0.4, 0.4, 0.9, 0.8], [0.0, 0.6, 0.2, 0.9]])
  fig = figures.plot_region_attention(["x"], att, boxes)
  ax = fig.axes[0]
  rects = [p for p in ax.patches if p.get_linewidth() == 2.0]
  assert len(rects) == 1
  assert (rects[0].get_x(), rects[0].get_y()) == pytest.approx((0.4, 0.4))
  assert [t.get_text() for t in ax.texts] == ["0.70"]


def test_box_relations_png_on_given_axes(tmp_path):
  fig = figures.new_figure(6, 3)
  ax1, ax2 = fig.subplots(1, 2)
  boxes = np.array([[0.1, 0.1, 0.8, 0.8], [0.2, 0.2, 0.4, 0.4], [0.85, 0.1, 0.95, 0.3]])
  got = figures.plot_box_relations(boxes, ["query", "child", "neighbour"], ax=ax1)
  figures.plot_box_relations(boxes, ["parent", "query", "none"], ax=ax2, title="query 1")
  assert got is fig
  figures.save_png(fig, str(tmp_path / "rel.png"))
  _check_png(tmp_path / "rel.png")


# ------------------------------------------------------------------------------ the scripts
REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _script(path):
  import importlib.util
  spec = importlib.util.spec_from_file_location(f"_script_{path.replace('/', '_')[:-3]}", REPO / path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_figures_script_curves(tmp_path):
  _metrics_file(tmp_path)
  out = tmp_path / "c.png"
  assert _script("scripts/figures.py").main(["curves", "--workdir", str(tmp_path), "--out", str(out)]) == [str(out)]
  _check_png(out)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_image_transformer_figure3_script(tmp_path):
  out = tmp_path / "fig3.png"
  _script("jaxcap/papers/image_transformer/analysis.py").main(["figure3", "--out", str(out)])
  _check_png(out)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_caption_aux_of_an_lstm_feeds_the_region_attention_figure(tmp_path):
  """jaxcap.analysis.words.caption_aux -> plot_region_attention, on an untrained tiny LSTM."""
  import jax
  from configs import lstm as lstm_config
  from jaxcap import data as data_lib
  from jaxcap.analysis.words import caption_aux
  from jaxcap.data import pipeline
  from jaxcap.models import registry
  from jaxcap.models.base import shift_right
  c = lstm_config.get_config("synthetic")
  c.data.num_train, c.data.num_val, c.data.num_test = 16, 8, 8
  c.model.hidden_dim = c.model.embed_dim = c.model.att_dim = 16
  ds = data_lib.get_dataset(c.data)
  model = registry.build(c.model, dict(ds.info))
  batch = next(iter(pipeline.eval_batches(ds.split("test"), 2, num_threads=0)))
  params = model.init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"]), train=False)
  batch = {k: v for k, v in batch.items() if k in ("feats", "feats_mask", "boxes", "global_feat")}
  words, aux = caption_aux(model, params, batch, ds.vocab, max_len=5, row=1)
  n_regions = int(np.sum(batch["feats_mask"][1]))
  assert 1 <= len(words) <= 6 and aux["attention"].shape == (len(words), batch["feats"].shape[1])
  np.testing.assert_allclose(aux["attention"][:, :n_regions].sum(-1), 1.0, rtol=1e-5)
  figures.plot_region_attention(words, aux["attention"][:, :n_regions],
                                batch["boxes"][1][:n_regions], out=str(tmp_path / "a.png"))
  _check_png(tmp_path / "a.png")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_run_plot_words_and_training_curves(tmp_path):
  """The API's figure methods (jaxcap.api.Run.plot_words / plot_training_curves) write PNGs."""
  import jax
  from configs import lstm as lstm_config
  from jaxcap import api
  from jaxcap import data as data_lib
  from jaxcap.data import pipeline
  from jaxcap.models import registry
  from jaxcap.models.base import shift_right
  c = lstm_config.get_config("synthetic")
  c.data.num_train, c.data.num_val, c.data.num_test = 16, 8, 8
  c.model.hidden_dim = c.model.embed_dim = c.model.att_dim = 16
  c.decode.max_len = 5
  ds = data_lib.get_dataset(c.data)
  model = registry.build(c.model, dict(ds.info))
  batch = next(iter(pipeline.eval_batches(ds.split("test"), 2, num_threads=0)))
  params = model.init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"]), train=False)
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 1, "time": 0, "train/loss": 3.0}\n{"step": 2, "time": 1, "train/loss": 2.5}\n')
  run = api.Run(c, ds.vocab, dict(ds.info), model, params, workdir=str(tmp_path))
  feats = {k: v for k, v in batch.items() if k in ("feats", "feats_mask", "boxes", "global_feat")}
  written = run.plot_words(feats, str(tmp_path / "w"), index=1)
  assert written == [str(tmp_path / "w_attention.png")]
  _check_png(tmp_path / "w_attention.png")
  run.plot_training_curves(out=str(tmp_path / "c.png"))
  _check_png(tmp_path / "c.png")


@pytest.mark.slow
@pytest.mark.parametrize("attention_impl", ["einsum", "xla"])
def test_run_plot_words_of_a_transformer(tmp_path, attention_impl):
  """The Transformer's decoder reports its cross-attention (aux["attention"]): plot_words
  draws it; with a fused attention_impl there are no weights and the error says what to do."""
  import jax
  from configs import transformer as transformer_config
  from jaxcap import api
  from jaxcap import data as data_lib
  from jaxcap.data import pipeline
  from jaxcap.models import registry
  from jaxcap.models.base import shift_right
  c = transformer_config.get_config("synthetic")
  c.data.num_train, c.data.num_val, c.data.num_test = 16, 8, 8
  c.model.update(dim=16, num_layers=1, num_dec_layers=2, num_heads=2, ff_dim=16,
                 attention_impl=attention_impl)
  c.decode.max_len = 5
  ds = data_lib.get_dataset(c.data)
  model = registry.build(c.model, dict(ds.info))
  batch = next(iter(pipeline.eval_batches(ds.split("test"), 2, num_threads=0)))
  params = model.init(jax.random.PRNGKey(0), batch, shift_right(batch["captions"]), train=False)
  run = api.Run(c, ds.vocab, dict(ds.info), model, params, workdir=str(tmp_path))
  feats = {k: v for k, v in batch.items() if k in ("feats", "feats_mask", "boxes", "global_feat")}
  if attention_impl != "einsum":
    with pytest.raises(ValueError, match="attention_impl='einsum'"):
      run.plot_words(feats, str(tmp_path / "w"), index=1)
    return
  written = run.plot_words(feats, str(tmp_path / "w"), index=1)
  assert written == [str(tmp_path / "w_attention.png")]
  _check_png(tmp_path / "w_attention.png")


@pytest.mark.parametrize("line, expected", [
    (b"[1, 2]", "line 2: a JSON list; expected a metrics record"),
    (b'{"step": "ten", "train/loss": 1.0}', "line 2: step 'ten'; expected an integer"),
    (b'{"step": 10, "train/loss": [1.0]}', "line 2: train/loss is [1.0]; expected a number or null"),
    (b'{"step": 10, "x": "\xff"}', "line 2 is not JSON"),
    (b"[" * 100_000, "line 2 is not JSON"),
])
def test_load_metrics_refuses_a_damaged_line_naming_it(tmp_path, line, expected):
  """They raised AttributeError, ValueError, TypeError, UnicodeDecodeError and RecursionError."""
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(b'{"step": 5, "train/loss": 2.0}\n' + line + b"\n")
  with pytest.raises(figures.BadInput) as e:
    figures.load_metrics(tmp_path)
  assert str(e.value).startswith(f"{path}: ") and expected in str(e.value), str(e.value)
  with pytest.raises(figures.BadInput, match=r"^records\[0\]: a JSON list"):
    figures.load_metrics([[1, 2]])
