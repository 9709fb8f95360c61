"""How a statement on the PostgreSQL port is sorted and what text the engine gets."""

from __future__ import annotations

import datetime as dt

import pytest

from dpsql.serving.pgstatements import (
    PgError,
    bind_literals,
    classify,
    parameter_count,
    split,
    unqualified,
)

TABLES = frozenset({"requests", "ranges"})


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELECT COUNT(*) FROM requests", "query"),
        ('SELECT COUNT(*) FROM "public"."requests"', "query"),
        ("SELECT COUNT(*) FROM demo.public.requests", "query"),
        ("WITH r AS (SELECT * FROM requests) SELECT COUNT(*) FROM r", "query"),
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1) COUNT(*) FROM requests", "query"),
        ("SELECT COUNT(* FROM requests", "query"),  # the engine names the syntax error
        ("SELECT * FROM ranges", "query"),  # a public table: the engine decides
        ("SELECT relname FROM pg_catalog.pg_class", "catalog"),
        ("SELECT * FROM information_schema.tables", "catalog"),
        ("SELECT * FROM other_schema.requests", "catalog"),  # not the policy's table
        ("WITH requests AS (SELECT 1 AS x) SELECT x FROM requests", "catalog"),
        ("select version()", "catalog"),
        ("EXPLAIN SELECT COUNT(*) FROM requests", "explain"),
        ("SET dpsql.epsilon TO 0.5", "set"),
        ("SHOW transaction isolation level", "show"),
        ("BEGIN", "begin"),
        ("COMMIT", "commit"),
        ("ROLLBACK TO SAVEPOINT s", "rollback_to"),
        ("SAVEPOINT s", "noop"),
        ("", "empty"),
    ],
)
def test_classify(sql: str, kind: str) -> None:
    assert classify(sql, TABLES, "demo").kind == kind


@pytest.mark.parametrize(
    "sql",
    ["INSERT INTO requests VALUES (1)", "COPY requests TO STDOUT", "EXPLAIN ANALYZE SELECT 1"],
)
def test_only_reads_are_accepted(sql: str) -> None:
    with pytest.raises(PgError) as refused:
        classify(sql, TABLES, "demo")
    assert refused.value.sqlstate == "0A000"


def test_set_and_show_names() -> None:
    set_ = classify("SET SESSION dpsql.intervals = 'on'", TABLES, "demo")
    assert (set_.name, set_.value) == ("dpsql.intervals", "on")
    zone = classify("SET TIME ZONE 'UTC'", TABLES, "demo")
    assert (zone.name, zone.value) == ("timezone", "UTC")
    assert classify("SHOW transaction isolation level", TABLES, "demo").name == (
        "transaction_isolation"
    )


def test_split_keeps_semicolons_in_strings_and_comments() -> None:
    assert split("SELECT ';' AS a; -- x; y\nSELECT 2;;") == ["SELECT ';' AS a", "-- x; y\nSELECT 2"]


def test_literals_are_quoted_and_placeholders_in_strings_kept() -> None:
    sql = "SELECT COUNT(*) FROM t WHERE c = $1 AND d = $2 AND e > $3 AND f = '$1' -- $2"
    bound = bind_literals(sql, ["x' OR '1'='1", dt.date(2024, 1, 31), -1.5])
    assert bound == (
        "SELECT COUNT(*) FROM t WHERE c = 'x'' OR ''1''=''1' AND d = DATE '2024-01-31' "
        "AND e >  -1.5 AND f = '$1' -- $2"
    )
    assert parameter_count(sql) == 3
    # a negative number after a minus is not a comment
    assert bind_literals("SELECT n -$1 FROM t", [-2]) == "SELECT n - -2 FROM t"


@pytest.mark.parametrize(
    ("values", "sqlstate"),
    [(["a\\"], "22P02"), ([float("nan")], "22023"), ([], None)],
)
def test_unusable_parameters_are_refused(values: list, sqlstate: str | None) -> None:
    sql = "SELECT COUNT(*) FROM t WHERE c = $1"
    if sqlstate is None:
        assert bind_literals(sql, values) == sql  # nothing bound: the engine refuses "$1"
        return
    with pytest.raises(PgError) as refused:
        bind_literals(sql, values)
    assert refused.value.sqlstate == sqlstate


def test_a_missing_parameter_is_refused() -> None:
    with pytest.raises(PgError) as refused:
        bind_literals("SELECT $2", [1])
    assert refused.value.sqlstate == "42P02"


def test_unqualified_keeps_positions() -> None:
    sql = 'SELECT t.c FROM demo.public.t JOIN "public".u ON public_x = 1'
    blanked = unqualified(sql, "demo")
    assert len(blanked) == len(sql)
    assert " ".join(blanked.split()) == "SELECT t.c FROM t JOIN u ON public_x = 1"


def test_leading_comments_and_parentheses() -> None:
    query = classify("-- monthly\n(SELECT COUNT(*) FROM requests)", TABLES, "demo")
    assert (query.kind, query.text) == ("query", "-- monthly\n(SELECT COUNT(*) FROM requests)")
    setting = classify("/* tool */ SET dpsql.epsilon = 0.1", TABLES, "demo")
    assert (setting.kind, setting.name, setting.value) == ("set", "dpsql.epsilon", "0.1")
    assert classify("SELECT 'unclosed", TABLES, "demo").kind == "query"  # the engine refuses
