"""Neighbouring databases, against DuckDB, for queries over several tables: joins on the privacy
unit, public lookups, per-person subqueries and unit-local windows (``dpsql.sql.relations``).

The schema has two private tables with the same privacy unit (``w``, the wide table of
``test_neighbours`` with a column of every type, and ``v``, a person's events) and a public table
``p``. The added person has rows in both private tables (values at every type's edge, 1-3 rows
each), or rows without a unit in both. For every generated query the checks of
``test_neighbours.check_neighbours`` hold: the same outcome on both sides, the same released keys,
and the exact aggregates moving by at most each measurement's stated sensitivity (not at all for
rows without a unit).

``test_the_suite_catches_each_broken_relation`` runs the checks against deliberately broken twins:
a join of private tables on a key other than the unit accepted (one person's row pairs with other
persons' rows), and a window not partitioned by the unit accepted (one person's row shifts other
persons' values).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.privacy.test_neighbours import (
    COLUMNS,
    EDGES,
    EXAMPLES,
    POLICY,
    _base_rows,
    _settings,
    check_neighbours,
    copy_with,
)

RELATION_POLICY = (
    POLICY
    + """
[tables.v]
privacy_unit = "u"
max_rows_per_unit = 3
max_groups_per_unit = 2
max_rows_per_group = 3
[tables.v.columns.x]
bounds = [0, 50]
[tables.v.columns.k]
public_keys = [1, 2, 3]
[tables.v.columns.e]
public_keys = ["open", "paid"]
[public_tables.p]
"""
)

V_COLUMNS = (("u", "BIGINT"), ("k", "INTEGER"), ("x", "DOUBLE"), ("d", "DATE"), ("e", "VARCHAR"))
V_EDGES = {
    "k": ["1", "3", "2147483647", "NULL"],
    "x": ["'nan'::DOUBLE", "1e308", "-1e308", "25", "NULL"],
    "d": ["DATE '5877641-06-25'", "'-infinity'::DATE", "DATE '2024-01-02'", "NULL"],
    "e": ["'open'", "'paid'", "''", "'a'", "NULL"],
}


def _create(path: Path) -> None:
    connection = duckdb.connect(str(path))
    columns = ", ".join(f"{name} {type_name}" for name, type_name in COLUMNS)
    connection.execute(f"CREATE TABLE w ({columns})")
    connection.execute("INSERT INTO w VALUES " + ", ".join(_base_rows()))
    connection.execute("CREATE TABLE v (u BIGINT, k INTEGER, x DOUBLE, d DATE, e VARCHAR)")
    rows = [
        f"({unit}, {1 + (unit + r) % 3}, {(unit * 7 + r * 3) % 51}, "
        f"DATE '2024-01-01' + {r * 9 + unit}, '{['open', 'paid'][(unit + r) % 2]}')"
        for unit in range(12)
        for r in range(unit % 4)
    ]
    connection.execute("INSERT INTO v VALUES " + ", ".join(rows))
    connection.execute("CREATE TABLE p (k INTEGER, cat VARCHAR)")
    connection.execute("INSERT INTO p VALUES (1, 'a'), (2, 'b'), (3, 'a'), (3, 'c'), (NULL, 'z')")
    connection.close()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dpsql.engine.session import set_policy

    path = tmp_path_factory.mktemp("relations") / "w.duckdb"
    _create(path)
    set_policy(path, RELATION_POLICY)
    return path


def _with_person(base: Path, directory: Path, person: dict[str, str], unit: str, rows: int) -> Path:
    """``base`` plus one person (or rows without a unit) with ``rows`` rows in ``w`` and in
    ``v``."""
    wide = ", ".join([unit, *(person[name] for name, _ in COLUMNS[1:])])
    narrow = ", ".join([unit, *(person[f"v.{name}"] for name, _ in V_COLUMNS[1:])])
    inserts = [f"INSERT INTO w VALUES ({wide})", f"INSERT INTO v VALUES ({narrow})"]
    return copy_with(base, directory, inserts * rows)


def people(**fixed: str) -> st.SearchStrategy[tuple[dict[str, str], str, int]]:
    """The added person's values in both tables (``fixed`` pins some), unit and rows."""
    edges = {**EDGES, **{f"v.{name}": values for name, values in V_EDGES.items()}}
    edges.update({name: [value] for name, value in fixed.items()})
    return st.tuples(
        st.fixed_dictionaries({name: st.sampled_from(values) for name, values in edges.items()}),
        st.sampled_from(["1000", "NULL"]),
        st.integers(1, 3),
    )


AGGREGATES = ["COUNT(*)", "SUM(v.x)", "AVG(v.x)", "COUNT(v.x)", "SUM(w.db)", "AVG(w.b)"]
FILTERS = ["", " WHERE v.x > 10", " WHERE w.g = 'a'", " WHERE v.e IN ('open')", " WHERE w.f"]


def join_queries() -> st.SearchStrategy[str]:
    """Private tables joined on the unit (inner, LEFT, USING), with public lookups."""
    joins = st.sampled_from([
        "w JOIN v ON w.u = v.u",
        "w LEFT JOIN v ON w.u = v.u",
        "v JOIN w USING (u)",
        "w JOIN v ON v.u = w.u JOIN p ON v.k = p.k",
        "v LEFT JOIN p ON v.k = p.k JOIN w USING (u)",
    ])
    ungrouped = st.builds(
        lambda a, j, f: f"SELECT {a} AS r FROM {j}{f}",
        st.sampled_from(AGGREGATES), joins, st.sampled_from(FILTERS),
    )
    grouped = st.builds(
        lambda key, a, j: f"SELECT {key} AS key, {a} AS r FROM {j} GROUP BY {key}",
        st.sampled_from(["w.g", "v.e", "v.k"]), st.sampled_from(AGGREGATES), joins,
    )
    lookup = st.builds(
        lambda a, f: f"SELECT p.cat, {a} AS r FROM v JOIN p ON v.k = p.k JOIN w USING (u){f} "
        "GROUP BY p.cat",
        st.sampled_from(AGGREGATES), st.sampled_from(FILTERS),
    )
    return st.one_of(ungrouped, grouped, lookup)


def per_person_queries() -> st.SearchStrategy[str]:
    """An aggregate across persons of values per person (FROM subqueries and CTEs)."""
    inner = st.builds(
        lambda f: "SELECT u, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS a, MAX(k) AS top, "
        f"COUNT(DISTINCT e) AS kinds FROM v{f} GROUP BY u",
        st.sampled_from(["", " WHERE x > 5", " WHERE d >= DATE '2024-01-05'", " WHERE e = 'paid'"]),
    )
    joined = st.just(
        "SELECT w.u, COUNT(v.x) AS n, SUM(v.x) AS s, AVG(w.db) AS a, MAX(v.k) AS top, "
        "COUNT(DISTINCT v.e) AS kinds FROM w LEFT JOIN v ON w.u = v.u GROUP BY w.u"
    )
    outer = st.sampled_from([
        "SELECT AVG(n) AS r FROM ({})",
        "SELECT SUM(s) AS r FROM ({}) AS t",
        "SELECT COUNT(*) AS r FROM ({}) WHERE n >= 2",
        "SELECT n, COUNT(*) AS r FROM ({}) GROUP BY n",
        "SELECT top, SUM(a) AS r FROM ({}) GROUP BY top",
        "SELECT AVG(kinds) AS r FROM ({})",
        "WITH per AS ({}) SELECT SUM(n) AS r FROM per WHERE s > 10",
    ])
    return st.builds(
        lambda o, i: o.replace("({})", "per").replace("per AS per", f"per AS ({i})")
        if o.startswith("WITH")
        else o.format(i),
        outer, st.one_of(inner, joined),
    )


def window_queries() -> st.SearchStrategy[str]:
    """Windows partitioned by the privacy unit, then an aggregate across persons."""
    windows = st.sampled_from([
        "ROW_NUMBER() OVER (PARTITION BY u ORDER BY d, x)",
        "LAG(x) OVER (PARTITION BY u ORDER BY d)",
        "LEAST(GREATEST(x - LAG(x) OVER (PARTITION BY u ORDER BY d), -50), 50)",
        "LEAST(GREATEST(d - LAG(d) OVER (PARTITION BY u ORDER BY d), 0), 400)",
        "SUM(x) OVER (PARTITION BY u)",
        "COUNT(*) OVER (PARTITION BY u, e)",
    ])
    outer = st.sampled_from([
        "SELECT COUNT(*) AS r FROM (SELECT u, e, {} AS z FROM v) WHERE z = 2",
        "SELECT SUM(z) AS r FROM (SELECT u, e, {} AS z FROM v)",
        "SELECT e, AVG(z) AS r FROM (SELECT u, e, {} AS z FROM v) GROUP BY e",
        "SELECT COUNT(z) AS r FROM (SELECT *, {} AS z FROM v WHERE x < 40)",
    ])
    return st.builds(lambda o, w: o.format(w), outer, windows)


def check(base: Path, directory: Path, sql: str, person: tuple) -> None:
    check_neighbours(base, directory, sql, person, with_person=_with_person)


@pytest.mark.parametrize(
    "queries", [join_queries, per_person_queries, window_queries], ids=lambda q: q.__name__
)
def test_neighbours_over_several_tables_agree_and_stay_within_the_sensitivity(
    base: Path, tmp_path: Path, queries: Callable[[], st.SearchStrategy[str]]
) -> None:
    @_settings()
    @given(queries(), people())
    def run(sql: str, person: tuple) -> None:
        check(base, tmp_path / "with", sql, person)

    run()


def test_the_generated_queries_are_answered(base: Path) -> None:
    """The shapes above are answered (the suite does not pass by refusing them all)."""
    import numpy as np

    from tests.conftest import seeded_connect

    queries = [
        "SELECT COUNT(*) FROM w JOIN v ON w.u = v.u",
        "SELECT p.cat, SUM(v.x) AS r FROM v JOIN p ON v.k = p.k JOIN w USING (u) GROUP BY p.cat",
        "SELECT AVG(n) FROM (SELECT u, COUNT(*) AS n FROM v GROUP BY u)",
        "SELECT n, COUNT(*) FROM (SELECT u, COUNT(*) AS n FROM v GROUP BY u) GROUP BY n",
        "SELECT COUNT(*) FROM (SELECT u, ROW_NUMBER() OVER (PARTITION BY u ORDER BY d) AS z "
        "FROM v) WHERE z = 2",
    ]
    with seeded_connect(base, analyst="a", rng=np.random.default_rng(3)) as db:
        for sql in queries:
            assert db.execute(sql, epsilon=1.0, delta=1e-6).rows, sql


TWINS = {
    "a join of private tables on another key": (
        "dpsql.sql.relations.joins_on_unit",
        lambda pairs, unit: True,
        st.just("SELECT COUNT(*) AS r FROM w JOIN v ON w.g = v.e"),
        {"v.e": "'a'"},  # one person's events meet four other persons' rows
    ),
    "a window over several persons": (
        "dpsql.sql.relations.partitions_by_unit",
        lambda columns, unit: True,
        st.just("SELECT SUM(z) AS r FROM (SELECT u, AVG(x) OVER (PARTITION BY e) AS z FROM v)"),
        {},
    ),
}


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_the_suite_catches_each_broken_relation(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twin: str
) -> None:
    target, broken, queries, fixed = TWINS[twin]
    monkeypatch.setattr(target, broken)

    @_settings(max(EXAMPLES, 40))
    @given(queries, people(**fixed))
    def run(sql: str, person: tuple) -> None:
        check(base, tmp_path / "with", sql, person)

    with pytest.raises(AssertionError):
        run()
