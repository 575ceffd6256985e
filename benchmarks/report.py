"""Turns the committed benchmark records into the tables of docs/PERFORMANCE.md and README.md.

  python benchmarks/report.py            # rewrites the generated sections in place
  python benchmarks/report.py --check    # exit 1 when a generated section is out of date (CI-able)
  python benchmarks/report.py --print    # only print the tables
  python benchmarks/report.py --collect DIR   # one benchmarks/gpu_record.sh call's files -> records

Reads every ``benchmarks/results/*.json`` written by ``benchmarks/run.py`` (or collected from
``benchmarks/gpu_record.sh``) and replaces the text between ``<!-- benchmark-results:begin -->``
and ``<!-- benchmark-results:end -->`` in docs/PERFORMANCE.md (one table per record: device,
date, commit, versions; one row per benchmark row) and in README.md (one summary line per model
from the newest accelerator's records, each cell from the newest record that has it), so the
numbers in the docs are never typed by hand. A record whose ``references`` names the PyTorch
references' JSON measured in the same call (``../shared/anchors/bench_pytorch_refs.py``) gets each row's ratio to the matching reference row:
the reference's fastest setting (strict fp32, TF32 or bf16 autocast; attention masks or none) at
the row's batch size (none where the reference ran at another one), labelled where the reference
is a different model, with a per-FLOP ratio beside it where the reference does other arithmetic.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)

from jaxcap import atomic  # noqa: E402  (after the checkout's path)

RESULTS = os.path.join(_REPO, "benchmarks", "results")
DOCS = (os.path.join(_REPO, "docs", "PERFORMANCE.md"), os.path.join(_REPO, "README.md"))
OPTIONAL = {DOCS[1]}  # the README may only link to docs/PERFORMANCE.md
BEGIN, END = "<!-- benchmark-results:begin -->", "<!-- benchmark-results:end -->"

# jaxcap model -> the PyTorch reference model of bench_pytorch_refs.py (self-critical.pytorch's
# Transformer, UpDown and AoANet; the official AAT code).
REFERENCE_MODELS = {"transformer": "TransformerModel", "aat": "AATModel", "aoanet": "AoAModel",
                    "lstm": "UpDownModel"}
REFERENCE_KINDS = {"train": "train_", "greedy": "greedy_", "beam": "beam3_"}
# jaxcap models whose reference is a different model, with jaxcap's parameter count (millions, the
# paper-sized model at COCO shapes: jax.eval_shape of its init): jaxcap's lstm is one LSTM with
# soft attention, UpDown an attention LSTM and a language LSTM. Their ratio is labelled as such.
DIFFERENT_MODEL_PARAMS_M = {"lstm": 15.0}
# The shapes of bench_pytorch_refs.py's runs (its "setup"), under which the FLOP count below holds.
COCO_SHAPES = {"regions": 36, "feat_dim": 2048, "vocab": 9487, "words": 16, "captions_per_image": 5}
# GFLOP per image of the reference's training step where it does other arithmetic than jaxcap's
# for the same images: self-critical.pytorch's Transformer encodes each image once per caption, so
# its step is 5 x what jaxcap's Transformer step does for an image with one caption, 5 x 7.73
# (matrix-multiply FLOPs of the jaxpr, jaxcap.flops, COCO shapes; 18.83 at 5 captions, as in the
# records). A per-FLOP ratio is shown beside its images/s ratio.
REFERENCE_TRAIN_GFLOP = {"transformer": 38.65}
FEATURES = "benchmarks/features.py"
PIPELINE = "benchmarks/input_pipeline.py"
CHECKPOINTS = "benchmarks/checkpoint_save.py"
DECODE_AUX = "benchmarks/decode_aux.py"
EXPORT = "benchmarks/export.py"
CLIP_SCORE = "benchmarks/clip_score.py"
CLIP_REWARD = "benchmarks/clip_reward_step.py"
SHARDED = "benchmarks/sharded_memory.py"
DETECTOR = "benchmarks/detector.py"
MESH_DRIFT = "benchmarks/mesh_drift.py"
DETECTOR_VS_REFERENCE = "scripts/detection/time_against_reference.py"
SIDE_BY_SIDE = "benchmarks/cpu_side_by_side.py"
OWN_RECORDS = {MESH_DRIFT: "mesh_drift_", FEATURES: "features_", PIPELINE: "input_pipeline_",  # records kept in their own file
               CHECKPOINTS: "checkpoint_save_", DECODE_AUX: "decode_aux_", EXPORT: "export_",
               CLIP_SCORE: "clip_score_", CLIP_REWARD: "clip_reward_step_", SHARDED: "sharded_memory_",
               DETECTOR: "detector_", DETECTOR_VS_REFERENCE: "detector_vs_reference_",
               SIDE_BY_SIDE: "cpu_side_by_side_"}


def load_records(folder: str = RESULTS) -> list[dict]:
  """The run.py records under ``folder`` (PyTorch reference files are read through the record
  that names them), each with ``_file`` and, where it names one, ``_references``."""
  records = []
  for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    with open(path) as f:
      rec = json.load(f)
    if "rows" not in rec:  # a references file
      continue
    rec["_file"] = os.path.relpath(path, _REPO)
    if rec.get("references"):
      with open(os.path.join(os.path.dirname(path), rec["references"])) as f:
        rec["_references"] = json.load(f)
    records.append(rec)
  return records


def reference(refs: dict | None, row: dict):
  """``(images/s, setting)`` of the fastest matching PyTorch reference row at the row's batch
  size, or None (images/s at another batch size is another measurement: no ratio)."""
  model = REFERENCE_MODELS.get(row["model"])
  prefix = REFERENCE_KINDS.get(row["what"])
  if not refs or not model or not prefix or row["what"] == "beam" and row.get("beam") != 3:
    return None
  setup = refs.get("setup") or {}
  default_batch = setup.get("train_imgs") if row["what"] == "train" else setup.get("decode_imgs")
  found = [(v["img_per_s"], k[len(prefix):]) for k, v in (refs.get(model) or {}).items()
           if k.startswith(prefix) and isinstance(v, dict) and v.get("img_per_s")
           and v.get("batch", default_batch) == row.get("batch")]
  return max(found) if found else None


def ratio_parts(rec: dict, row: dict) -> dict | None:
  """The row against its reference: ``x`` (images/s over the reference's), ``ref`` and ``setting``
  (the reference's fastest), ``per_flop`` (where the reference does other arithmetic per image)
  and ``label`` (where it is another model); None without a reference row at the same batch."""
  ref = reference(rec.get("_references"), row) if "images_per_s" in row else None
  if not ref:
    return None
  out = {"x": row["images_per_s"] / ref[0], "ref": ref[0], "setting": ref[1], "per_flop": None, "label": ""}
  ref_gflop = REFERENCE_TRAIN_GFLOP.get(row["model"]) if row["what"] == "train" else None
  shapes = rec.get("shapes") or {}
  if (ref_gflop and row.get("gflop_per_image") and all(shapes.get(k) == v for k, v in COCO_SHAPES.items())
      and row.get("layers") is None and row.get("overrides") is None):
    out["per_flop"] = out["x"] * row["gflop_per_image"] / ref_gflop
  if row["model"] in DIFFERENT_MODEL_PARAMS_M:
    theirs = (rec["_references"].get(REFERENCE_MODELS[row["model"]]) or {}).get("params_M")
    out["label"] = (f"vs {REFERENCE_MODELS[row['model']].replace('Model', '')} (different model: "
                    f"{DIFFERENT_MODEL_PARAMS_M[row['model']]:.0f} M vs "
                    + (f"{theirs:.0f} M parameters)" if theirs else "? parameters)"))
  return out


def _ratio(rec: dict, row: dict) -> str:
  r = ratio_parts(rec, row)
  if not r:
    return ""
  return (f"{r['x']:.1f}× ({r['ref']:,.0f} {r['setting']})"
          + (f"; {r['per_flop']:.1f}× per FLOP" if r["per_flop"] else "")
          + (f" {r['label']}" if r["label"] else ""))


def _recompute_mfu(rec: dict) -> None:
  """Each row's MFU from its TFLOP/s and the device's dense peak for its dtype at the record's
  matmul precision (float32 at XLA's default precision runs TF32 matmuls on a GPU)."""
  from common import device_peak  # benchmarks/common.py (imports jax: only collect needs it)
  env = rec["environment"]
  for r in rec["rows"]:
    peak = device_peak(env["device_kind"], r.get("dtype", "float32"), env.get("default_matmul_precision"))
    if "tflops" in r and peak:
      r["mfu"], r["mfu_peak_tflops"] = round(r["tflops"] / (peak * env.get("device_count", 1)), 4), peak


def collect(src: str, dest: str = RESULTS, note: str = "", commit: str = "") -> list[str]:
  """One ``benchmarks/gpu_record.sh`` call's files (``records.tgz`` unpacked in ``src``) -> the
  committed records: ``<device>_<date>.json`` (the timed parts' rows in order, each with
  ``compile_s_cold``, its compile seconds in the precompile pass) and, where the references ran,
  ``<device>_<date>_pytorch_refs.json``. ``commit``: the commit the call ran, where the records'
  own (read from the device's copy of the tree) is wrong. Returns the paths written."""
  def order(path):
    return int(re.sub(r"\D", "", os.path.basename(path)) or 0)

  # the timed parts' records are named after their parts (t1..t18 of earlier calls, d1..d10)
  parts = sorted((p for p in glob.glob(os.path.join(src, "*.json"))
                  if re.fullmatch(r"[a-z]\d+\.json", os.path.basename(p))), key=order)
  if not parts:
    raise SystemExit(f"--collect {src}: no <part>.json records of benchmarks/gpu_record.sh there "
                     "(t1.json, d1.json, ...)")
  cold = {}
  for path in glob.glob(os.path.join(src, "compile_*.json")):
    with open(path) as f:
      for r in json.load(f)["rows"]:
        if "compile_s" in r and "model" in r:
          cold[_row_key(r)] = r["compile_s"]
  record, written = None, []
  for path in parts:
    with open(path) as f:
      rec = json.load(f)
    if commit:
      rec["environment"].update(git_commit=commit, git_dirty=None, git_commit_source="given when collected")
    if rec.get("benchmark") in OWN_RECORDS:  # its own record, as the script writes it
      _recompute_mfu(rec)
      prefix = OWN_RECORDS[rec["benchmark"]]
      out = os.path.join(dest, prefix + _stem(rec["environment"], dest, prefix) + ".json")
      atomic.write_json(out, rec)
      written.append(out)
      continue
    if record is None:
      record = dict(rec, argv=[], rows=[])
    record["argv"].append(rec["argv"])
    for r in rec["rows"]:
      r["compile_s_cold"] = cold.get(_row_key(r))
      record["rows"].append(r)
  refs = os.path.join(src, "pytorch_refs.json")
  if record is None:  # a call of parts with records of their own only (e.g. ONLY=t11)
    if os.path.exists(refs):
      out = os.path.join(dest, _stem(rec["environment"], dest) + "_pytorch_refs.json")
      with open(refs) as f:
        atomic.write_json(out, json.load(f))
      written.append(out)
    return written
  record["benchmark"] = "benchmarks/gpu_record.sh"
  _recompute_mfu(record)
  if note:
    record["note"] = note
  procs = os.path.join(src, "precompile_processes")  # gpu_record.sh writes it: its groups, all at once
  if os.path.exists(procs):
    with open(procs) as f:
      at_once = f"{int(f.read().strip())} processes compiling at once"
  else:
    at_once = "one process per precompile group of gpu_record.sh, all at once (how many was not recorded)"
  record["compile_note"] = ("compile_s: lowering + a load from the persistent compilation cache that the "
                            "precompile pass filled (a full compile where it had not reached the row); "
                            f"compile_s_cold: that pass's compile seconds, {at_once}")
  smi = os.path.join(src, "nvidia_smi.csv")
  if os.path.exists(smi):
    with open(smi) as f:
      record["nvidia_smi"] = f.read().strip()
  stem = _stem(record["environment"], dest)
  if os.path.exists(refs):
    record["references"] = stem + "_pytorch_refs.json"
    with open(refs) as f:
      ref_obj = json.load(f)
    atomic.write_json(os.path.join(dest, record["references"]), ref_obj)
    written.append(os.path.join(dest, record["references"]))
  atomic.write_json(os.path.join(dest, stem + ".json"), record)
  written.append(os.path.join(dest, stem + ".json"))
  return written


# A row's fields that make it a variant of its model's paper-sized step (run.py's --prng, --dropout,
# --optimizer, --layers, --embed, --set): shown in its step column, kept out of the summary.
VARIANT_FIELDS = ("prng", "dropout", "dropout_bits", "fused_decode", "optimizer", "layers", "embed", "overrides")


def _row_key(r: dict) -> tuple:
  """What makes a row's compiled step: its model, kind, dtype, batch, reward and variant."""
  return tuple(r.get(k) for k in ("model", "what", "dtype", "batch", "reward", *VARIANT_FIELDS))


def _stem(env: dict, dest: str = "", prefix: str = "") -> str:
  """``<device>_<date>``; ``..._<HHMM>`` where ``dest`` already holds another call's record of
  that device and day (a second lease the same day must not overwrite the first)."""
  stem = re.sub(r"[^a-z0-9]+", "_", env["device_kind"].lower()).strip("_") + "_" + env["date"][:10]
  path = os.path.join(dest, prefix + stem + ".json")
  if dest and os.path.exists(path):
    with open(path) as f:
      if json.load(f).get("environment", {}).get("date") != env["date"]:
        stem += "_" + re.sub(r"\D", "", env["date"][11:16])
  return stem


def _fmt(x, digits=1):
  if x is None:
    return "–"
  return f"{x:,.{digits}f}"


def _head(rec: dict) -> str:
  env = rec["environment"]
  refs = rec.get("_references") or {}
  ref_env = refs.get("env") or {}
  host = (f" ({env['cpu_model']}, {'/'.join(env.get('cpu_isa') or []) or 'no AVX2'})"
          if env.get("platform") == "cpu" and env.get("cpu_model") else "")
  return (f"**{env['device_kind']}**{host} × {env['device_count']}, {env['date'][:10]}, jax {env['jax']}"
          f"{', CUDA ' + str(env['cuda'].get('cuda_runtime')) if env.get('cuda') else ''}, "
          f"commit `{(env.get('git_commit') or '?')[:10]}`{' (dirty)' if env.get('git_dirty') else ''} "
          f"— `{rec['_file']}`"
          + (f"; PyTorch references in the same call: torch {ref_env.get('torch', '?')} on "
             f"{ref_env.get('gpu', '?')} — `{rec['references']}`" if refs else "")
          + (f". {rec['note']}" if rec.get("note") else ""))


def features_table(rec: dict) -> str:
  lines = [_head(rec) + " (feature extraction: the backbone's forward pass, random weights and images)", "",
           "| backbone | image side | dtype | batch | images/s | step ms (spread) | GFLOP/img | MFU | compile s |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
  for r in rec["rows"]:
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "–"
    lines.append(f"| {r['backbone']} | {r['size']} | {r['dtype']} | {r['batch']} | {_fmt(r['images_per_s'])} | "
                 f"{_fmt(r['step_ms'], 2)} ({100 * r['spread']:.0f}%) | {_fmt(r['gflop_per_image'], 2)} | {mfu} | "
                 f"{_fmt(r['compile_s'])} |")
  return "\n".join(lines)


def pipeline_table(rec: dict) -> str:
  lines = [_head(rec) + f" (input pipeline, {rec['environment'].get('cpu_count', '?')} CPUs)", "",
           "| what | threads | workers | batch | images/s | notes |", "|---|---:|---:|---:|---:|---|"]
  for r in rec["rows"]:
    if "loop_images_per_s" in r:
      lines.append(f"| {r['source']} ({r['model']}, {r['dtype']}, {r['steps']} steps) | train.py's | {r.get('workers', 0)} | "
                   f"{r['batch']} | "
                   f"{_fmt(r['loop_images_per_s'])} | the step alone {_fmt(r['step_images_per_s'])} images/s; "
                   f"loop / step {r['loop_over_step']:.2f} |")
    else:
      lines.append(f"| loader, {r['source']} | {r['threads']} | {r['workers']} | {r['batch']} | "
                   f"{_fmt(r['images_per_s'])} | – |")
  return "\n".join(lines)


def checkpoint_table(rec: dict) -> str:
  rows = {r["mode"]: r for r in rec["rows"]}
  any_row = rec["rows"][0]
  lines = [_head(rec) + f" (checkpoint saves: {rec['model']['name']} train state "
           f"{rec['state_mib']:,.0f} MiB, batch {any_row['batch']}, a save every {any_row['every']} of "
           f"{any_row['steps']} steps, median of {any_row['repeats']} loops; "
           f"{rec['environment'].get('cpu_count', '?')} CPUs)", "",
           "| saves | loop s | per save s | step s |", "|---|---:|---:|---:|"]
  names = {"none": "none", "sync": "synchronous", "async": "asynchronous (orbax)"}
  for mode in ("none", "sync", "async"):
    r = rows[mode]
    lines.append(f"| {names[mode]} | {_fmt(r['loop_s'], 2)} | "
                 f"{_fmt(r.get('per_save_s'), 3) if mode != 'none' else '–'} | {_fmt(r['step_s'], 3)} |")
  return "\n".join(lines)


def decode_aux_table(rec: dict) -> str:
  model = rec["model"]
  lines = [_head(rec) + f" (decoding with and without the per-step aux: {model['name']} d={model['dim']}, "
           f"{model['num_dec_layers']} decoder layers, batch {rec['batch']}, {rec['max_len']} steps, median of "
           f"{rec['repeats']} calls; {rec['environment'].get('cpu_count', '?')} CPUs)", "",
           "| decoding | variant | ms (min–max) | return_aux=False compiles to the program without aux code |",
           "|---|---|---:|---|"]
  for r in rec["rows"]:
    same = r.get("same_program_as_no_aux_code")
    lines.append(f"| {r['method']} | {r['variant']} | {_fmt(r['median_ms'], 1)} ({_fmt(r['min_ms'], 1)}–"
                 f"{_fmt(r['max_ms'], 1)}) | {'–' if same is None else ('yes' if same else 'no')} |")
  return "\n".join(lines)


def export_table(rec: dict) -> str:
  model = rec["model"]
  lines = [_head(rec) + f" (the exported captioner, `jaxcap-export`: {model['name']} d={model['dim']}, "
           f"file {rec['file_bytes'] / 2**20:.2f} MiB of which parameters {rec['params_bytes'] / 2**20:.2f} MiB, "
           f"export {_fmt(rec['export_s'], 1)} s, load {_fmt(rec['load_s'], 2)} s, platforms "
           f"{', '.join(rec['platforms'])}; median of {rec['repeats']} calls; "
           f"{rec['environment'].get('cpu_count', '?')} CPUs)", "",
           "| decoding | batch | artefact ms (per image) | Run.caption ms (per image) | same captions |",
           "|---|---:|---:|---:|---|"]
  for r in rec["rows"]:
    what = r["method"] + (f"-{r['beam_size']}" if r["method"] == "beam" else "")
    lines.append(f"| {what} | {r['batch']} | {_fmt(r['artefact_ms'], 2)} ({_fmt(r['artefact_ms_per_image'], 2)}) | "
                 f"{_fmt(r['run_ms'], 2)} ({_fmt(r['run_ms_per_image'], 2)}) | {'yes' if r['same_captions'] else 'no'} |")
  return "\n".join(lines)


def clip_score_table(rec: dict) -> str:
  diff = rec.get("max_abs_diff_per_pair")
  lines = [_head(rec) + f" (CLIP-S of {rec['pairs']:,} image-caption pairs from PNG files and strings, "
           f"{rec['weights']} weights, jaxcap batch {rec['batch']}"
           + (f"; largest per-pair difference {diff:.1e}" if diff is not None else "")
           + f"; {rec['environment'].get('cpu_count', '?')} CPUs)", "",
           "| scorer | call | s | pairs/s | mean CLIP-S |", "|---|---|---:|---:|---:|"]
  for r in rec["rows"]:
    lines.append(f"| {r['scorer']} | {r['call']} | {_fmt(r['seconds'], 1)} | {_fmt(r['pairs_per_s'], 1)} | "
                 f"{r['mean_clip_s']:.4f} |")
  return "\n".join(lines)


def clip_reward_table(rec: dict) -> str:
  lines = [_head(rec) + f" (the jitted SCST step: `{rec['config']}`, batch {rec['batch']}, "
           f"{rec['num_samples']} samples, {rec['baseline']} baseline, CLIP {rec['clip']} of random weights; "
           f"best of {rec['steps']} steps; {rec['environment'].get('cpu_count', '?')} CPUs)", "",
           "| reward | compile + first step s | step ms |", "|---|---:|---:|"]
  names = {"cider": "CIDEr-D", "clip": "2 x CLIP-S (cider_weight 0)"}
  for r in rec["rows"]:
    lines.append(f"| {names.get(r['reward'], r['reward'])} | {_fmt(r['compile_and_first_step_s'], 1)} | "
                 f"{_fmt(r['step_ms'], 1)} |")
  lines.append(f"| CLIP-S / CIDEr-D | | {rec['clip_over_cider']:.2f}x |")
  return "\n".join(lines)


def mesh_drift_table(rec: dict) -> str:
  base = rec["rows"][0]["losses"]
  marks = sorted({1, 10, 100, rec["steps"]} & set(range(1, len(base) + 1)))
  lines = [_head(rec) + f" (whole train.py runs of `{rec['config']}` at batch {rec['batch']}, {rec['steps']} steps: "
           "each step's loss on the devices of each row, relative to the 1-device run's)", "",
           "| run | " + " | ".join(f"step {m}" for m in marks) + " | first step past 1e-5 | past 1e-3 | "
           "past 1e-2 | largest |", "|---|" + "---:|" * (len(marks) + 4)]
  for r in rec["rows"]:
    if "drift" not in r:
      lines.append(f"| {r['run']} (loss) | " + " | ".join(f"{r['losses'][m - 1]:.4f}" for m in marks)
                   + " | – | – | – | – |")
      continue
    d = r["drift"]
    rel = dict(zip(d["steps"], d["relative"]))
    first = d["first_step_over"]
    lines.append(f"| {r['run']} | " + " | ".join(f"{rel[m]:.1e}" for m in marks) + " | "
                 + " | ".join(str(first[k]) if first[k] is not None else "never" for k in ("1e-05", "0.001", "0.01"))
                 + f" | {d['max_relative']:.1e} |")
  return "\n".join(lines)


def sharded_table(rec: dict) -> str:
  m = rec["model"]
  mib = lambda b: f"{b / 2**20:,.1f}"
  lines = [_head(rec) + f" (the cross-entropy step compiled over {rec['devices']} devices: {m['backbone']} at "
           f"{m['size']} px + {m['captioner']}, {m['parameters']:,} parameters, {m['dtype']}; MiB per device)", "",
           "| rule | backbone remat | batch | parameters | Adam state | arguments | temporaries | compile s |"
           + (" images/s |" if any("images_per_s" in r for r in rec["rows"]) else ""),
           "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if any("images_per_s" in r for r in rec["rows"]) else "")]
  for r in rec["rows"]:
    mem = r.get("memory") or {}
    line = (f"| {r['rule']} | {'on' if r['remat'] else 'off'} | {r['batch']} | {mib(r['params_bytes_per_device'])} | "
            f"{mib(r['opt_state_bytes_per_device'])} | {mib(mem['arguments']) if mem else '–'} | "
            f"{mib(mem['temporaries']) if mem else '–'} | {_fmt(r['compile_s'], 1)} |")
    if "images_per_s" in r:
      line += f" {_fmt(r['images_per_s'], 1)} |"
    lines.append(line)
  ratios = ", ".join(f"{k}: {v:.4f}" for k, v in rec["fsdp_over_replicated"].items())
  lines += ["", f"FSDP's parameters + Adam state per device over the replicated program's: {ratios} "
            f"(target at most {rec['target_fsdp_over_replicated']:.4f}, 1/{rec['devices']} + 5 %)."]
  return "\n".join(lines)


def detector_vs_reference_table(rec: dict) -> str:
  env = rec["environment"]
  lines = [_head(rec) + f" (the VG region detector on random weights, the same tensors on both sides, "
           f"{rec['photos_timed']} JPEG photos of {rec['photo_hw'][0]} x {rec['photo_hw'][1]} px at batch "
           f"{rec['batch']}, each side reading the file itself; torch {env['torch']} with "
           f"{env['torch_threads']} threads; seconds per photo)", "",
           "| side | first photo s | median s | mean s | regions | reference's median / this |",
           "|---|---:|---:|---:|---:|---:|"]
  for r in rec["rows"]:
    lines.append(f"| {r['side']} | {r['first_s']:.2f} | {r['median_s']:.2f} | {r['mean_s']:.2f} | "
                 f"{min(r['regions'])}-{max(r['regions'])} | {r['reference_over_this']:.2f} |")
  return "\n".join(lines)


def _words(row: dict) -> str:
  """A row's caption lengths: the mean, and the range where the record has it."""
  if "words_min" not in row:
    return f"{row['mean_words']:.1f}"
  return f"{row['mean_words']:.1f} ({row['words_min']}-{row['words_max']})"


def side_by_side_table(rec: dict) -> str:
  names = {"sc_transformer": "self-critical.pytorch's Transformer", "m2": "the Meshed-Memory Transformer"}
  parts = []
  for model, info in rec["models"].items():
    f = info["fields"]
    text = f"{names.get(model, model)} ({f.get('num_layers')} + {f.get('num_dec_layers')} layers, d = {f.get('dim')}"
    ref = info.get("reference")
    if ref:
      rise = (f"rising {ref['eos_slope_per_word']:g} per word and " if ref.get("eos_slope_per_word") else "")
      text += (f"; random weights, the end token's logit {rise}shifted so that the reference's "
               f"{'greedy' if model == 'sc_transformer' else 'beam-5'} captions average "
               f"{ref['calibrated_mean_words']:.1f} words; reference: {ref['code']}, torch {ref['torch']}, "
               f"{ref['threads']} threads")
    parts.append(text + ")")
  lines = [_head(rec) + f" ({'; '.join(parts)}; {rec['images']} images x {rec['regions']} regions; batch 1: "
           f"{rec['b1_images']} images x {rec['b1_repeats']} calls, median and p99; batch {rec['images']}: "
           f"median of {rec['repeats']}; seconds per call)", "",
           "| model | route | decoding | first call s | batch 1 median s | batch 1 p99 s | "
           f"batch {rec['images']} median s | words: mean (min-max) | same captions | speed-up b1 | speed-up b{rec['images']} |",
           "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|"]
  for r in rec["rows"]:
    dec = "greedy" if r["method"] == "greedy" else f"beam-{r['beam_size']}"
    route = r["route"].split(" ")[0]  # the reference's code, without its call
    same = {True: "yes", False: "**no**"}.get(r.get("same_captions"), "–")
    lines.append(f"| {r['model']} | {route} | {dec} | {r['first_call_s']:.2f} | {r['b1_median_s']:.4f} | "
                 f"{r['b1_p99_s']:.4f} | {r['batch_median_s']:.4f} | {_words(r)} | {same} | "
                 f"{_fmt(r.get('speedup_b1'), 2)} | {_fmt(r.get('speedup_batch'), 2)} |")
  fl = rec.get("floor")
  if fl:
    enc, step = fl["encoder"], fl["step"]
    lines += ["", f"One image's greedy caption ({fl['model']}), part by part, beside NumPy ({fl.get('numpy_blas') or 'its BLAS'}) "
              f"running the same matrices in the same process (a step: greedy at max_len 20 minus max_len 1 over "
              f"{fl['steps_at_max_len_20'] - 1} further steps):", "",
              "| part | work | jaxcap ms | NumPy ms | jaxcap rate | NumPy rate |", "|---|---|---:|---:|---:|---:|",
              f"| encoder, once per image ({fl['regions']} regions) | {enc['gflop']:.2f} GFLOP | {enc['jaxcap_ms']:.1f} | "
              f"{enc['numpy_ms']:.1f} | {enc['jaxcap_gflop_s']:.0f} GFLOP/s | {enc['numpy_gflop_s']:.0f} GFLOP/s |",
              f"| one decoding step (1 row) | {step['weights_mb']:.1f} MB of weights | {step['jaxcap_ms']:.2f} | "
              f"{step['numpy_ms']:.2f} | {step['jaxcap_gb_s']:.1f} GB/s | {step['numpy_gb_s']:.1f} GB/s |"]
  return "\n".join(lines)


def record_table(rec: dict) -> str:
  if rec.get("benchmark") == SIDE_BY_SIDE:
    return side_by_side_table(rec)
  if rec.get("benchmark") == DETECTOR_VS_REFERENCE:
    return detector_vs_reference_table(rec)
  if rec.get("benchmark") == MESH_DRIFT:
    return mesh_drift_table(rec)
  if rec.get("benchmark") == SHARDED:
    return sharded_table(rec)
  if rec.get("benchmark") == CLIP_SCORE:
    return clip_score_table(rec)
  if rec.get("benchmark") == CLIP_REWARD:
    return clip_reward_table(rec)
  if rec.get("benchmark") == EXPORT:
    return export_table(rec)
  if rec.get("benchmark") == DECODE_AUX:
    return decode_aux_table(rec)
  if rec.get("benchmark") == FEATURES:
    return features_table(rec)
  if rec.get("benchmark") == CHECKPOINTS:
    return checkpoint_table(rec)
  if rec.get("benchmark") == PIPELINE:
    return pipeline_table(rec)
  lines = [_head(rec), "",
           "| model | step | dtype | batch | images/s | step ms (spread) | GFLOP/img | MFU | compile s | "
           "notes | vs PyTorch (its fastest setting) |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
  for r in rec["rows"]:
    step = r["what"] + (f"-{r['beam']}" if r["what"] == "beam" and r.get("beam") else "")
    step += f" ×{r['samples']}" if r["what"] in ("sample", "scst") and r.get("samples") else ""
    step += f" ({r['reward']} reward)" if r["what"] == "scst" and r.get("reward") else ""
    step += "".join(f", {k} {r[k]}" for k in VARIANT_FIELDS if r.get(k) is not None)
    if "error" in r:
      lines.append(f"| {r['model']} | {step} | {r['dtype']} | {r['batch']} | failed: {r['error'][:80]} "
                   "| – | – | – | – | – | – |")
      continue
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "–"
    comp = _fmt(r["compile_s"]) + (f" ({_fmt(r['compile_s_cold'])} cold)" if r.get("compile_s_cold") else "")
    lines.append(f"| {r['model']} | {step} | {r['dtype']} | {r['batch']} | {_fmt(r['images_per_s'])} | "
                 f"{_fmt(r['step_ms'], 2)} ({100 * r['spread']:.0f}%) | {_fmt(r['gflop_per_image'], 2)} | "
                 f"{mfu} | {comp} | {_notes(r) or '–'} | {_ratio(rec, r) or '–'} |")
  return "\n".join(lines)


def summary_table(recs: list[dict]) -> str:
  """README's table: per model, images/s (and the ratio to its reference, measured in the same
  call) of the main rows at the first batch size, each cell from the newest of ``recs`` (one
  device's records, newest first) that has that row; a cell from an older record names it."""
  cols = [("train", "float32", None), ("train", "bfloat16", None), ("greedy", "float32", None),
          ("beam", "float32", None), ("scst", "float32", "device")]
  first = {}
  for i, rec in enumerate(recs):
    seen = set()
    for r in rec["rows"]:
      key = (r["model"], r["what"], r["dtype"], r.get("reward"))
      if "error" not in r and not any(r.get(k) is not None for k in VARIANT_FIELDS) and key not in seen:
        seen.add(key)
        first.setdefault(key, (i, rec, r))
  models = list(dict.fromkeys(r["model"] for rec in recs for r in rec["rows"]))
  used = sorted({i for i, _, _ in first.values()})
  head = _head(recs[0]) + "".join(f"\n\n[{i + 1}] " + _head(recs[i]) for i in used if i)
  lines = [head, "",
           "| model | train f32 | train bf16 | greedy | beam-3 | SCST (device reward) |", "|---|" + "---:|" * 5]
  labelled = {}  # model -> the label of its ratio (another reference model)
  for m in models:
    cells = []
    for what, dtype, reward in cols:
      if (m, what, dtype, reward) not in first:
        cells.append("–")
        continue
      i, rec, r = first[(m, what, dtype, reward)]
      ratio = ratio_parts(rec, r)
      if ratio:
        if ratio["label"]:
          labelled.setdefault(m, ratio["label"])
        ratio = (f"{ratio['x']:.1f}×" + (f", {ratio['per_flop']:.1f}× per FLOP" if ratio["per_flop"] else "")
                 + ("†" if ratio["label"] else ""))
      cells.append(f"{_fmt(r['images_per_s'], 0)}" + (f" ({ratio})" if ratio else "")
                   + (f" [{i + 1}]" if i else ""))
    lines.append(f"| {m} | " + " | ".join(cells) + " |")
  lines.append("")
  lines.append("images/s at " + ", ".join(sorted({f"{r['batch']} ({r['what']})" for _, _, r in first.values()
                                                   if r["what"] in ("train", "greedy")}))
               + " images per call; (n×): against the PyTorch reference's fastest setting measured in the "
               "same call at the same batch size; per FLOP: that ratio times jaxcap's FLOPs per image over "
               "the reference's; "
               + "".join(f"†: {m} {labelled[m]}; " for m in sorted(labelled))
               + "[n]: a row the newest record lacks, from the earlier record [n]; every row, the "
               "references and the profile: docs/PERFORMANCE.md.")
  return "\n".join(lines)


def _notes(r: dict) -> str:
  """The host reward's share of an SCST step; a profiled row's device busy share, kernels and
  the parts of the model with the most kernel time."""
  notes = []
  if r.get("reward_share") is not None:
    notes.append(f"reward {100 * r['reward_share']:.0f}% of the step")
  prof = r.get("profile") or {}
  if "busy_pct" in prof:
    notes.append(f"device busy {prof['busy_pct']:.0f}%, {prof['kernels'] // 3:,} kernels/step")
  if prof.get("by_part"):  # the three parts of the model with the most kernel time
    total = max(prof["kernel_ms"], 1e-12)
    notes.append("kernel time: " + ", ".join(f"{k} {100 * v / total:.0f}%"
                                             for k, v in list(prof["by_part"].items())[:3]))
  return "; ".join(notes)


_NONE = ("No benchmark record is committed yet: run `python benchmarks/run.py` on the target "
         "device (it writes `benchmarks/results/<device>_<date>.json`), then "
         "`python benchmarks/report.py`.")


def render(records: list[dict]) -> str:
  if not records:
    return _NONE
  return "\n\n".join(record_table(r) for r in records)


def render_summary(records: list[dict]) -> str:
  """The summary of the newest accelerator's records (a CPU record's full table if there is none)."""
  gpu = [r for r in records if r["environment"].get("platform") not in (None, "cpu")
         and r.get("benchmark") not in OWN_RECORDS]
  if not gpu:
    return render(records)
  newest = max(gpu, key=lambda r: r["environment"]["date"])
  same = [r for r in gpu if r["environment"]["device_kind"] == newest["environment"]["device_kind"]]
  return summary_table(sorted(same, key=lambda r: r["environment"]["date"], reverse=True))


def replace_section(text: str, body: str, path: str) -> str:
  if BEGIN not in text or END not in text:
    raise SystemExit(f"{path}: expected the markers {BEGIN} and {END}")
  a = text.index(BEGIN) + len(BEGIN)
  b = text.index(END)
  return text[:a] + "\n" + body + "\n" + text[b:]


def main(argv=None) -> int:
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--check", action="store_true")
  p.add_argument("--print", dest="print_only", action="store_true")
  p.add_argument("--results", default=RESULTS)
  p.add_argument("--collect", default="", help="the unpacked records.tgz of one benchmarks/gpu_record.sh "
                 "call: write its records under --results, then the tables")
  p.add_argument("--note", default="", help="with --collect: a sentence kept in the record and shown under "
                 "its table (e.g. which parts ran in a later call)")
  p.add_argument("--commit", default="", help="with --collect: the commit the call ran (where the device's "
                 "copy of .git gave a stale one)")
  args = p.parse_args(argv)
  if args.collect:
    if not os.path.isdir(args.collect):
      p.error(f"--collect={args.collect}: not a directory; expected the unpacked records.tgz of "
              "benchmarks/gpu_record.sh")
    for path in collect(args.collect, args.results, args.note, args.commit):
      print(f"wrote {os.path.relpath(path, _REPO)}")
  if args.results != RESULTS and not os.path.isdir(args.results):  # the default: none committed yet
    p.error(f"--results={args.results}: not a directory; expected the folder of benchmarks/run.py's "
            "JSON records")
  records = load_records(args.results)
  body = render(records)
  if args.print_only:
    print(body)
    return 0
  stale = []
  for path in DOCS:
    with open(path) as f:
      text = f.read()
    if path in OPTIONAL and BEGIN not in text:
      continue
    new = replace_section(text, render_summary(records) if path in OPTIONAL else body, path)
    if new != text:
      if args.check:
        stale.append(path)
      else:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
          f.write(new)
        os.replace(tmp, path)
        print(f"updated {os.path.relpath(path, _REPO)}")
  if stale:
    print("out of date (run python benchmarks/report.py): " + ", ".join(os.path.relpath(s, _REPO) for s in stale))
    return 1
  return 0


if __name__ == "__main__":
  if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
  from jaxcap.cli import run_script
  run_script(main)  # bad input: one line, exit 2; --check: exit 1 when stale
