"""Functional ablations through ``Run.ablate``: each switch equals the trained variant's forward
pass over the same parameters where the two definitions coincide.

Tiny models with random parameters (the equalities hold for any parameters), teacher-forced
logits compared to float32 precision:

* ETA: ``force_gate=1.0`` == ``variant="stacked_v"`` (the visual pathway alone, eq. 12 with
  c = 1 and f = identity), ``force_gate=0.0`` == ``stacked_s``; on a ``parallel`` model
  ``force_gate=1.0`` == ``transformer_v``.
* AAT: ``min_steps=max_steps=1`` == ``attention="recurrent", steps=1`` (section 3.2.4);
  ``max_steps`` caps the steps at test time; ``epsilon`` close to 1 halts before any attention.
* Image Transformer: ``graph="all_neighbour"`` == the model built with that config field, and
  == the default graph on boxes that make every pair a neighbour (identical boxes).
* TPGN: ``zero_role_cluster`` with a centroid no u_t is near changes nothing; with one
  centroid every u_t is zeroed, so f_t = 0 and the logits no longer depend on the image.

Mutants tried (each made a test here fail, then restored): ETA's ``force_gate`` ignored in
``entangle`` (the gate test fails); ``Run.ablate`` keeping the original model (the AAT and
Image Transformer tests fail).
"""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_collections

from jaxcap import api
from jaxcap.data import batch as batch_lib
from jaxcap.data.vocab import Vocab
from jaxcap.models import registry
from jaxcap.models.base import shift_right

V_WORDS = [f"w{i}" for i in range(12)]
INFO = {"feature_dim": 12, "global_dim": 12, "max_regions": 5, "max_len": 6, "vocab_size": 16,
        "src_vocab_size": 0, "num_attributes": 8, "grid": False, "seq_per_img": 2,
        "max_attributes": 3, "src_max_len": 0}


def _run(model_fields: dict, seed: int = 0) -> api.Run:
  cfg = ml_collections.ConfigDict({"model": dict(model_fields, dtype="float32"),
                                   "decode": {"method": "greedy", "max_len": INFO["max_len"]}})
  model = registry.build(cfg.model, INFO)
  batch = jax.tree.map(jnp.asarray, batch_lib.dummy(INFO, 2))
  params = model.init(jax.random.PRNGKey(seed), batch, shift_right(batch["captions"]), train=False)
  if model_fields["name"] == "tpgn":
    params = dict(params, constants=dict(params["constants"],
                                         feat_mean=jnp.full((INFO["global_dim"],), 0.1, jnp.float32)))
  return api.Run(cfg, Vocab(V_WORDS), INFO, model, params)


def _batch(seed: int = 1, b: int = 3) -> dict:
  rng = np.random.default_rng(seed)
  n = INFO["max_regions"]
  xy = rng.uniform(0, 0.5, (b, n, 2))
  wh = rng.uniform(0.1, 0.5, (b, n, 2))
  boxes = np.concatenate([xy, xy + wh], -1).astype(np.float32)
  boxes[:, 1] = [0.0, 0.0, 1.0, 1.0]  # region 1 contains the others: the graph has parents
  mask = np.ones((b, n), bool)
  mask[0, 3:] = False
  feats = rng.normal(size=(b, n, INFO["feature_dim"])).astype(np.float32)
  caps = rng.integers(4, INFO["vocab_size"], (b, INFO["seq_per_img"], INFO["max_len"] + 1)).astype(np.int32)
  return {"feats": feats, "feats_mask": mask, "boxes": boxes, "global_feat": feats.mean(1),
          "captions": caps, "attributes": rng.integers(4, INFO["vocab_size"], (b, 3)).astype(np.int32),
          "valid": np.ones((b,), bool), "image_index": np.arange(b, dtype=np.int32)}


def _forward(run: api.Run, batch: dict):
  """Teacher-forced ``(logits [B, S, T, V], aux)`` of the run's model."""
  b = jax.tree.map(jnp.asarray, batch)
  fn = jax.jit(lambda p, b: run.model.apply(p, b, shift_right(b["captions"]), train=False),
               compiler_options={"xla_backend_optimization_level": 0})
  return jax.device_get(fn(run.params, b))


def _logits(run: api.Run, batch: dict) -> np.ndarray:
  return np.asarray(_forward(run, batch)[0])


ETA = {"name": "eta", "dim": 16, "num_layers": 1, "num_dec_layers": 1, "num_heads": 2, "ff_dim": 32,
       "dropout": 0.0}


@pytest.mark.slow
def test_eta_forced_gate_equals_the_single_pathway_variants():
  run, batch = _run(dict(ETA, variant="eta")), _batch()
  full = _logits(run, batch)
  for gate, variant in ((1.0, "stacked_v"), (0.0, "stacked_s")):
    forced = _logits(run.ablate(force_gate=gate), batch)
    np.testing.assert_allclose(forced, _logits(run.ablate(variant=variant), batch), rtol=1e-5, atol=1e-5)
    assert np.abs(forced - full).max() > 1e-3  # the gate matters in the full model
  assert run.ablate(force_gate=1.0).model.force_gate == 1.0 and run.model.force_gate is None
  parallel = _run(dict(ETA, variant="parallel"))
  np.testing.assert_allclose(_logits(parallel.ablate(force_gate=1.0), batch),
                             _logits(parallel.ablate(variant="transformer_v"), batch), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_ablate_reports_unknown_fields_and_parameters_that_do_not_fit():
  run = _run(dict(ETA, variant="stacked_v"))
  with pytest.raises(ValueError, match=r"no field 'force_gates'") as e:
    run.ablate(force_gates=1.0)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"ablate\(variant='eta'\): the parameters do not fit") as e:
    run.ablate(variant="eta")  # a stacked_v run has no semantic pathway to turn on
  assert "\n" not in str(e.value)
  assert run.ablate(force_gate=0.5).ablations == {"force_gate": 0.5}
  assert run.ablate(force_gate=0.5).config.model.force_gate == 0.5 and run.config.model.get("force_gate") is None


AAT = {"name": "aat", "dim": 16, "num_heads": 2, "attention": "adaptive", "min_steps": 0, "max_steps": 4,
       "epsilon": 1e-4, "dropout": 0.0}


def _steps(run, batch):
  return np.asarray(_forward(run, batch)[1]["attention_steps"])


@pytest.mark.slow
def test_aat_step_cap_and_epsilon_at_test_time():
  run, batch = _run(AAT), _batch()
  np.testing.assert_allclose(_logits(run.ablate(min_steps=1, max_steps=1), batch),
                             _logits(run.ablate(attention="recurrent", steps=1), batch), rtol=1e-5, atol=1e-5)
  full = _steps(run, batch)
  assert full.max() == 4  # untrained confidences ~0.5: epsilon 1e-4 is never reached in 4 steps
  capped = _steps(run.ablate(max_steps=2), batch)
  assert capped.max() == 2 and capped.min() >= 0
  assert _steps(run.ablate(epsilon=0.999), batch).max() == 0  # halts before the first attention step


IT = {"name": "image_transformer", "dim": 16, "num_heads": 2, "num_layers": 2, "spatial_layers": "all",
      "num_sub": 3, "ff_dim": 32, "dropout": 0.0}


@pytest.mark.slow
def test_image_transformer_all_neighbour_graph():
  run, batch = _run(IT), _batch()
  ablated = _logits(run.ablate(graph="all_neighbour"), batch)
  built = registry.build(ml_collections.ConfigDict(dict(IT, graph="all_neighbour")), INFO)
  np.testing.assert_allclose(ablated, _logits(api.Run(run.config, run.vocab, INFO, built, run.params), batch),
                             rtol=1e-6, atol=1e-6)
  # Identical boxes make every pair of regions a neighbour (eq. 5's strict ">" fails).
  same = dict(batch, boxes=np.broadcast_to(np.float32([0.1, 0.1, 0.6, 0.6]), batch["boxes"].shape).copy())
  np.testing.assert_allclose(ablated, _logits(run, same), rtol=1e-5, atol=1e-5)
  assert np.abs(ablated - _logits(run, batch)).max() > 1e-4  # the batch's containment matters


TPGN = {"name": "tpgn", "d": 4, "dropout": 0.0}


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_tpgn_zeroed_role_cluster():
  run, batch = _run(TPGN), _batch()
  full = _logits(run, batch)
  d2 = 16
  far = np.stack([np.full((d2,), 1e3), np.zeros((d2,))]).astype(np.float32)  # every u_t is near 1
  np.testing.assert_allclose(_logits(run.ablate(zero_role_cluster=0, role_centroids=far), batch), full,
                             rtol=1e-6, atol=1e-6)
  one = np.zeros((1, d2), np.float32)
  zeroed = _logits(run.ablate(zero_role_cluster=0, role_centroids=one), batch)
  assert np.abs(zeroed - full).max() > 1e-4
  # f_t = S_t u_t = 0 at every step: the output no longer depends on the image or the words.
  np.testing.assert_allclose(zeroed, np.broadcast_to(zeroed[:1, :1, :1], zeroed.shape), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="parameters do not fit"):
    run.ablate(zero_role_cluster=0)  # no centroids given


@pytest.mark.slow  # past the quick loop's CPU limit (tests/durations.py)
def test_tpgn_role_centroids_of_the_wrong_shape_or_file_are_one_line(tmp_path):
  """Centroids must be [K, d*d] (d = 4 here: 16); a file is named in the message."""
  run = _run(TPGN)
  for bad in (np.zeros((2, 9), np.float32), np.zeros((16,), np.float32), np.full((1, 16), np.nan),
              [["a"] * 16]):
    with pytest.raises(ValueError, match=r"^role_centroids: expected finite \[K, 16\] centroids"):
      run.ablate(zero_role_cluster=0, role_centroids=bad)
  path = tmp_path / "roles_k2.npy"
  np.save(path, np.zeros((2, 9), np.float32))  # a run of d = 3
  with pytest.raises(ValueError, match=rf"^role_centroids={path}: expected finite \[K, 16\]"):
    run.ablate(zero_role_cluster=0, role_centroids=str(path))
  (tmp_path / "bad.npy").write_text("not numpy")
  with pytest.raises(ValueError, match=rf"^role_centroids={tmp_path / 'bad.npy'}: unreadable"):
    run.ablate(zero_role_cluster=0, role_centroids=str(tmp_path / "bad.npy"))
  np.save(path, np.zeros((1, 16), np.float32))
  assert run.ablate(zero_role_cluster=0, role_centroids=str(path)).ablations == {"zero_role_cluster": 0}
