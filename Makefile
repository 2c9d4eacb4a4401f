# lce-lab developer entry points. Run `make` or `make help` for the list.
#
# Every public target depends on the install stamp, so `make demo` or
# `make test` on a fresh clone creates .venv and installs the project first.

# Interpreter used to create the venv: python3.11 if it runs, else python3.
PYTHON ?= $(shell python3.11 -c 'import sys' >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV ?= .venv
PYTEST_ARGS ?=

STAMP := $(VENV)/.installed
# The Jupyter kernel every notebook names (analysis/report/notebooks.py: KERNEL), registered inside the venv.
KERNEL := lce-lab
KERNEL_DISPLAY := Python (lce-lab)

.DEFAULT_GOAL := help
.PHONY: help setup demo lint test test-fast explore check-lab lab figures reproduce notebooks gpu-wheels gpu-dry-run clean

help: ## Show this list of targets
	@echo "Usage: make <target>   (PYTHON=$(PYTHON) VENV=$(VENV))"
	@echo
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Re-runs whenever pyproject.toml or constraints.txt changes.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -c constraints.txt -e '.[dev]'
	$(VENV)/bin/python analysis/checkout.py
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "$(KERNEL_DISPLAY)"
	@touch $@

setup: $(STAMP) ## Create the venv (.venv), install the project with all extras (torch pinned by constraints.txt), register the kernel

demo: $(STAMP) ## Run the small end-to-end demo (python -m analysis demo)
	$(VENV)/bin/python -m analysis demo

lint: $(STAMP) ## Lint with ruff (rules and line length in pyproject.toml); CI runs it before the tests
	$(VENV)/bin/ruff check .

test: $(STAMP) ## Run the whole test suite on every core, as CI does (extra pytest flags: PYTEST_ARGS=...)
	$(VENV)/bin/python -m pytest -q -n auto $(PYTEST_ARGS)

test-fast: $(STAMP) ## The edit-test loop (< 2 min): lce and analysis unit tests and the claims; no subprocess, notebook, training or distributed run
	$(VENV)/bin/python -m pytest -q -n auto -m "not slow" $(PYTEST_ARGS)

explore: $(STAMP) ## Property tests with fresh random examples (Hypothesis "explore" profile, 5000 per test)
	HYPOTHESIS_PROFILE=explore $(VENV)/bin/python -m pytest -q tests/lce/test_parity_hypothesis.py

check-lab: $(STAMP) ## Open every notebook in JupyterLab (headless chromium) and check nothing is rewritten (~3 min)
	LCE_BROWSER_TESTS=1 $(VENV)/bin/python -m pytest -q tests/repo/test_jupyterlab_browser.py

lab: $(STAMP) ## Start JupyterLab on notebooks/ (the notebooks open with the venv's "Python (lce-lab)" kernel)
	$(VENV)/bin/jupyter lab notebooks/

figures: $(STAMP) ## Regenerate the figures (python -m analysis figures)
	$(VENV)/bin/python -m analysis figures

reproduce: $(STAMP) ## Quick reproduction of the results (python -m analysis reproduce --quick)
	$(VENV)/bin/python -m analysis reproduce --quick

notebooks: $(STAMP) ## Execute every notebook from its notebooks/NN_*.py source and write the .ipynb with outputs
	$(VENV)/bin/python -m analysis notebooks

gpu-wheels: $(STAMP) ## Download Liger-Kernel and Cut Cross-Entropy wheels for the lent GPU's Python 3.12 into .gpu/wheels (< 60 MiB)
	$(VENV)/bin/python -m analysis gpu-wheels

gpu-dry-run: $(STAMP) ## The GPU check's dry run on this CPU: every step's plan, the wheels, the grid emulated (< 1 min)
	$(VENV)/bin/python -m analysis gpu-check --dry-run

clean: ## Remove caches and build outputs (keeps the venv and data)
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
	rm -rf .pytest_cache .hypothesis build dist *.egg-info
