"""The DuckDB backend: frames registered from Python, in-memory databases, errors without data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine.backends import DuckDBBackend, ReadsRows, Rows, rows_of
from dpsql.errors import FAILED_AFTER_CHARGE, ExecutionError, ParameterError
from tests.engine.test_sources import EPSILON, set_policy_with

POLICY = """
[dataset]
epsilon = 1000000.0
[analysts.alice]
epsilon = 1000000.0
[tables.orders]
privacy_unit = "customer"
max_rows_per_unit = 2
[tables.orders.columns.shop]
public_keys = ["a", "b", "c"]
[tables.returns]
privacy_unit = "customer"
"""


def _orders() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame(
        {"customer": np.repeat(np.arange(200), 3), "shop": rng.choice(["a", "b"], 600)}
    )


def _backend(orders: pd.DataFrame, returns: object) -> DuckDBBackend:
    backend = DuckDBBackend(None)
    backend.register("orders", orders)
    backend.register("returns", returns)
    return backend


def test_pandas_and_arrow_tables_answer_queries_through_a_session(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="Arrow tables need pyarrow (pip install pyarrow)")
    orders = _orders()
    returns = pa.table({"customer": pa.array(np.arange(37), pa.int32())})
    database = tmp_path / "frames"  # names the ledger; no database file is needed
    set_policy_with(database, POLICY, lambda: _backend(orders, returns))
    backend = _backend(orders, returns)
    assert backend.catalog() == {
        "orders": {"customer": "BIGINT", "shop": "VARCHAR"},
        "returns": {"customer": "INTEGER"},
    }
    with dpsql.Session(database, analyst="alice", backend=backend) as db:
        grouped = db.execute("SELECT shop, COUNT(*) FROM orders GROUP BY shop", epsilon=EPSILON)
        returned = db.execute("SELECT COUNT(*) FROM returns", epsilon=EPSILON)
    # max_groups_per_unit = 1 and max_rows_per_unit = 2: each customer adds at most one row to
    # one shop; which shop depends on the salted order, but every customer adds exactly one.
    assert [row[0] for row in grouped.rows] == ["a", "b", "c"]
    assert sum(row[1] for row in grouped.rows) == 200 and grouped.rows[2][1] == 0
    assert returned.rows == [(37,)]


def test_frames_register_beside_the_tables_of_a_database_file(tmp_path: Path) -> None:
    database = tmp_path / "shop.duckdb"
    connection = duckdb.connect(str(database))
    connection.execute("CREATE TABLE orders AS SELECT 1 AS customer, 'a' AS shop")
    connection.close()
    backend = DuckDBBackend(database)
    try:
        backend.register("returns", pd.DataFrame({"customer": [1, 2]}))
        assert set(backend.catalog()) == {"orders", "returns"}
        assert backend.run("SELECT COUNT(*) AS n FROM returns")["n"].tolist() == [2]
        with pytest.raises(ParameterError, match="already exists"):
            backend.register("ORDERS", pd.DataFrame({"customer": [1]}))
        with pytest.raises(ParameterError, match="already exists"):
            backend.register("returns", pd.DataFrame({"customer": [1]}))
        with pytest.raises(ParameterError, match="cannot register int"):
            backend.register("numbers", 12)
        with pytest.raises(ParameterError, match="non-empty table name"):
            backend.register("", pd.DataFrame({"customer": [1]}))
    finally:
        backend.close()


def test_an_in_memory_backend_reads_no_files_and_reports_no_data(tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("secret\n4242\n")
    backend = DuckDBBackend(None)
    try:
        assert backend.catalog() == {}
        backend.register("values", pd.DataFrame({"text": ["4242"]}))
        for sql in (
            f"SELECT * FROM read_csv('{secret}')",
            "SELECT CAST(text AS INTEGER) / 0 * CAST(text AS DATE) FROM values",
            "SET enable_external_access = true",
        ):
            with pytest.raises(ExecutionError) as caught:
                backend.run(sql)
            # One message whatever failed, and no exception chain that could carry the cause.
            assert str(caught.value) == FAILED_AFTER_CHARGE
            assert caught.value.__context__ is None and caught.value.__cause__ is None
    finally:
        backend.close()


def test_a_missing_database_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="does not exist"):
        DuckDBBackend(tmp_path / "missing.duckdb")


def test_a_memory_limit_spills_to_a_private_directory_removed_on_close() -> None:
    backend = DuckDBBackend(None, memory_limit="64MB")
    spill = Path(backend._spill.name)  # type: ignore[union-attr]
    try:
        assert spill.is_dir()
        limit = backend.run("SELECT current_setting('memory_limit') AS m")["m"][0]
        assert limit.endswith("MiB") and float(limit.split()[0]) <= 64
        groups = backend.run(
            "SELECT COUNT(*) AS n FROM (SELECT range % 1000003 AS k, COUNT(*) AS c "
            "FROM range(4000000) GROUP BY k)"
        )
        assert groups["n"].tolist() == [1000003]
    finally:
        backend.close()
    assert not spill.exists()
    with pytest.raises(ParameterError, match="memory_limit"):
        DuckDBBackend(None, memory_limit="lots")


class _FailingDrops:
    """A DuckDB connection whose next ``drops`` DROP statements fail (as when interrupted)."""

    def __init__(self, connection: Any, drops: int):
        self.connection, self.drops = connection, drops

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("DROP") and self.drops:
            self.drops -= 1
            raise duckdb.InterruptException("interrupted")
        return self.connection.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


def test_scratch_tables_a_failed_drop_left_are_dropped_by_the_next_scratch() -> None:
    backend = DuckDBBackend(None)
    backend.register("t", pd.DataFrame({"k": [1, 2, 3]}))
    real = backend._connection
    try:
        listed = "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '__dpsql%'"
        backend._connection = _FailingDrops(real, drops=1)  # type: ignore[assignment]
        with backend.scratch() as scratch:
            first = scratch.table("SELECT k FROM t")
            assert backend.run(f'SELECT SUM(k) AS s FROM "{first}"')["s"].tolist() == [6]
            keys = scratch.values("__k", np.array(["a"], dtype=object), text=True)
            assert backend.run(f'SELECT * FROM "{keys}"')["__k"].tolist() == ["a"]
        assert backend.run(listed)["table_name"].tolist() == [first]
        assert first not in backend.catalog() and set(backend.catalog()) == {"t"}
        with backend.scratch() as scratch:
            second = scratch.table("SELECT k FROM t")
            assert backend.run(listed)["table_name"].tolist() == [second]
        assert backend.run(listed).empty and backend._undropped == []
    finally:
        backend._connection = real
        backend.close()


def test_rows_are_the_run_frames_values_without_a_frame() -> None:
    backend = DuckDBBackend(None)
    backend.register("orders", _orders())
    sql = "SELECT shop, COUNT(*) AS n, SUM(customer) AS total FROM orders GROUP BY shop ORDER BY 1"
    rows = backend.rows(sql)
    frame = backend.run(sql)
    assert rows.columns == ("shop", "n", "total") == tuple(frame.columns)
    assert rows.data == list(frame.itertuples(index=False, name=None))
    assert Rows.of_frame(frame) == rows
    assert rows.column("n") == frame["n"].tolist()
    empty = backend.rows("SELECT COUNT(*) AS n FROM orders WHERE false GROUP BY shop")
    assert empty.columns == ("n",) and empty.data == []
    with pytest.raises(ExecutionError) as caught:
        backend.rows("SELECT CAST(shop AS INTEGER) FROM orders")  # fails on a row value
    assert str(caught.value) == FAILED_AFTER_CHARGE and caught.value.__cause__ is None
    assert caught.value.__context__ is None


class _RunOnly:
    """A backend written against ``run(sql)`` alone."""

    dialect = "duckdb"

    def __init__(self, inner: DuckDBBackend) -> None:
        self.inner = inner

    def run(self, sql: str) -> pd.DataFrame:
        return self.inner.run(sql)


def test_a_backend_without_rows_is_read_through_its_frames() -> None:
    inner = DuckDBBackend(None)
    inner.register("orders", _orders())
    sql = "SELECT shop, COUNT(*) AS n FROM orders GROUP BY shop ORDER BY 1"
    assert not isinstance(_RunOnly(inner), ReadsRows) and isinstance(inner, ReadsRows)
    assert rows_of(_RunOnly(inner), sql) == rows_of(inner, sql)
