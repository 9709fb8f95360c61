"""SQLSTATEs of refusals, and how an answer becomes a result set."""

from __future__ import annotations

import math

import duckdb
import pytest

from dpsql.engine.results import QueryResult
from dpsql.errors import (
    BudgetExceededError,
    ExecutionError,
    SchemaError,
    ServiceError,
    SqlSyntaxError,
    UnsupportedQueryError,
)
from dpsql.serving.pgreplies import notice, position, refusal, released
from dpsql.serving.pgstatements import PgError


@pytest.mark.parametrize(
    ("error", "sqlstate", "status"),
    [
        (SqlSyntaxError("malformed SQL", line=1, column=8), "42601", 400),
        (UnsupportedQueryError("'*' is not supported"), "0A000", 400),
        (SchemaError("unknown table 'x'"), "42P01", 400),
        (SchemaError("unknown column 'c' in table 'requests'"), "42703", 400),
        (BudgetExceededError("budget exceeded"), "53400", 409),
        (ServiceError("rate limit", status=429), "53400", 429),
        (ServiceError("too long", status=413), "54000", 413),
        (ExecutionError("the query failed"), "XX000", 500),
        (PgError("28P01", 'password authentication failed for user "a"'), "28P01", 401),
        (duckdb.CatalogException("Table x does not exist"), "42P01", 400),
    ],
)
def test_refusals_have_fitting_sqlstates(error: Exception, sqlstate: str, status: int) -> None:
    found, message, found_status, problem = refusal(error)
    assert (found, found_status) == (sqlstate, status)
    assert "(line" not in message and problem.startswith("urn:dpsql:problem:")


def test_a_query_error_points_at_its_character() -> None:
    error = SqlSyntaxError("x", line=2, column=3)
    assert position("SELECT\n  COUNT(*", error) == 10  # 7 characters of line 1, then 3


def result() -> QueryResult:
    return QueryResult(
        columns=["country", "n", "mean"],
        rows=[("DK", 10, 2.5), ("NO", -1, math.nan)],
        intervals={"n": [(7.0, 13.0), (-4.0, 2.0)], "mean": [(1.0, 4.0), (None, None)]},
        noise_scale={"n": 2.0, "mean": math.nan},
        confidence=0.95,
        epsilon=0.5,
        delta=0.0,
        mechanism="laplace",
        analyst="alice",
        ledger_entry=7,
    )


def test_released_types_and_interval_columns() -> None:
    plain = released(result(), intervals=False)
    assert [(c.name, c.oid) for c in plain.columns] == [("country", 25), ("n", 20), ("mean", 701)]
    wide = released(result(), intervals=True)
    assert [c.name for c in wide.columns] == [
        "country", "n", "n_low", "n_high", "mean", "mean_low", "mean_high",
    ]  # fmt: skip
    assert {c.oid for c in wide.columns[2:4]} == {701}
    assert wide.rows[0][:4] == ("DK", 10, 7.0, 13.0)


def test_the_notice_says_cost_and_keeps_its_json_strict() -> None:
    text = notice(result(), intervals=False)
    assert b"ledger entry 7: epsilon 0.5, delta 0, mechanism laplace" in text
    assert b"SET dpsql.intervals = on" in text and b"NaN" not in text
