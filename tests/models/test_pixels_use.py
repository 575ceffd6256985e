"""A run from pixels used as any run: ``Run.caption_images``, ``jaxcap-serve`` and
``jaxcap-export`` take its trained backbone and its captioner, and give what the model itself
gives on the pixels (``Run.predict`` on the dataset's image files)."""

import asyncio
import zipfile

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jaxcap
from jaxcap import run_dir
from jaxcap.images import read_image
from jaxcap.models import pixels
from jaxcap.training import checkpoint as ckpt_lib
from jaxcap.training import train_lib
from tests.training.test_pixels_run import pixels_config, scenes  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def run(scenes, tmp_path_factory):  # noqa: F811
  """A saved run from pixels whose backbone differs from any initialisation (its parameters
  moved by noise), so a component that rebuilt a fresh backbone would give other captions."""
  wd = str(tmp_path_factory.mktemp("pixel_run"))
  config = pixels_config(scenes, **{"decode.max_len": 6})
  trainer = train_lib.Trainer(config, wd)
  run_dir.init_workdir(wd, config, trainer.dataset.vocab, trainer.info)
  state = trainer.initial_state()
  keys = iter(jax.random.split(jax.random.PRNGKey(7), 1000))
  params = dict(state.params)
  params["params"] = dict(params["params"], backbone=jax.tree.map(
      lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), params["params"]["backbone"]))
  ckpts = ckpt_lib.Checkpoints(wd)
  ckpts.save_best_if_improved(2, state.replace(step=jnp.int32(2), params=params), {"epoch": 0}, {"CIDEr": 0.5})
  ckpts.close()
  return jaxcap.load(wd, dataset=trainer.dataset)


def _test_paths(run):
  return list(run.dataset.split_data("test").features.paths)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_the_trained_backbone_and_captioner_give_what_the_model_gives_on_pixels(run):
  assert run.from_pixels and isinstance(run.backbone(), pixels.TrainedBackbone)
  paths = _test_paths(run)[:4]
  px = np.stack([read_image(p, 32) for p in paths])
  # The four feature keys as the model lays out its backbone's output (cells, grid boxes, fc).
  laid = run.model.apply(run.params, jnp.asarray(px), method="features")
  batch = run.image_batch(paths)
  for key in ("feats", "feats_mask", "boxes", "global_feat"):
    np.testing.assert_allclose(np.asarray(laid[key], np.float32), np.asarray(batch[key], np.float32),
                               atol=1e-5, err_msg=key)
  # The captioner's encoding of the trained backbone's features laid out by image_layout is
  # the model's own encoding of the pixels.
  enc_model = run.model.apply(run.params, {"pixels": jnp.asarray(px)}, method="encode")
  enc_split = run.feature_model.apply(run.feature_params, jax.tree.map(jnp.asarray, run.image_batch(paths)),
                                      method="encode")
  for a, b in zip(jax.tree.leaves(enc_model), jax.tree.leaves(enc_split)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=1e-5)
  # The backbone is the checkpoint's, not a fresh one.
  trained = pixels.split_variables(run.params)[0]
  for a, b in zip(jax.tree.leaves(run.backbone().variables), jax.tree.leaves(trained)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # caption_images on the test PNG paths gives what the run's own evaluation gives.
  predicted = run.predict("test")
  ids = run.dataset.split_data("test").image_ids
  assert run.caption_images(_test_paths(run)) == [predicted[i] for i in ids]


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_weights_for_a_trained_backbone_are_refused_in_one_line(run, tmp_path):
  with pytest.raises(ValueError, match=r"x.safetensors: this run trained its backbone \(vit_b16\); expected no weights file"):
    run.caption_images(_test_paths(run)[:1], weights=str(tmp_path / "x.safetensors"))


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_evaluate_images_captions_a_folder_with_the_trained_backbone(run, tmp_path):
  """evaluate.py --images (runs.caption_folder) takes a run from pixels as caption_images
  does: the same captions of the same PNG files, read at the run's image size."""
  import os
  import shutil
  from jaxcap.evaluation import runs
  folder = tmp_path / "photos"
  folder.mkdir()
  paths = _test_paths(run)[:5]
  for p in paths:
    shutil.copy(p, folder / os.path.basename(p))
  out = tmp_path / "captions.json"
  result = runs.caption_folder(run.workdir, str(folder), str(out), decode={"method": "greedy"})
  want = dict(zip((os.path.basename(p) for p in paths), run.caption_images(paths, method="greedy")))
  assert {r["image"]: r["caption"] for r in result} == want and out.exists()
  with pytest.raises(ValueError, match=r"--weights=.*trained its backbone \(vit_b16\); expected no --weights"):
    runs.caption_folder(run.workdir, str(folder), str(tmp_path / "c2.json"), weights=str(tmp_path / "w.safetensors"))
  assert not (tmp_path / "c2.json").exists()


def test_an_ablation_changes_the_captioner_and_keeps_the_backbone(run):
  ablated = run.ablate(dropout=0.5)
  assert ablated.from_pixels and ablated.model.captioner.dropout == 0.5
  assert ablated.model.backbone is run.model.backbone
  with pytest.raises(ValueError, match="has no field 'nonsense'"):
    run.ablate(nonsense=1)


@pytest.mark.slow
def test_the_export_carries_the_trained_backbone_and_serves_the_same_captions(run, tmp_path):
  from jaxcap import serving
  from jaxcap.serving import server
  path = str(tmp_path / "px.jaxcap")
  meta = run.export(path, method="greedy", platforms=("cpu",))
  assert meta["model"] == "transformer" and repr(run).startswith(f"Run({run.workdir!r}, model='transformer from pixels (vit_b16)'")
  assert meta["backbone"]["size"] == 32 and meta["backbone"]["backbone"] == "vit_b16"
  assert meta["backbone"]["weights"]["trained"] and meta["backbone"]["weights"]["step"] == 2
  # backbone.npz holds the trained backbone's arrays, params.npz the captioner's.
  with zipfile.ZipFile(path) as z:
    with z.open("backbone.npz") as f:
      stored = np.load(f)
      stored = [stored[f"arr_{i}"] for i in range(len(stored.files))]
  expected = [np.asarray(x) for x in jax.tree.leaves(run.backbone().variables)]
  assert len(stored) == len(expected)
  for a, b in zip(stored, expected):
    np.testing.assert_array_equal(a, b)
  paths = _test_paths(run)
  want = run.caption_images(paths, method="greedy")
  assert [r["caption"] for r in serving.load(path).caption_images(paths)] == want

  async def test(client, app):
    meta = await (await client.get("/metadata")).json()
    out = []
    for p in paths[:3]:
      with open(p, "rb") as f:
        r = await client.post("/caption?method=greedy", data=f.read(), headers={"Content-Type": "image/png"})
      out.append((r.status, await r.json()))
    return meta, out

  async def main():
    from aiohttp.test_utils import TestClient, TestServer
    app = server.make_app(server.RunBackend(run))
    async with TestClient(TestServer(app)) as client:
      return await test(client, app)

  served_meta, out = asyncio.run(main())
  assert served_meta["input"]["images"]
  assert [status for status, _ in out] == [200] * 3
  assert [body["captions"][0]["caption"] for _, body in out] == want[:3]

