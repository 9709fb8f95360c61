# Two entry points: `make demo` and `make test`. Each creates .venv and installs dpsql from
# pyproject.toml (with its test extras) when needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/dpsql demo

test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_engine.py
