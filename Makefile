# Set-up is part of each target: a fresh clone needs only `make run` or `make test`.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $@

.PHONY: run test benchmark
run: $(VENV)/.installed
	$(PYTHON) -m bwopt $(ARGS)

test: $(VENV)/.installed
	$(PYTHON) -m pytest $(PYTEST_ARGS)

benchmark: $(VENV)/.installed
	$(PYTHON) benchmarks/run_all.py
