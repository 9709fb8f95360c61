"""Replays of the attacks on the SQL surface of expressions, computed keys and rows without a unit:
each one, as a hostile analyst wrote it, is now refused or fully charged and answers the same
with and without the person it targeted."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from dpsql.engine.session import database_ledger, set_policy
from dpsql.errors import DpsqlError, UnsupportedQueryError
from tests.conftest import seeded_connect

POLICY = """
[dataset]
epsilon = 1e6
delta = 1e-6
[analysts.a]
epsilon = 1e6
[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 1
[tables.t.columns.salary]
bounds = [0, 100000]
"""


def _database(path: Path, target: str | None) -> Path:
    """40 people (salaries 0..39,000; x small), plus ``target``'s row if given."""
    connection = duckdb.connect(str(path))
    connection.execute("CREATE TABLE t (uid BIGINT, salary DOUBLE, x INTEGER)")
    connection.execute("INSERT INTO t SELECT i, i * 1000.0, i FROM range(40) AS r(i)")
    if target is not None:
        connection.execute(f"INSERT INTO t VALUES {target}")
    connection.close()
    set_policy(path, POLICY)
    return path


def _answers(path: Path, sql: str, epsilon: float = 1e5) -> list[tuple]:
    with seeded_connect(path, analyst="a", rng=np.random.default_rng(4)) as db:
        return db.execute(sql, epsilon=epsilon).rows


def test_a_bin_times_zero_is_one_group_charged_once(tmp_path: Path) -> None:
    """Averaging one group's copies (one per bin, each with fresh noise) read a salary."""
    path = _database(tmp_path / "t.duckdb", None)
    sql = "SELECT FLOOR(salary / 1000) * 0 AS k, SUM(salary) AS s FROM t GROUP BY 1"
    rows = _answers(path, sql)
    assert [row[0] for row in rows] == [0]
    assert rows[0][1] == pytest.approx(sum(i * 1000.0 for i in range(40)), rel=1e-3)
    (entry,) = [e for e in database_ledger(path, "a") if e["kind"] == "charge"]
    assert entry["epsilon"] == pytest.approx(1e5)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(x * 2147483647) AS n FROM t",
        "SELECT COUNT(CASE WHEN x > 0 THEN x * 1000000000000 END) AS n FROM t",
        "SELECT COUNT(*) FILTER (WHERE salary > 0) AS n, COUNT(x + 9223372036854775807) AS m "
        "FROM t",
        "SELECT COUNT(-x - 2147483647) AS n FROM t",
    ],
)
def test_overflow_on_one_persons_value_does_not_fail_after_the_charge(
    tmp_path: Path, sql: str
) -> None:
    """Integer arithmetic on a column without bounds overflowed for some values only: success
    or failure after the charge read the value by binary search."""
    outcomes = []
    for name, target in (("without", None), ("with", "(1000, 5.0, 2147483647)")):
        path = _database(tmp_path / f"{name}.duckdb", target)
        try:
            outcomes.append(len(_answers(path, sql, epsilon=1e-6)))
        except DpsqlError as error:
            outcomes.append(type(error).__name__)
    assert outcomes == [1, 1]


def test_arithmetic_on_strings_and_dates_is_refused_before_the_charge(tmp_path: Path) -> None:
    connection = duckdb.connect(str(tmp_path / "s.duckdb"))
    connection.execute("CREATE TABLE t (uid BIGINT, salary DOUBLE, x INTEGER, s VARCHAR, d DATE)")
    connection.close()
    set_policy(tmp_path / "s.duckdb", POLICY)
    with seeded_connect(tmp_path / "s.duckdb", analyst="a", rng=np.random.default_rng(1)) as db:
        for sql in ("SELECT COUNT(s + 1) FROM t", "SELECT COUNT(d + 1) FROM t",
                    "SELECT COUNT(CASE WHEN x > 0 THEN s ELSE 1 END) FROM t"):
            with pytest.raises(UnsupportedQueryError, match="numbers"):
                db.execute(sql, epsilon=1.0)
    assert [e for e in database_ledger(tmp_path / "s.duckdb", "a") if e["kind"] == "charge"] == []


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) AS n FROM t WHERE uid NOT IN (SELECT uid FROM t WHERE salary > 20000)",
        # The same subquery inside a FILTER, and as a GROUP BY condition (both are computed
        # columns): found by the neighbouring suite at 500 examples.
        "SELECT COUNT(*) FILTER (WHERE uid NOT IN (SELECT uid FROM t WHERE salary > 20000)) "
        "AS n FROM t",
        "SELECT uid NOT IN (SELECT uid FROM t WHERE salary > 20000) AS k, COUNT(*) AS n "
        "FROM t GROUP BY 1",
    ],
)
def test_a_row_without_a_unit_changes_nothing(tmp_path: Path, sql: str) -> None:
    """``uid NOT IN (SELECT uid ...)`` was NULL for every row once one row had no unit: one
    unit-less row flipped the answer from N to 0."""
    answers = [
        _answers(_database(tmp_path / f"{name}.duckdb", target), sql)
        for name, target in (("without", None), ("with", "(NULL, 30000.0, 1)"))
    ]
    assert answers[1] == answers[0]
    assert [row[-1] for row in answers[0]][-1] == pytest.approx(21, abs=0.5)


def test_a_released_key_shown_under_two_names_is_answered(tmp_path: Path) -> None:
    """``SELECT s AS k, s AS j ... GROUP BY 1, 2`` over keys without public keys failed after its
    charge (the release assumed one key column and one count): found by the neighbouring suite
    at 500 examples."""
    policy = POLICY.replace("epsilon = 1e6\n[tables", "epsilon = 1e6\ndelta = 1e-6\n[tables")
    path = tmp_path / "t.duckdb"
    connection = duckdb.connect(str(path))
    connection.execute(
        "CREATE TABLE t AS SELECT i AS uid, 1.0 AS salary, i % 3 AS x FROM range(90) r(i)"
    )
    connection.close()
    set_policy(path, policy)
    with seeded_connect(path, analyst="a", rng=np.random.default_rng(8)) as db:
        result = db.execute(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(mechanism='threshold') "
            "x AS k, x AS j, COUNT(*) AS n FROM t GROUP BY 1, 2",
            epsilon=1e4,
            delta=1e-6,
        )
    assert result.columns == ["k", "j", "n"]
    assert result.rows and all(row[0] == row[1] for row in result.rows)
