# `make run`: set up .venv (if missing) and run the main job; `make test`: set up and run the tests.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The first Python >= 3.12 found: $(PYTHON), python3.13/3.12 on PATH, then pyenv's.
find_python = $(shell for p in $(PYTHON) python3.12 python3.13 python3 \
	$$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null); do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
	&& { command -v $$p; break; }; done)

.PHONY: run test lint typecheck bench models clean

$(STAMP): pyproject.toml
	@test -x $(PY) || { py="$(find_python)"; test -n "$$py" || { echo "oxla needs Python >= 3.12 (set PYTHON=...)"; exit 1; }; \
		echo "creating $(VENV) with $$py"; $$py -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

run: $(STAMP)
	$(PY) -m oxla.demo

test: $(STAMP)
	$(PY) -m ruff check oxla tests benchmarks scripts
	$(PY) -m mypy
	$(PY) -m pytest -n 2 tests

lint: $(STAMP)
	$(PY) -m ruff check oxla tests benchmarks scripts

typecheck: $(STAMP)
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info
