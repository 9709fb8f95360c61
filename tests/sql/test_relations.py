"""The allow-list of FROM clauses over several tables (``dpsql.sql.relations``), without a
database: which queries form a relation, its columns and their origins, and the rewritten query."""

from __future__ import annotations

import functools

import pytest

from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.sql.analyze import check_filter
from dpsql.sql.parse import parse
from dpsql.sql.relations import PrivateTable, lift, with_ctes_as_subqueries

CATALOG = {
    "orders": {"oid": "BIGINT", "cid": "BIGINT", "pid": "INTEGER", "amount": "DOUBLE",
               "day": "DATE", "status": "VARCHAR"},
    "customers": {"cid": "BIGINT", "region": "VARCHAR", "age": "INTEGER"},
    "items": {"pid": "INTEGER", "category": "VARCHAR"},
}
PRIVATE = {"orders": PrivateTable("cid", None, 5), "customers": PrivateTable("cid", None, 1)}


def _lift(sql: str):
    parsed = with_ctes_as_subqueries(parse(sql))
    return lift(parsed, CATALOG, PRIVATE, ["items"], functools.partial(check_filter, parsed))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM orders",
        "SELECT COUNT(*) FROM orders WHERE amount > 3",
        "WITH o AS (SELECT * FROM orders WHERE amount > 3) SELECT COUNT(*) FROM o",
        "SELECT r.lo, COUNT(*) FROM orders o JOIN items r ON o.amount BETWEEN r.lo AND r.hi "
        "GROUP BY r.lo",
        "SELECT s / n FROM (SELECT SUM(amount) AS s, COUNT(*) AS n FROM orders)",
    ],
)
def test_one_table_and_post_processing_keep_their_own_paths(sql: str) -> None:
    parsed, relation = _lift(sql)
    assert relation is None
    assert parsed.expression.sql() == parse(sql).expression.sql()


def test_a_join_names_columns_plainly_unless_two_tables_share_a_name() -> None:
    parsed, relation = _lift(
        "SELECT c.region, SUM(o.amount) FROM orders o JOIN customers c ON o.cid = c.cid "
        "GROUP BY c.region"
    )
    assert relation is not None
    assert relation.unit == "o_cid"
    assert {"o_cid", "c_cid", "amount", "region", "age"} <= set(relation.types)
    assert relation.origins["o_cid"].kind == "unit"
    assert relation.origins["c_cid"].kind == "value"  # another table's unit: a plain value here
    assert relation.factors == ("orders", "customers")
    query = parsed.expression.sql()
    assert '"region"' in query and '"amount"' in query and "JOIN" not in query
    assert "ROW_NUMBER" in relation.select.sql()  # each private side truncated before the join


def test_using_merges_the_join_column_and_lookups_record_their_keys() -> None:
    _, relation = _lift(
        "SELECT i.category, COUNT(*) FROM orders o JOIN customers c USING (cid) "
        "JOIN items i ON o.pid = i.pid GROUP BY i.category"
    )
    assert relation is not None
    assert relation.unit == "cid"
    assert relation.public_joins == (("items", ("pid",)),)
    assert relation.origins["category"].kind == "public"


def test_a_per_person_subquery_has_one_row_per_person() -> None:
    _, relation = _lift(
        "WITH per AS (SELECT cid, COUNT(*) AS n, SUM(amount) AS s, MAX(day) AS last "
        "FROM orders WHERE amount > 3 GROUP BY cid) SELECT AVG(n) FROM per"
    )
    assert relation is not None and relation.per_person
    assert relation.factors == ()
    assert relation.origins["n"].kind == "count" and relation.origins["n"].rows == ("orders",)
    assert relation.origins["s"].kind == "sum"
    assert relation.origins["last"].kind == "value"
    assert relation.types["n"] == "BIGINT" and relation.types["s"] == "DOUBLE"
    # the filter passed the WHERE allow-list: its literal is typed for the binder to convert
    assert "CAST('3' AS DOUBLE)" in relation.select.sql(dialect="duckdb")


def test_a_window_and_a_stated_clamp() -> None:
    _, relation = _lift(
        "SELECT AVG(g) FROM (SELECT cid, LEAST(GREATEST(day - LAG(day) OVER (PARTITION BY cid "
        "ORDER BY day), 0), 30) AS g FROM orders)"
    )
    assert relation is not None and not relation.per_person
    assert relation.origins["g"].kind == "clamped"
    assert relation.origins["g"].limits == (0.0, 30.0)
    assert "DATE_DIFF" in relation.select.sql(dialect="duckdb").upper()


@pytest.mark.parametrize(
    ("sql", "error", "words"),
    [
        ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.oid = c.cid",
         UnsupportedQueryError, "privacy unit only"),
        ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.cid = c.cid AND o.pid = c.age",
         UnsupportedQueryError, "privacy unit only"),
        ("SELECT COUNT(*) FROM orders o JOIN customers c ON o.cid > c.cid",
         UnsupportedQueryError, "column = column"),
        ("SELECT COUNT(*) FROM orders o FULL JOIN customers c USING (cid)",
         UnsupportedQueryError, "LEFT JOIN"),
        ("SELECT COUNT(*) FROM orders o JOIN orders o2 USING (cid) JOIN orders o3 USING (cid) "
         "JOIN orders o4 USING (cid) JOIN orders o5 USING (cid) JOIN orders o6 USING (cid) "
         "JOIN orders o7 USING (cid) JOIN orders o8 USING (cid) JOIN orders o9 USING (cid)",
         UnsupportedQueryError, "at most 8"),
        ("SELECT COUNT(*) FROM orders o JOIN nowhere n USING (cid)", SchemaError, "unknown table"),
        ("SELECT COUNT(*) FROM orders o JOIN customers o USING (cid)",
         UnsupportedQueryError, "distinct names"),
        ("SELECT COUNT(*) FROM (SELECT cid, RANK() OVER (PARTITION BY cid ORDER BY day "
         "ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS r FROM orders)",
         UnsupportedQueryError, "frames"),
        ("SELECT COUNT(*) FROM (SELECT cid, NTILE(2) OVER (PARTITION BY cid) AS r FROM orders)",
         UnsupportedQueryError, "not supported"),
        ("SELECT AVG(n) FROM (SELECT cid, COUNT(*) FROM orders GROUP BY cid)",
         UnsupportedQueryError, "name each computed column"),
        ("SELECT AVG(n) FROM (SELECT cid, amount, COUNT(*) AS n FROM orders GROUP BY cid)",
         UnsupportedQueryError, "not the privacy unit"),
        ("SELECT AVG(n) FROM (SELECT cid, COUNT(*) AS n FROM orders WHERE amount > pid "
         "GROUP BY cid)", UnsupportedQueryError, "two columns"),
        ("SELECT COUNT(*) FROM (SELECT cid, amount + 1 AS a FROM orders)",
         UnsupportedQueryError, "window functions"),
    ],
)
def test_refusals_name_the_problem(sql: str, error: type, words: str) -> None:
    with pytest.raises(error) as raised:
        _lift(sql)
    assert words in str(raised.value)
