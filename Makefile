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

# Tests run in two parts: those that time nothing, $(TEST_WORKERS) at a time (pytest-xdist), then the
# `timing` ones alone, so that no other test's work sits in the window they time. A timing test that
# fails runs once more (pytest-rerunfailures; the report counts it as "rerun"): another process on
# the cores for part of its window can push one measurement past its margin, a wrong figure misses
# twice. Both parts always run; the target fails if either failed (exit 5, "no test selected", is
# not a failure: PYTEST_ARGS may name tests of one part only).
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(PYTHON) -m pytest -n $(TEST_WORKERS) -m "not timing" $(PYTEST_ARGS); first=$$?; \
	$(PYTHON) -m pytest -m timing --reruns 1 $(PYTEST_ARGS); second=$$?; \
	for code in $$first $$second; do case $$code in 0|5) ;; *) exit $$code;; esac; done

# The fast tier: the tests that start no process and take well under a second each, in one process
# (two workers' start-up costs more than they save here).
test-fast: $(VENV)/.installed
	$(PYTHON) -m pytest -m "not slow" $(PYTEST_ARGS)

benchmark: $(VENV)/.installed
	$(PYTHON) benchmarks/run_all.py
