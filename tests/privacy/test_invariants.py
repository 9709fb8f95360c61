"""Property-based tests of the privacy invariant, checked against DuckDB itself.

For partition columns of many types (TIMESTAMP, TIMESTAMPTZ, DATE, BIGINT, HUGEINT, DOUBLE, FLOAT,
DECIMAL, VARCHAR) with values at precision edges, hypothesis writes predicates (=, IN, BETWEEN both
ways and SYMMETRIC, <, >, AND, OR, NOT) from literals spelled the ways an adversary would (offsets,
float spellings of integers, neighbours beyond a type's precision). For every query dpsql accepts:

1. every row DuckDB reads for the answer has a partition value in the charged set;
2. every row the analyst's own predicate selects among the declared values is in the charged set
   (the charge covers what the question asks, so the restriction never silently drops rows);
3. run end to end, the ledger's dataset total is never below any one person's actual exposure:
   the sum of ε over the answered queries that read at least one of their rows;
4. on neighbouring databases (with and without one person whose values sit at every type's edge)
   a query has the same outcome, and no query fails after its charge.

``DPSQL_INVARIANT_EXAMPLES`` sets the examples per type (the suite's default is small; the
benchmark-style run in ``benchmarks/bench_invariants.py`` uses many more).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.engine.backends import DUCKDB_CONFIG, DuckDBBackend
from dpsql.engine.literals import Binder
from dpsql.engine.policy import parse_policy
from dpsql.engine.session import database_budget, set_policy
from dpsql.errors import DpsqlError
from dpsql.sql.analyze import analyze
from dpsql.sql.generate import private_rows
from dpsql.sql.parse import parse

EXAMPLES = int(os.environ.get("DPSQL_INVARIANT_EXAMPLES", "25"))


@dataclass(frozen=True)
class Column:
    """A partition column type, values stored in the table (SQL literals), declared values (policy
    TOML) and literal spellings an analyst may write."""

    type_name: str
    stored: tuple[str, ...]
    declared: str
    spellings: tuple[str, ...]


_TS = ("2024-01-01 00:00:00", "2024-01-01 00:00:01", "2024-01-01 01:00:00", "2023-12-31 23:00:00")
COLUMNS = {
    "timestamp": Column(
        "TIMESTAMP",
        tuple(f"TIMESTAMP '{t}'" for t in _TS),
        str(list(_TS[:3])).replace("'", '"'),
        (*(f"'{t}'" for t in _TS), "'2024-01-01T00:00:00+00:01'", "'2024-01-01 00:00:00+01:00'",
         "'2024-01-01'", "'2024-01-01T01:00'", "'2024-01-01 00:00:00.000001'"),
    ),
    "timestamptz": Column(
        "TIMESTAMPTZ",
        tuple(f"TIMESTAMPTZ '{t}+00'" for t in _TS),
        '["2024-01-01 00:00:00+00", "2024-01-01 02:00:00+01:00", "2024-01-01 00:00:01Z"]',
        ("'2024-01-01 00:00:00+00'", "'2024-01-01 01:00:00+01:00'", "'2023-12-31 23:00:00+00'",
         "'2024-01-01T02:00:00+01'", "'2024-01-01 00:00:00'", "'2024-01-01 00:00:01Z'"),
    ),
    "date": Column(
        "DATE",
        ("DATE '2024-01-01'", "DATE '2024-01-02'", "DATE '2023-12-31'", "DATE '2024-02-29'"),
        '["2024-01-01", "2024-01-02", "2024-02-29"]',
        ("'2024-01-01'", "'2024-1-1'", "'2024-01-02'", "'2023-12-31'", "'2024-02-29'",
         "'2024-02-30'", "'2024-01-01 12:00'"),
    ),
    "bigint": Column(
        "BIGINT",
        ("9007199254740992", "9007199254740993", "-1", "9223372036854775807"),
        "[9007199254740992, 9007199254740993, -1]",
        ("9007199254740992", "9007199254740993", "9007199254740992.0", "9007199254740993.0",
         "-1", "-1.0", "9223372036854775807", "9223372036854775808", "1e3", "-0.5"),
    ),
    "hugeint": Column(
        "HUGEINT",
        ("170141183460469231731687303715884105727", "18446744073709551616", "0", "-5"),
        "[170141183460469231731687303715884105727, 18446744073709551616, 0]",
        ("170141183460469231731687303715884105727", "170141183460469231731687303715884105728",
         "18446744073709551616", "18446744073709551616.0", "0", "-5", "1e38"),
    ),
    "double": Column(
        "DOUBLE",
        ("4611686018427387904", "0.1", "-0.0", "1e300"),
        "[4611686018427387904.0, 0.1, 1e300]",
        ("4611686018427387904", "4611686018427387905", "4611686018427387904.0", "0.1",
         "0.1000000000000000055511151231257827", "0", "-0.0", "1e300", "1e400"),
    ),
    "float": Column(
        "FLOAT",
        ("16777216", "0.5", "3", "-2"),
        "[16777216.0, 0.5, 3.0]",
        ("16777216", "16777217", "16777216.0", "0.5", "0.1", "3", "-2", "3e38", "4e38"),
    ),
    "decimal": Column(
        "DECIMAL(18,3)",
        ("1.5", "1.501", "-2", "999999999999999.999"),
        "[1.5, 1.501, -2.0]",
        ("1.5", "1.5000", "1.501", "1.5005", "-2", "999999999999999.999", "1e15", "0.0001"),
    ),
    "varchar": Column(
        "VARCHAR",
        ("'DK'", "'dk'", "'NO'", "'Dk'"),
        '["DK", "dk", "NO"]',
        ("'DK'", "'dk'", "'Dk'", "'NO'", "'no'", "'a'", "'Z'", "''"),
    ),
}

UNITS = 8


def _policy(column: Column) -> str:
    return f"""
[dataset]
epsilon = 1000.0
delta = 1e-6
[analysts.a]
epsilon = 1000.0
[tables.t]
privacy_unit = "u"
partition_column = "p"
max_rows_per_unit = 3
[tables.t.columns.p]
public_keys = {column.declared}
"""


def _make(directory: Path, column: Column) -> Path:
    """Units 0..7: each has rows with one stored value, unit 7 has rows with two (enforced)."""
    path = directory / "t.duckdb"
    connection = duckdb.connect(str(path))
    connection.execute(f"CREATE TABLE t (u BIGINT, p {column.type_name}, x INTEGER)")
    rows = []
    for unit in range(UNITS):
        value = column.stored[unit % len(column.stored)]
        rows += [f"({unit}, {value}, {unit})", f"({unit}, {value}, {unit + 10})"]
    rows.append(f"({UNITS - 1}, {column.stored[0]}, 99)")
    connection.execute("INSERT INTO t VALUES " + ", ".join(rows))
    connection.close()
    set_policy(path, _policy(column))
    return path


@pytest.fixture(scope="module", params=sorted(COLUMNS))
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    column = COLUMNS[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    return column, _make(directory, column)


def predicates(column: Column) -> st.SearchStrategy[str]:
    literal = st.sampled_from(column.spellings)
    atoms = st.one_of(
        st.builds(lambda a: f"p = {a}", literal),
        st.builds(lambda a: f"p <> {a}", literal),
        st.builds(lambda xs: f"p IN ({', '.join(xs)})", st.lists(literal, min_size=1, max_size=3)),
        st.builds(lambda a, b: f"p BETWEEN {a} AND {b}", literal, literal),
        st.builds(lambda a, b: f"p BETWEEN SYMMETRIC {a} AND {b}", literal, literal),
        st.builds(lambda a, o: f"p {o} {a}", literal, st.sampled_from(["<", "<=", ">", ">="])),
        st.builds(lambda a: f"x > {a}", st.integers(-1, 20)),
        st.builds(lambda a: f"u = {a}", st.integers(0, UNITS)),
    )
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            st.builds(lambda a, b: f"({a} AND {b})", inner, inner),
            st.builds(lambda a, b: f"({a} OR {b})", inner, inner),
            st.builds(lambda a: f"NOT ({a})", inner),
        ),
        max_leaves=4,
    )


def _bind(database: Path, column: Column, sql: str):
    backend = DuckDBBackend(database)
    try:
        binder = Binder(backend, backend.catalog())
        shape = analyze(parse(sql), backend.catalog())
        return binder.bind(shape, parse_policy(_policy(column))), backend
    except BaseException:
        backend.close()
        raise


def _count(connection: duckdb.DuckDBPyConnection, where: str) -> int:
    return connection.execute(f"SELECT COUNT(*) FROM t WHERE {where}").fetchone()[0]


def _settings() -> Callable:
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        derandomize=True,
    )


def test_rows_read_lie_in_the_charged_values_and_cover_the_question(database) -> None:
    column, path = database

    @_settings()
    @given(predicates(column))
    def check(predicate: str) -> None:
        sql = f"SELECT COUNT(*) FROM t WHERE {predicate}"
        try:
            bound, backend = _bind(path, column, sql)
        except DpsqlError:
            return  # refused before any charge
        backend.close()
        shape, partition = bound.shape, bound.partition
        connection = duckdb.connect(str(path), read_only=True)
        try:
            where = shape.where.sql(dialect="duckdb")
            if partition is None:
                assert '"p"' not in where  # only queries that do not mention p are sequential
                return
            charged = list(partition[1])
            typed = ", ".join(f"CAST('{v.replace(chr(39), chr(39) * 2)}' AS {column.type_name})"
                              for v in charged)
            # 1. every row read has a charged partition value (in DuckDB's own equality)
            assert _count(connection, f"({where}) AND NOT (p IN ({typed}))") == 0
            # 2. the analyst's own predicate, over the declared values, needs no more values
            original = where.rsplit(' AND "p" IN (', 1)[0]
            keys = parse_policy(_policy(column)).tables["t"].column("p").public_keys or ()
            catalog = {"t": {"u": "BIGINT", "p": column.type_name, "x": "INTEGER"}}
            binder = Binder(_Runner(connection), catalog)
            declared = ", ".join(v.sql(dialect="duckdb") for v in binder.keys("t", "p", keys))
            missed = f"({original}) AND p IN ({declared}) AND NOT (p IN ({typed}))"
            assert _count(connection, missed) == 0, (sql, charged)
        finally:
            connection.close()

    check()


class _Runner:
    def __init__(self, connection: duckdb.DuckDBPyConnection):
        self.connection = connection

    def run(self, sql: str) -> pd.DataFrame:
        return self.connection.execute(sql).df()


def test_the_ledger_total_covers_every_persons_exposure(database, tmp_path: Path) -> None:
    column, path = database

    @_settings()
    @given(st.lists(predicates(column), min_size=1, max_size=4))
    def check(queries: list[str]) -> None:
        directory = tmp_path / "run"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        copy = directory / "t.duckdb"
        shutil.copy(path, copy)
        shutil.copy(f"{path}.dpsql.sqlite", f"{copy}.dpsql.sqlite")
        exposure = dict.fromkeys(range(UNITS), 0.0)
        reader = duckdb.connect(str(copy), read_only=True, config=DUCKDB_CONFIG)
        try:
            with dpsql.connect(copy, analyst="a") as db:
                for predicate in queries:
                    sql = f"SELECT COUNT(*) FROM t WHERE {predicate}"
                    try:
                        plan = db.explain(sql, epsilon=1.0)["plan"]
                        db.execute(sql, epsilon=1.0)
                    except DpsqlError:
                        continue
                    source = private_rows("t", "u", "p")
                    read = reader.execute(
                        f"SELECT DISTINCT u FROM {source} WHERE {plan['where']}"
                    ).fetchall()
                    for (unit,) in read:
                        exposure[unit] += 1.0
        finally:
            reader.close()
        spent = database_budget(copy).dataset.epsilon_spent
        assert spent >= max(exposure.values()) - 1e-9, (queries, exposure, spent)

    check()


# --- after the charge, success or failure never depends on one person's data -------------------

EXTREME_POLICY = """
[dataset]
epsilon = 1000000.0
delta = 1e-3
[analysts.a]
epsilon = 1000000.0
delta = 1e-3
[tables.v]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 4
[tables.v.columns.d]
bounds = [-1e300, 1e300]
[tables.v.columns.h]
bounds = [0, 1e20]
[tables.v.columns.m]
bounds = [-1e30, 1e30]
[tables.v.columns.f]
bounds = [0, 1e38]
[tables.v.columns.ub]
bounds = [0, 1e19]
[tables.v.columns.ki]
key_domain = [0, 1000]
"""

EXTREME_VALUES = {
    "d": ["'nan'::DOUBLE", "'inf'::DOUBLE", "'-inf'::DOUBLE", "1.7e308", "-1.7e308", "-0.0",
          "5e-324", "NULL"],
    "h": ["170141183460469231731687303715884105727", "-170141183460469231731687303715884105728",
          "0", "NULL"],
    "m": ["99999999999999999999999999999999999999", "-99999999999999999999999999999999999999",
          "NULL"],
    "f": ["'inf'::FLOAT", "'nan'::FLOAT", "3.4e38", "-3.4e38", "NULL"],
    "ub": ["18446744073709551615", "0", "NULL"],
    "ki": ["9223372036854775807", "-9223372036854775808", "0", "1001", "NULL"],
    "kt": ["''", "repeat('x', 100000)", "'\\x00'", "'ü'", "NULL"],
}

_SUMMED = ("d", "h", "m", "f", "ub")
EXTREME_QUERIES = [
    *(f"SELECT {a}({c}) FROM v" for a in ("SUM", "AVG", "COUNT") for c in _SUMMED),
    "SELECT COUNT(*) FROM v WHERE d > 0 OR h < 5",
    "SELECT kt, COUNT(*) FROM v GROUP BY kt",
    "SELECT ki, COUNT(*) FROM v GROUP BY ki",
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(mechanism='alp') kt, COUNT(*) FROM v GROUP BY kt",
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(delta=0) ki, COUNT(*) FROM v GROUP BY ki",
    "SELECT COUNT(*) FROM v WHERE kt = 'k3'",
    # Expressions in aggregates, bins, persons, filters, post-processing.
    "SELECT SUM(CASE WHEN d > 0 THEN h ELSE 0 END), COUNT(*) FILTER (WHERE f > 1) FROM v",
    "SELECT AVG(h * 2 - m / 4), STDDEV(h), SUM(m) / COUNT(*) FROM v",
    "SELECT FLOOR(h / 1e19) AS b, d > 0 AS pos, COUNT(DISTINCT u) FROM v GROUP BY ALL",
    "SELECT kt, COUNT(*) AS n FROM v WHERE lower(kt) LIKE 'k%' GROUP BY kt ORDER BY n DESC LIMIT 2",
    "SELECT COUNT(*) FROM v WHERE u IN (SELECT u FROM v WHERE d > 1.5 OR ki = '3')",
    "WITH w AS (SELECT u, ki, m FROM v WHERE ki <> 3) SELECT SUM(m) AS s FROM w ORDER BY 1",
    # Quantiles (permute-and-flip over a grid of the bounds).
    "SELECT MEDIAN(d), quantile_cont(h, 0.9) FROM v",
    "SELECT percentile_cont(0.1) WITHIN GROUP (ORDER BY f) FILTER (WHERE m > 0) FROM v",
    "SELECT MEDIAN(ub), quantile_cont(m, 0.25) AS q FROM v ORDER BY q",
]


@pytest.fixture(scope="module")
def extreme(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("extreme") / "v.duckdb"
    connection = duckdb.connect(str(path))
    connection.execute(
        "CREATE TABLE v (u BIGINT, d DOUBLE, h HUGEINT, m DECIMAL(38,0), f FLOAT, ub UBIGINT, "
        "ki BIGINT, kt VARCHAR)"
    )
    connection.execute(
        "INSERT INTO v SELECT i // 2, i * 1.5, i, i, i, i, i % 7, 'k' || (i % 5) "
        "FROM range(60) t(i)"
    )
    connection.close()
    set_policy(path, EXTREME_POLICY)
    return path


def _outcome(path: Path, sql: str, epsilon: float) -> str:
    with dpsql.connect(path, analyst="a") as db:
        try:
            db.execute(sql, epsilon=epsilon, delta=1e-6)
        except DpsqlError as error:
            return f"{type(error).__name__}: {error}"
    return "answered"


def test_after_the_charge_success_never_depends_on_one_persons_rows(
    extreme: Path, tmp_path: Path
) -> None:
    """Neighbouring datasets (with and without one person whose values sit
    at every type's edge: NaN, infinities, the largest HUGEINT, DECIMAL(38), UBIGINT and BIGINT
    keys, empty and 100k-character strings) give the same outcome; none fails after its charge."""

    @_settings()
    @given(
        st.sampled_from(EXTREME_QUERIES),
        st.sampled_from([0.5, 1000.0]),
        st.fixed_dictionaries({c: st.sampled_from(v) for c, v in EXTREME_VALUES.items()}),
        st.integers(1, 3),
    )
    def check(sql: str, epsilon: float, person: dict[str, str], rows: int) -> None:
        outcomes = []
        for with_person in (False, True):
            directory = tmp_path / f"n{with_person}"
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            copy = directory / "v.duckdb"
            shutil.copy(extreme, copy)
            shutil.copy(f"{extreme}.dpsql.sqlite", f"{copy}.dpsql.sqlite")
            if with_person:
                connection = duckdb.connect(str(copy))
                values = ", ".join(person[c] for c in ("d", "h", "m", "f", "ub", "ki", "kt"))
                for _ in range(rows):
                    connection.execute(f"INSERT INTO v VALUES (1000, {values})")
                connection.close()
            outcomes.append(_outcome(copy, sql, epsilon))
        assert outcomes[0] == outcomes[1], (sql, person, outcomes)
        assert not outcomes[1].startswith("ExecutionError"), (sql, person, outcomes)

    check()
