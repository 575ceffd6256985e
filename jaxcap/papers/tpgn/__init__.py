"""Tensor Product Generation Network (Huang et al., 2018) and its Show-and-Tell baseline: page,
configs and tools in this folder (README.md)."""

from jaxcap.papers.tpgn import model, show_tell  # noqa: F401  (register the models)

# README.md's model table (python -m jaxcap.papers): this paper's models, each with what it is.
MODEL_ROWS = {
    "tpgn": "TPGN: Tensor Product Generation Network (sentence-encoding LSTM with a d×d state, unbinding LSTM, f_t = S_t u_t)",
    "show_tell": "Show and Tell CNN-LSTM (image feature as the LSTM's first input; TPGN's Table 1 baseline)",
}

# experiments/flickr8k/table.py: the rows this paper adds (model -> its place, cheapest first).
FLICKR8K_ROWS = {"show_tell": 20, "tpgn": 30}
