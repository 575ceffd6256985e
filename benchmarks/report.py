"""Turns the committed benchmark records into the tables of docs/PERFORMANCE.md and README.md.

  python benchmarks/report.py            # rewrites the generated sections in place
  python benchmarks/report.py --check    # exit 1 when a generated section is out of date (CI-able)
  python benchmarks/report.py --print    # only print the tables

Reads every ``benchmarks/results/*.json`` written by ``benchmarks/run.py`` and replaces the text
between ``<!-- benchmark-results:begin -->`` and ``<!-- benchmark-results:end -->`` in
docs/PERFORMANCE.md (which must have them) and in README.md where it has them, so the numbers
in the docs are never typed by hand. One table per record (device,
date, commit, versions), one row per benchmark row, with the PyTorch reference (self-critical.pytorch
or the official code on one H100, 50 images per step) and the speed-up over it where the record
was measured on an H100 and a reference exists.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(_REPO, "benchmarks", "results")
DOCS = (os.path.join(_REPO, "docs", "PERFORMANCE.md"), os.path.join(_REPO, "README.md"))
OPTIONAL = {DOCS[1]}  # the README may only link to docs/PERFORMANCE.md
BEGIN, END = "<!-- benchmark-results:begin -->", "<!-- benchmark-results:end -->"

# PyTorch references on one H100 at 50 images per step, float32: (train, beam-3) images/s
# (self-critical.pytorch, and the official AAT code; ../shared/anchors).
REFERENCE_H100 = {"transformer": (653, 266), "updown": (806, 308), "aoanet": (596, 311), "aat": (180, 7.6)}


def load_records(folder: str = RESULTS) -> list[dict]:
  records = []
  for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    with open(path) as f:
      rec = json.load(f)
    rec["_file"] = os.path.relpath(path, _REPO)
    records.append(rec)
  return records


def _fmt(x, digits=1):
  if x is None:
    return "–"
  return f"{x:,.{digits}f}"


def record_table(rec: dict) -> str:
  env = rec["environment"]
  h100 = "h100" in env["device_kind"].lower()
  head = (f"**{env['device_kind']}** × {env['device_count']}, {env['date'][:10]}, jax {env['jax']}"
          f"{', CUDA ' + str(env['cuda'].get('cuda_runtime')) if env.get('cuda') else ''}, "
          f"commit `{(env.get('git_commit') or '?')[:10]}`{' (dirty)' if env.get('git_dirty') else ''} "
          f"— `{rec['_file']}`")
  lines = [head, "",
           "| model | step | dtype | batch | images/s | step ms (spread) | GFLOP/img | MFU | compile s | "
           "notes | vs PyTorch H100 |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
  for r in rec["rows"]:
    step = r["what"] + (f"-{r['beam']}" if r["what"] == "beam" and r.get("beam") else "")
    step += f" ×{r['samples']}" if r["what"] == "sample" and r.get("samples") else ""
    ref = ""
    if h100 and r["model"] in REFERENCE_H100 and r["what"] in ("train", "beam") and r["dtype"] == "float32":
      base = REFERENCE_H100[r["model"]][0 if r["what"] == "train" else 1]
      ref = f"{r['images_per_s'] / base:.1f}× ({base:,})"
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "–"
    lines.append(f"| {r['model']} | {step} | {r['dtype']} | {r['batch']} | {_fmt(r['images_per_s'])} | "
                 f"{_fmt(r['step_ms'], 2)} ({100 * r['spread']:.0f}%) | {_fmt(r['gflop_per_image'], 2)} | "
                 f"{mfu} | {_fmt(r['compile_s'])} | {_notes(r) or '–'} | {ref or '–'} |")
  return "\n".join(lines)


def _notes(r: dict) -> str:
  """The host reward's share of an SCST step; a profiled row's device busy share and kernels."""
  notes = []
  if r.get("reward_share") is not None:
    notes.append(f"reward {100 * r['reward_share']:.0f}% of the step")
  prof = r.get("profile") or {}
  if "busy_pct" in prof:
    notes.append(f"device busy {prof['busy_pct']:.0f}%, {prof['kernels'] // 3:,} kernels/step")
  return "; ".join(notes)


def render(records: list[dict]) -> str:
  if not records:
    return ("No benchmark record is committed yet: run `python benchmarks/run.py` on the target "
            "device (it writes `benchmarks/results/<device>_<date>.json`), then "
            "`python benchmarks/report.py`.")
  return "\n\n".join(record_table(r) for r in records)


def replace_section(text: str, body: str, path: str) -> str:
  if BEGIN not in text or END not in text:
    raise SystemExit(f"{path}: expected the markers {BEGIN} and {END}")
  a = text.index(BEGIN) + len(BEGIN)
  b = text.index(END)
  return text[:a] + "\n" + body + "\n" + text[b:]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--check", action="store_true")
  p.add_argument("--print", dest="print_only", action="store_true")
  p.add_argument("--results", default=RESULTS)
  args = p.parse_args(argv)
  if args.results != RESULTS and not os.path.isdir(args.results):  # the default: none committed yet
    p.error(f"--results={args.results}: not a directory; expected the folder of benchmarks/run.py's "
            "JSON records")
  body = render(load_records(args.results))
  if args.print_only:
    print(body)
    return 0
  stale = []
  for path in DOCS:
    with open(path) as f:
      text = f.read()
    if path in OPTIONAL and BEGIN not in text:
      continue
    new = replace_section(text, body, path)
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
