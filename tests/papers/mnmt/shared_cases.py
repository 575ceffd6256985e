"""What the shared tests need of MNMT (collected by tests/papers/__init__.py)."""

import numpy as np

from tests.bad_inputs_lib import C, NO_TEST, multi30k

# tests/models/test_attention_aux.py: case -> (registered model, fields).
ATTENTION_AUX = {"mnmt": ("mnmt", dict(embed_dim=8, hidden_dim=8, att_dim=8))}


def aux_memory(key: str):
  if key in ("src_attention", "attention_txt"):
    return "src_mask"
  return "feats_mask" if key == "attention_im" else None


def aux_summaries(name: str, fields: dict, case: str, s: dict) -> bool:
  """``attention`` / ``src_attention``: the image and source attentions themselves."""
  if name != "mnmt":
    return False
  np.testing.assert_array_equal(s["attention"], s["attention_im"])
  np.testing.assert_array_equal(s["src_attention"], s["attention_txt"])
  return True


# ------------------------------------------------------------------------- tests/test_bad_inputs.py
BAD_INPUT_MODELS = {
    "mnmt": ["--config=configs/mnmt.py:multi30k,size=cpu,tiny", NO_TEST,
             "--config.data.root={tmp}/m30k"],
    "mnmt_synthetic": ["--config=configs/mnmt.py:synthetic,tiny", NO_TEST],
}
# A multimodal variant needs image features, every one a source.
BAD_INPUT_CASES = [
    C("mnmt7-on-text-only-multi30k", [], "config field data.text_only", model="mnmt",
      mutate=multi30k),
    C("mnmt-imgtxt-on-text-only-multi30k", ["--config.model.variant=imgtxt"],
      "config field data.text_only", model="mnmt", mutate=multi30k),
    C("mnmt-on-captions-without-source", ["--config.data.task=caption"], "config field data.task",
      model="mnmt_synthetic"),
    C("mnmt-variant-unknown", ["--config.model.variant=mnmt9"], "model.variant",
      model="mnmt_synthetic"),
    C("mnmt-hidden-dim-0", ["--config.model.hidden_dim=0"], "model.hidden_dim",
      model="mnmt_synthetic"),
    C("mnmt-decoder-unknown", ["--config.model.decoder=dl4mt"], "model.decoder",
      model="mnmt_synthetic"),
]


# -------------------------------------------------------------- tests/scripts/test_script_errors.py
SCRIPT_BAD_FLAG = {
    "jaxcap/papers/mnmt/table2.py": (["--workdir", "{tmp}/t", "--steps", "x"], "--steps"),
}
SCRIPT_WRITES = {
    "jaxcap/papers/mnmt/table2.py": (["--workdir", "{out}", "--rows", "nmt", "--seeds", "0", "--steps", "1"], None),
}


# --------------------------------------------------------------------------- tests/readme_runner.py
README_HEAVY = {
    "-m jaxcap.papers.mnmt.table2": "10 rows trained and tested (315 s)",
}
README_SHRINK = {
    "-m jaxcap.papers.mnmt.table2": "--steps 4 --batch 8 --num_train 64 --num_test 16 --hidden 16 --embed 16 --seeds 0",
}
README_TABLE_SCRIPTS = ["-m jaxcap.papers.mnmt.table2"]
README_NOT_RUN = [
    (r"configs/mnmt\.py:multi30k,variant=nmt --workdir runs/m30k_paper",
     "the paper-sized Multi30k run: shrunk to tiny sizes it is the size=cpu command before it plus "
     "a beam-12 decoding of the 1,000 test sentences (159 s on CI); the evaluate command after it "
     "decodes Multi30k with beam 12, tests/papers/mnmt/test_model.py::test_paper_config checks the "
     "paper's settings and ::test_trains_and_tests_a_translation_run trains with BLEU-4 early stopping"),
]
README_NEEDS_SHARED = [r"jaxcap\.papers\.mnmt\.table2"]
