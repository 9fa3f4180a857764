# Set-up is part of each target: a fresh clone needs only `make run` or `make test`.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=

# An editable install in setuptools' default mode (bwopt registers its Hydra plugins itself, see
# bwopt/plugins.py); the notice setuptools prints about editable installs is not for users, hence
# PYTHONWARNINGS.
$(VENV)/.installed: pyproject.toml
	@echo "bwopt: installing into $(VENV) (once)"
	@python3 -m venv $(VENV)
	@$(PYTHON) -m pip install --quiet --upgrade pip
	@PYTHONWARNINGS=ignore $(PYTHON) -m pip install --quiet -e '.[test]'
	@touch $@

.PHONY: run test test-fast benchmark
run: $(VENV)/.installed
	$(PYTHON) -m bwopt $(ARGS)

test: $(VENV)/.installed
	$(PYTHON) -m pytest $(PYTEST_ARGS)

# The fast tier: the tests that start no process and take well under a second each.
test-fast: $(VENV)/.installed
	$(PYTHON) -m pytest -m "not slow" $(PYTEST_ARGS)

benchmark: $(VENV)/.installed
	$(PYTHON) benchmarks/run_all.py
