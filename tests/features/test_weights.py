"""The safetensors loader: torchvision / timm names through the name maps, and its one-line errors."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxcap import features
from tests.features import np_backbones
from tests.features.conftest import TINY_RESNET, TINY_VIT, random_images, random_state_dict
from tests.features.test_backbones import assert_close


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_name_maps_cover_every_variable_once(tiny_resnet, tiny_vit):
  import jax
  for module in (tiny_resnet, tiny_vit, features.build("resnet101"), features.build("vit_b16")):
    leaves = {tuple(k.key for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(
        features.registry.abstract_variables(module, 64 if module.__class__.__name__ == "ResNet"
                                             else None))[0]}
    filled = [p for target in features.name_map(module).values() for p in target.paths]
    assert len(filled) == len(set(filled)) and set(filled) == leaves


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_full_size_maps_have_the_published_shapes():
  resnet = features.name_map(features.build("resnet101"))
  assert len(resnet) == 5 + (3 + 4 + 23 + 3) * 15 + 4 * 5  # 520 tensors (+ 104 counters, fc.*)
  assert resnet["layer3.22.conv2.weight"].torch_shape == (256, 256, 3, 3)
  assert resnet["layer4.0.downsample.0.weight"].torch_shape == (2048, 1024, 1, 1)
  vit = features.name_map(features.build("vit_b16"))
  assert vit["pos_embed"].torch_shape == (1, 197, 768)
  assert vit["blocks.11.attn.qkv.weight"].torch_shape == (2304, 768)
  assert vit["patch_embed.proj.weight"].torch_shape == (768, 3, 16, 16)


@pytest.mark.parametrize("kind", ["resnet", "vit"])
@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_safetensors_round_trip_matches_reference(kind, tiny_resnet, tiny_vit, tmp_path):
  module, size = (tiny_resnet, 64) if kind == "resnet" else (tiny_vit, 32)
  sd = random_state_dict(module, seed=11)
  path = tmp_path / "model.safetensors"
  save_file(sd, str(path))
  variables, ignored = features.load(str(path), module)
  assert ignored == (19 if kind == "resnet" else 2)
  images = random_images(2, size, seed=12)
  out = features.make_extract(module)(variables, images)
  if kind == "resnet":
    fc, att = np_backbones.resnet(sd, images, TINY_RESNET["depths"], TINY_RESNET["att_size"])
  else:
    fc, att = np_backbones.vit(sd, images, TINY_VIT["patch"], TINY_VIT["num_heads"])
  assert_close(out["fc"], fc)
  assert_close(out["att"], att)


def _save(tmp_path, sd):
  path = tmp_path / "w.safetensors"
  save_file(sd, str(path))
  return str(path)


def test_missing_tensor_is_one_line(tiny_resnet, tmp_path):
  sd = random_state_dict(tiny_resnet)
  del sd["layer2.0.bn2.running_var"]
  path = _save(tmp_path, sd)
  with pytest.raises(ValueError) as e:
    features.load(path, tiny_resnet)
  assert str(e.value) == f"{path}: missing tensor layer2.0.bn2.running_var (expected shape [8])"


def test_wrong_shape_is_one_line(tiny_vit, tmp_path):
  sd = random_state_dict(tiny_vit)
  sd["blocks.1.attn.qkv.weight"] = np.zeros((96, 16), np.float32)
  path = _save(tmp_path, sd)
  with pytest.raises(ValueError) as e:
    features.load(path, tiny_vit)
  assert str(e.value) == (f"{path}: tensor blocks.1.attn.qkv.weight: expected shape [96, 32], "
                          "found [96, 16]")


def test_unmapped_tensor_is_one_line(tiny_resnet, tmp_path):
  sd = random_state_dict(tiny_resnet)
  sd["layer1.1.conv1.weight"] = np.zeros((4, 16, 1, 1), np.float32)  # a deeper network's block
  path = _save(tmp_path, sd)
  with pytest.raises(ValueError, match=r"unexpected tensor layer1\.1\.conv1\.weight \[4, 16, 1, 1\]"):
    features.load(path, tiny_resnet)


def test_not_a_safetensors_file_is_one_line(tiny_vit, tmp_path):
  path = tmp_path / "model.pth"
  path.write_bytes(b"PK\x03\x04 a torch zip archive, not safetensors")
  with pytest.raises(ValueError) as e:
    features.load(str(path), tiny_vit)
  assert str(e.value).startswith(f"{path}: not a readable safetensors file (")
  assert "\n" not in str(e.value)
  with pytest.raises(FileNotFoundError, match="no such checkpoint file"):
    features.load(str(tmp_path / "absent.safetensors"), tiny_vit)
