"""benchmarks/report.py: the docs' benchmark tables come from the committed JSON records."""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import report  # noqa: E402


def test_docs_tables_match_the_committed_records():
  assert report.main(["--check"]) == 0, "run python benchmarks/report.py"


def _row(**kw):
  row = {"model": "transformer", "what": "train", "dtype": "float32", "batch": 50, "beam": None,
         "images_per_s": 3265.0, "step_ms": 15.3, "spread": 0.02, "gflop_per_image": 19.2, "mfu": 0.31,
         "compile_s": 40.0}
  row.update(kw)
  return row


_REFS = {"env": {"torch": "2.11.0", "gpu": "NVIDIA H100 80GB HBM3"},
         "setup": {"train_imgs": 50, "decode_imgs": 100},
         "TransformerModel": {"train_fp32_mask": {"img_per_s": 640.0}, "train_bf16_mask": {"img_per_s": 653.0},
                              "beam3_fp32": {"img_per_s": 266.0}, "greedy_fp32": {"img_per_s": 600.0}},
         "UpDownModel": {"train_fp32_mask": {"error": "Traceback ..."}}}


def _h100(**kw):
  rec = {"environment": {"device_kind": "NVIDIA H100 80GB HBM3", "device_count": 1, "platform": "gpu",
                         "date": "2026-11-23T10:00:00Z", "jax": "0.11.2", "cuda": {"cuda_runtime": 12080},
                         "git_commit": "abcdef1234567"},
         "rows": [_row(), _row(what="beam", beam=3, batch=100, images_per_s=2660.0, mfu=None), _row(model="eta"),
                  _row(model="lstm")]}
  rec.update(kw)
  return rec


def test_render_compares_rows_with_the_fastest_reference_setting_of_the_same_call(tmp_path):
  (tmp_path / "h100.json").write_text(json.dumps(_h100(references="refs.json")))
  (tmp_path / "refs.json").write_text(json.dumps(_REFS))
  records = report.load_records(str(tmp_path))
  assert len(records) == 1  # the references file is not a record of its own
  text = report.render(records)
  assert "NVIDIA H100" in text and "abcdef1234" in text and "2026-11-23" in text and "torch 2.11.0" in text
  lines = [l for l in text.splitlines() if l.startswith("| transformer")]
  assert "5.0× (653 bf16_mask)" in lines[0] and "31.0%" in lines[0]  # bf16 autocast was its fastest
  assert "10.0× (266 fp32)" in lines[1] and "beam-3" in lines[1]
  for model in ("eta", "lstm"):  # no reference model; a reference whose every row failed
    assert [l for l in text.splitlines() if l.startswith(f"| {model}")][0].endswith("| – |")


def test_without_a_references_file_no_ratio_is_given(tmp_path):
  (tmp_path / "h100.json").write_text(json.dumps(_h100()))
  text = report.render(report.load_records(str(tmp_path)))
  assert "×" not in "".join(l for l in text.splitlines() if l.startswith("| transformer"))


def test_summary_has_one_line_per_model_with_its_ratios(tmp_path):
  rec = _h100(references="refs.json")
  rec["rows"].append(_row(what="train", dtype="bfloat16", images_per_s=6530.0))
  rec["rows"].append(_row(model="aat", what="train", error="XlaRuntimeError: RESOURCE_EXHAUSTED"))
  rec["rows"].insert(0, _row(images_per_s=9999.0, dropout=0.0))  # a variant row: not the summary's
  (tmp_path / "h100.json").write_text(json.dumps(rec))
  (tmp_path / "refs.json").write_text(json.dumps(_REFS))
  text = report.render_summary(report.load_records(str(tmp_path)))
  line = [l for l in text.splitlines() if l.startswith("| transformer")][0]
  assert line.startswith("| transformer | 3,265 (5.0×) | 6,530 (10.0×) | – | 2,660 (10.0×) | – |")
  assert [l for l in text.splitlines() if l.startswith("| aat")][0] == "| aat | – | – | – | – | – |"
  full = report.render(report.load_records(str(tmp_path)))
  assert "failed: XlaRuntimeError" in full and "| transformer | train, dropout 0.0 | float32 |" in full


def test_collect_merges_the_parts_and_the_cold_compile_seconds(tmp_path):
  src, dest = tmp_path / "src", tmp_path / "results"
  src.mkdir()
  env = _h100()["environment"]
  # t4: the same step with dropout 0 (another compiled program: not t1's cold compile)
  for name, rows in (("t1", [_row()]), ("t2", [_row(what="beam", beam=3)]), ("t4", [_row(dropout=0.0)]),
                     ("t10", [_row(model="eta")])):
    (src / f"{name}.json").write_text(json.dumps({"argv": [name], "environment": env, "rows": rows}))
  (src / "compile_t1.json").write_text(json.dumps({"rows": [_row(compile_s=61.5, reward=None)]}))
  features = {"backbone": "resnet101", "size": 448, "dtype": "bfloat16", "batch": 64, "compile_s": 20.0,
              "step_ms": 40.0, "spread": 0.01, "images_per_s": 1600.0, "gflop_per_image": 31.2, "mfu": 0.05}
  (src / "t3.json").write_text(json.dumps({"benchmark": "benchmarks/features.py", "argv": [], "environment": env,
                                           "rows": [features]}))
  (src / "compile_t3.json").write_text(json.dumps({"rows": [features]}))  # no model: not a cold compile
  (src / "pytorch_refs.json").write_text(json.dumps(_REFS))
  (src / "nvidia_smi.csv").write_text("name, driver_version\nNVIDIA H100 80GB HBM3, 580\n")
  written = report.collect(str(src), str(dest))
  assert sorted(os.path.basename(p) for p in written) == [
      "features_nvidia_h100_80gb_hbm3_2026-11-23.json", "nvidia_h100_80gb_hbm3_2026-11-23.json",
      "nvidia_h100_80gb_hbm3_2026-11-23_pytorch_refs.json"]
  rec = json.loads((dest / "nvidia_h100_80gb_hbm3_2026-11-23.json").read_text())
  assert rec["argv"] == [["t1"], ["t2"], ["t4"], ["t10"]]  # parts in their number's order, not the name's
  assert [r["compile_s_cold"] for r in rec["rows"]] == [61.5, None, None, None]
  assert rec["references"] == "nvidia_h100_80gb_hbm3_2026-11-23_pytorch_refs.json" and "H100" in rec["nvidia_smi"]
  text = report.render(report.load_records(str(dest)))
  assert "(61.5 cold)" in text and "| resnet101 | 448 | bfloat16 | 64 | 1,600.0 |" in text
  assert "resnet101" not in report.render_summary(report.load_records(str(dest)))


def test_a_cpu_record_gets_no_speedup_column(tmp_path):
  rec = {"environment": {"device_kind": "cpu", "device_count": 1, "date": "2026-11-23T10:00:00Z", "jax": "0.10.2",
                         "cuda": None, "git_commit": None}, "rows": [_row(images_per_s=4.5, mfu=None)]}
  (tmp_path / "cpu.json").write_text(json.dumps(rec))
  line = [l for l in report.render(report.load_records(str(tmp_path))).splitlines() if l.startswith("| transformer")][0]
  assert "×" not in line


def test_notes_name_the_reward_share_and_the_profiled_device_busy_share(tmp_path):
  rec = {"environment": {"device_kind": "NVIDIA H200", "device_count": 1, "date": "2026-11-23T10:00:00Z",
                         "jax": "0.11.2", "cuda": None, "git_commit": None},
         "rows": [_row(what="scst", samples=5, reward_share=0.18),
                  _row(what="sample", samples=5, profile={"busy_pct": 71.0, "kernels": 3000}),
                  _row(profile={"note": "no device stream events in the trace (CPU run?)"}),
                  _row(batch=200, profile={"busy_pct": 95.0, "kernels": 300, "kernel_ms": 20.0,
                                           "by_part": {"attention": 8.0, "dropout masks": 5.0, "layer norm": 4.0,
                                                       "loss": 1.0}})]}
  (tmp_path / "h200.json").write_text(json.dumps(rec))
  lines = [l for l in report.render(report.load_records(str(tmp_path))).splitlines() if l.startswith("| transformer")]
  assert "| reward 18% of the step |" in lines[0]
  assert "sample ×5" in lines[1] and "| device busy 71%, 1,000 kernels/step |" in lines[1]
  assert "| – | – |" in lines[2]
  assert "| device busy 95%, 100 kernels/step; kernel time: attention 40%, dropout masks 25%, layer norm 20% |" in lines[3]


def test_a_second_call_the_same_day_gets_its_own_file_and_the_summary_merges_them(tmp_path):
  """Two leases of one device on one day: the second call's records do not overwrite the first's,
  and README's summary takes each cell from the newest record that has it, naming an older one."""
  dest = tmp_path / "results"
  for name, date, rows in (("a", "2026-11-23T10:00:00Z", [_row(), _row(what="beam", beam=3, batch=100,
                                                                       images_per_s=2660.0)]),
                           ("b", "2026-11-23T16:12:20Z", [_row(images_per_s=4000.0), _row(model="tpgn")])):
    src = tmp_path / name
    src.mkdir()
    env = dict(_h100()["environment"], date=date)
    (src / "t1.json").write_text(json.dumps({"argv": ["t1"], "environment": env, "rows": rows}))
    (src / "pytorch_refs.json").write_text(json.dumps(_REFS))
    report.collect(str(src), str(dest))
  assert sorted(os.listdir(dest)) == [
      "nvidia_h100_80gb_hbm3_2026-11-23.json", "nvidia_h100_80gb_hbm3_2026-11-23_1612.json",
      "nvidia_h100_80gb_hbm3_2026-11-23_1612_pytorch_refs.json", "nvidia_h100_80gb_hbm3_2026-11-23_pytorch_refs.json"]
  report.collect(str(tmp_path / "b"), str(dest))  # collecting the same call again rewrites its own file
  assert len(os.listdir(dest)) == 4
  text = report.render_summary(report.load_records(str(dest)))
  line = [l for l in text.splitlines() if l.startswith("| transformer")][0]
  assert line == "| transformer | 4,000 (6.1×) | – | – | 2,660 (10.0×) [2] | – |", line
  assert "[2] **NVIDIA H100" in text and "nvidia_h100_80gb_hbm3_2026-11-23.json" in text
  assert [l for l in text.splitlines() if l.startswith("| tpgn")]


def test_a_ratio_compares_only_equal_batch_sizes(tmp_path):
  """The reference trains at 50 images and decodes at 100: a jaxcap row at another batch size gets
  no ratio (images/s at 200 or 800 images per step over the reference's 50-image rate is not a
  comparison of the same work)."""
  rec = _h100(references="refs.json", rows=[_row(dtype="bfloat16"), _row(dtype="bfloat16", batch=200, images_per_s=8000.0),
                                              _row(what="beam", beam=3, batch=100, images_per_s=2660.0),
                                              _row(what="beam", beam=3, batch=50, images_per_s=2000.0)])
  (tmp_path / "h100.json").write_text(json.dumps(rec))
  (tmp_path / "refs.json").write_text(json.dumps(_REFS))
  lines = [l for l in report.render(report.load_records(str(tmp_path))).splitlines() if l.startswith("| transformer")]
  assert "5.0× (653 bf16_mask)" in lines[0]
  assert lines[1].endswith("| – |") and "×" not in lines[1], lines[1]
  assert "10.0× (266 fp32)" in lines[2]
  assert lines[3].endswith("| – |") and "×" not in lines[3], lines[3]


def test_the_transformer_gets_a_per_flop_ratio_and_the_lstm_a_different_model_label(tmp_path):
  """The reference Transformer encodes each image once per caption (about twice jaxcap's FLOPs per
  image): its ratio has a per-FLOP one beside it. UpDown is not jaxcap's lstm: that ratio says so."""
  refs = dict(_REFS, UpDownModel={"params_M": 52.125, "train_tf32_mask": {"img_per_s": 1000.0}})
  shapes = {"regions": 36, "feat_dim": 2048, "vocab": 9487, "words": 16, "captions_per_image": 5}
  rec = _h100(references="refs.json", shapes=shapes,
              rows=[_row(gflop_per_image=18.83), _row(model="lstm", images_per_s=6000.0, gflop_per_image=4.44)])
  (tmp_path / "h100.json").write_text(json.dumps(rec))
  (tmp_path / "refs.json").write_text(json.dumps(refs))
  records = report.load_records(str(tmp_path))
  text = report.render(records)
  line = [l for l in text.splitlines() if l.startswith("| transformer")][0]
  per_flop = 3265.0 / 653.0 * 18.83 / report.REFERENCE_TRAIN_GFLOP["transformer"]
  assert line.endswith(f"| 5.0× (653 bf16_mask); {per_flop:.1f}× per FLOP |"), line
  line = [l for l in text.splitlines() if l.startswith("| lstm")][0]
  assert line.endswith("| 6.0× (1,000 tf32_mask) vs UpDown (different model: 15 M vs 52 M parameters) |"), line
  summary = report.render_summary(records)
  assert f"| transformer | 3,265 (5.0×, {per_flop:.1f}× per FLOP) |" in summary
  assert "| lstm | 6,000 (6.0×†) |" in summary and "†: lstm vs UpDown (different model" in summary


def test_collect_of_a_call_with_only_own_record_parts(tmp_path):
  """A call whose parts all keep records of their own (``ONLY=t11``: train.py's loop) writes that
  record, and the precompile count the script wrote names the concurrency of a run.py record."""
  src, dest = tmp_path / "src", tmp_path / "results"
  src.mkdir()
  env = _h100()["environment"]
  loop = {"source": "npz", "model": "transformer", "dtype": "float32", "steps": 60, "workers": 8, "batch": 50,
          "loop_images_per_s": 2500.0, "step_images_per_s": 2900.0, "loop_over_step": 0.86}
  (src / "t11.json").write_text(json.dumps({"benchmark": "benchmarks/input_pipeline.py", "argv": [],
                                            "environment": env, "rows": [loop]}))
  written = report.collect(str(src), str(dest))
  assert [os.path.basename(p) for p in written] == ["input_pipeline_nvidia_h100_80gb_hbm3_2026-11-23.json"]
  (src / "t1.json").write_text(json.dumps({"argv": ["t1"], "environment": env, "rows": [_row()]}))
  (src / "precompile_processes").write_text("5\n")
  report.collect(str(src), str(dest))
  rec = json.loads((dest / "nvidia_h100_80gb_hbm3_2026-11-23.json").read_text())
  assert rec["compile_note"].endswith("5 processes compiling at once")
