"""Writes tests/features/fixtures/prepro_feats.npz: self-critical.pytorch's own ``prepro_feats.py``
run on three small images with a small random ResNet, for tests/features/test_self_critical.py.

  /work/torchenv/bin/python scripts/self_critical/make_prepro_feats_fixture.py --sc_root /path/to/self-critical.pytorch

Needs torch, torchvision (its Python sources: a wheel whose compiled ops do not load against the
installed torch is used without them), scikit-image, h5py and six, in a venv of its own: torch is
no dependency of jaxcap or of its tests. Nothing is downloaded.

What runs is self-critical's code, not a reading of it: ``scripts/prepro_feats.py``'s ``main``
(skimage.io.imread, grayscale repeated, / 255, torchvision's ``Normalize``, one image per
forward, ``np.save`` / ``np.savez_compressed``) over a Karpathy-style JSON, with the network of
``captioning/utils/resnet.py`` (its Caffe-style maxpool and strides) and ``resnet_utils.myResnet``
(``fc``, ``att``). Two things differ from a real run, both outside the computation:

- ``.cuda()`` is the identity (no GPU here; float32 on the CPU);
- the network is self-critical's ``ResNet(Bottleneck, [1, 1, 1, 1])`` at 1/16 of the width (stem
  4 channels, stages 4, 8, 16, 32, output 128) so that the weights take ~130 KB: its
  ``_make_layer`` gets the planes divided by 16 and the stem is rebuilt at that width;
  ``prepro_feats`` loads it by name from ``--model_root`` as it loads ``resnet101.pth``.
  Weights: torchvision's initialisation under ``--seed``, then every BatchNorm's scale, bias
  and running statistics drawn at random so that inference-mode BatchNorm matters.

The images (PNG, written with Pillow): 53 x 67 RGB carrying an EXIF orientation tag (rotate
90 degrees; prepro_feats ignores it), 40 x 40 grayscale (mode L: the 2-D branch) and 101 x 123
RGB, whose last map is 4 x 4, pooled to ``--att_size`` 3 with overlapping cells. The fixture
holds the state_dict (``weights/<name>``), the PNG files' bytes (``png/<file>``), the bytes of
the files prepro_feats wrote (``fc/<cocoid>.npy``, ``att/<cocoid>.npz``) and a JSON ``meta``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

IMAGES = [  # (file name, cocoid, height, width, mode, EXIF orientation or 0)
    ("rgb_53x67_exif6.png", 1, 53, 67, "RGB", 6),
    ("gray_40x40.png", 2, 40, 40, "L", 0),
    ("rgb_101x123.png", 3, 101, 123, "RGB", 0),
]
MODEL = "resnet_fixture"  # the name prepro_feats looks up in captioning.utils.resnet


def import_torchvision():
  """torchvision, or its Python sources alone when its compiled ops do not load (a CUDA wheel
  beside a CPU torch): the ResNet modules and transforms used here are plain Python."""
  try:
    import torchvision  # noqa: F401
    return "package"
  except (ImportError, RuntimeError, OSError):
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
      del sys.modules[name]
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
      raise SystemExit("torchvision: not installed; expected the torchvision release of this torch "
                       "(pip install torchvision==<match>)") from None
    pkg = types.ModuleType("torchvision")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["torchvision"] = pkg
    return "python sources only (compiled ops not loadable)"


def make_images(folder: str, seed: int) -> dict[str, bytes]:
  """The PNG files: smooth gradients plus noise (small files, every pixel different)."""
  from PIL import Image
  rng = np.random.RandomState(seed)
  out = {}
  for name, _, h, w, mode, orientation in IMAGES:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    chans = 3 if mode == "RGB" else 1
    base = np.stack([127 + 100 * np.sin(xx / (5 + 3 * c) + yy / (7 + 2 * c) + c) for c in range(chans)], -1)
    pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels[..., 0] if mode == "L" else pixels, mode)
    kwargs = {}
    if orientation:
      exif = Image.Exif()
      exif[0x0112] = orientation
      kwargs["exif"] = exif.tobytes()
    path = os.path.join(folder, name)
    img.save(path, **kwargs)
    with open(path, "rb") as f:
      out[name] = f.read()
  return out


def narrow_resnet_class(sc_resnet, width: int):
  """self-critical's ResNet class with every width divided by 64 / ``width``."""
  import torch.nn as nn
  from torchvision.models.resnet import Bottleneck

  class NarrowResNet(sc_resnet.ResNet):
    def __init__(self):
      super().__init__(Bottleneck, [1, 1, 1, 1], num_classes=2)
      # torchvision builds the stem at 64 channels before any layer; rebuilt at the stem width.
      self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
      self.bn1 = nn.BatchNorm2d(width)
      nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
      if planes == 64:  # the first stage takes the stem's channels
        self.inplanes = width
      return super()._make_layer(block, planes * width // 64, blocks, stride, dilate)

  return NarrowResNet


def randomise_batch_norm(net, torch) -> None:
  g = torch.Generator().manual_seed(1234)
  for m in net.modules():
    if isinstance(m, torch.nn.BatchNorm2d):
      n = m.num_features
      with torch.no_grad():
        m.weight.copy_(0.5 + torch.rand(n, generator=g))
        m.bias.copy_(0.2 * torch.randn(n, generator=g))
        m.running_mean.copy_(0.3 * torch.randn(n, generator=g))
        m.running_var.copy_(0.5 + 1.5 * torch.rand(n, generator=g))
        m.num_batches_tracked.fill_(100)


def git_commit(root: str) -> str:
  try:
    return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown (not a git checkout)"


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sc_root", required=True, help="self-critical.pytorch's source folder.")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                               "features", "fixtures", "prepro_feats.npz"))
  p.add_argument("--width", type=int, default=4, help="Stem width (torchvision's is 64).")
  p.add_argument("--att_size", type=int, default=3, help="prepro_feats --att_size.")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--sc_commit", default=None,
                 help="The commit of --sc_root to record when it is not a git checkout.")
  a = p.parse_args()
  sc_root = os.path.abspath(a.sc_root)
  if not os.path.isfile(os.path.join(sc_root, "scripts", "prepro_feats.py")):
    raise SystemExit(f"--sc_root={a.sc_root}: no scripts/prepro_feats.py; expected "
                     "self-critical.pytorch's source folder")
  if 64 % a.width:
    raise SystemExit(f"--width={a.width}: expected a divisor of 64")

  import torch
  torchvision_how = import_torchvision()
  sys.path.insert(0, sc_root)
  import captioning.utils.resnet as sc_resnet
  spec = importlib.util.spec_from_file_location("prepro_feats", os.path.join(sc_root, "scripts",
                                                                             "prepro_feats.py"))
  prepro_feats = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(prepro_feats)
  import skimage
  # No GPU here: prepro_feats' .cuda() calls keep the tensors and the network on the CPU.
  torch.Tensor.cuda = lambda self, *args, **kwargs: self
  torch.nn.Module.cuda = lambda self, *args, **kwargs: self

  torch.manual_seed(a.seed)
  net_class = narrow_resnet_class(sc_resnet, a.width)
  net = net_class()
  randomise_batch_norm(net, torch)
  setattr(sc_resnet, MODEL, net_class)  # prepro_feats: getattr(resnet, params['model'])()
  state = {k: v.detach().clone() for k, v in net.state_dict().items()}

  with tempfile.TemporaryDirectory() as tmp:
    images_root, model_root = os.path.join(tmp, "images"), os.path.join(tmp, "weights")
    os.makedirs(images_root)
    os.makedirs(model_root)
    pngs = make_images(images_root, a.seed)
    torch.save(state, os.path.join(model_root, MODEL + ".pth"))
    input_json = os.path.join(tmp, "dataset.json")
    with open(input_json, "w") as f:
      json.dump({"images": [{"filepath": "", "filename": n, "cocoid": c} for n, c, *_ in IMAGES]}, f)
    output_dir = os.path.join(tmp, "feats")
    prepro_feats.main({"input_json": input_json, "output_dir": output_dir, "images_root": images_root,
                       "att_size": a.att_size, "model": MODEL, "model_root": model_root})
    arrays = {f"weights/{k}": v.numpy() for k, v in state.items()}
    arrays.update({f"png/{n}": np.frombuffer(b, np.uint8) for n, b in pngs.items()})
    for _, cocoid, *_ in IMAGES:
      for kind, ext in (("fc", ".npy"), ("att", ".npz")):
        with open(os.path.join(f"{output_dir}_{kind}", f"{cocoid}{ext}"), "rb") as f:
          arrays[f"{kind}/{cocoid}{ext}"] = np.frombuffer(f.read(), np.uint8)

  for _, cocoid, *_ in IMAGES:  # a fixture of zeros would prove nothing
    fc = np.load(io.BytesIO(arrays[f"fc/{cocoid}.npy"].tobytes()))
    if not (np.isfinite(fc).all() and np.count_nonzero(fc) > fc.size // 2 and fc.std() > 1e-3):
      raise SystemExit(f"image {cocoid}: degenerate fc {fc[:4]}...; expected varied features "
                       "(another --seed)")
  meta = {"images": [{"file": n, "cocoid": c, "height": h, "width": w, "mode": m, "exif_orientation": o}
                     for n, c, h, w, m, o in IMAGES],
          "att_size": a.att_size, "width": a.width, "layers": [1, 1, 1, 1], "seed": a.seed,
          "feature_dim": 8 * a.width * 4, "self_critical_commit": a.sc_commit or git_commit(sc_root),
          "torch": torch.__version__, "torchvision": f"{importlib.metadata.version('torchvision')} ({torchvision_how})",
          "skimage": skimage.__version__, "numpy": np.__version__}
  arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
  out = os.path.abspath(a.out)
  os.makedirs(os.path.dirname(out), exist_ok=True)
  np.savez_compressed(out, **arrays)
  print(f"{out}: {os.path.getsize(out)} bytes; {json.dumps(meta)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
