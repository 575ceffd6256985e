"""Seeds x rows experiments: what the papers' table scripts (``experiments/<paper>/``) share.

A table is a set of rows (a config each), every row trained once per seed. The scripts differ
in what one run is (train + test, a detector first, cross-entropy then SCST, ...); they share

* :func:`argument_parser`, :func:`parse_list` / :func:`parse_seeds` / :func:`parse_rows`: the
  ``--workdir`` / ``--rows`` / ``--seeds`` / ``--steps`` flags and lists (one-line errors);
* :func:`run_grid`: every (row, seed) run, row-major or seed-major, each run's result read back
  from its file when a finished run left one (an interrupted table resumes);
* :func:`mean_std` / :func:`summarize`: the one mean ± std of every table, the *sample* standard
  deviation (ddof = 1; 0 for a single seed), so that the error bars of all tables compare;
* :func:`pm` / :func:`markdown_table` / :func:`write_table`: the ``table.md`` they write (and
  their JSON file), written atomically so that a killed run never leaves half a table;
* :func:`paired_against`: where a table's rows score the same test images, each row's
  difference from a baseline row paired by image (its seeds' per-image scores averaged; a
  paired bootstrap 95 % interval, :mod:`jaxcap.evaluation.compare`) beside the mean ± std.

Run as ``python experiments/<paper>/<script>.py`` (jaxcap installed, or the script puts the
checkout's root on ``sys.path``).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Iterable, Sequence

from jaxcap import atomic
from jaxcap.atomic import write_json, write_text  # noqa: F401  (the table scripts' writers)

DDOF = 1  # sample standard deviation: the seeds are a sample of the runs a config can give


def parse_list(text: str, flag: str, cast=str) -> list:
  """``"a,b,,a"`` -> ``["a", "b"]`` (distinct, order kept); bad input is one line (exit 2)."""
  out = []
  for item in (text or "").split(","):
    item = item.strip()
    if not item:
      continue
    try:
      value = cast(item)
    except ValueError:
      raise SystemExit(f"{flag}: expected comma-separated {'integers' if cast is int else 'values'}, "
                       f"got {text!r}") from None
    if value not in out:
      out.append(value)
  if not out:
    raise SystemExit(f"{flag}: expected at least one value, got {text!r}")
  return out


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
  """``"0,1,2"`` -> ``[0, 1, 2]``."""
  return parse_list(text, flag, int)


def parse_rows(text: str, known: Iterable[str], flag: str = "--rows") -> list[str]:
  """A comma-separated subset of ``known``; an unknown name is one line naming the choices."""
  known = list(known)
  rows = parse_list(text, flag)
  for row in rows:
    if row not in known:
      raise SystemExit(f"{flag}: unknown row {row!r}; expected a subset of {known}")
  return rows


def argument_parser(doc: str, rows: Iterable[str], default_rows: Iterable[str]):
  """The flags every seeds x rows script has: ``--workdir`` (required), ``--rows`` (a subset of
  ``rows``), ``--seeds`` (default ``0,1,2``) and ``--steps`` (0: the config's); the script adds
  its own size flags."""
  from jaxcap.cli import ArgumentParser  # its refusals: one line (run_script)
  ap = ArgumentParser(description=doc.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--rows", default=",".join(default_rows), help=f"comma-separated subset of {list(rows)}")
  ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (config.seed)")
  ap.add_argument("--steps", type=int, default=0, help="training steps per run (0: the config's)")
  add_overwrite(ap)
  return ap


def add_overwrite(ap) -> None:
  ap.add_argument("--overwrite", action="store_true",
                  help="Write into a --workdir / --out that holds files jaxcap did not write.")


# The files a table script's folder holds first: a run's config.json (training writes it before
# anything else), a row's result (result.json, scores.json, sweep.json, run_seconds.json,
# scores_<split>.json: the names the scripts read back), the table. Checkpoints and event files
# are not searched.
_OWN_FILES = ("config.json", "result.json", "scores.json", "sweep.json", "run_seconds.json", "table.md",
              atomic.FOLDER_MARKER)
_NOT_SEARCHED = ("checkpoints", "best", "tensorboard", "images", "fc", "att")


def is_run_dir_config(path: str) -> bool:
  """``path`` is a run's ``config.json`` (jaxcap's sections ``model`` and ``data``; another
  library's config.json has neither)."""
  config = atomic.read_json(path)
  return isinstance(config, dict) and isinstance(config.get("model"), dict) and isinstance(config.get("data"), dict)


def is_experiment_folder(path: str, depth: int = 3) -> bool:
  """``path`` is a folder of a table script's runs and tables (its known structure: a run
  directory, a row's result file (:data:`_OWN_FILES`, ``scores_<split>.json``) or a
  ``table*.json`` / ``table.md`` within ``depth`` levels), or holds folders and no file at all
  (a run killed before its first write)."""
  files = 0
  for root, dirs, names in os.walk(path):
    level = os.path.relpath(root, path).count(os.sep) + (root != path)
    if "checkpoints" in dirs and any(d.isdigit() for d in os.listdir(os.path.join(root, "checkpoints"))):
      return True  # a run's checkpoints/<step>/ (a run resumes from them)
    kept = [d for d in dirs if d not in _NOT_SEARCHED] if level < depth else []
    files += len(dirs) - len(kept)  # a folder not searched: its files are unknown, not none
    dirs[:] = kept
    for n in names:
      files += 1
      full = os.path.join(root, n)
      if n in _OWN_FILES[1:] or (n.startswith(("table", "scores_")) and n.endswith(".json")):
        return True
      if n == "config.json" and atomic.says(is_run_dir_config, full):
        return True
  return files == 0


def check_workdir(path: str, overwrite: bool = False, flag: str = "--workdir") -> None:
  """A table script's folder of runs: new, empty, or one of its own (to resume), else one line
  naming ``--overwrite`` (:func:`jaxcap.atomic.check_output`); nothing is written."""
  atomic.check_output(path, f"{flag}={path}", folder=True, overwrite=overwrite, mine=is_experiment_folder,
                      what="a folder of this script's runs and tables (to resume)")


def check_files(out: str, names: dict, overwrite: bool = False, flag: str = "--out") -> None:
  """The files a script writes under fixed ``names`` in the folder ``out`` (``{name: mine}``,
  ``mine(path)`` recognising the script's own): each new or its own, else one line naming it and
  ``--overwrite``. Other files in ``out`` are left alone."""
  atomic.check_writable(out, f"{flag}={out}")
  for name, mine in names.items():
    path = os.path.join(out, name)
    atomic.check_output(path, f"{flag}={out}: {path}", overwrite=overwrite, mine=mine,
                        what="one this script wrote")


def json_with_keys(*keys: str) -> Callable[[str], bool]:
  """A ``mine`` for :func:`check_files`: a JSON object with these keys (the script's own
  layout), or jaxcap's marker."""
  def mine(path: str) -> bool:
    obj = atomic.read_json(path)
    return isinstance(obj, dict) and (set(keys) <= set(obj) or isinstance(obj.get(atomic.JSON_MARKER), dict))
  return mine


def beside(json_path: str, mine: Callable[[str], bool]) -> Callable[[str], bool]:
  """A ``mine`` for a file written with ``json_path`` (a table's ``.md`` beside its ``.json``):
  the script's own when that JSON is."""
  return lambda path: os.path.isfile(json_path) and mine(json_path)


def add_split_sizes(ap, eval_images: int = 0) -> None:
  """``--eval_images`` (validation images per evaluation; 0: the config's) and ``--test_images``
  (the size of the synthetic test split; 0: the config's)."""
  ap.add_argument("--eval_images", type=int, default=eval_images,
                  help="validation images per evaluation (0: the config's)")
  ap.add_argument("--test_images", type=int, default=0, help="size of the synthetic test split (0: the config's)")


def parse_args(ap, argv, rows: Iterable[str]):
  """``(args, rows, seeds)``: ``ap``'s flags (:func:`argument_parser`), the ``--rows`` among
  ``rows`` and the ``--seeds``, each bad one a one-line error."""
  args = ap.parse_args(argv)
  rows, seeds = parse_rows(args.rows, rows), parse_seeds(args.seeds)
  check_workdir(args.workdir, args.overwrite)  # before any run: another program's folder
  return args, rows, seeds


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def mean_std(values: Iterable[Any]) -> tuple[float, float] | None:
  """Mean and sample standard deviation (ddof = 1; 0.0 for one value) of the numbers among
  ``values`` (``None`` and non-numbers are skipped); ``None`` when there are none."""
  vals = [float(v) for v in values if _number(v)]
  if not vals:
    return None
  mean = sum(vals) / len(vals)
  if len(vals) <= DDOF:
    return mean, 0.0
  var = sum((v - mean) ** 2 for v in vals) / (len(vals) - DDOF)
  return mean, math.sqrt(var)


def summarize(per_seed: dict) -> dict:
  """``{seed: {metric: value}}`` -> ``{"mean": {...}, "std": {...}, "n": seeds}`` over the seeds
  that report each numeric metric (:func:`mean_std`)."""
  keys = sorted({k for s in per_seed.values() for k, v in s.items() if _number(v)})
  mean, std = {}, {}
  for k in keys:
    mean[k], std[k] = mean_std(s.get(k) for s in per_seed.values())
  return {"mean": mean, "std": std, "n": len(per_seed)}


def run_grid(rows: Sequence[str], seeds: Sequence[int], run: Callable[[str, int], dict], *,
             result_file: Callable[[str, int], str] | None = None, seed_major: bool = False,
             after: Callable[[dict], None] | None = None) -> dict:
  """``{row: {seed: result}}``: ``run(row, seed)`` for every pair (all seeds of a row before the
  next row, or with ``seed_major`` every row's seed k before seed k + 1).

  With ``result_file(row, seed)``, a run whose file exists is read back instead of run, and a
  new result is written there; ``after(results)`` is called after each run (to rewrite the
  table as it fills in). ``run`` may return ``None`` for a run it skips.
  """
  results: dict = {row: {} for row in rows}
  order = ([(r, s) for s in seeds for r in rows] if seed_major else [(r, s) for r in rows for s in seeds])
  for row, seed in order:
    path = result_file(row, seed) if result_file else None
    if path and os.path.exists(path):
      result = read_json(path)
    else:
      result = run(row, seed)
      if path and result is not None:
        write_json(path, result)
    if result is not None:
      results[row][seed] = result
    if after:
      after(results)
  return results


def pm(pair, scale: float = 100.0, digits: int = 1) -> str:
  """``(mean, std)`` -> ``"mean ± std"`` (times ``scale``); ``"-"`` for a missing value."""
  if pair is None or pair[0] is None:
    return "-"
  return f"{scale * pair[0]:.{digits}f} ± {scale * pair[1]:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
  """A GitHub-markdown table."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


def write_table(workdir: str, payload, caption: str, table: str, json_name: str = "table.json") -> None:
  """``<workdir>/<json_name>`` (the per-seed values and their summaries) and ``<workdir>/table.md``
  (``caption``, a blank line, the markdown ``table``)."""
  write_json(os.path.join(workdir, json_name), payload)
  write_text(os.path.join(workdir, "table.md"), f"{caption}\n\n{table}\n")


def paired_against(baseline: str, rows: Sequence[str], scores_file: Callable[[str, int], str],
                   seeds: Sequence[int], metric: str = "CIDEr") -> dict[str, str]:
  """``{row: "+1.23 [+0.40, +2.05]"}``: each finished row's ``metric`` minus ``baseline``'s
  (x100), over the images both scored, with the paired bootstrap 95 % interval; the per-image
  scores of each row are the mean over its seeds (``scores_file(row, seed)``: a run's
  ``scores_test.json``). Rows (and the baseline) with a missing file are left out."""
  from jaxcap.evaluation import compare, files
  by_row = {}
  for row in [baseline, *rows]:
    paths = [scores_file(row, s) for s in seeds]
    if paths and all(os.path.exists(p) for p in paths):
      by_row[row] = [files.load_scores(p) for p in paths]
  if baseline not in by_row:
    return {}
  out = {}
  for row, result in compare.seed_paired(by_row, baseline).items():
    out[row] = compare.interval_text(result, metric)
  return out
