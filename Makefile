# The README's two commands: `make up` (start the embedded cluster) and `make test`.
# Both set up everything on a fresh machine: the virtualenv, raylog with its dependencies, and the
# system packages Spark and the client tests need (a Java 17 runtime, kcat).

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.raylog-installed
PYTEST_ARGS ?=
UP_ARGS ?=

.PHONY: up test lint system-deps client-deps venv bench clean

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "raylog needs Python >= 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

# Reinstall only when the project's dependencies change.
$(STAMP): pyproject.toml storage/_record_scan.c | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

system-deps:
	@bash .ci/system-deps.sh

# kafkajs for the client tests, from its lock file, where Node.js is installed (the test says it
# skips where it is not). Installed here rather than inside the timed test run.
KAFKAJS = tests/e2e/kafkajs
client-deps:
	@if command -v npm >/dev/null 2>&1 && [ ! -d $(KAFKAJS)/node_modules/kafkajs ]; then \
		cd $(KAFKAJS) && npm ci --no-audit --no-fund --loglevel=error; fi

# raylog's own modules are installed in place (pip -e): compile them once here, since every Ray
# worker process imports them and, where PYTHONDONTWRITEBYTECODE is set, would compile them
# again at each start (about 0.3 s of CPU per process on a 2-core machine).
SOURCES = actors gateway storage pipelines

up: $(STAMP)
	@$(PY) -m compileall -q $(SOURCES)
	$(VENV)/bin/raylog up $(UP_ARGS)

test: $(STAMP) system-deps client-deps
	@$(PY) -m compileall -q $(SOURCES)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/storage_append.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
