"""Imported weights that are not finite are refused, naming the file and the tensor as the
user's file names it (issue 70 item 3: a diverged or damaged checkpoint imported without a word
and then captioned, or trained, on NaNs). Each file is written by its producer's code path:
safetensors' own save_file, and the M² authors' torch.save zip (the committed fixture) with one
float32 storage overwritten in place."""

import os
import shutil
import zipfile

import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from jaxcap.errors import BadInput
from jaxcap.features import weights as fw
from jaxcap.importers import self_critical
from jaxcap.papers.m2 import importer as m2_importer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SC = os.path.join(REPO, "tests", "importers", "fixtures", "self_critical", "transformer", "model.safetensors")
M2 = os.path.join(REPO, "tests", "papers", "m2", "fixtures", "import", "meshed_memory_transformer.pth")


def test_check_finite_names_the_tensor_and_the_first_bad_index():
  ok = {"a.weight": np.ones((2, 3), np.float32), "ids": np.arange(4)}
  assert fw.check_finite(ok, "w.pth") is ok
  bad = dict(ok, **{"b.bias": np.array([[0.0, 1.0], [np.inf, np.nan]], np.float32)})
  with pytest.raises(BadInput) as e:
    fw.check_finite(bad, "w.pth")
  assert str(e.value) == ("w.pth: tensor 'b.bias' [2, 2] holds 2 NaN / Inf value(s) (first at [1, 0]); "
                          "expected finite weights")


@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_a_backbone_safetensors_with_nan_or_inf(tmp_path, value):
  w = np.zeros((4, 3), np.float32)
  w[2, 1] = value
  path = tmp_path / "resnet.safetensors"
  safetensors_numpy.save_file({"conv1.weight": w}, str(path))
  with pytest.raises(BadInput, match=r"resnet\.safetensors: tensor 'conv1\.weight' \[4, 3\] holds 1 NaN / Inf value\(s\) \(first at \[2, 1\]\)"):
    fw.read_safetensors(str(path))


def test_self_critical_s_safetensors_with_a_nan(tmp_path):
  state = safetensors_numpy.load_file(SC)
  name = sorted(k for k, v in state.items() if v.dtype == np.float32 and v.size > 1)[0]
  state[name] = state[name].copy()
  state[name].flat[1] = np.nan
  path = tmp_path / "model.safetensors"
  safetensors_numpy.save_file(state, str(path))
  with pytest.raises(BadInput, match=rf"model\.safetensors: tensor '{name}' .* holds 1 NaN"):
    self_critical.read_state_dict(str(path))


def test_m2_s_pth_with_an_inf_in_a_stored_tensor(tmp_path):
  name = "decoder.word_emb.weight"
  want = np.ascontiguousarray(m2_importer.read_state_dict(M2)[name]).tobytes()
  path = tmp_path / "meshed_memory_transformer.pth"
  with zipfile.ZipFile(M2) as src, zipfile.ZipFile(path, "w") as dst:
    hits = 0
    for info in src.infolist():
      data = src.read(info)
      if "/data/" in info.filename and data.startswith(want):  # the tensor's storage
        data = np.float32(np.inf).tobytes() + data[4:]
        hits += 1
      dst.writestr(info, data)
  assert hits == 1
  with pytest.raises(BadInput, match=rf"meshed_memory_transformer\.pth: tensor '{name}' .* holds 1 NaN / Inf value\(s\) \(first at \[0, 0\]\)"):
    m2_importer.read_state_dict(str(path))
  shutil.copy(M2, path)  # the untouched file still reads
  assert name in m2_importer.read_state_dict(str(path))
