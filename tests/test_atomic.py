"""jaxcap.atomic: a file is written whole or not at all."""

import json
import os

import pytest

from jaxcap import atomic


def test_writes_json_and_makes_the_folder(tmp_path):
  path = tmp_path / "a" / "b" / "s.json"
  atomic.write_json(str(path), {"x": [1, 2]})
  assert json.loads(path.read_text()) == {"x": [1, 2]}
  assert os.listdir(path.parent) == ["s.json"]


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
  out = tmp_path / "scores.json"
  out.write_text('{"old": true}')

  def full(*args):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(atomic.os, "replace", full)
  with pytest.raises(OSError):
    atomic.write_json(str(out), {"overall": {}})
  assert json.loads(out.read_text()) == {"old": True}
  assert os.listdir(tmp_path) == ["scores.json"]


def test_an_unserialisable_object_writes_nothing(tmp_path):
  with pytest.raises(TypeError):
    atomic.write_json(str(tmp_path / "s.json"), {"x": object()})
  assert os.listdir(tmp_path) == []
