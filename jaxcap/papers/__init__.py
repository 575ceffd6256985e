"""One folder per paper: ``jaxcap/papers/<paper>/``.

A paper's folder holds everything that is the paper's alone:

- its model(s) (``model.py``, baselines of its own such as ``aoanet.py``), registered by name
  (``@registry.register("<name>")``); a model file holds the equations, a short docstring with
  the dimension legend, and a pointer to the page;
- its configs (``configs/<model>.py``: ``get_config(arg)``; ``--config configs/<model>.py:<arg>``
  finds them, :func:`jaxcap.config_files.resolve`);
- its page (``README.md``): what was built, the deviations from the paper and the notes where
  the paper is silent, the tables and the commands that make them;
- its table scripts (``python -m jaxcap.papers.<paper>.<script>``), notebook(s), recorded
  ``results/`` and tools no other paper uses.

:data:`PAPERS` is the registry's list: a new paper is its folder, its tests
(``tests/papers/<paper>/``) and one line here.
"""

PAPERS = (
    "eta",  # ETA-Transformer (Li et al., ICCV 2019)
    "image_transformer",  # Image Transformer (He et al., 2020) and its AoANet baseline
    "aat",  # Adaptive Attention Time (Huang et al., NeurIPS 2019)
    "mnmt",  # Multimodal attention NMT (Caglayan et al., 2016)
    "tpgn",  # Tensor Product Generation Network (Huang et al., 2018) and Show and Tell
    "m2",  # Meshed-Memory Transformer (Cornia et al., CVPR 2020)
)
