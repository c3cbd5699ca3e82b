# Two commands do all set-up on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.xconf-installed

.PHONY: setup run test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Exit 1 from xconf-run means "ran to completion with a non-pass verdict": still a success here.
run: setup
	$(VENV)/bin/xconf-run +experiment=cpu_smoke allow_smoke_operators=true; rc=$$?; [ $$rc -le 1 ]

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest

test: lint typecheck unit

clean:
	rm -rf outputs multirun .pytest_cache .mypy_cache .ruff_cache
