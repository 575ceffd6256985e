# The two commands of the README. Both create .venv from requirements.txt on first use and
# reinstall only when requirements.txt changes (the stamp file is older than it).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-requirements

.PHONY: train test test-slow bench setup

setup: $(STAMP)

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@cp requirements.txt $(STAMP)

# Trains the default model on the embedded synthetic dataset and evaluates it (ARGS are passed on).
train: $(STAMP)
	$(PY) train.py $(ARGS)

# The default test suite (what .ci/run runs).
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests $(ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow tests $(ARGS)
