"""What the shared tests need of the Image Transformer (collected by tests/papers/__init__.py)."""

import numpy as np

from tests.bad_inputs_lib import C, NO_TEST

# tests/models/test_attention_aux.py: case -> (registered model, fields).
ATTENTION_AUX = {
    "image_transformer": ("image_transformer", dict(dim=16, num_heads=2, num_layers=1, num_sub=3,
                                                    ff_dim=24, dropout=0.0)),
    "aoanet": ("aoanet", dict(dim=16, num_heads=2, num_layers=1, dropout=0.0)),
}


def aux_summaries(name: str, fields: dict, case: str, s: dict) -> bool:
  """``attention``: the mean over sub-transformers and heads of ``cross_attention``."""
  if name not in ("image_transformer", "aoanet"):
    return False
  np.testing.assert_allclose(s["attention"], s["cross_attention"].mean((2, 3)), atol=1e-6)
  assert s["cross_attention"].shape[2] == fields.get("num_sub", 1)
  return True


# ------------------------------------------------------------------------- tests/test_bad_inputs.py
BAD_INPUT_MODELS = {
    "image_transformer": ["--config=configs/image_transformer.py:synthetic,tiny", NO_TEST],
    "aoanet": ["--config=configs/aoanet.py:synthetic,tiny", NO_TEST],
}
# The Image Transformer's spatial graph is built from the region boxes.
BAD_INPUT_CASES = [
    C("image-transformer-region-features-without-boxes", ["--config.data.box_dir="],
      "config field data.box_dir", data="karpathy", model="image_transformer"),
    C("image-transformer-epsilon-0", ["--config.model.epsilon=0.0"], "model.epsilon",
      model="image_transformer"),
    C("image-transformer-heads-not-dividing-dim", ["--config.model.num_heads=5"],
      "model.num_heads", model="image_transformer"),
    C("image-transformer-spatial-layer-4-of-1", ["--config.model.spatial_layers=4"],
      "model.spatial_layers", model="image_transformer"),
    C("image-transformer-graph-unknown", ["--config.model.graph=knn"], "model.graph",
      model="image_transformer"),
    C("aoanet-heads-not-dividing-dim", ["--config.model.num_heads=3"], "model.num_heads",
      model="aoanet"),
]


# -------------------------------------------------------------- tests/scripts/test_script_errors.py
SCRIPT_BAD_FLAG = {
    "jaxcap/papers/image_transformer/analysis.py": (["spread", "--workdir", "{tmp}/t", "--words", "x"], "--words"),
    "jaxcap/papers/image_transformer/table3.py": (["--workdir", "{tmp}/t", "--steps", "x"], "--steps"),
}
SCRIPT_READS_RUN = {
    "jaxcap/papers/image_transformer/analysis.py": ["spread", "--workdir", "{run}"],
}
SCRIPT_WRITES = {
    "jaxcap/papers/image_transformer/table3.py": (["--workdir", "{out}", "--rows", "aoanet", "--seeds", "0", "--steps", "2"],
     "aoanet/seed0"),
}


# --------------------------------------------------------------------------- tests/readme_runner.py
README_HEAVY = {
    "-m jaxcap.papers.image_transformer.table3": "7 rows trained and tested (375 s)",
}
README_SHRINK = {
    "-m jaxcap.papers.image_transformer.table3": "--steps 4 --dim 32 --batch 8 --eval_images 16 --test_images 16 --seeds 0",
}
README_PROMISES = [(r"image_transformer\.analysis figure3", ["fig3.png"])]
README_TABLE_SCRIPTS = ["-m jaxcap.papers.image_transformer.table3"]
README_NEEDS_SHARED = [r"jaxcap\.papers\.image_transformer\.table3"]
