"""An output path that holds a file jaxcap did not write is never overwritten without a flag.

Every program that writes to a path the user names checks it first (``atomic.check_output``,
before anything is read, computed or written): a new path, a file the same program wrote earlier
(its marker: a JSON key, the export's metadata, a PNG text chunk, a folder's
``atomic.FOLDER_MARKER``, or an earlier version's known structure) or an empty folder is
written; anything else is one ``error:`` line naming the path and ``--overwrite``, exit 2, the
file left byte-identical; with ``--overwrite`` it is replaced.

The argparse programs run in-process (``cli.run_script(main)``, as the user's process would);
``evaluate.py`` and the ETA attribute trainer are absl programs, run in processes of their own
(``tests/programs.py``) with ``--only_check_args``: their output check is part of their
``check``, so a pass there is the write's permission.
"""

import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from jaxcap import atomic, cli

REPO = Path(__file__).resolve().parents[1]
FOREIGN = b"a file of someone else's, not jaxcap's\n"


def _main(main, prog, argv, capsys):
  """``main`` run as its program (``run_script``: bad input one line, exit 2): (code, out, err)."""
  saved = sys.argv
  sys.argv = [prog, *map(str, argv)]
  try:
    with pytest.raises(SystemExit) as e:
      cli.run_script(main)
  finally:
    sys.argv = saved
  out = capsys.readouterr()
  return e.value.code, out.out, out.err


def _refused(code, err, path):
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
  assert str(path) in lines[0] and "did not write" in lines[0] and "--overwrite" in lines[0], lines[0]
  assert "expected a new" in lines[0], lines[0]


def _foreign(path: Path) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(FOREIGN)
  return path


def _script(rel: str):
  spec = importlib.util.spec_from_file_location(Path(rel).stem + "_under_test", REPO / rel)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# ---------------------------------------------------------------------------- the shared check
def test_check_output_new_own_foreign_and_the_flag(tmp_path):
  atomic.check_output(str(tmp_path / "new.json"), "--out=n")  # new: fine
  foreign = _foreign(tmp_path / "f.json")
  with pytest.raises(ValueError, match=r"^--out=f: a file jaxcap did not write is there; expected "
                                       r"a new path or one this program wrote \(--overwrite replaces it\)$"):
    atomic.check_output(str(foreign), "--out=f")
  atomic.check_output(str(foreign), "--out=f", overwrite=True)
  atomic.check_output(str(foreign), "--out=f", mine=lambda p: True)
  with pytest.raises(ValueError, match="did not write"):  # a reader's error: not recognised
    atomic.check_output(str(foreign), "--out=f", mine=atomic.json_marked)
  atomic.write_json(str(tmp_path / "own.json"), {atomic.JSON_MARKER: atomic.marker_value("t")})
  atomic.check_output(str(tmp_path / "own.json"), "--out=o", mine=atomic.json_marked)
  assert foreign.read_bytes() == FOREIGN


def test_check_output_folders(tmp_path):
  (tmp_path / "empty").mkdir()
  atomic.check_output(str(tmp_path / "empty"), "--out=e", folder=True)
  atomic.check_output(str(tmp_path / "new"), "--out=n", folder=True)
  _foreign(tmp_path / "theirs" / "notes.txt")
  with pytest.raises(ValueError, match=r"^--out=t: a folder that holds files jaxcap did not write; "
                                       r"expected a new or empty folder .*\(--overwrite writes into it anyway\)$"):
    atomic.check_output(str(tmp_path / "theirs"), "--out=t", folder=True)
  atomic.check_output(str(tmp_path / "theirs"), "--out=t", folder=True, overwrite=True)
  atomic.mark_folder(str(tmp_path / "ours"), "t")
  _foreign(tmp_path / "ours" / "x.txt")
  atomic.check_output(str(tmp_path / "ours"), "--out=o", folder=True)
  assert sorted(os.listdir(tmp_path / "theirs")) == ["notes.txt"]


def test_png_marker_is_the_figures_text_chunk(tmp_path):
  from PIL import Image
  from jaxcap.analysis import figures
  fig = figures.new_figure(1, 1)
  fig.gca().plot([0, 1])
  figures.save_png(fig, str(tmp_path / "ours.png"))
  Image.new("RGB", (4, 4)).save(tmp_path / "theirs.png")
  assert atomic.png_marked(str(tmp_path / "ours.png"))
  assert not atomic.png_marked(str(tmp_path / "theirs.png"))
  assert not atomic.png_marked(str(_foreign(tmp_path / "text.png")))


# ---------------------------------------------------------------------------- jaxcap-compare
def _scores(path: Path, cider: float) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"overall": {"CIDEr": cider},
                              "per_image": [{"image_id": i, "CIDEr": cider + 0.01 * i} for i in range(4)],
                              "signature": {"decode": {"method": "greedy"}}}))
  return path


def test_compare_json(tmp_path, capsys):
  from jaxcap.commands import compare
  a, b = _scores(tmp_path / "a.json", 0.5), _scores(tmp_path / "b.json", 0.6)
  out = _foreign(tmp_path / "out.json")
  argv = [a, b, "--resamples", "50", "--json", out]
  code, _, err = _main(compare.main, "jaxcap-compare", argv, capsys)
  _refused(code, err, out)
  assert out.read_bytes() == FOREIGN and "A:" not in capsys.readouterr().out  # nothing computed
  code, _, err = _main(compare.main, "jaxcap-compare", argv + ["--overwrite"], capsys)
  assert code == 0, err
  written = json.loads(out.read_text())
  assert written[atomic.JSON_MARKER]["program"] == "jaxcap-compare"
  code, _, err = _main(compare.main, "jaxcap-compare", argv, capsys)  # its own: replaced
  assert code == 0, err
  del written[atomic.JSON_MARKER]  # an earlier jaxcap's comparison: known by its keys
  out.write_text(json.dumps(written))
  code, _, err = _main(compare.main, "jaxcap-compare", argv, capsys)
  assert code == 0 and atomic.JSON_MARKER in json.loads(out.read_text()), err


# ---------------------------------------------------------------------------- jaxcap-export
def test_export_out(tmp_path, capsys):
  from jaxcap.commands import export
  from jaxcap.serving import artefact
  out = _foreign(tmp_path / "c.jaxcap")
  argv = ["--workdir", tmp_path / "no_run", "--out", out]
  code, _, err = _main(export.main, "jaxcap-export", argv, capsys)
  _refused(code, err, out)
  # With the flag (or over its own file) the output check passes: the next check, the missing
  # run, is the refusal (a whole export is tests/test_export.py's).
  code, _, err = _main(export.main, "jaxcap-export", argv + ["--overwrite"], capsys)
  assert code == 2 and "--workdir=" in err and "did not write" not in err, err
  assert out.read_bytes() == FOREIGN
  with zipfile.ZipFile(tmp_path / "own.jaxcap", "w") as z:
    z.writestr("metadata.json", json.dumps({"format": artefact.FORMAT, "format_version": 1}))
  assert export.is_artefact(str(tmp_path / "own.jaxcap"))
  code, _, err = _main(export.main, "jaxcap-export", ["--workdir", tmp_path / "no_run", "--out",
                                                      tmp_path / "own.jaxcap"], capsys)
  assert code == 2 and "--workdir=" in err and "did not write" not in err, err


# ---------------------------------------------------------------------------- jaxcap-extract
def test_extract_out_folder(tmp_path, capsys):
  from jaxcap.commands import extract
  images = tmp_path / "images"
  images.mkdir()
  out = tmp_path / "feats"
  theirs = _foreign(out / "notes.txt")
  argv = ["--images", images, "--out", out]
  code, _, err = _main(extract.main, "jaxcap-extract", argv, capsys)
  _refused(code, err, out)
  # Past the output check, the next refusal is the missing --weights: nothing written yet.
  code, _, err = _main(extract.main, "jaxcap-extract", argv + ["--overwrite"], capsys)
  assert code == 2 and "--weights: missing" in err, err
  assert os.listdir(out) == ["notes.txt"] and theirs.read_bytes() == FOREIGN
  (out / extract.extract.RECORD_FILE).write_text(json.dumps({"backbone": "resnet101"}))  # an earlier one's
  code, _, err = _main(extract.main, "jaxcap-extract", argv, capsys)
  assert code == 2 and "--weights: missing" in err, err
  atomic.mark_folder(str(tmp_path / "marked"), "jaxcap-extract")
  _foreign(tmp_path / "marked" / "fc" / "x.npy")
  code, _, err = _main(extract.main, "jaxcap-extract", ["--images", images, "--out", tmp_path / "marked"], capsys)
  assert code == 2 and "--weights: missing" in err, err


# ---------------------------------------------------------------------------- jaxcap.data.render
def test_render_out_folder(tmp_path, capsys):
  from jaxcap.data import render
  out = tmp_path / "scenes"
  theirs = _foreign(out / "notes.txt")
  argv = ["--out", out, "--size", "8", "--num_train", "1", "--num_val", "1", "--num_test", "1"]
  code, _, err = _main(render.main, "python -m jaxcap.data.render", argv, capsys)
  _refused(code, err, out)
  assert os.listdir(out) == ["notes.txt"]
  code, _, err = _main(render.main, "python -m jaxcap.data.render", argv + ["--overwrite"], capsys)
  assert code == 0 and theirs.read_bytes() == FOREIGN, err
  assert (out / atomic.FOLDER_MARKER).is_file() and len(os.listdir(out / "images")) == 3
  code, _, err = _main(render.main, "python -m jaxcap.data.render", argv, capsys)  # its own folder
  assert code == 0, err
  os.remove(out / atomic.FOLDER_MARKER)  # an earlier jaxcap's folder: its captions.json
  assert render.is_rendered(str(out))
  code, _, err = _main(render.main, "python -m jaxcap.data.render", argv, capsys)
  assert code == 0, err


# ---------------------------------------------------------------------------- the figures
def _metrics_run(tmp_path) -> Path:
  run = tmp_path / "run"
  run.mkdir()
  (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 3.0 - s / 10}) + "\n"
                                             for s in range(1, 6)))
  return run


def test_figures_curves_png(tmp_path, capsys):
  figures = _script("scripts/figures.py")
  run, out = _metrics_run(tmp_path), _foreign(tmp_path / "curves.png")
  argv = ["curves", "--workdir", run, "--out", out]
  code, _, err = _main(figures.main, "scripts/figures.py", argv, capsys)
  _refused(code, err, out)
  assert out.read_bytes() == FOREIGN
  code, _, err = _main(figures.main, "scripts/figures.py", argv + ["--overwrite"], capsys)
  assert code == 0 and atomic.png_marked(str(out)), err
  code, _, err = _main(figures.main, "scripts/figures.py", argv, capsys)  # its own: replaced
  assert code == 0, err


def test_figures_words_pngs_checked_before_the_run_loads(tmp_path, capsys):
  figures = _script("scripts/figures.py")
  out = _foreign(tmp_path / "w_gate.png")
  argv = ["words", "--workdir", tmp_path / "no_run", "--out", tmp_path / "w"]
  code, _, err = _main(figures.main, "scripts/figures.py", argv, capsys)
  _refused(code, err, out)
  code, _, err = _main(figures.main, "scripts/figures.py", argv + ["--overwrite"], capsys)
  assert code == 2 and "no_run" in err and "did not write" not in err, err
  assert out.read_bytes() == FOREIGN


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_image_transformer_figure3_png(tmp_path, capsys):
  from jaxcap.papers.image_transformer import analysis
  out = _foreign(tmp_path / "fig3.png")
  argv = ["figure3", "--out", out]
  code, _, err = _main(analysis.main, "analysis.py", argv, capsys)
  _refused(code, err, out)
  code, _, err = _main(analysis.main, "analysis.py", argv + ["--overwrite"], capsys)
  assert code == 0 and atomic.png_marked(str(out)), err
  analysis.figures.check_png_out(str(out), "--out")  # its own: replaced without the flag


@pytest.mark.parametrize("module,flag", [("jaxcap.papers.aat.plot_attention_steps", "--out"),
                                         ("jaxcap.papers.tpgn.roles", "--png")])
def test_paper_figures_checked_before_the_run_loads(tmp_path, capsys, module, flag):
  main = importlib.import_module(module).main
  out = _foreign(tmp_path / "fig.png")
  argv = ["--workdir", tmp_path / "no_run", flag, out]
  code, _, err = _main(main, module, argv, capsys)
  _refused(code, err, out)
  code, _, err = _main(main, module, argv + ["--overwrite"], capsys)  # next: the missing run
  assert code == 2 and "no_run" in err and "did not write" not in err, err
  assert out.read_bytes() == FOREIGN


# ---------------------------------------------------------------------------- CLIP stand-ins
def test_clip_standin_refuses_real_weights_before_writing(tmp_path, capsys):
  from jaxcap.clip import weights
  out = _foreign(tmp_path / "open_clip_model.safetensors")
  code, _, err = _main(weights.main, "python -m jaxcap.clip.weights", ["--random", "--out", out], capsys)
  _refused(code, err, out)
  assert out.read_bytes() == FOREIGN and not (tmp_path / "open_clip_config.json").exists()
  # --overwrite replacing it, and its own stand-ins rewritten: tests/clip/test_weights.py (slow).


# ---------------------------------------------------------------------------- absl programs
@pytest.fixture(scope="module")
def programs():
  from tests.programs import Programs
  with Programs() as server:
    yield server


def _run(programs, argv, cwd):
  code, _, err = programs.run(argv, cwd)
  return code, err


def test_evaluate_outputs(programs, tmp_path):
  preds = tmp_path / "p.json"
  preds.write_text(json.dumps([{"image_id": 1, "caption": "a cat"}]))
  refs = tmp_path / "r.json"
  refs.write_text(json.dumps({"annotations": [{"image_id": 1, "caption": "a cat"}]}))
  out = _foreign(tmp_path / "s.json")
  scoring = ["evaluate.py", "--predictions", preds, "--references", refs, "--out", out]
  code, err = _run(programs, scoring, tmp_path)  # the run itself refuses before scoring
  _refused(code, err, out)
  code, err = _run(programs, scoring + ["--overwrite", "--only_check_args"], tmp_path)
  assert code == 0, err
  out.write_text(json.dumps({"overall": {}, "per_image": [], "signature": {"jaxcap": "0"}}))  # its own
  code, err = _run(programs, scoring + ["--only_check_args"], tmp_path)
  assert code == 0, err
  # --images' captions JSON: a list carries no marker; known by its structure.
  captions = _foreign(tmp_path / "c.json")
  listing = ["evaluate.py", "--workdir", tmp_path / "run", "--images", tmp_path, "--out", captions,
             "--only_check_args"]
  code, err = _run(programs, listing, tmp_path)
  _refused(code, err, captions)
  assert captions.read_bytes() == FOREIGN
  captions.write_text(json.dumps([{"image": "a.png", "caption": "a cat"}]))
  code, err = _run(programs, listing, tmp_path)
  assert code == 0, err
  # An ensemble's --workdir: a folder of another program's files is refused.
  theirs = _foreign(tmp_path / "ens" / "notes.txt")
  code, err = _run(programs, ["evaluate.py", "--ensemble", f"{tmp_path}/a,{tmp_path}/b", "--workdir",
                              tmp_path / "ens", "--only_check_args"], tmp_path)
  _refused(code, err, tmp_path / "ens")
  assert theirs.read_bytes() == FOREIGN and os.listdir(tmp_path / "ens") == ["notes.txt"]


def test_eta_train_attributes_out_folder(programs, tmp_path):
  theirs = _foreign(tmp_path / "attrs" / "notes.txt")
  argv = ["-m", "jaxcap.papers.eta.train_attributes", "--out", tmp_path / "attrs", "--only_check_args"]
  code, err = _run(programs, argv, tmp_path)
  _refused(code, err, tmp_path / "attrs")
  code, err = _run(programs, argv + ["--overwrite"], tmp_path)
  assert code == 0, err
  for name in ("attributes.json", "metrics.json"):  # an earlier jaxcap's folder: its two files
    (tmp_path / "attrs" / name).write_text("{}")
  code, err = _run(programs, argv, tmp_path)
  assert code == 0 and theirs.read_bytes() == FOREIGN, err
  assert sorted(os.listdir(tmp_path / "attrs")) == ["attributes.json", "metrics.json", "notes.txt"]


def test_train_workdir_that_is_no_run_directory(programs, tmp_path):
  """train.py's --workdir: a run directory resumes (its config.json checked against the run)
  and a folder of other files is written into as before, but a folder without config.json that
  holds a file of the names training writes (metrics.jsonl here) is another's."""
  wd = tmp_path / "wd"
  theirs = _foreign(wd / "metrics.jsonl")
  argv = ["train.py", "--workdir", wd, "--only_check_args"]
  code, err = _run(programs, argv, tmp_path)
  _refused(code, err, wd)
  assert "metrics.jsonl" in err and theirs.read_bytes() == FOREIGN
  code, err = _run(programs, argv + ["--overwrite"], tmp_path)
  assert code == 0, err
  os.rename(theirs, wd / "notes.txt")  # no name of training's: as before
  (wd / "checkpoints" / "4").mkdir(parents=True)  # steps to resume from: as before
  code, err = _run(programs, argv, tmp_path)
  assert code == 0, err


# ---------------------------------------------------------------------------- table scripts
def test_experiment_folders_are_known_by_their_runs_and_tables(tmp_path):
  from jaxcap.analysis import experiment
  run = tmp_path / "runs" / "row" / "seed0"
  run.mkdir(parents=True)
  assert experiment.is_experiment_folder(str(tmp_path / "runs"))  # folders only: a killed start
  (run / "config.json").write_text(json.dumps({"model": {"name": "x"}, "data": {}}))
  assert experiment.is_experiment_folder(str(tmp_path / "runs"))
  hf = _foreign(tmp_path / "hf" / "model" / "notes.txt").parent
  (hf / "config.json").write_text(json.dumps({"model_type": "bert"}))  # another library's
  assert not experiment.is_experiment_folder(str(tmp_path / "hf"))
  _foreign(tmp_path / "photos" / "images" / "a.jpg")  # not searched: unknown, not empty
  assert not experiment.is_experiment_folder(str(tmp_path / "photos"))
  (tmp_path / "killed" / "row" / "seed0" / "checkpoints" / "4").mkdir(parents=True)  # a run's steps
  _foreign(tmp_path / "killed" / "row" / "seed0" / "checkpoints" / "4" / "state")
  assert experiment.is_experiment_folder(str(tmp_path / "killed"))
  (tmp_path / "t").mkdir()
  (tmp_path / "t" / "table3.json").write_text("{}")
  experiment.check_workdir(str(tmp_path / "t"))
  with pytest.raises(ValueError, match=r"^--workdir=.*hf: a folder that holds files jaxcap did not write"):
    experiment.check_workdir(str(tmp_path / "hf"))
  experiment.check_workdir(str(tmp_path / "hf"), overwrite=True)


@pytest.mark.parametrize("script", ["jaxcap/papers/aat/table1.py", "jaxcap/papers/mnmt/table2.py",
                                    "experiments/flickr8k/table.py", "experiments/pixels/run.py"])
def test_table_scripts_refuse_a_folder_of_another_program(tmp_path, capsys, script):
  main = _script(script).main
  theirs = _foreign(tmp_path / "w" / "notes.txt")
  code, _, err = _main(main, script, ["--workdir", tmp_path / "w", "--seeds", "0"], capsys)
  _refused(code, err, tmp_path / "w")
  assert os.listdir(tmp_path / "w") == ["notes.txt"] and theirs.read_bytes() == FOREIGN


def test_sweep_tables_refuse_files_they_did_not_write(tmp_path, capsys):
  sweep = _script("experiments/flickr8k/scst_sweep.py")
  out = tmp_path / "results"
  theirs = _foreign(out / "scst_sweep.md")
  argv = ["--sweep", tmp_path / "none", "--xe-workdir", tmp_path / "none", "--out", out]
  code, _, err = _main(sweep.main, "scst_sweep.py", argv, capsys)
  _refused(code, err, out / "scst_sweep.md")
  code, _, err = _main(sweep.main, "scst_sweep.py", argv + ["--overwrite"], capsys)  # next: --sweep
  assert code == 2 and "--sweep" in err and "did not write" not in err, err
  (out / "scst_sweep.json").write_text(json.dumps({"model": "m", "seed": 0, "settings": {}}))  # its own
  code, _, err = _main(sweep.main, "scst_sweep.py", argv, capsys)  # the .md beside it: its own too
  assert code == 2 and "--sweep" in err and "did not write" not in err, err
  assert theirs.read_bytes() == FOREIGN
  config_sweep = _script("experiments/flickr8k/config_sweep.py")
  theirs = _foreign(tmp_path / "cs" / "config_sweep_transformer.json")
  code, _, err = _main(config_sweep.main, "config_sweep.py", ["--model", "transformer", "--workdir",
                                                               tmp_path / "cs", "--report"], capsys)
  _refused(code, err, tmp_path / "cs")
  assert theirs.read_bytes() == FOREIGN


def test_eta_ablations_workdir(programs, tmp_path):
  theirs = _foreign(tmp_path / "abl" / "notes.txt")
  code, err = _run(programs, ["-m", "jaxcap.papers.eta.ablations", "--workdir", tmp_path / "abl"], tmp_path)
  _refused(code, err, tmp_path / "abl")
  assert theirs.read_bytes() == FOREIGN and os.listdir(tmp_path / "abl") == ["notes.txt"]
