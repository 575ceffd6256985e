"""The Flax backbones against independent float64 NumPy references on random weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcap import features
from jaxcap.features import image
from tests.features import np_backbones
from tests.features.conftest import TINY_RESNET, TINY_VIT, random_images, random_state_dict

RTOL = 1e-5  # achieved: ~4e-7 (float32 against float64)


def assert_close(got, want, rtol=RTOL):
  """Relative to the reference's largest magnitude (features are O(1) to O(10))."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape
  err = np.abs(got - want).max() / np.abs(want).max()
  assert err <= rtol, f"relative error {err:.2e} > {rtol:.0e}"


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_resnet_matches_numpy_reference(tiny_resnet):
  sd = random_state_dict(tiny_resnet, seed=1)
  variables, ignored = features.from_state_dict(tiny_resnet, sd)
  assert ignored == 2 + 1 + 4 * 4  # fc.*, num_batches_tracked of bn1 and 4 BatchNorms per block
  images = random_images(2, 64)
  out = features.make_extract(tiny_resnet)(variables, images)
  fc, att = np_backbones.resnet(sd, images, TINY_RESNET["depths"], TINY_RESNET["att_size"])
  assert out["fc"].shape == (2, 128) and out["att"].shape == (2, 3, 3, 128)
  assert out["fc"].dtype == jnp.float32
  assert_close(out["fc"], fc)
  assert_close(out["att"], att)
  # The reference itself is sensitive to the residual and the BatchNorm.
  for kwargs in ({"residual": False}, {"use_bn": False}):
    wrong_fc, _ = np_backbones.resnet(sd, images, TINY_RESNET["depths"], 3, **kwargs)
    assert np.abs(np.asarray(out["fc"]) - wrong_fc).max() / np.abs(fc).max() > 1e-2


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_resnet_grid_sizes_and_odd_image():
  """A 2-block stage (identity shortcut), a non-square odd image, native and upsampled grids."""
  module = features.build("resnet50", width=4, depths=(2, 1, 1, 1), att_size=None)
  sd = random_state_dict(module, seed=2, head=False)
  variables, ignored = features.from_state_dict(module, sd)
  images = np.random.default_rng(3).integers(0, 256, (1, 61, 45, 3), dtype=np.uint8)
  out = features.make_extract(module)(variables, images)
  fc, _ = np_backbones.resnet(sd, images, (2, 1, 1, 1), 1)
  assert out["att"].shape == (1, 2, 2, 128)  # 61 x 45 -> 31 x 23 -> 16 x 12 -> ... -> 2 x 2
  assert_close(out["fc"], fc)
  x = np.random.default_rng(4).standard_normal((1, 7, 5, 3))
  want = np_backbones.adaptive_avg_pool(x.transpose(0, 3, 1, 2), 14).transpose(0, 2, 3, 1)
  got = image.adaptive_avg_pool(jnp.asarray(x, jnp.float32), 14)
  assert_close(got, want, 1e-6)


def test_vit_matches_numpy_reference(tiny_vit):
  sd = random_state_dict(tiny_vit, seed=5)
  variables, ignored = features.from_state_dict(tiny_vit, sd)
  assert ignored == 2  # head.weight, head.bias
  images = random_images(2, 32, seed=6)
  out = features.make_extract(tiny_vit)(variables, images)
  fc, att = np_backbones.vit(sd, images, TINY_VIT["patch"], TINY_VIT["num_heads"])
  assert out["fc"].shape == (2, 32) and out["att"].shape == (2, 4, 4, 32)
  assert_close(out["fc"], fc)
  assert_close(out["att"], att)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_bfloat16_compute_stays_close(tiny_resnet, tiny_vit):
  for module, size in ((tiny_resnet, 64), (tiny_vit, 32)):
    sd = random_state_dict(module, seed=7)
    variables, _ = features.from_state_dict(module, sd)
    images = random_images(1, size, seed=8)
    ref = features.make_extract(module)(variables, images)
    low = features.make_extract(module.clone(dtype=jnp.bfloat16))(variables, images)
    assert low["fc"].dtype == jnp.float32
    assert_close(low["fc"], ref["fc"], rtol=5e-2)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_registry_names_fields_and_random_variables():
  assert features.names() == ["resnet101", "resnet101_self_critical", "resnet152",
                              "resnet152_self_critical", "resnet50", "resnet50_self_critical",
                              "vit_b16"]
  caffe = features.build("resnet101_self_critical")
  assert (caffe.depths, caffe.stride_on_1x1, caffe.maxpool_ceil) == ((3, 4, 23, 3), True, True)
  assert not features.build("resnet101").stride_on_1x1
  assert features.build("resnet152").depths == (3, 8, 36, 3)
  assert features.build("resnet101").feature_dim == 2048
  assert features.build("vit_b16", dtype="bfloat16").dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="backbone 'resnet18': expected one of"):
    features.build("resnet18")
  with pytest.raises(ValueError, match="unknown field 'widht'"):
    features.build("resnet50", widht=4)
  module = features.build("vit_b16", **TINY_VIT)
  variables = features.random_variables(module)
  out = features.make_extract(module)(variables, random_images(1, 32))
  assert np.isfinite(np.asarray(out["att"])).all()


def test_bad_images_are_one_line(tiny_vit):
  extract = features.make_extract(tiny_vit)
  variables = features.random_variables(tiny_vit)
  with pytest.raises(ValueError, match=r"images: expected a uint8 RGB batch \[B, H, W, 3\], got float32"):
    extract(variables, np.zeros((1, 32, 32, 3), np.float32))
  with pytest.raises(ValueError, match=r"expected 32 x 32 pixels .* got 48 x 32"):
    extract(variables, np.zeros((1, 48, 32, 3), np.uint8))
  # A size the patch does not divide is the size's fault, said as such (it once read "expected
  # 36 x 36 ... got 36 x 36").
  odd = features.build("vit_b16", **dict(TINY_VIT, image_size=36))
  with pytest.raises(ValueError, match=r"^image size 36: expected a multiple of this ViT's patch 8 \(e\.g\. 32 or 40\)"):
    features.random_variables(odd)
