"""Neighbouring databases, against DuckDB, for the SQL an analyst writes: expressions, computed
group keys and rows without a privacy unit.

Hypothesis writes queries from the whole analyst surface: arithmetic (``+ - * /``, unary minus),
CASE and FILTER, casts, string functions and date arithmetic, over every column type, with and
without declared bounds, the privacy unit included, with literals at each type's edge; WHERE and
CASE conditions with LIKE, IS NULL and person-level subqueries (``unit [NOT] IN (SELECT ...)``);
and GROUP BY keys that are columns, conditions or bins ``FLOOR(col / w) * m`` (m = 0 included).
Each query runs on a table and on its neighbour with one more person, whose values sit at every
type's edge (NaN, infinities, the largest integers, empty and long strings, the last date), in 1-3
rows; the added "person" may also be rows *without* a privacy unit. For every query:

1. the outcome is the same on both sides (answered, or the same refusal), and no query fails after
   its charge (``ExecutionError``);
2. an answer releases one row per distinct key, the same keys on both sides;
3. the exact aggregates behind the answer (the generated SQL on DuckDB, before noise) move by at
   most each measurement's stated L1 sensitivity, and not at all when the added rows have no unit.

``test_the_suite_catches_each_broken_twin`` runs the same checks against three deliberately
broken twins of the engine and requires a counterexample for each: a bin domain counted in Python
(no DISTINCT: ``FLOOR(x / w) * 0`` repeats one group per bin), expressions run in the column's
own integer type (overflow after the charge on one person's value), a person-level subquery that
reads rows without a unit (one such row makes ``NOT IN`` unknown for every row: N becomes 0), and
a source that keeps rows without a unit (a unit-less row changes the answer).

``DPSQL_INVARIANT_EXAMPLES`` sets the examples per property (``benchmarks/bench_invariants.py``
runs 500).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dpsql.engine.answers import _aligned
from dpsql.engine.release import bounded_sql
from dpsql.errors import DpsqlError
from tests.conftest import seeded_connect

EXAMPLES = int(os.environ.get("DPSQL_INVARIANT_EXAMPLES", "25"))

POLICY = """
[dataset]
epsilon = 1e9
delta = 0.5
[analysts.a]
epsilon = 1e9
delta = 0.5
[tables.w]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_group = 2
max_rows_per_unit = 3
[tables.w.columns.b]
bounds = [-1000, 1000]
[tables.w.columns.db]
bounds = [0, 100]
[tables.w.columns.g]
public_keys = ["a", "b", "c"]
"""

COLUMNS = (
    ("u", "BIGINT"),
    ("i", "INTEGER"),
    ("b", "BIGINT"),
    ("h", "HUGEINT"),
    ("dd", "DOUBLE"),
    ("db", "DOUBLE"),
    ("m", "DECIMAL(38,0)"),
    ("s", "VARCHAR"),
    ("t", "DATE"),
    ("ts", "TIMESTAMP"),
    ("f", "BOOLEAN"),
    ("g", "VARCHAR"),
)
NUMERIC = ("u", "i", "b", "h", "dd", "db", "m", "f")
"""Columns arithmetic may read: the unit, unbounded (i, h, dd, m) and bounded (b, db) ones."""

EDGES = {
    "i": ["-2147483648", "2147483647", "0", "NULL"],
    "b": ["9223372036854775807", "-9223372036854775808", "5", "NULL"],
    "h": ["170141183460469231731687303715884105727", "-170141183460469231731687303715884105728",
          "NULL"],
    "dd": ["'nan'::DOUBLE", "'inf'::DOUBLE", "'-inf'::DOUBLE", "1.7e308", "-0.0", "5e-324",
           "NULL"],
    "db": ["'nan'::DOUBLE", "1e308", "-1e308", "50", "NULL"],
    "m": ["99999999999999999999999999999999999999", "-99999999999999999999999999999999999999",
          "NULL"],
    "s": ["''", "repeat('x', 10000)", "'ü'", "'%'", "'9223372036854775808'", "NULL"],
    "t": ["DATE '5877641-06-25'", "'-infinity'::DATE", "'infinity'::DATE", "NULL"],
    "ts": ["'infinity'::TIMESTAMP", "TIMESTAMP '294247-01-10 04:00:54'", "NULL"],
    "f": ["true", "false", "NULL"],
    "g": ["'a'", "'zz'", "NULL"],
}
"""Values of the added person at each type's edge."""

NUMBERS = ["0", "1", "-1", "7", "0.5", "2147483647", "9223372036854775807",
           "170141183460469231731687303715884105727", "1e308", "1e400"]
SMALL = ["1", "3", "10", "0.5", "1e300", "1e-300"]


# --- the tables --------------------------------------------------------------------------------

def _base_rows() -> list[str]:
    rows = []
    for unit in range(12):
        for r in range(1 + unit % 3):
            rows.append(
                f"({unit}, {unit * 7 - 30}, {unit * 90 - 500}, {unit * 11}, {unit * 1.5 - 4}, "
                f"{(unit * 13 + r) % 101}, {unit * 3}, 'k{unit % 4}', DATE '2024-01-01' + {unit}, "
                f"TIMESTAMP '2024-01-01 00:00:00' + INTERVAL {unit} HOUR, {unit % 2 == 0!s}, "
                f"'{'abc'[unit % 3]}')"
            )
    return rows  # rows without a unit come with the neighbour (a "person" whose unit is NULL)


def _create(path: Path) -> None:
    connection = duckdb.connect(str(path))
    columns = ", ".join(f"{name} {type_name}" for name, type_name in COLUMNS)
    connection.execute(f"CREATE TABLE w ({columns})")
    connection.execute("INSERT INTO w VALUES " + ", ".join(_base_rows()))
    connection.close()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dpsql.engine.session import set_policy

    path = tmp_path_factory.mktemp("neighbours") / "w.duckdb"
    _create(path)
    set_policy(path, POLICY)
    return path


def copy_with(base: Path, directory: Path, statements: list[str]) -> Path:
    """A copy of the database ``base`` (and its ledger) in ``directory``, with ``statements``
    run on it."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    copy = directory / "w.duckdb"
    shutil.copy(base, copy)
    shutil.copy(f"{base}.dpsql.sqlite", f"{copy}.dpsql.sqlite")
    connection = duckdb.connect(str(copy))
    try:
        for statement in statements:
            connection.execute(statement)
    finally:
        connection.close()
    return copy


def _with_person(base: Path, directory: Path, person: dict[str, str], unit: str, rows: int) -> Path:
    values = ", ".join([unit, *(person[name] for name, _ in COLUMNS[1:])])
    return copy_with(base, directory, [f"INSERT INTO w VALUES ({values})"] * rows)


# --- the queries -------------------------------------------------------------------------------

def numbers() -> st.SearchStrategy[str]:
    """Numeric expressions as an analyst may write them (and some dpsql must refuse)."""
    atoms = st.one_of(
        st.sampled_from(NUMERIC),
        st.sampled_from(NUMBERS),
        st.sampled_from(["s", "t", "ts", "'1'"]),  # non-numbers inside arithmetic: refused
    )
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            st.builds(lambda a, o, b: f"({a} {o} {b})", inner, st.sampled_from("+-*"), inner),
            st.builds(lambda a, d: f"({a} / {d})", inner, st.sampled_from([*SMALL, "0", "i"])),
            st.builds(lambda a: f"-{a}", inner),
            st.builds(lambda c, a, b: f"CASE WHEN {c} THEN {a} ELSE {b} END",
                      conditions(), inner, inner),
            st.builds(lambda a, t: f"CAST({a} AS {t})", inner,
                      st.sampled_from(["INTEGER", "DOUBLE", "VARCHAR"])),
            st.builds(lambda f, c: f"{f}({c})", st.sampled_from(["length", "abs", "ln"]),
                      st.sampled_from(["s", "i", "dd"])),
            st.sampled_from(["t + 1", "ts + INTERVAL 1 DAY", "t - DATE '2024-01-01'",
                             "s || 'x'", "repeat(s, 100000)"]),
        ),
        max_leaves=4,
    )


def conditions() -> st.SearchStrategy[str]:
    """WHERE / CASE / FILTER conditions, person-level subqueries included."""
    atoms = st.one_of(
        st.builds(lambda c, o, v: f"{c} {o} {v}", st.sampled_from(["i", "b", "h", "dd", "db", "m"]),
                  st.sampled_from(["<", ">=", "=", "<>"]), st.sampled_from(["0", "5", "-1"])),
        st.builds(lambda c: f"{c} IS NULL", st.sampled_from(["i", "s", "t", "u", "f"])),
        st.sampled_from(["s LIKE 'k%'", "lower(s) = 'k1'", "f", "NOT f", "g = 'a'",
                         "t >= '2024-01-05'", "ts < '2024-01-01 05:00'"]),
        st.builds(lambda n, c: f"u {n}IN (SELECT u FROM w WHERE {c})",
                  st.sampled_from(["", "NOT "]),
                  st.sampled_from(["i > 0", "s = 'k2'", "dd < 0", "f"])),
    )
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            st.builds(lambda a, b: f"({a} AND {b})", inner, inner),
            st.builds(lambda a, b: f"({a} OR {b})", inner, inner),
            st.builds(lambda a: f"NOT ({a})", inner),
        ),
        max_leaves=3,
    )


def aggregate_queries() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda e: f"SELECT COUNT({e}) AS n FROM w", numbers()),
        st.builds(lambda e: f"SELECT SUM({e}) AS s FROM w", numbers()),
        st.builds(lambda e, c: f"SELECT AVG({e}) AS a, COUNT(*) FILTER (WHERE {c}) AS n FROM w",
                  numbers(), conditions()),
        st.builds(lambda e, c: f"SELECT g, COUNT({e}) AS n FROM w WHERE {c} GROUP BY g",
                  numbers(), conditions()),
        st.builds(lambda e: f"SELECT COUNT(CASE WHEN {e} > 0 THEN s END) AS n FROM w", numbers()),
    )


def filter_queries() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda c: f"SELECT COUNT(*) AS n FROM w WHERE {c}", conditions()),
        st.builds(lambda c: f"SELECT COUNT(DISTINCT u) AS n, SUM(db) AS s FROM w WHERE {c}",
                  conditions()),
        st.builds(lambda c: f"WITH v AS (SELECT * FROM w WHERE {c}) SELECT COUNT(*) AS n FROM v",
                  conditions()),
        st.builds(lambda c: f"SELECT SUM(b) FILTER (WHERE {c}) AS s FROM w", conditions()),
    )


def keys() -> st.SearchStrategy[str]:
    bins = st.builds(
        lambda c, w, m: f"FLOOR({c} / {w}) * {m}",
        st.sampled_from(["b", "db", "i", "dd", "u"]),
        st.sampled_from(SMALL),
        st.sampled_from(["0", "1", "-3", "10", "1099511627776", "0.5"]),
    )
    return st.one_of(bins, conditions(), st.sampled_from(["g", "f", "s"]))


def key_queries() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda k: f"SELECT {k} AS k, COUNT(*) AS n FROM w GROUP BY 1", keys()),
        st.builds(lambda k, j: f"SELECT {k} AS k, {j} AS j, COUNT(*) AS n FROM w GROUP BY 1, 2",
                  keys(), keys()),
        st.builds(lambda k, e: f"SELECT {k} AS k, SUM({e}) AS s FROM w GROUP BY 1",
                  keys(), st.sampled_from(["b", "db", "b * 2 - db", "CASE WHEN f THEN b END"])),
    )


def people() -> st.SearchStrategy[tuple[dict[str, str], str, int]]:
    """The added person's values, unit (a new one, or NULL: rows without a unit) and rows."""
    return st.tuples(
        st.fixed_dictionaries({name: st.sampled_from(values) for name, values in EDGES.items()}),
        st.sampled_from(["1000", "NULL"]),
        st.integers(1, 3),
    )


# --- the checks --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Observation:
    outcome: str
    keys: list[tuple] | None = None
    exact: dict[str, np.ndarray] | None = None
    sensitivity: dict[str, int] | None = None


def observe(path: Path, sql: str) -> Observation:
    """The outcome of ``sql`` on ``path``, and for an answer its released keys and the exact
    aggregates (the generated SQL on DuckDB, before noise) with their stated sensitivities."""
    with seeded_connect(path, analyst="a", rng=np.random.default_rng(3)) as db:
        try:
            result = db.execute(sql, epsilon=1.0, delta=1e-6)
        except DpsqlError as error:
            return Observation(f"{type(error).__name__}: {error}")
        plan = db.plan(sql, epsilon=1.0, delta=1e-6)
        shown = [row[: len(plan.shape.group_by)] for row in result.rows]
        assert len(set(map(tuple, shown))) == len(shown), ("a key released twice", sql, shown)
        if plan.mechanism != "discrete_laplace" or plan.summary()["auto_bounds"]:
            return Observation("answered", [tuple(k) for k in shown])
        rows = db.backend.rows(bounded_sql(plan, 7, db.backend.dialect))
        aligned, keys = _aligned(plan, rows)
        exact = {m.label: aligned[m.measure.name] for m in plan.measurements}
        sensitivity = {m.label: m.sensitivity_units for m in plan.measurements}
        return Observation("answered", keys, exact, sensitivity)


def check_neighbours(
    base: Path,
    directory: Path,
    sql: str,
    person: tuple,
    with_person: Callable[[Path, Path, dict[str, str], str, int], Path] | None = None,
) -> None:
    """The checks above for ``sql`` on ``base`` and on it with ``person`` added (by
    ``with_person``, default: rows of table ``w``)."""
    values, unit, rows = person
    without = observe(base, sql)
    neighbour = observe((with_person or _with_person)(base, directory, values, unit, rows), sql)
    assert not without.outcome.startswith("ExecutionError"), (sql, without.outcome)
    assert not neighbour.outcome.startswith("ExecutionError"), (sql, person, neighbour.outcome)
    assert without.outcome == neighbour.outcome, (sql, person, without, neighbour)
    if without.keys is None:
        return
    assert without.keys == neighbour.keys, (sql, person)
    assert len(set(without.keys)) == len(without.keys), ("a key released twice", sql)
    if without.exact is None or neighbour.exact is None or without.sensitivity is None:
        return
    for label, values_without in without.exact.items():
        moved = int(np.abs(neighbour.exact[label] - values_without).sum())
        allowed = 0 if unit == "NULL" else without.sensitivity[label]
        assert moved <= allowed, (sql, person, label, moved, allowed)


def _settings(examples: int = EXAMPLES) -> Callable:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # report the first counterexample as found
    )


@pytest.mark.parametrize(
    "queries", [aggregate_queries, filter_queries, key_queries], ids=lambda q: q.__name__
)
def test_neighbours_agree_on_the_outcome_keys_and_within_the_sensitivity(
    base: Path, tmp_path: Path, queries: Callable[[], st.SearchStrategy[str]]
) -> None:
    @_settings()
    @given(queries(), people())
    def check(sql: str, person: tuple) -> None:
        check_neighbours(base, tmp_path / "with", sql, person)

    check()


# --- the broken twins --------------------------------------------------------------------------

def _domain_counted_in_python(found, first: int, last: int) -> str:
    """Twin: one key per bin, as a count of bins in Python gives (no DISTINCT)."""
    value = f"CAST(__k AS BIGINT) * {found.multiplier}"
    return (
        f"SELECT CAST({value} AS VARCHAR) AS __key, {value} AS __value "
        f"FROM range({int(first)}, {int(last) + 1}) AS __bins(__k) ORDER BY __value"
    )


def _in_the_columns_own_type(node, bounds, kinds):
    """Twin: expressions run as written (integer arithmetic in the columns' own types)."""
    return node.copy()


def _rows_without_a_unit_too(table: str, unit: str, partition: str | None = None) -> str:
    """Twin: the source keeps rows without a privacy unit."""
    return f'"{table}"'


def _subqueries_read_every_row(where, table: str, unit: str) -> str:
    """Twin: a person-level subquery reads the table itself, rows without a unit included."""
    return where.sql(dialect="duckdb")


TWINS = {
    "bin domain counted in Python": (
        "a key released twice", "dpsql.sql.expressions.bin_domain_sql", _domain_counted_in_python,
        st.builds(lambda w: f"SELECT FLOOR(db / {w}) * 0 AS k, COUNT(*) AS n FROM w GROUP BY 1",
                  st.sampled_from(["10", "3"])),
    ),
    "expressions in the columns' own types": (
        "ExecutionError",
        ("dpsql.sql.expressions.clamped", "dpsql.engine.virtual_columns.clamped"),
        _in_the_columns_own_type,
        st.builds(lambda c, n: f"SELECT COUNT({c} * {n}) AS n FROM w",
                  st.sampled_from(["i", "h", "m"]), st.sampled_from(["2147483647", "3", "-7"])),
    ),
    "subqueries that read rows without a unit": (
        None, "dpsql.sql.generate.scoped", _subqueries_read_every_row,
        st.builds(
            lambda template, c: template.format(f"u NOT IN (SELECT u FROM w WHERE {c})"),
            st.sampled_from([
                "SELECT COUNT(*) AS n FROM w WHERE {}",
                "SELECT COUNT(*) FILTER (WHERE {}) AS n FROM w",
                "SELECT {} AS k, COUNT(*) AS n FROM w GROUP BY 1",
            ]),
            st.sampled_from(["i > 0", "dd < 0", "f"]),
        ),
    ),
    "a source with rows without a unit": (
        None, "dpsql.sql.generate.private_rows", _rows_without_a_unit_too, filter_queries(),
    ),
}


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_the_suite_catches_each_broken_twin(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twin: str
) -> None:
    caught, targets, broken, queries = TWINS[twin]
    for target in (targets,) if isinstance(targets, str) else targets:
        monkeypatch.setattr(target, broken)  # every module is imported (conftest.py)

    @_settings(max(EXAMPLES, 40))
    @given(queries, people())
    def check(sql: str, person: tuple) -> None:
        check_neighbours(base, tmp_path / "with", sql, person)

    with pytest.raises(AssertionError, match=caught):
        check()
