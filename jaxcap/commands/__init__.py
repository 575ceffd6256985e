"""The command-line programs: ``train`` (``train.py``, ``jaxcap-train``) and ``evaluate``
(``evaluate.py``, ``jaxcap-evaluate``). Each module defines its absl flags on import and a
``run()`` entry point (what the console scripts of ``pyproject.toml`` run, through
:mod:`jaxcap.entry`)."""
