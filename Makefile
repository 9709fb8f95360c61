# Two entry points: `make demo` and `make test`. Each creates .venv and installs dpsql from
# pyproject.toml (with its test extras) when needed. `make serve` runs the demo, then serves it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install serve browser

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/dpsql demo

# The console's browser test drives Debian's chromium; install it when apt can (as root), else
# the test is skipped with the reason. Nothing else is downloaded.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium not installed: the console's browser test will be skipped"; }

test: $(BIN)/.installed browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

serve: $(BIN)/.installed
	$(BIN)/dpsql demo --serve

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_engine.py
