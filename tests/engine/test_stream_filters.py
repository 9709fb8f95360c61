"""Streams with a fixed filter (``AND city = 'a'``) and over DATE / TIMESTAMP / DECIMAL columns,
end to end: charged once for the filtered rows (which DuckDB decides), answering only a WHERE
that is exactly the fixed filter AND conditions on the stream's columns; anything else is a
normal charged query or a refusal that charges nothing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from dpsql.errors import ParameterError, UnsupportedQueryError
from tests.conftest import make_database, seeded_connect

ROWS = 6_000

POLICY = """
[dataset]
epsilon = 100.0
delta = 1e-6
[analysts.alice]
epsilon = 60.0
delta = 1e-6

[tables.people]
privacy_unit = "uid"
[tables.people.columns.age]
bounds = [0, 99]
[tables.people.columns.amount]
bounds = [0, 50]
"""


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    start = dt.datetime(2024, 1, 1)
    return pd.DataFrame(
        {
            "uid": np.arange(ROWS),
            "age": rng.integers(0, 100, ROWS),
            "city": rng.choice(["a", "b", "A", "a "], ROWS),
            "day": [start.date() + dt.timedelta(days=int(d)) for d in rng.integers(0, 120, ROWS)],
            "seen": [
                start + dt.timedelta(seconds=int(s)) for s in rng.integers(0, 5 * 86400, ROWS)
            ],
            "amount": rng.integers(0, 5000, ROWS) / 100,
        }
    )


@pytest.fixture
def people(tmp_path: Path) -> Path:
    database = make_database(tmp_path / "f.duckdb", {"people": _frame()}, POLICY)
    connection = duckdb.connect(str(database))
    connection.execute("ALTER TABLE people ALTER amount TYPE DECIMAL(8,2)")
    connection.close()
    return database


def _connect(database: Path):
    return seeded_connect(database, analyst="alice", rng=np.random.default_rng(2))


_ORACLE: duckdb.DuckDBPyConnection | None = None


def _truth(database: Path, where: str) -> int:
    """DuckDB's own count of ``where`` over the same rows (an in-memory copy: the session holds
    the file)."""
    global _ORACLE
    if _ORACLE is None:
        _ORACLE = duckdb.connect()
        _ORACLE.register("frame", _frame())
        _ORACLE.execute(
            "CREATE TABLE people AS SELECT * REPLACE (CAST(amount AS DECIMAL(8,2)) AS amount) "
            "FROM frame"
        )
    return _ORACLE.execute(f"SELECT COUNT(*) FROM people WHERE {where}").fetchone()[0]


def _covers(result, truth: int) -> bool:
    ((low, high),) = next(iter(result.intervals.values()))
    return low <= truth <= high


def test_a_fixed_filter_is_charged_once_and_matched_exactly(people: Path) -> None:
    with _connect(people) as session:
        opened = session.open_stream(
            "people", [("age", 1)], epsilon=20.0, mechanism="range_tree", filter="city = 'a'"
        )
        assert opened["filters"] == ["\"city\" = 'a'"]
        spent = session.budget().for_analyst("alice").epsilon_spent
        assert spent == pytest.approx(20.0)
        answered = [
            "SELECT COUNT(*) FROM people WHERE age BETWEEN 30 AND 39 AND city = 'a'",
            "SELECT COUNT(*) FROM people WHERE city = 'a' AND age < 50",
            "SELECT COUNT(*) FROM people WHERE (city = 'a') AND (age >= 50 OR age < 5) "
            "AND city = 'a'",
            "SELECT COUNT(*) FROM people WHERE \"CITY\" = 'a'",
            "SELECT COUNT(*) FROM people WHERE city = 'a' AND age > 90 AND age > 90",
            "SELECT COUNT(*) FROM people WHERE 'a' = city AND age < 50",  # the analyzer's order
        ]
        for sql in answered:
            assert session.explain(sql)["plan"]["mechanism"] == "stream", sql
            result = session.execute(sql)
            assert result.mechanism == f"stream:{opened['name']}" and result.epsilon == 0
            # DuckDB's own count of the same WHERE (case- and space-sensitive 'a').
            assert _covers(result, _truth(people, sql.split("WHERE", 1)[1])), sql
        assert session.budget().for_analyst("alice").epsilon_spent == pytest.approx(spent)
        not_matched = [
            "SELECT COUNT(*) FROM people WHERE age < 50",
            "SELECT COUNT(*) FROM people WHERE age < 50 AND city = 'b'",
            "SELECT COUNT(*) FROM people WHERE age < 50 AND city <> 'b'",
            "SELECT COUNT(*) FROM people WHERE age < 50 AND (city = 'a' OR city = 'a')",
            "SELECT COUNT(*) FROM people WHERE age < 50 OR city = 'a'",
            "SELECT COUNT(*) FROM people WHERE age < 50 AND city = 'a' AND city = 'A'",
        ]
        for sql in not_matched:
            plan = session.explain(sql, epsilon=0.5)
            assert plan["plan"]["mechanism"] != "stream", sql
            assert plan["cost"]["epsilon"] == 0.5
        fresh = session.execute(not_matched[1], epsilon=0.5)
        assert fresh.epsilon == 0.5 and not fresh.mechanism.startswith("stream")


def test_a_query_opens_a_stream_with_its_other_conditions_as_the_fixed_filter(people) -> None:
    first = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=10, mechanism='range_tree') "
        "COUNT(*) FROM people WHERE age BETWEEN 20 AND 29 AND city = 'b' AND day >= '2024-02-01'"
    )
    with _connect(people) as session:
        plan = session.explain(first)
        assert [c["name"] for c in plan["plan"]["opens"]["columns"]] == ["age"]
        answer = session.execute(first)
        opened = answer.details["opened_stream"]
        assert opened["filters"] == [
            "\"city\" = 'b'",
            "\"day\" >= CAST('2024-02-01' AS DATE)",
        ]
        where = "age BETWEEN 20 AND 29 AND city = 'b' AND day >= '2024-02-01'"
        assert _covers(answer, _truth(people, where))
        later = session.execute(
            "SELECT COUNT(*) FROM people WHERE day >= DATE '2024-02-01' AND city = 'b' AND age < 9"
        )
        assert later.epsilon == 0 and later.mechanism == answer.mechanism
        assert _covers(later, _truth(people, "day >= DATE '2024-02-01' AND city = 'b' AND age < 9"))


@pytest.mark.parametrize(
    ("filter_text", "message"),
    [
        ("age < 30", "other columns than the stream's"),
        ("city = 'a' GROUP BY city", "one WHERE condition"),
        ("nope = 1", "nope"),
        ("city = 'a' ORDER BY 1", None),
        ("", "text of a WHERE"),
        ("city = 'a'; DROP TABLE people", None),
    ],
)
def test_bad_filters_are_refused_and_charge_nothing(people, filter_text, message) -> None:
    with _connect(people) as session:
        with pytest.raises(Exception, match=message) as raised:
            session.open_stream("people", [("age", 1)], epsilon=1.0, filter=filter_text)
        assert raised.type.__module__.startswith("dpsql")
        assert session.budget().for_analyst("alice").epsilon_spent == 0
        assert session.synopses() == []


def test_date_timestamp_and_decimal_streams_answer_in_their_own_type(people: Path) -> None:
    with _connect(people) as session:
        weeks = session.open_stream(
            "people",
            [("day", 7, "2024-01-01", "2024-04-28")],
            epsilon=10.0,
            mechanism="range_tree",
        )
        assert weeks["cells"] == 17 and weeks["columns"][0]["bounds"] == [
            "2024-01-01",
            "2024-04-28",
        ]
        hours = session.open_stream(
            "people",
            [("seen", "6 hours", "2024-01-01", "2024-01-05 23:59:59")],
            epsilon=10.0,
            mechanism="range_tree",
        )
        assert hours["cells"] == 20
        money = session.open_stream(
            "people", [("amount", "0.50")], epsilon=10.0, mechanism="range_tree"
        )
        assert money["cells"] == 101  # the policy's bounds [0, 50] in cells of 0.50
        for where in [
            "day >= '2024-01-08' AND day < '2024-02-05'",
            "day BETWEEN DATE '2024-01-01' AND DATE '2024-01-07'",
            "seen >= '2024-01-02 06:00:00' AND seen < TIMESTAMP '2024-01-03'",
            "amount < 10.5 OR amount >= 40",
            "amount BETWEEN 1.00 AND 1.49",
        ]:
            result = session.execute(f"SELECT COUNT(*) FROM people WHERE {where}")
            assert result.epsilon == 0 and result.mechanism.startswith("stream:"), where
            assert _covers(result, _truth(people, where)), where
        entries = len(session.ledger())
        for where in [
            "day < '2024-01-10'",
            "seen < '2024-01-02 05:00:00'",
            "amount < 10.25",
            "day = '2024-01-08'",
        ]:
            with pytest.raises(UnsupportedQueryError):
                session.execute(f"SELECT COUNT(*) FROM people WHERE {where}")
        assert len(session.ledger()) == entries
        with pytest.raises(ParameterError, match="needs bounds"):
            session.open_stream("people", [("day", 1)], epsilon=1.0)


def test_cli_opens_a_typed_stream_with_a_filter(people: Path, capsys) -> None:
    from dpsql.cli import main

    args = ["stream", "open", "--db", str(people), "--analyst", "alice", "--table", "people"]
    typed = ["--column", "seen:6 hours", "--bounds", "seen=2024-01-01..2024-01-05 23:59:59"]
    rest = ["--filter", "city = 'a'", "--mechanism", "range_tree", "--epsilon", "1"]
    assert main([*args, *typed, *rest, "--format", "json"]) == 0
    opened = json.loads(capsys.readouterr().out)
    assert opened["cells"] == 20 and opened["filters"] == ["\"city\" = 'a'"]
    assert opened["columns"][0]["bounds"] == ["2024-01-01 00:00:00", "2024-01-05 23:59:59"]
    assert main([*args, "--column", "age", "--bounds", "day=1..2", "--epsilon", "1"]) == 2
    assert main([*args, "--column", "age", "--bounds", "age=1-2", "--epsilon", "1"]) == 2
