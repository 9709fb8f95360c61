# Two entry points: `make demo` and `make test`. Each creates .venv when needed; the demo installs
# only what dpsql needs to run, the tests add the test extras (pyspark, pyarrow, scipy, ...).
# `make serve` builds the demo, then serves it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install serve browser pgclients

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

# The console's browser test drives Debian's chromium; install it when apt can (as root), else
# the test is skipped with the reason. Nothing else is downloaded.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium not installed: the console's browser test will be skipped"; }

# The PostgreSQL port's tests drive psql (postgresql-client) and pgjdbc (Metabase's and DBeaver's
# driver, libpostgresql-jdbc-java, on the machine's Java); installed the same way, else skipped.
pgclients:
	@{ command -v psql >/dev/null 2>&1 && [ -f /usr/share/java/postgresql.jar ]; } \
		|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get update -qq && apt-get install -y -qq postgresql-client libpostgresql-jdbc-java >/dev/null) \
		|| echo "psql or pgjdbc not installed: those PostgreSQL-port tests will be skipped"; }

test: $(BIN)/.installed-test browser pgclients
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

serve: $(BIN)/.installed-run
	$(BIN)/dpsql demo --serve

bench: $(BIN)/.installed-test
	$(BIN)/python benchmarks/bench_engine.py
