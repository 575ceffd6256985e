"""A photo to a caption through the region detector, for a run trained on region features:
``Run.caption_images(photos, "pytorch_model.bin")`` decodes exactly what the run's own reader
reads from the files ``python -m jaxcap.detection.extract`` writes; the refusals name what is wrong."""

import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import jaxcap
from jaxcap import run_dir
from jaxcap.errors import BadInput

FIXTURES = Path(__file__).parent / "fixtures"
WEIGHTS = str(FIXTURES / "pytorch_model.bin")  # the tiny detector: 128-d region features
SMALL = dict(short=96, long=160, pre_nms_topk=200, post_nms_topk=30)


def _workdir(path, **fields):
  """A tiny Transformer on the synthetic scenes' 128-d region features (no features.json: the
  situation of an imported self-critical or M² run), its checkpoint saved as training does."""
  from jaxcap.training import checkpoint as ckpt_lib, train_lib  # noqa: PLC0415
  config = jaxcap.get_config("transformer.py:synthetic,tiny", test_after_training=False,
                             **{"decode.max_len": 6, **fields})
  trainer = train_lib.Trainer(config, str(path))
  run_dir.init_workdir(str(path), config, trainer.dataset.vocab, trainer.info)
  state = trainer.initial_state()
  ckpts = ckpt_lib.Checkpoints(str(path))
  ckpts.save_best_if_improved(2, state.replace(step=jnp.int32(2)), {"epoch": 0}, {"CIDEr": 0.5})
  ckpts.close()
  return str(path)


@pytest.fixture(scope="module")
def region_run(tmp_path_factory):
  return jaxcap.load(_workdir(tmp_path_factory.mktemp("run")))


def _photos(folder):
  with np.load(FIXTURES / "frcnn_tiny.npz") as z:
    rgb = [np.ascontiguousarray(z[f"raw_{i}"][..., ::-1]) for i in range(2)]
  folder.mkdir()
  for i, a in enumerate(rgb):
    Image.fromarray(a).save(folder / f"p{i}.png")
  return [str(folder / f"p{i}.png") for i in range(2)], rgb


@pytest.mark.slow  # detector and decoder compiles: past the quick loop's CPU limit
def test_photos_are_captioned_from_what_the_extracted_files_would_give(region_run, tmp_path):
  from jaxcap.data import base as data_base, karpathy  # noqa: PLC0415
  from jaxcap.detection import extract  # noqa: PLC0415
  paths, rgb = _photos(tmp_path / "photos")
  info = region_run.feature_info
  n = int(info["max_regions"])  # 10: the first 10 of the command's 10-12 regions, as its reader reads them
  got = region_run.caption_images(paths, WEIGHTS, detector=SMALL)
  # The same photos through the command, read back by the COCO reader a region run trains on.
  out = tmp_path / "bu"
  assert extract.main(["--images", str(tmp_path / "photos"), "--out", str(out), "--weights", WEIGHTS,
                       "--short=96", "--long=160", "--pre_nms_topk=200", "--post_nms_topk=30",
                       "--no_progress"]) == 0
  assert all(len(np.load(out / "cocobu_box" / f"p{i}.npy")) > n for i in range(2))  # truncation is exercised
  reader = karpathy.DirFeatures(["p0", "p1"], att_dir=str(out / "cocobu_att"), fc_dir=str(out / "cocobu_fc"),
                                box_dir=str(out / "cocobu_box"), sizes=[a.shape[:2][::-1] for a in rgb])
  examples = []
  for i in range(2):
    feats, boxes, glob = data_base.resolve_features(reader.read(i), reader.name(i), info["feature_dim"],
                                                    info["global_dim"])
    examples.append({"image_index": np.int32(i), "feats": feats, "boxes": boxes, "global_feat": glob,
                     "captions": np.zeros((1, int(info["max_len"]) + 1), np.int32),
                     "attributes": np.zeros((0,), np.int32),
                     "attr_labels": np.zeros((int(info["num_attributes"]),), np.float32)})
  want_batch = data_base.collate(examples, None, info=info, seq_per_img=1)
  backbone = region_run.backbone(WEIGHTS, **SMALL)
  batch = backbone.batch(backbone.read(paths)[0], info)
  for k in ("feats", "feats_mask", "boxes"):
    np.testing.assert_array_equal(batch[k], want_batch[k], err_msg=k)
  np.testing.assert_allclose(batch["global_feat"], want_batch["global_feat"], rtol=1e-6)
  assert batch["feats_mask"].sum(1).tolist() == [n, n]
  want = region_run.caption({k: want_batch[k] for k in ("feats", "feats_mask", "boxes", "global_feat")})
  assert got == want and all(isinstance(c, str) for c in got)
  # one unreadable file among them: a warning line, None in its place, the others captioned
  bad = tmp_path / "photos" / "broken.png"
  bad.write_bytes(b"\x89PNG not really")
  assert region_run.caption_images([paths[0], str(bad)], WEIGHTS, detector=SMALL) == [want[0], None]


@pytest.mark.slow
def test_refusals_name_the_file_and_what_the_run_reads(region_run, tmp_path):
  from jaxcap.detection import backbone as region_backbone  # noqa: PLC0415
  info = dict(region_run.feature_info)
  with pytest.raises(BadInput, match="128-d region features; this run reads 64-d"):
    region_backbone.RegionBackbone(WEIGHTS, dict(info, feature_dim=64), **SMALL)
  with pytest.raises(BadInput, match="grid features"):
    region_backbone.RegionBackbone(WEIGHTS, dict(info, grid=True), **SMALL)
  with pytest.raises(BadInput, match="no such file"):
    region_run.caption_images(["x.png"], str(tmp_path / "nowhere.bin"))
  not_a_detector = tmp_path / "weights.bin"
  not_a_detector.write_bytes(b"not a checkpoint")
  with pytest.raises(BadInput, match=str(not_a_detector)):
    region_run.caption_images(["x.png"], str(not_a_detector))
  # settings holding a list (the reference selection's thresholds): one backbone per settings, kept
  listed = dict(selection="reference", nms_thresholds=[0.5, 0.6], **SMALL)
  assert region_run.backbone(WEIGHTS, **listed) is region_run.backbone(WEIGHTS, **listed)
  assert region_run.backbone(WEIGHTS, **listed) is not region_run.backbone(WEIGHTS, **SMALL)
  with pytest.raises(BadInput, match="detector settings"):  # settings without the detector's file
    region_run.caption_images(["x.png"], None, detector={"short": 96})


@pytest.mark.slow
def test_the_server_captions_a_posted_photo_through_the_detector(region_run, tmp_path):
  import asyncio  # noqa: PLC0415
  from aiohttp.test_utils import TestClient, TestServer  # noqa: PLC0415
  from jaxcap.serving import server  # noqa: PLC0415
  paths, rgb = _photos(tmp_path / "photos")
  backend = server.RunBackend(region_run, max_batch=2, weights=WEIGHTS, detector=SMALL)
  assert backend.metadata()["input"]["images"] is True

  async def main():
    app = server.make_app(backend, max_batch=2)
    async with TestClient(TestServer(app)) as client:
      r = await client.post("/caption?method=greedy", data=open(paths[1], "rb").read(),
                            headers={"Content-Type": "image/png"})
      return r.status, await r.json()

  status, body = asyncio.run(main())
  assert status == 200, body
  answer = body["captions"][0]
  assert answer["caption"] == region_run.caption_images([paths[1]], WEIGHTS, detector=SMALL)[0]
  # the page's regions: the detector's boxes over the photo, in [0, 1]
  boxes = np.asarray(answer["boxes"], np.float32)
  assert boxes.shape == (10, 4) and (boxes >= 0).all() and (boxes <= 1).all()


@pytest.mark.slow
def test_evaluate_images_captions_a_folder_through_the_detector(region_run, tmp_path):
  import json  # noqa: PLC0415
  from jaxcap.evaluation import runs  # noqa: PLC0415
  paths, _ = _photos(tmp_path / "photos")
  out = tmp_path / "captions.json"
  got = runs.caption_folder(region_run.workdir, str(tmp_path / "photos"), str(out), weights=WEIGHTS)
  assert [g["image"] for g in got] == ["p0.png", "p1.png"] and all(isinstance(g["caption"], str) for g in got)
  assert json.loads(out.read_text()) == got
  # the command's default detector settings (the original's 600 / 1000, RPN 6000 -> 300) are the API's
  assert [g["caption"] for g in got] == region_run.caption_images(paths, WEIGHTS)
