"""What the shared tests need of M² (collected by tests/papers/__init__.py)."""

import numpy as np

from tests.bad_inputs_lib import C, NO_TEST

# tests/models/test_attention_aux.py (and test_decode_length.py): case -> (registered model,
# fields). pad_mask="input": the shared test checks zero weight on padded regions, which the
# authors' mask attends; positions="sinusoid": decode_length steps past any table.
ATTENTION_AUX = {
    "m2": ("m2", dict(dim=16, num_heads=2, ff_dim=24, num_layers=2, num_dec_layers=2,
                      memory_slots=3, dropout=0.0, pad_mask="input", positions="sinusoid")),
}


def aux_summaries(name: str, fields: dict, case: str, s: dict) -> bool:
  """M²'s ``attention``: the last decoder layer's mean over the attended encoder layers and
  heads of ``cross_attention`` ``[.., L, E', H, N]``."""
  if name != "m2":
    return False
  np.testing.assert_allclose(s["attention"], s["cross_attention"][:, :, -1].mean((2, 3)), atol=1e-6)
  return True


# ------------------------------------------------------------------ tests/test_bad_inputs.py
BAD_INPUT_MODELS = {"m2": ["--config=configs/m2.py:synthetic,tiny", NO_TEST]}
BAD_INPUT_CASES = [
    C("m2-pad-mask-unknown", ["--config.model.pad_mask=both"], "model.pad_mask", model="m2"),
    C("m2-decode-past-position-table", ["--config.model.max_positions=8", "--config.decode.max_len=9"],
      "decode.max_len", model="m2"),
]


# ------------------------------------------------------------------ tests/readme_runner.py
# jaxcap/papers/m2/README.md's import command (the fixture their code wrote): the run it writes.
README_PROMISES = [
    (r"^jaxcap-import --format m2 .*--workdir runs/m2_import_trial$",
     ["runs/m2_import_trial/config.json", "runs/m2_import_trial/vocab.json",
      "runs/m2_import_trial/checkpoints/0"]),
]


# -------------------------------------------------------------- tests/scripts/test_script_errors.py
SCRIPT_BAD_FLAG = {
    "jaxcap/papers/m2/table.py": (["--workdir", "{tmp}/t", "--dataset", "coco"], "--dataset"),
}
SCRIPT_WRITES = {
    "jaxcap/papers/m2/table.py": (["--workdir", "{out}", "--rows", "m2", "--seeds", "0", "--steps", "2"],
                                  "m2/seed0"),
}


# ------------------------------------------------------------------ tests/readme_runner.py (table)
README_HEAVY = {
    "-m jaxcap.papers.m2.table": ("4 rows trained and tested at the dataset's full splits even at 4 steps "
                                  "and one seed; tests/scripts/test_script_errors.py runs table.py on one row"),
}
README_SHRINK = {"-m jaxcap.papers.m2.table": "--steps 4 --seeds 0"}
README_TABLE_SCRIPTS = ["-m jaxcap.papers.m2.table"]
