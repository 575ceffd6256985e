# The two commands of the README. Both create .venv from requirements.txt (the package) and
# requirements-dev.txt (the tests) on first use and reinstall only when one of them or
# pyproject.toml changes (the stamp file is older).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-requirements

.PHONY: train test test-slow test-heavy setup

setup: $(STAMP)

# jaxcap itself is installed editable (no dependencies: they are the line before), so that
# `import jaxcap`, jaxcap-train and jaxcap-evaluate work in .venv from any directory.
# editable_mode=compat puts the checkout on sys.path (a .pth path entry) instead of setuptools'
# import hook, which Python asks only after sys.path: with the hook, a script run from the
# checkout's parent (a clone at ~/jaxcap, run from ~) imports the clone folder as an empty
# namespace package `jaxcap` (no attribute 'load'); tests/test_editable_install.py.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e . --config-settings editable_mode=compat
	@cat requirements.txt requirements-dev.txt > $(STAMP)

# Trains the default model on the embedded synthetic dataset and evaluates it (ARGS are passed on).
train: $(STAMP)
	$(PY) train.py $(ARGS)

# The default test suite (what .ci/run runs), in WORKERS processes (pytest-xdist), each test
# file on one worker (module fixtures are shared within a file), the costliest files first
# (tests/conftest.py orders them from tests/durations.json; --no-loadscope-reorder keeps that
# order). WORKERS=0 runs in this process. A worker that dies is not replaced: with loadfile
# scheduling a replaced worker can wait forever for work (pytest-xdist #784); this way the run
# fails at once and names the test that was running.
WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --durations=40

test: $(STAMP)
	$(PYTEST) -m "not slow" tests $(ARGS)

# Every test the quick loop leaves out, the heavy tier included (.ci/run's second step).
test-slow: $(STAMP)
	$(PYTEST) -m slow tests $(ARGS)

# The heavy tier alone: tests of minutes of CPU each (the notebooks, the GPU script's CPU smoke
# run, benchmarks/run.py on every model, the ETA and AAT table scripts, the from-pixels
# two-process run, the pixels experiments; pytest.ini's heavy marker), for a change that touches
# what they cover. `JAXCAP_README_RUN=all make test-slow` adds the documentation's paper-table builds.
test-heavy: $(STAMP)
	$(PYTEST) -m heavy tests $(ARGS)
