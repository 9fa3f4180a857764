# Set-up is part of each target: a fresh clone needs only `make run` or `make test`.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=

# The editable install's compat mode gives the hydra_plugins namespace a real folder, which Hydra's
# plugin scan needs (the default mode maps it through a placeholder); its transitional notice is
# not for users, hence PYTHONWARNINGS.
$(VENV)/.installed: pyproject.toml
	@echo "bwopt: installing into $(VENV) (once)"
	@python3 -m venv $(VENV)
	@$(PYTHON) -m pip install --quiet --upgrade pip
	@PYTHONWARNINGS=ignore $(PYTHON) -m pip install --quiet -e '.[test]' --config-settings editable_mode=compat
	@touch $@

.PHONY: run test benchmark
run: $(VENV)/.installed
	$(PYTHON) -m bwopt $(ARGS)

test: $(VENV)/.installed
	$(PYTHON) -m pytest $(PYTEST_ARGS)

benchmark: $(VENV)/.installed
	$(PYTHON) benchmarks/run_all.py
