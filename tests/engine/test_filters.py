"""Person-level filters and text filters (``dpsql.sql.filters``), CTE inlining
(``dpsql.sql.ctes``): privacy on neighbouring inputs, and the partition charge."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.engine.session import database_budget, set_policy
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse
from tests.engine.panel import panel_frame

CATALOG = {
    "males": {
        "nr": "BIGINT",
        "year": "INTEGER",
        "ethn": "VARCHAR",
        "union": "VARCHAR",
        "hours": "INTEGER",
        "wage": "DOUBLE",
        "school": "INTEGER",
        "industry": "VARCHAR",
    }
}

ACCEPTED_FILTERS = [
    "nr IN (SELECT nr FROM males WHERE year = 1980 AND \"union\" = 'yes')",
    "nr NOT IN (SELECT nr FROM males WHERE hours > 3000)",
    "nr IN (SELECT nr FROM males WHERE lower(industry) LIKE 'manu%') AND year >= '1984'",
]
BROKEN_TWIN = "year IN (SELECT year FROM males WHERE nr = {person} AND \"union\" = 'yes')"
"""A filter whose outcome for every row depends on one person's rows: the kind
``check_unit_filters`` refuses (it is on ``year``, not the privacy unit)."""


def _passing(connection: duckdb.DuckDBPyConnection, where: str) -> set[tuple]:
    return set(connection.execute(f"SELECT * FROM males WHERE {where}").fetchall())


def _neighbours_differ_only_in_one_person(where: str, frame, person: int) -> bool:
    """Run ``where`` on the table and on it without ``person``: the passing rows may differ in
    that person's rows only."""
    results = []
    for table in (frame, frame[frame["nr"] != person]):
        connection = duckdb.connect()
        connection.register("source", table)
        connection.execute("CREATE TABLE males AS SELECT * FROM source")
        results.append(_passing(connection, where))
        connection.close()
    changed = results[0] ^ results[1]
    return all(row[0] == person for row in changed)


@pytest.mark.parametrize("condition", ACCEPTED_FILTERS)
def test_person_level_filters_keep_each_persons_influence_on_their_own_rows(
    condition: str,
) -> None:
    frame = panel_frame(persons=60, seed=3)
    shape = analyze(parse(f"SELECT COUNT(*) FROM males WHERE {condition}"), CATALOG)
    assert shape.where is not None
    where = shape.where.sql(dialect="duckdb")
    assert "IN (SELECT" in where
    for person in range(0, 60, 3):
        assert _neighbours_differ_only_in_one_person(where, frame, person)


def test_the_broken_twin_fails_the_neighbour_property_and_is_refused(tmp_path: Path) -> None:
    frame = panel_frame(persons=60, seed=3)
    failures = sum(
        not _neighbours_differ_only_in_one_person(BROKEN_TWIN.format(person=p), frame, p)
        for p in range(0, 60, 3)
    )
    assert failures >= 15  # one person's rows decide which years everyone else counts in
    database = tmp_path / "p.duckdb"
    connection = duckdb.connect(str(database))
    connection.register("source", frame)
    connection.execute("CREATE TABLE males AS SELECT * FROM source")
    connection.close()
    set_policy(
        database,
        "[dataset]\nepsilon = 1.0\n[analysts.a]\nepsilon = 1.0\n[tables.males]\n"
        'privacy_unit = "nr"\nmax_rows_per_unit = 8\n',
    )
    refused = pytest.raises(UnsupportedQueryError, match="must be on the privacy unit 'nr'")
    with dpsql.connect(database, analyst="a") as session, refused:
        session.execute(
            f"SELECT COUNT(*) FROM males WHERE {BROKEN_TWIN.format(person=3)}", epsilon=1.0
        )
    assert database_budget(database).dataset.epsilon_spent == 0


def test_person_level_filters_are_refused_on_partitioned_tables(tmp_path: Path) -> None:
    """The inner WHERE could read partitions the charge does not cover: refused, charges
    nothing. Text filters on the partition column are charged to what DuckDB reads."""
    database = tmp_path / "d.duckdb"
    connection = duckdb.connect(str(database))
    connection.execute("CREATE TABLE t (uid BIGINT, country VARCHAR, x DOUBLE)")
    connection.execute(
        "INSERT INTO t SELECT i, CASE WHEN i % 3 = 0 THEN 'DK' WHEN i % 3 = 1 THEN 'NO' "
        "ELSE 'SE' END, i FROM range(60) r(i)"
    )
    connection.close()
    set_policy(
        database,
        "[dataset]\nepsilon = 10.0\n[analysts.a]\nepsilon = 10.0\n[tables.t]\n"
        'privacy_unit = "uid"\npartition_column = "country"\nmax_rows_per_unit = 1\n'
        '[tables.t.columns.country]\npublic_keys = ["DK", "NO", "SE"]\n',
    )
    with dpsql.connect(database, analyst="a") as session:
        with pytest.raises(UnsupportedQueryError, match="partition column"):
            session.execute(
                "SELECT COUNT(*) FROM t WHERE country = 'DK' AND "
                "uid IN (SELECT uid FROM t WHERE country = 'NO')",
                epsilon=1.0,
            )
        assert session.budget().for_analyst("a").epsilon_spent == 0
        session.execute("SELECT COUNT(*) FROM t WHERE lower(country) LIKE 'd%'", epsilon=1.0)
        session.execute("SELECT COUNT(*) FROM t WHERE country ILIKE 'n%'", epsilon=1.0)
        lines = {(line.scope, line.name): line.epsilon_spent for line in session.budget().lines}
    partitions = {name: value for (scope, name), value in lines.items() if scope == "partition"}
    assert partitions == {"t.country = 'DK'": 1.0, "t.country = 'NO'": 1.0}
    assert lines[("dataset", "d")] == 1.0  # disjoint partitions: parallel composition
