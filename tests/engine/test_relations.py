"""Queries over several tables: joins on the privacy unit, public lookups, per-person subqueries
and unit-local windows (``dpsql.sql.relations``, ``dpsql.engine.relations``).

A customers / orders / public catalogue schema: the relation's derived contribution bounds and
column rules, the refusals (with their reasons), and answers near the truth within their
intervals at a fixed seed.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from dpsql.engine.session import set_policy
from dpsql.errors import DpsqlError, PolicyError, SchemaError, UnsupportedQueryError
from tests.conftest import seeded_connect

POLICY = """
[dataset]
epsilon = 1e6
delta = 0.5
[analysts.ana]
epsilon = 1e6
delta = 0.5
[tables.customers]
privacy_unit = "cid"
[tables.customers.columns.age]
bounds = [18, 90]
[tables.customers.columns.region]
public_keys = ["north", "south"]
[tables.orders]
privacy_unit = "cid"
max_rows_per_unit = 4
max_groups_per_unit = 2
max_rows_per_group = 4
[tables.orders.columns.amount]
bounds = [0, 100]
[tables.orders.columns.status]
public_keys = ["open", "paid"]
[public_tables.catalogue]
"""


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shop") / "shop.duckdb"
    connection = duckdb.connect(str(path))
    connection.execute(
        "CREATE TABLE customers AS SELECT i AS cid, CASE WHEN i % 2 = 0 THEN 'north' ELSE "
        "'south' END AS region, 18 + i % 60 AS age FROM range(400) AS t(i)"
    )
    connection.execute(
        "CREATE TABLE orders AS SELECT i AS oid, i % 300 AS cid, i % 7 AS pid, "
        "CAST((i * 37) % 101 AS DOUBLE) AS amount, DATE '2025-01-01' + CAST(i % 97 AS INTEGER) "
        "AS day, CASE WHEN i % 3 = 0 THEN 'open' ELSE 'paid' END AS status FROM range(900) t(i)"
    )
    connection.execute(
        "CREATE TABLE catalogue AS SELECT * FROM (VALUES (0, 'books'), (1, 'games'), "
        "(2, 'books'), (3, 'food'), (4, 'food'), (5, 'games'), (6, 'books'), (6, 'toys')) "
        "AS t(pid, category)"
    )
    connection.close()
    set_policy(path, POLICY)
    return path


def _truth(shop: Path, sql: str) -> list[tuple]:
    connection = duckdb.connect(str(shop), read_only=True)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def _plan(shop: Path, sql: str):
    with seeded_connect(shop, analyst="ana", rng=np.random.default_rng(1)) as db:
        return db.plan(sql, epsilon=1.0)


def test_a_join_on_the_unit_multiplies_the_tables_bounds(shop: Path) -> None:
    plan = _plan(shop, "SELECT COUNT(*) FROM orders o JOIN customers c USING (cid)")
    assert plan.table.max_rows_per_unit == 4 * 1
    assert plan.table.max_groups_per_unit == 2
    (measure,) = plan.summary()["measures"].values()
    assert "product of max_rows_per_unit: orders 4 × customers 1" in measure


def test_a_public_lookup_multiplies_by_its_most_matches(shop: Path) -> None:
    plan = _plan(
        shop,
        "SELECT p.category, COUNT(*) FROM orders o JOIN catalogue p ON o.pid = p.pid "
        "GROUP BY p.category",
    )
    assert plan.table.max_rows_per_unit == 4 * 2  # product 6 matches two catalogue rows
    assert set(plan.key_domain["category"]) == {"books", "games", "food", "toys"}


def test_per_person_values_take_bounds_and_keys_from_the_policy(shop: Path) -> None:
    plan = _plan(
        shop,
        "SELECT n, COUNT(*) FROM (SELECT cid, COUNT(*) AS n, SUM(amount) AS s FROM orders "
        "GROUP BY cid) GROUP BY n",
    )
    assert plan.table.max_rows_per_unit == 1
    assert plan.table.column("n").bounds == (0, 4)
    assert plan.table.column("n").public_keys == (0, 1, 2, 3, 4)
    assert plan.table.column("s").bounds == (0, 400)


def test_a_window_keeps_the_tables_bounds_and_the_querys_clamp(shop: Path) -> None:
    plan = _plan(
        shop,
        "SELECT AVG(gap) FROM (SELECT cid, LEAST(GREATEST(day - LAG(day) OVER (PARTITION BY cid "
        "ORDER BY day), 0), 90) AS gap FROM orders) WHERE gap IS NOT NULL",
    )
    assert plan.table.max_rows_per_unit == 4
    assert plan.table.column("gap").bounds == (0, 90)


@pytest.mark.parametrize(
    ("sql", "error", "words"),
    [
        ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.oid = c.cid",
         UnsupportedQueryError, "join on the privacy unit only"),
        ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.cid = c.age",
         UnsupportedQueryError, "join on the privacy unit only"),
        ("SELECT COUNT(*) FROM customers c RIGHT JOIN orders o USING (cid)",
         UnsupportedQueryError, "LEFT JOIN"),
        ("SELECT COUNT(*) FROM customers c CROSS JOIN orders o",
         UnsupportedQueryError, "CROSS JOIN"),
        ("SELECT COUNT(*) FROM customers c, orders o", UnsupportedQueryError, "ON or USING"),
        ("SELECT cid, COUNT(*) FROM orders o JOIN customers c USING (cid) GROUP BY cid",
         UnsupportedQueryError, "one group per person"),
        ("SELECT * FROM orders o JOIN customers c USING (cid)", UnsupportedQueryError, "'*'"),
        ("SELECT n FROM (SELECT cid, COUNT(*) AS n FROM orders GROUP BY cid)",
         UnsupportedQueryError, "aggregate"),
        ("SELECT MAX(amount) FROM orders o JOIN customers USING (cid)",
         UnsupportedQueryError, "MAX"),
        ("SELECT COUNT(*) FROM (SELECT cid, ROW_NUMBER() OVER (ORDER BY day) AS r FROM orders) "
         "WHERE r = 1", UnsupportedQueryError, "PARTITION BY the privacy unit"),
        ("SELECT COUNT(*) FROM (SELECT cid, LAG(amount) OVER (PARTITION BY status ORDER BY day) "
         "AS r FROM orders) WHERE r = 1", UnsupportedQueryError, "PARTITION BY the privacy unit"),
        ("SELECT AVG(n) FROM (SELECT status AS cid, COUNT(*) AS n FROM orders GROUP BY status)",
         UnsupportedQueryError, ""),
        ("SELECT AVG(g) FROM (SELECT cid, day - LAG(day) OVER (PARTITION BY cid ORDER BY day) "
         "AS g FROM orders)", PolicyError, "LEAST(GREATEST"),
        ("SELECT COUNT(*) FROM orders o JOIN secrets s USING (cid)", SchemaError, "unknown"),
        ("SELECT COUNT(*) FROM catalogue p JOIN orders o USING (pid)",
         UnsupportedQueryError, "private table first"),
        ("SELECT COUNT(*) FROM orders o JOIN catalogue p ON o.pid = p.category",
         UnsupportedQueryError, "different types"),
        ("SELECT AVG(n) FROM (SELECT cid, COUNT(*) AS n FROM orders WHERE cid IN "
         "(SELECT cid FROM customers) GROUP BY cid)", UnsupportedQueryError, "subquery"),
    ],
)
def test_refusals_name_the_problem_and_charge_nothing(
    shop: Path, sql: str, error: type[DpsqlError], words: str
) -> None:
    with seeded_connect(shop, analyst="ana", rng=np.random.default_rng(1)) as db:
        spent = db.budget().model_dump()
        with pytest.raises(error) as raised:
            db.execute(sql, epsilon=1.0)
        assert words in str(raised.value)
        assert db.budget().model_dump() == spent


ANSWERS = [
    ("SELECT COUNT(*) AS n FROM orders o JOIN customers c ON o.cid = c.cid",
     "SELECT COUNT(*) FROM orders o JOIN customers c ON o.cid = c.cid"),
    ("SELECT c.region, SUM(o.amount) AS s FROM orders o JOIN customers c USING (cid) "
     "GROUP BY c.region",
     "SELECT c.region, SUM(o.amount) FROM orders o JOIN customers c USING (cid) GROUP BY 1"),
    ("SELECT COUNT(*) AS n FROM customers c LEFT JOIN orders o USING (cid) WHERE o.oid IS NULL",
     "SELECT COUNT(*) FROM customers c LEFT JOIN orders o USING (cid) WHERE o.oid IS NULL"),
    ("SELECT p.category, COUNT(*) AS n FROM orders o JOIN catalogue p ON o.pid = p.pid "
     "GROUP BY p.category",
     "SELECT p.category, COUNT(*) FROM orders o JOIN catalogue p ON o.pid = p.pid GROUP BY 1"),
    ("SELECT AVG(n) AS a FROM (SELECT cid, COUNT(*) AS n FROM orders GROUP BY cid)",
     "SELECT AVG(n) FROM (SELECT cid, COUNT(*) AS n FROM orders GROUP BY cid)"),
    ("WITH per AS (SELECT cid, SUM(amount) AS s FROM orders GROUP BY cid) "
     "SELECT COUNT(*) AS n FROM per WHERE s >= 150",
     "SELECT COUNT(*) FROM (SELECT cid, SUM(amount) AS s FROM orders GROUP BY cid) "
     "WHERE s >= 150"),
    ("SELECT n, COUNT(*) AS persons FROM (SELECT cid, COUNT(*) AS n FROM orders GROUP BY cid) "
     "GROUP BY n",
     "SELECT n, COUNT(*) FROM (SELECT cid, COUNT(*) AS n FROM orders GROUP BY cid) GROUP BY n"),
    ("SELECT COUNT(*) AS n FROM (SELECT cid, ROW_NUMBER() OVER (PARTITION BY cid ORDER BY day) "
     "AS r FROM orders) WHERE r = 2",
     "SELECT COUNT(*) FROM (SELECT cid, ROW_NUMBER() OVER (PARTITION BY cid ORDER BY day) AS r "
     "FROM orders) WHERE r = 2"),
    ("SELECT prev, status, COUNT(*) AS n FROM (SELECT cid, status, LAG(status) OVER "
     "(PARTITION BY cid ORDER BY day) AS prev FROM orders) GROUP BY prev, status",
     "SELECT prev, status, COUNT(*) FROM (SELECT cid, status, LAG(status) OVER (PARTITION BY "
     "cid ORDER BY day) AS prev FROM orders) WHERE prev IS NOT NULL GROUP BY 1, 2"),
]


@pytest.mark.parametrize(("sql", "truth"), ANSWERS)
def test_answers_land_near_the_truth_within_their_intervals(
    shop: Path, sql: str, truth: str
) -> None:
    """Every person respects the bounds here (at most 3 orders, one customer row, at most 2
    catalogue matches), so the bounded answer is the plain SQL answer."""
    expected = {tuple(row[:-1]): row[-1] for row in _truth(shop, truth)}
    with seeded_connect(shop, analyst="ana", rng=np.random.default_rng(7)) as db:
        result = db.execute(sql, epsilon=5.0, delta=1e-6)
    keys = len(result.columns) - 1
    found = {tuple(row[:keys]): row[keys] for row in result.rows}
    assert set(found) >= {k for k, v in expected.items() if v}  # public keys: every key
    column = result.columns[-1]
    for index, (key, value) in enumerate(found.items()):
        truth_value = expected.get(key, 0)
        assert value == pytest.approx(truth_value, rel=0.1, abs=3), (key, value)
        if column in result.intervals:
            low, high = result.intervals[column][index]
            assert low <= truth_value <= high or abs(value - truth_value) < 1e-9


@pytest.mark.parametrize(
    ("value", "bounds"),
    [
        ("LEAST(SUM(amount), 300)", (0, 300)),  # the stated high, the implied low
        ("GREATEST(LEAST(SUM(amount), 300), 10)", (10, 300)),
        ("LEAST(SUM(amount), 1e308)", (0, 400)),  # a clamp only narrows the implied bounds
    ],
)
def test_a_per_person_value_takes_the_tighter_of_stated_and_implied_bounds(
    shop: Path, value: str, bounds: tuple[float, float]
) -> None:
    plan = _plan(shop, f"SELECT AVG(s) FROM (SELECT cid, {value} AS s FROM orders GROUP BY cid)")
    assert plan.table.column("s").bounds == bounds
