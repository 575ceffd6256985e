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


def test_a_written_file_has_the_modes_of_the_umask_not_mkstemps_0600(tmp_path):
  old = os.umask(0o022)
  try:
    atomic.write_text(str(tmp_path / "a.txt"), "x")
  finally:
    os.umask(old)
  assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644


def test_a_write_error_without_a_file_name_names_the_file(tmp_path):
  def full(f):
    raise OSError(28, "No space left on device")  # what write() or close() raise on a full disk

  with pytest.raises(OSError) as e:
    atomic.write_with(str(tmp_path / "fc" / "x.npy"), full)
  assert e.value.errno == 28 and e.value.filename == str(tmp_path / "fc" / "x.npy")
  assert os.listdir(tmp_path / "fc") == []


def test_check_writable_names_the_flag_and_writes_nothing(tmp_path):
  (tmp_path / "f").write_text("x")
  atomic.check_writable(str(tmp_path / "new" / "deeper"), "--out=o")  # creatable: fine
  atomic.check_writable(str(tmp_path / "new.json"), "--out=o", file=True)
  with pytest.raises(ValueError, match=r"^--out=o: is a file; expected a directory"):
    atomic.check_writable(str(tmp_path / "f"), "--out=o")
  with pytest.raises(ValueError, match=r"^--out=o: is a directory; expected a file name"):
    atomic.check_writable(str(tmp_path), "--out=o", file=True)
  with pytest.raises(ValueError, match=r"^--out=o: .*/f is a file; expected a directory to write in"):
    atomic.check_writable(str(tmp_path / "f" / "x"), "--out=o")
  assert sorted(os.listdir(tmp_path)) == ["f"]


def test_a_killed_write_s_temporary_file_is_removed_by_remove_leftovers(tmp_path):
  """A SIGKILL skips write_with's cleanup: the temporary file stays until a resumed command
  removes it (only write_with's names; another process's fresh one is kept with older_than_s)."""
  import signal
  import subprocess
  import sys
  import time
  code = ("import sys, time\nfrom jaxcap import atomic\n"
          "atomic.write_with(sys.argv[1], lambda f: (f.write(b'half'), f.flush(), print('writing', flush=True), time.sleep(60)))")
  proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "a.npz")], stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "writing\n"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  (tmp_path / "keep.tmp").write_text("not ours")  # no mkstemp part: a user's file
  (tmp_path / "b.json").write_text("{}")
  left = [p.name for p in tmp_path.iterdir() if p.name.startswith("a.npz.")]
  assert len(left) == 1 and left[0].endswith(".tmp")
  assert atomic.remove_leftovers(str(tmp_path), older_than_s=60) == []  # fresh: maybe being written
  old = time.time() - 120
  os.utime(tmp_path / left[0], (old, old))
  assert atomic.remove_leftovers(str(tmp_path), older_than_s=60) == [str(tmp_path / left[0])]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "keep.tmp"]
  assert atomic.remove_leftovers(str(tmp_path / "absent")) == []
