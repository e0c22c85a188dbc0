# Two entry points for a fresh machine with only Python:
#   make run   - set up the virtualenv and start the local 3-node cluster
#   make test  - set up the virtualenv, lint, type-check, run the tests and the
#                simulation, and build the manual
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# pytest's parallel workers (pytest-xdist); 0 runs the tests in this process.
TEST_WORKERS ?= 2

.PHONY: run test lint typecheck docs browser promtool unit simulate bench clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet -e clients/python
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m node dev $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) tools/max_complexity.py 15 node chaos clients/python/bucket_scheduler_client

typecheck: $(STAMP)
	$(PY) -m mypy node ring membership chaos bench tools clients/python/bucket_scheduler_client

# The manual (docs/, mkdocs.yml) into site/: --strict fails on a broken link,
# a page left out of the navigation or a navigation entry without its page.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

unit: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The deterministic simulation (docs/chaos.md): SIM_SEEDS seeds of the whole
# cluster, each 10 simulated minutes under load and faults, must pass; then
# every mutant must be caught within the same seeds. SIM_JOBS at once.
SIM_SEEDS ?= 200
SIM_JOBS  ?= 2
simulate: $(STAMP)
	$(PY) -m chaos simulate --seeds 1-$(SIM_SEEDS) --jobs $(SIM_JOBS)
	$(PY) -m chaos simulate --seeds 1-$(SIM_SEEDS) --jobs $(SIM_JOBS) --all-mutants

# The console's tests run in the distribution's Chromium: install it where
# this machine allows (root with apt-get); elsewhere those tests skip, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && { apt-get install -y -q chromium >/dev/null 2>&1 \
	            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } \
	  || echo "make: no Chromium (needs root and apt-get): the browser tests will skip"

# The alert rules' tests run promtool, which the distribution's prometheus
# package ships: install it where this machine allows (root with apt-get),
# without its recommends (a node exporter) and without the server the package
# would start on port 9090: a policy-rc.d that refuses every start stands for
# the install (where none is there already), and the unit is disabled after.
# Elsewhere those tests skip, saying why.
promtool:
	@command -v promtool >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && { [ -e /usr/sbin/policy-rc.d ] \
	            || { trap 'rm -f /usr/sbin/policy-rc.d' EXIT \
	                 && printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
	                 && chmod +x /usr/sbin/policy-rc.d; }; } \
	       && { apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
	            || { apt-get update -q >/dev/null 2>&1 \
	                 && apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }; } \
	       && { ! command -v systemctl >/dev/null 2>&1 \
	            || { systemctl disable --quiet prometheus; systemctl stop prometheus; } >/dev/null 2>&1 \
	            || true; }; } \
	  || echo "make: no promtool (needs root and apt-get): the alert rules' tests will skip"

test: lint typecheck docs browser promtool unit simulate
	rm -rf .schemathesis

bench: $(STAMP)
	$(PY) -m bench all --out bench-results/latest.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dev-data site .schemathesis
