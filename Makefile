# Two entry points for a fresh machine with only Python:
#   make run   - set up the virtualenv and start the local 3-node cluster
#   make test  - set up the virtualenv, lint, type-check and run the tests
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m node dev $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy node ring membership chaos bench

unit: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint typecheck unit

bench: $(STAMP)
	$(PY) -m bench node

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dev-data
