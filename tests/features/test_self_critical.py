"""``jaxcap-extract --backbone resnet*_self_critical`` computes self-critical.pytorch's
``prepro_feats.py`` features exactly, and :mod:`jaxcap.data.karpathy` reads what prepro_feats writes.

The reference, ``fixtures/prepro_feats.npz``, is prepro_feats' own run (its ``main``, its
``captioning/utils/resnet.py`` network, torch on the CPU) over three PNGs, with a random
``ResNet(Bottleneck, [1, 1, 1, 1])`` at 1/16 of the width; written by
``scripts/self_critical/make_prepro_feats_fixture.py`` (its docstring says how). No torch here:
the weights go through a ``.safetensors`` file and jaxcap's loader, as a user's would.

The images are a 53 x 67 RGB PNG with an EXIF orientation tag, a 40 x 40 grayscale one and a
101 x 123 RGB one (last map 4 x 4, pooled to 3 x 3 with overlapping cells).
"""

import io
import json
import shutil
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxcap import features
from jaxcap.commands import extract as command
from jaxcap.data import karpathy
from jaxcap.features import extract, record

from tests.features.test_extract import run_cli

FIXTURE = __file__.rsplit("/", 1)[0] + "/fixtures/prepro_feats.npz"
# float32 in both frameworks, different convolution algorithms: relative to each image's largest
# feature (a few units here), far below what any of the variations tested below changes.
TOLERANCE = 1e-5


def _bytes(z, key) -> io.BytesIO:
  return io.BytesIO(z[key].tobytes())


@pytest.fixture(scope="module")
def prepro(tmp_path_factory):
  """The fixture, its PNGs in a folder and its weights in a safetensors file."""
  z = np.load(FIXTURE)
  meta = json.loads(z["meta"].tobytes())
  root = tmp_path_factory.mktemp("prepro_feats")
  images = root / "images"
  images.mkdir()
  ref = {}
  for item in meta["images"]:
    (images / item["file"]).write_bytes(z[f"png/{item['file']}"].tobytes())
    fc = np.load(_bytes(z, f"fc/{item['cocoid']}.npy"))
    with np.load(_bytes(z, f"att/{item['cocoid']}.npz")) as f:
      att = f["feat"]
    ref[item["file"]] = (fc, att)
  weights = root / "resnet_fixture.safetensors"
  save_file({k[len("weights/"):]: np.asarray(z[k]) for k in z.files if k.startswith("weights/")},
            str(weights))
  fields = {"width": meta["width"], "depths": meta["layers"]}
  return {"z": z, "meta": meta, "root": root, "images": images, "weights": weights, "ref": ref,
          "fields": fields}


def assert_matches(fc_D, att_CxD, ref, what):
  fc_ref, att_ref_gxgxD = ref
  scale = float(np.abs(fc_ref).max())
  np.testing.assert_allclose(fc_D, fc_ref, rtol=TOLERANCE, atol=TOLERANCE * scale, err_msg=f"{what} fc")
  att_ref = att_ref_gxgxD.reshape(-1, att_ref_gxgxD.shape[-1])  # cells row-major, as jaxcap writes
  np.testing.assert_allclose(att_CxD, att_ref, rtol=TOLERANCE, atol=TOLERANCE * scale,
                             err_msg=f"{what} att")


def off_by(fc_D, att_CxD, ref) -> float:
  """The largest difference to the reference, relative to its largest feature (nan: shapes differ)."""
  fc_ref, att_ref = ref
  att_ref = att_ref.reshape(-1, att_ref.shape[-1])
  if np.shape(fc_D) != fc_ref.shape or np.shape(att_CxD) != att_ref.shape:
    return float("nan")
  return float(max(np.abs(fc_D - fc_ref).max(), np.abs(att_CxD - att_ref).max()) / np.abs(fc_ref).max())


def test_the_fixture_is_what_its_script_says(prepro):
  meta, ref = prepro["meta"], prepro["ref"]
  assert [(i["height"], i["width"], i["mode"]) for i in meta["images"]] == [
      (53, 67, "RGB"), (40, 40, "L"), (101, 123, "RGB")]
  g, d = meta["att_size"], meta["feature_dim"]
  for fc, att in ref.values():
    assert fc.shape == (d,) and att.shape == (g, g, d) and fc.dtype == att.dtype == np.float32
    assert fc.std() > 0.1 and np.count_nonzero(att) > att.size // 2  # not a degenerate network
  # prepro_feats' fc is the mean of the last map; its att the adaptive pooling of the same map,
  # so for the 40 x 40 image (last map 2 x 2, pooled to 3 x 3: cells repeated) fc is the mean
  # of the four distinct corner cells.
  fc, att = ref["gray_40x40.png"]
  np.testing.assert_allclose(att[[0, 0, 2, 2], [0, 2, 0, 2]].mean(0), fc, rtol=1e-5, atol=1e-6)
  assert (meta["images"][0]["exif_orientation"], meta["self_critical_commit"]) == (6, "4c48a33")


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_jaxcap_extract_writes_prepro_feats_features(prepro, tmp_path, capsys):
  """The fixture's images, two copies of one (three images of one size: a batch of 2, then 1)
  and a broken file (skipped), through the program with the default ``--size`` (native)."""
  images, out = tmp_path / "images", tmp_path / "feats"
  shutil.copytree(prepro["images"], images)
  for copy in ("copy_a.png", "copy_b.png"):
    shutil.copy(images / "rgb_101x123.png", images / copy)
  (images / "broken.png").write_bytes(b"\x89PNG not a png")
  refs = dict(prepro["ref"], **{c: prepro["ref"]["rgb_101x123.png"] for c in ("copy_a.png", "copy_b.png")})
  code, stdout, err = run_cli(["--images", images, "--out", out,
                               "--backbone", "resnet50_self_critical",
                               "--fields", json.dumps(prepro["fields"]),
                               "--att_size", prepro["meta"]["att_size"],
                               "--weights", prepro["weights"], "--batch_size", 2, "--no_progress"],
                              capsys)
  assert code == 0, err
  assert "broken.png: unreadable image" in err and "extracted 5 images" in stdout
  rec = json.loads((out / "features.json").read_text())
  assert rec["size"] == extract.NATIVE and rec["backbone"] == "resnet50_self_critical"
  for name, ref in refs.items():
    stem = name.rsplit(".", 1)[0]
    fc = np.load(out / "fc" / f"{stem}.npy")
    with np.load(out / "att" / f"{stem}.npz") as f:
      att = f["feat"]
    assert att.shape == (prepro["meta"]["att_size"] ** 2, prepro["meta"]["feature_dim"])
    assert_matches(fc, att, ref, name)

  # The run's record rebuilds the same extractor for new images (Run.caption_images' path).
  backbone = record.Backbone(rec, str(prepro["weights"]))
  names = sorted(prepro["ref"])
  fc_BxD, att_BxCxD = backbone.features([str(prepro["images"] / n) for n in names])
  for k, name in enumerate(names):
    assert_matches(fc_BxD[k], att_BxCxD[k], prepro["ref"][name], f"record.Backbone {name}")


def _module(prepro, name="resnet50_self_critical", **override):
  fields = dict(width=prepro["meta"]["width"], depths=tuple(prepro["meta"]["layers"]),
                att_size=prepro["meta"]["att_size"])
  return features.build(name, **dict(fields, **override))


def _features(module, variables, pixels_HxWx3):
  out = features.make_extract(module)(variables, pixels_HxWx3[None])
  return np.asarray(out["fc"])[0], np.asarray(out["att"]).reshape(-1, module.feature_dim)


@pytest.mark.slow
def test_each_difference_from_torchvision_matters(prepro):
  """The comparison above can fail: torchvision's maxpool or stride placement, a resize, or the
  EXIF orientation applied each move the features by far more than the tolerance."""
  module = _module(prepro)
  variables, ignored = features.load(str(prepro["weights"]), module)
  assert ignored > 0  # the classifier (fc.*) and num_batches_tracked, as in a real checkpoint
  native = {n: extract.read_image(str(prepro["images"] / n), extract.NATIVE) for n in prepro["ref"]}
  assert native["rgb_53x67_exif6.png"].shape == (53, 67, 3)  # stored orientation, not displayed
  gray = native["gray_40x40.png"]
  assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 0] == gray[..., 2]).all()
  for name, pixels in native.items():
    assert_matches(*_features(module, variables, pixels), prepro["ref"][name], name)

  variants = {
      "torchvision stride (on the 3x3 conv)": (_module(prepro, stride_on_1x1=False), None),
      "torchvision maxpool (padding 1, floor)": (_module(prepro, maxpool_ceil=False), None),
      "torchvision resnet50": (_module(prepro, "resnet50"), None),
      "resized to 64 x 64": (module, 64),
      "EXIF orientation applied": (module, "exif"),
  }
  for what, (variant, reading) in variants.items():
    worst = 0.0
    for name in prepro["ref"]:
      path = str(prepro["images"] / name)
      if reading == "exif":
        from PIL import Image, ImageOps
        with Image.open(path) as img:
          pixels = np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
      else:
        pixels = extract.read_image(path, reading or extract.NATIVE)
      off = off_by(*_features(variant, variables, pixels), prepro["ref"][name])
      worst = max(worst, off) if off == off else float("inf")
    assert worst > 100 * TOLERANCE, f"{what}: features within {worst:.2g} of prepro_feats'"


def test_karpathy_reads_the_files_prepro_feats_writes(prepro, tmp_path):
  """``<cocoid>.npy`` ``[D]`` in ``*_fc``, ``<cocoid>.npz`` key ``feat`` ``[g, g, D]`` in ``*_att``:
  read as ``g*g`` regions (self-critical's loader reshapes them so) with or without ``grid``."""
  z, meta = prepro["z"], prepro["meta"]
  fc_dir, att_dir = tmp_path / "cocotalk_fc", tmp_path / "cocotalk_att"
  fc_dir.mkdir()
  att_dir.mkdir()
  ids = [str(i["cocoid"]) for i in meta["images"]]  # as karpathy.load_splits keys them
  for cocoid in ids:
    (fc_dir / f"{cocoid}.npy").write_bytes(z[f"fc/{cocoid}.npy"].tobytes())
    (att_dir / f"{cocoid}.npz").write_bytes(z[f"att/{cocoid}.npz"].tobytes())
  g, d = meta["att_size"], meta["feature_dim"]
  for grid in (False, True):
    reader = karpathy.DirFeatures(ids, att_dir=str(att_dir), fc_dir=str(fc_dir), grid=grid)
    for i, item in enumerate(meta["images"]):
      fc_ref, att_ref = prepro["ref"][item["file"]]
      got = reader.read(i)
      np.testing.assert_array_equal(got["feats"], att_ref.reshape(g * g, d))
      np.testing.assert_array_equal(got["global_feat"], fc_ref)
      assert (got["boxes"] is not None) == grid
      assert reader.header(i)["feats"][0] == (g * g, d)


def test_native_size_flag_and_defaults():
  module, _, size = extract.build_backbone("resnet101_self_critical", '{"width": 4}')
  assert size == extract.NATIVE and module.stride_on_1x1 and module.maxpool_ceil
  assert extract.build_backbone("resnet101", '{"width": 4}')[2] == 448
  assert extract.build_backbone("resnet101_self_critical", '{"width": 4}', size=224)[2] == 224
  assert extract.build_backbone("resnet50", '{"width": 4}', size=extract.NATIVE)[2] == extract.NATIVE
  with pytest.raises(ValueError, match="--size=native: vit_b16 takes 224 x 224 images only"):
    extract.build_backbone("vit_b16", size=extract.NATIVE)
  assert command.parser().parse_args(["--images", "i", "--out", "o", "--size", "native"]).size == "native"
  assert command.parser().parse_args(["--images", "i", "--out", "o", "--size", "32"]).size == 32
  with pytest.raises(ValueError, match=r"features.json: size=0: expected an int >= 1 .* or 'native'"):
    extract.parse_size(0, "features.json: size")


def test_missing_weights_point_to_the_recipe(tmp_path, capsys):
  (tmp_path / "images").mkdir()
  code, _, err = run_cli(["--images", tmp_path / "images", "--out", tmp_path / "out",
                          "--backbone", "resnet101_self_critical"], capsys)
  assert code == 2
  assert "--weights: missing" in err and "docs/USAGE.md, 'Your own images'" in err
  assert len(err.strip().splitlines()) == 1, err


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
