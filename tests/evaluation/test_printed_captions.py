"""What ``evaluate.py --images`` prints of its captions: an empty caption (EOS at the first step)
says so instead of ``name: `` and nothing, while the JSON keeps the caption string itself.

The run, its backbone and the images are stand-ins (monkeypatched): what is tested is the
printing, not the captioning (tests/features/test_caption_images.py runs the real thing).
"""

import json
import types

import numpy as np

from jaxcap import api, run_dir
from jaxcap.evaluation import runs
from jaxcap.features import extract
from jaxcap.features import record as record_lib


def test_shown_caption_says_why_a_caption_is_empty():
  assert runs.shown_caption("a red cube") == "a red cube"
  assert runs.shown_caption("") == runs.EMPTY_CAPTION
  assert runs.shown_caption("") == "(empty: the model ended the caption at its first step)"
  assert runs.shown_caption(None).startswith("(none: ")


def test_caption_folder_prints_why_and_writes_the_empty_string(tmp_path, monkeypatch, capsys):
  images = tmp_path / "photos"
  images.mkdir()
  for name in ("test_00000.png", "test_00001.png"):
    (images / name).write_bytes(b"stand-in")
  monkeypatch.setattr(extract, "list_images", lambda folder: ["test_00000.png", "test_00001.png"])
  monkeypatch.setattr(extract, "read_image", lambda path, size: np.zeros((4, 4, 3), np.uint8))
  monkeypatch.setattr(run_dir, "read_features_record", lambda wd: {"size": 4, "backbone": "stand-in"})
  monkeypatch.setattr(record_lib, "check_weights", lambda *a, **k: None)
  monkeypatch.setattr(runs, "_decode_of", lambda decode, config: {"method": "greedy"})
  monkeypatch.setattr(run_dir, "read_config", lambda wd: None)
  fake = types.SimpleNamespace(step=7, caption_images=lambda imgs, weights, **kw: ["", "a red cube"])
  monkeypatch.setattr(api, "load", lambda wd, step=None: fake)
  out = tmp_path / "captions.json"
  runs.caption_folder(str(tmp_path / "run"), str(images), str(out))
  printed = capsys.readouterr().out.splitlines()
  assert "  test_00000.png: (empty: the model ended the caption at its first step)" in printed
  assert "  test_00001.png: a red cube" in printed
  assert json.loads(out.read_text()) == [{"image": "test_00000.png", "caption": ""},
                                         {"image": "test_00001.png", "caption": "a red cube"}]
