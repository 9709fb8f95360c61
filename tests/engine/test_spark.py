"""The Spark backend: the same generated SQL gives the same true aggregates as DuckDB.

Each test plans a query from the policy, generates its bounded aggregate once in DuckDB's dialect
and once transpiled to Spark's, runs both on the same Parquet file, and compares the aggregates
before any noise. Contribution bounds bind on every grouped query (about 15 rows per unit against
max_groups_per_unit = 2, max_rows_per_group = 2, max_rows_per_unit = 3) and values include NULL,
NaN, +-inf and values outside the bounds. One Spark session (local[1]) serves the module; it is
skipped, with the reason, when PySpark or Java is missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.planner import QueryPlan, plan_query
from dpsql.engine.policy import parse_policy
from dpsql.engine.session import database_ledger
from dpsql.engine.sources import FileSource, file_source
from dpsql.engine.spark import SparkBackend, local_spark, spark_unavailable
from dpsql.errors import ExecutionError
from dpsql.sql import generate
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse
from tests.conftest import seeded
from tests.engine.test_sources import EPSILON, set_policy_with

REASON = spark_unavailable()
if REASON is not None:
    pytest.skip(f"Spark backend tests need a local Spark: {REASON}", allow_module_level=True)

POLICY = """
[dataset]
epsilon = 1000000.0
[analysts.alice]
epsilon = 1000000.0
[tables.events]
privacy_unit = "user_id"
source = "events.parquet"
max_groups_per_unit = 2
max_rows_per_group = 2
max_rows_per_unit = 3
[tables.events.columns.country]
public_keys = ["DK", "NO", "SE", "FI", "IS", "XX"]
[tables.events.columns.bucket]
public_keys = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
[tables.events.columns.day]
public_keys = ["2024-01-01", "2024-01-02", "2024-01-04", "2024-01-06", "2024-01-09"]
[tables.events.columns.flag]
public_keys = [true, false]
[tables.events.columns.amount]
bounds = [-10.0, 100.0]
"""

LOOSE = (
    POLICY.replace("max_groups_per_unit = 2", "max_groups_per_unit = 100")
    .replace("max_rows_per_group = 2", "max_rows_per_group = 100")
    .replace("max_rows_per_unit = 3", "max_rows_per_unit = 10000")
)

ROWS = """
SELECT (i % 97)::BIGINT AS user_id,
       CASE WHEN i % 53 = 0 THEN NULL
            ELSE (['DK', 'NO', 'SE', 'FI', 'IS'])[1 + (hash(i * 3) % 5)::INTEGER] END AS country,
       (hash(i * 5) % 12)::INTEGER AS bucket,
       DATE '2024-01-01' + (hash(i * 7) % 9)::INTEGER AS day,
       TIMESTAMP '2024-01-01 00:00:00' + to_seconds((hash(i * 11) % 864000)::BIGINT) AS ts,
       CASE i % 41 WHEN 0 THEN NULL WHEN 1 THEN 'NaN'::DOUBLE WHEN 2 THEN 'inf'::DOUBLE
            WHEN 3 THEN '-inf'::DOUBLE
            ELSE (hash(i * 13) % 20000)::DOUBLE / 100.0 - 50.0 END AS amount,
       hash(i * 17) % 2 = 0 AS flag
FROM range(1500) AS t(i)
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> FileSource:
    directory = tmp_path_factory.mktemp("spark")
    connection = duckdb.connect()
    connection.execute(f"COPY ({ROWS}) TO '{directory / 'events.parquet'}' (FORMAT parquet)")
    connection.close()
    return file_source("events", str(directory / "events.parquet"))


QUICK_JVM = {
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}
"""Small jobs: start fast (C1 compiler only, serial GC), one shuffle partition."""


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_spark(1, **QUICK_JVM)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def backends(source: FileSource, spark: Any) -> Iterator[tuple[DuckDBBackend, SparkBackend]]:
    duck = DuckDBBackend(None, sources=[source])
    spark_backend = SparkBackend(spark, tables={"events": source})
    yield duck, spark_backend
    duck.close()
    spark_backend.close()


def _plan(sql: str, catalog: dict[str, dict[str, str]], policy: str = POLICY) -> QueryPlan:
    return plan_query(analyze(parse(sql), catalog), parse_policy(policy), epsilon=1.0, delta=0.0)


def _generated(plan: QueryPlan, salt: int, dialect: str) -> str:
    return generate.bounded_aggregate(
        plan.shape,
        measures=[m.measure for m in plan.measurements],
        bounds=plan.bounds,
        public_keys=plan.key_literals,
        salt=salt,
        dialect=dialect,
    )


def _plain(value: Any) -> Any:
    if hasattr(value, "isoformat"):  # DuckDB gives dates as timestamps, Spark as dates
        return value.isoformat()[:10]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _normalized(frame: pd.DataFrame, keys: list[str]) -> list[tuple[Any, ...]]:
    """Rows as plain Python values, sorted by their keys."""
    rows = [tuple(_plain(v) for v in record.values()) for record in frame.to_dict("records")]
    return sorted(rows, key=lambda row: tuple(str(v) for v in row[: len(keys)]))


QUERIES = [
    "SELECT COUNT(*) AS n, SUM(amount) AS s FROM events",
    "SELECT country, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM events "
    "GROUP BY country",
    "SELECT day, COUNT(amount) AS n FROM events WHERE flag = TRUE GROUP BY day",
    "SELECT bucket, COUNT(*) AS n, SUM(amount) AS s FROM events "
    "WHERE amount BETWEEN -20 AND 120 GROUP BY bucket",
    "SELECT country, bucket, COUNT(*) AS n FROM events GROUP BY country, bucket",
    "SELECT flag, SUM(amount) AS s FROM events GROUP BY flag",
    "SELECT COUNT(*) AS n FROM events WHERE ts >= '2024-01-04 12:00:00' "
    "AND day <= '2024-01-08' AND country IN ('DK', 'SE')",
]


@pytest.mark.parametrize(("sql", "salt"), [(q, 7919 * i) for i, q in enumerate(QUERIES)])
def test_spark_and_duckdb_agree_on_the_true_aggregates(
    backends: tuple[DuckDBBackend, SparkBackend], sql: str, salt: int
) -> None:
    duck, spark_backend = backends
    assert spark_backend.catalog() == duck.catalog()
    plan = _plan(sql, duck.catalog())
    keys = list(plan.shape.group_by)
    for_spark = _generated(plan, salt, "spark")
    # dpsql's randomness (the salt) never comes from the database.
    assert not re.search(r"\b(RAND|RANDOM|UUID|SHUFFLE|NOW|CURRENT_\w+)\b", for_spark, re.I)
    on_duckdb = _normalized(duck.run(_generated(plan, salt, "duckdb")), keys)
    on_spark = _normalized(spark_backend.run(for_spark), keys)
    assert on_spark == on_duckdb
    # The bounds bind: the same query under loose bounds gives other aggregates.
    loose = _plan(sql, duck.catalog(), LOOSE)
    assert _normalized(duck.run(_generated(loose, salt, "duckdb")), keys) != on_duckdb


def test_engine_hashes_would_make_the_engines_disagree(
    backends: tuple[DuckDBBackend, SparkBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teeth: with each engine's own HASH ordering a unit's groups, the kept groups differ."""
    duck, spark_backend = backends
    monkeypatch.setattr(generate, "_integral", lambda kinds: True)
    monkeypatch.setattr(
        generate,
        "_salted_order",
        lambda unit_code, key_code, salt: ((), f"HASH(__unit, __key0, {salt})"),
    )
    plan = _plan("SELECT country, COUNT(*) AS n FROM events GROUP BY country", duck.catalog())
    on_duckdb = _normalized(duck.run(_generated(plan, 11, "duckdb")), ["country"])
    on_spark = _normalized(spark_backend.run(_generated(plan, 11, "spark")), ["country"])
    assert sum(row[1] for row in on_duckdb) == sum(row[1] for row in on_spark)
    assert on_spark != on_duckdb


def test_sessions_on_spark_and_duckdb_answer_alike(
    tmp_path: Path, source: FileSource, spark: Any
) -> None:
    """The three benchmark shapes through Session on both backends, sharing one ledger."""
    (tmp_path / "events.parquet").symlink_to(source.files[0])
    database = tmp_path / "lake"  # no database file: the ledger's name and the sources' base
    policy = parse_policy(POLICY)
    set_policy_with(database, policy, lambda: DuckDBBackend.for_policy(database, policy))
    queries = [
        "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
        "SELECT COUNT(*) AS n FROM events WHERE day BETWEEN '2024-01-02' AND '2024-01-06'",
        "SELECT SUM(amount) AS s FROM events",
    ]
    answers = {}
    for name, backend in (
        ("duckdb", DuckDBBackend.for_policy(database, policy)),
        ("spark", SparkBackend.for_policy(database, policy, spark)),
    ):
        with seeded(
            dpsql.Session, database, analyst="alice", backend=backend, rng=np.random.default_rng(5)
        ) as db:
            answers[name] = [db.execute(q, epsilon=EPSILON) for q in queries]
    for on_duckdb, on_spark in zip(answers["duckdb"], answers["spark"], strict=True):
        assert on_spark.columns == on_duckdb.columns
        for row_duckdb, row_spark in zip(on_duckdb.rows, on_spark.rows, strict=True):
            assert row_spark == pytest.approx(row_duckdb, abs=1)
        for column, intervals in on_spark.intervals.items():
            for (low, high), row in zip(intervals, on_spark.rows, strict=True):
                assert low <= row[on_spark.columns.index(column)] <= high
    assert [e["kind"] for e in database_ledger(database)].count("charge") == 6


def test_spark_errors_name_no_data(backends: tuple[DuckDBBackend, SparkBackend]) -> None:
    _, spark_backend = backends
    with pytest.raises(ExecutionError, match="the charge stands") as caught:
        spark_backend.run("SELECT CAST(country AS INT) FROM events")
    assert "DK" not in str(caught.value)


RELATION_POLICY = """
[dataset]
epsilon = 1000000.0
[analysts.alice]
epsilon = 1000000.0
[tables.customers]
privacy_unit = "cid"
[tables.customers.columns.region]
public_keys = ["north", "south"]
[tables.orders]
privacy_unit = "cid"
max_rows_per_unit = 2
max_groups_per_unit = 2
max_rows_per_group = 2
[tables.orders.columns.amount]
bounds = [0.0, 100.0]
[tables.orders.columns.status]
public_keys = ["open", "paid"]
[public_tables.catalogue]
"""

RELATION_TABLES = {
    "customers": "SELECT i AS cid, CASE WHEN i % 3 = 0 THEN 'north' ELSE 'south' END AS region "
    "FROM range(60) AS t(i)",
    "orders": "SELECT i AS oid, CASE WHEN i % 50 = 0 THEN NULL ELSE i % 45 END AS cid, "
    "i % 5 AS pid, CAST((i * 37) % 130 AS DOUBLE) AS amount, DATE '2025-01-01' + "
    "CAST(i % 17 AS INTEGER) AS day, CASE WHEN i % 3 = 0 THEN 'open' ELSE 'paid' END AS status "
    "FROM range(200) AS t(i)",
    "catalogue": "SELECT * FROM (VALUES (0, 'a'), (1, 'b'), (2, 'a'), (3, 'c'), (3, 'd'), "
    "(4, 'b')) AS t(pid, category)",
}

RELATION_QUERIES = [
    "SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS s FROM orders o JOIN customers c "
    "USING (cid) GROUP BY c.region",
    "SELECT COUNT(*) AS n FROM customers c LEFT JOIN orders o ON c.cid = o.cid "
    "WHERE o.oid IS NULL",
    "SELECT p.category, COUNT(*) AS n FROM orders o JOIN catalogue p ON o.pid = p.pid "
    "GROUP BY p.category",
    "SELECT AVG(n) AS a, SUM(s) AS t FROM (SELECT cid, COUNT(*) AS n, SUM(amount) AS s "
    "FROM orders GROUP BY cid)",
    "SELECT n, COUNT(*) AS persons FROM (SELECT cid, COUNT(*) AS n FROM orders GROUP BY cid) "
    "GROUP BY n",
    "SELECT COUNT(*) AS n FROM (SELECT cid, ROW_NUMBER() OVER (PARTITION BY cid ORDER BY day, "
    "oid) AS r FROM orders) WHERE r = 2",
    "SELECT status, AVG(gap) AS g FROM (SELECT cid, status, LEAST(GREATEST(day - LAG(day) OVER "
    "(PARTITION BY cid ORDER BY day, oid), 0), 30) AS gap FROM orders) GROUP BY status",
]


@pytest.fixture(scope="module")
def relation_backends(
    tmp_path_factory: pytest.TempPathFactory, spark: Any
) -> Iterator[tuple[DuckDBBackend, SparkBackend]]:
    directory = tmp_path_factory.mktemp("spark_relations")
    connection = duckdb.connect()
    sources = []
    for name, select in RELATION_TABLES.items():
        path = directory / f"{name}.parquet"
        connection.execute(f"COPY ({select}) TO '{path}' (FORMAT parquet)")
        sources.append(file_source(name, str(path)))
    connection.close()
    duck = DuckDBBackend(None, sources=sources)
    spark_backend = SparkBackend(spark, tables={s.table: s for s in sources})
    yield duck, spark_backend
    duck.close()
    spark_backend.close()


@pytest.mark.parametrize(
    ("sql", "salt"), [(q, 104729 * i) for i, q in enumerate(RELATION_QUERIES)]
)
def test_spark_and_duckdb_agree_on_joins_and_subqueries(
    relation_backends: tuple[DuckDBBackend, SparkBackend], sql: str, salt: int
) -> None:
    """Joins on the unit, public lookups, per-person subqueries and unit-local windows: the
    relation's SQL, transpiled, gives Spark the same true aggregates as DuckDB."""
    from dpsql.engine.literals import Binder
    from dpsql.engine.query import bind, planner

    duck, spark_backend = relation_backends
    policy = parse_policy(RELATION_POLICY)
    query = bind(
        sql, dialect="duckdb", policy=policy, backend=duck, binder=Binder(duck, duck.catalog())
    )
    plan = planner(query.bound, query.policy, query.binder, delta=0.0)(1.0)
    assert plan.shape.relation is not None
    keys = list(plan.shape.group_by)
    on_duckdb = _normalized(duck.run(_generated(plan, salt, "duckdb")), keys)
    on_spark = _normalized(spark_backend.run(_generated(plan, salt, "spark")), keys)
    assert on_duckdb
    assert on_spark == on_duckdb
