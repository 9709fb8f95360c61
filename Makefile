# Two entry points: `make demo` and `make test`. Each creates .venv when needed; the demo installs
# only what dpsql needs to run, the tests add the test extras (pyspark, pyarrow, scipy, ...).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install

$(BIN)/.installed-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(BIN)/.installed-test: $(BIN)/.installed-run
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/.installed-test

demo: $(BIN)/.installed-run
	$(BIN)/dpsql demo

test: $(BIN)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

bench: $(BIN)/.installed-test
	$(BIN)/python benchmarks/bench_engine.py
