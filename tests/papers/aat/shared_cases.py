"""What the shared tests need of AAT (collected by tests/papers/__init__.py)."""

import numpy as np

from tests.bad_inputs_lib import C, NO_TEST

# tests/models/test_attention_aux.py: case -> (registered model, fields).
ATTENTION_AUX = {
    # epsilon 0.3: random confidences halt at different steps (the paper's 1e-4 never halts).
    "aat": ("aat", dict(dim=16, num_heads=2, max_steps=3, epsilon=0.3, dropout=0.0)),
    "aat_recurrent": ("aat", dict(dim=16, num_heads=2, attention="recurrent", steps=2,
                                  dropout=0.0, attention_out_proj=False)),
}


def aux_memory(key: str):
  return "feats_mask" if key == "step_attention" else None


def aux_row_sums(key: str, stepped: dict, a_RxTx_M, sums):
  """The documented zero rows: slot 0 (h1) and the steps after N(t) attend to none; a word
  that halted at N(t) = 0 has no ``attention``. None: not an AAT key."""
  if key == "step_attention":
    slots = np.arange(a_RxTx_M.shape[2])
    taken = (slots[None, None, :] >= 1) & (slots[None, None, :] <= stepped["attention_steps"][..., None])
    return np.broadcast_to(taken[..., None], sums.shape).astype(sums.dtype)
  if key == "attention" and "beta" in stepped:
    return (stepped["beta"][..., 1:].sum(-1) > 0).astype(sums.dtype)
  return None


def aux_case_check(case: str, stepped: dict) -> None:
  if case == "aat":  # the case exercises both halting and not halting
    steps = stepped["attention_steps"]
    assert len(np.unique(steps)) > 1, steps


def aux_summaries(name: str, fields: dict, case: str, s: dict) -> bool:
  """``attention``: the steps' attention mixed by beta without the h1 slot, renormalised."""
  if name != "aat":
    return False
  beta = s["beta"].copy()
  beta[..., 0] = 0.0
  mixed = np.einsum("rts,rtsn->rtn", beta, s["step_attention"].mean(3))
  mass = beta.sum(-1, keepdims=True)
  np.testing.assert_allclose(s["attention"], np.where(mass > 0, mixed / np.maximum(mass, 1e-30), 0),
                             atol=1e-6)
  return True


# ------------------------------------------------------------------------- tests/test_bad_inputs.py
BAD_INPUT_MODELS = {"aat": ["--config=configs/aat.py:synthetic,tiny", NO_TEST]}
BAD_INPUT_CASES = [
    C("aat-min-steps-above-max", ["--config.model.min_steps=5", "--config.model.max_steps=2"],
      "model.min_steps", model="aat"),
    C("aat-epsilon-1", ["--config.model.epsilon=1.0"], "model.epsilon", model="aat"),
    C("aat-attention-unknown", ["--config.model.attention=soft"], "model.attention", model="aat"),
]


# -------------------------------------------------------------- tests/scripts/test_script_errors.py
SCRIPT_CASES = [
    ("jaxcap/papers/aat/plot_attention_steps.py", ["--workdir", "{tmp}/nowhere", "--out", "{tmp}/a.png"],
     "{tmp}/nowhere/config.json"),
    ("jaxcap/papers/aat/table1.py", ["--workdir", "{tmp}/t", "--rows", "nope"], "--rows"),
]
SCRIPT_BAD_FLAG = {
    "jaxcap/papers/aat/table1.py": (["--workdir", "{tmp}/t", "--steps", "x"], "--steps"),
    "jaxcap/papers/aat/plot_attention_steps.py": (["--workdir", "{tmp}/t", "--index", "x"], "--index"),
}
SCRIPT_READS_RUN = {
    "jaxcap/papers/aat/plot_attention_steps.py": ["--workdir", "{run}", "--out", "{tmp}/a.png"],
}
SCRIPT_WRITES = {
    "jaxcap/papers/aat/table1.py": (["--workdir", "{out}", "--rows", "base", "--seeds", "0", "--steps", "2"], "base/seed0"),
}


# --------------------------------------------------------------------------- tests/readme_runner.py
README_HEAVY = {
    "-m jaxcap.papers.aat.table1": "4 rows trained and tested (197 s)",
}
README_SHRINK = {
    "-m jaxcap.papers.aat.table1": "--steps 4 --batch_size 8 --eval_images 16 --test_images 16 --seeds 0",
}
README_PROMISES = [(r"plot_attention_steps", ["steps.png"])]
README_TABLE_SCRIPTS = ["-m jaxcap.papers.aat.table1"]
