"""What the shared tests need of ETA (collected by tests/papers/__init__.py)."""

import numpy as np

from tests.bad_inputs_lib import C, NO_TEST, init_workdir

_TRANSFORMER = dict(dim=16, num_layers=1, num_dec_layers=2, num_heads=2, ff_dim=24, dropout=0.0)

# tests/models/test_attention_aux.py: case -> (registered model, fields).
ATTENTION_AUX = {
    "eta": ("eta", dict(_TRANSFORMER, variant="eta")),
    "eta_parallel": ("eta", dict(_TRANSFORMER, variant="parallel")),
    "eta_late_fusion": ("eta", dict(_TRANSFORMER, variant="late_fusion")),
}


def aux_memory(key: str):
  """The batch mask an ETA aux key's last axis runs over (its attribute and pathway keys)."""
  if key.startswith("attribute_") or key.endswith(("_a_s", "_gv_s")):
    return "attr_mask"
  if key.endswith(("_a_v", "_gs_v")):
    return "feats_mask"
  return None


def aux_summaries(name: str, fields: dict, case: str, s: dict) -> bool:
  """ETA's ``attention`` / ``attribute_attention``: the last decoder layer's mean over heads;
  the region summary is the visual pathway's output attention gs_v."""
  if name != "eta":
    return False
  np.testing.assert_allclose(s["attention"], s["cross_attention"][:, :, -1].mean(2), atol=1e-6)
  if "attribute_attention" in s:
    np.testing.assert_allclose(s["attribute_attention"],
                               s["attribute_cross_attention"][:, :, -1].mean(2), atol=1e-6)
  if case == "eta":
    np.testing.assert_array_equal(s["cross_attention"], s["cross_attention_gs_v"])
    np.testing.assert_array_equal(s["attribute_cross_attention"], s["cross_attention_gv_s"])
  return True


# ------------------------------------------------------------------------- tests/test_bad_inputs.py
BAD_INPUT_MODELS = {"eta": ["--config=configs/eta.py:synthetic,tiny", NO_TEST]}
# ETA attends to attribute words: a run without them is refused, training and evaluate.py.
BAD_INPUT_CASES = [
    C("eta-attributes-none", ["--config.data.attributes=none"], "config field data.attributes",
      model="eta"),
    C("eta-test-attributes-none", ["--config.data.test_attributes=none",
                                   "--config.test_after_training=True"],
      "config field data.test_attributes", model="eta"),
    C("eta-detected-attributes-file-missing", ["--config.data.attributes=detected",
                                               "--config.data.attributes_file={tmp}/nope.json"],
      "nope.json", model="eta"),
    C("eta-variant-unknown", ["--config.model.variant=both"], "model.variant", model="eta"),
    C("eta-evaluate-attributes-none", ["--workdir={tmp}/wd", "--attributes=none"],
      "--attributes=none", script="evaluate", mutate=init_workdir("eta", "--workdir={tmp}/wd")),
]


# -------------------------------------------------------------- tests/scripts/test_script_errors.py
SCRIPT_CASES = [
    ("jaxcap/papers/eta/ablations.py", ["--workdir={tmp}/t", "--seeds=x"], "--seeds"),
]
SCRIPT_BAD_FLAG = {
    "jaxcap/papers/eta/ablations.py": (["--workdir={tmp}/t", "--steps=x"], "--steps"),
    "jaxcap/papers/eta/train_attributes.py": (["--out={tmp}/t", "--bogus=1"], "--bogus"),
}
SCRIPT_WRITES = {
    "jaxcap/papers/eta/ablations.py": (["--workdir={out}", "--variants=transformer_v", "--seeds=0", "--steps=2"],
     "transformer_v/seed0"),
    "jaxcap/papers/eta/train_attributes.py": (["--out={out}"], None),
}


# --------------------------------------------------------------------------- tests/readme_runner.py
README_HEAVY = {
    "-m jaxcap.papers.eta.ablations": "7 variants trained and tested (815 s)",
}
README_SHRINK = {
    "-m jaxcap.papers.eta.ablations": "--steps 4 --batch_size 8 --eval_num_images 16 --test_images 16 --seeds 0",
}
README_DEFAULT_CONFIGS = {"-m jaxcap.papers.eta.train_attributes": "configs/eta.py:synthetic"}
README_PROMISES = [(r"train_attributes", ["runs/attributes/metrics.json"])]
README_CONFIG_SCRIPTS = ["-m jaxcap.papers.eta.train_attributes"]
README_TABLE_SCRIPTS = ["-m jaxcap.papers.eta.ablations"]
