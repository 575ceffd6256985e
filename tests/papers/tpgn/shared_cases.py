"""What the shared tests need of TPGN and Show and Tell (collected by tests/papers/__init__.py)."""

from tests.bad_inputs_lib import C, NO_TEST, write

# tests/models/test_attention_aux.py: registered models whose decoder attends to nothing.
NO_ATTENTION = {"show_tell": "the global feature only", "tpgn": "the global feature only"}
# tests/models/test_decode_length.py: the same models, case -> (registered model, fields).
DECODE_LENGTH_CASES = {
    "show_tell": ("show_tell", dict(hidden_dim=16, embed_dim=8, dropout=0.0)),
    "tpgn": ("tpgn", dict(d=4)),
}


# ------------------------------------------------------------------------- tests/test_bad_inputs.py
BAD_INPUT_MODELS = {
    "tpgn": ["--config=configs/tpgn.py:synthetic,tiny", NO_TEST],
    "show_tell": ["--config=configs/show_tell.py:synthetic,tiny", NO_TEST],
}
# TPGN's GloVe file is read when the run starts: checked before anything is written.
BAD_INPUT_CASES = [
    C("tpgn-glove-empty", ["--config.model.glove_path={tmp}/glove.txt"],
      "glove.txt: holds no vectors", model="tpgn", mutate=write("glove.txt", "")),
    C("tpgn-glove-missing", ["--config.model.glove_path={tmp}/nowhere.txt"], "nowhere.txt",
      model="tpgn"),
    C("tpgn-glove-wrong-width", ["--config.model.glove_path={tmp}/glove.txt"], "glove.txt line 2",
      model="tpgn", mutate=write("glove.txt", "red 1 2 3\ncube 1 2 3 4 5\n")),
    C("tpgn-glove-no-vocabulary-word", ["--config.model.glove_path={tmp}/glove.txt"],
      "glove.txt: none of its 2 vectors", model="tpgn",
      mutate=write("glove.txt", "zebra 1 2 3\ngiraffe 1 2 3\n")),
    C("tpgn-glove-not-numbers", ["--config.model.glove_path={tmp}/glove.txt"], "glove.txt line 1",
      model="tpgn", mutate=write("glove.txt", "red one two three\n")),
    C("tpgn-glove-nan", ["--config.model.glove_path={tmp}/glove.txt"], "glove.txt line 1",
      model="tpgn", mutate=write("glove.txt", "red nan 1 2\n")),
    C("tpgn-glove-a-directory", ["--config.model.glove_path={tmp}"], "not a file", model="tpgn"),
    C("tpgn-d-0", ["--config.model.d=0"], "model.d", model="tpgn"),
    C("tpgn-lexical-unknown", ["--config.model.lexical=shared"], "model.lexical", model="tpgn"),
    C("show-tell-embed-dim-0", ["--config.model.embed_dim=0"], "model.embed_dim",
      model="show_tell"),
]


# -------------------------------------------------------------- tests/scripts/test_script_errors.py
SCRIPT_BAD_FLAG = {
    "jaxcap/papers/tpgn/roles.py": (["--workdir", "{tmp}/t", "--step", "x"], "--step"),
    "jaxcap/papers/tpgn/table1.py": (["--workdir", "{tmp}/t", "--steps", "x"], "--steps"),
}
SCRIPT_READS_RUN = {
    "jaxcap/papers/tpgn/roles.py": ["--workdir", "{run}"],
}
SCRIPT_WRITES = {
    "jaxcap/papers/tpgn/table1.py": (["--workdir", "{out}", "--rows", "show_tell", "--seeds", "0", "--steps", "2"],
     "show_tell_s0"),
}


# --------------------------------------------------------------------------- tests/readme_runner.py
README_HEAVY = {
    "-m jaxcap.papers.tpgn.table1": "2 models trained and tested (110 s)",
}
README_SHRINK = {
    "-m jaxcap.papers.tpgn.table1": "--steps 4 --seeds 0",
    "-m jaxcap.papers.tpgn.roles": "--fit-images 16",
}
README_PROMISES = [(r"tpgn\.roles .*--png roles\.png", ["roles.png"])]
README_TABLE_SCRIPTS = ["-m jaxcap.papers.tpgn.table1"]
README_NEEDS_SHARED = [r"jaxcap\.papers\.tpgn\.table1", r"runs/tpgn_table1"]
