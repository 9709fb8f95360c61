"""Parsing: the BigQuery DP clause is lifted, and errors point at the original text."""

from __future__ import annotations

import dataclasses

import pytest
from sqlglot import exp

from dpsql.errors import ParameterError, QueryError, SqlSyntaxError, UnsupportedQueryError
from dpsql.sql.parse import OPTION_TYPES, ParsedQuery, parse

DP = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS"


def _at(text: str, needle: str, occurrence: int = 1) -> tuple[int, int]:
    """1-based line and column of the ``occurrence``-th ``needle`` in ``text``."""
    index = -1
    for _ in range(occurrence):
        index = text.index(needle, index + 1)
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _position(error: QueryError) -> tuple[int | None, int | None]:
    return error.line, error.column


# --- lifting the clause ------------------------------------------------------------------------


def test_clause_is_lifted_and_options_read() -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.5, delta=1e-6) COUNT(*) FROM t"
    parsed = parse(sql)
    assert parsed.options == {"epsilon": 0.5, "delta": 1e-6}
    assert parsed.expression.sql() == "SELECT COUNT(*) FROM t"
    assert parsed.text == sql
    assert parsed.dialect == "duckdb"
    assert isinstance(parsed.expression, exp.Select)


def test_options_are_floats_even_when_written_as_integers_or_strings() -> None:
    parsed = parse(f"{DP}(epsilon=2, delta='1e-7') COUNT(*) FROM t")
    assert parsed.options == {"epsilon": 2.0, "delta": 1e-7}
    assert all(type(value) is float for value in parsed.options.values())
    assert set(OPTION_TYPES) == {
        "epsilon",
        "delta",
        "mechanism",
        "max_answers",
        "selection_share",
        "prefer",
        "accuracy",
        "confidence",
        "quantile_candidates",
        "simultaneous",
        "expected_count",
    }
    assert parse(f"{DP}(mechanism='alp') COUNT(*) FROM t").options == {"mechanism": "alp"}


def test_a_boolean_option_takes_true_or_false_only() -> None:
    assert parse(f"{DP}(simultaneous=TRUE) COUNT(*) FROM t").options == {"simultaneous": True}
    for value in ("1", "'true'"):
        with pytest.raises(ParameterError, match="simultaneous must be TRUE or FALSE"):
            parse(f"{DP}(simultaneous={value}) COUNT(*) FROM t")
    with pytest.raises(ParameterError, match="accuracy must be a number"):
        parse(f"{DP}(accuracy=true) COUNT(*) FROM t")


@pytest.mark.parametrize(
    "sql",
    [
        "select with differential_privacy options(epsilon=0.25) count(*) from t",
        "Select With Differential_Privacy Options(EPSILON=0.25) Count(*) From t",
        "SELECT\n  WITH\n  DIFFERENTIAL_PRIVACY\n  OPTIONS (\n    epsilon = 0.25\n  )\n"
        "COUNT(*) FROM t",
        "SELECT\tWITH\tDIFFERENTIAL_PRIVACY\tOPTIONS\t(\tepsilon\t=\t0.25\t)\tCOUNT(*) FROM t",
        "SELECT -- lead\n WITH /* a */ DIFFERENTIAL_PRIVACY -- b\n"
        " OPTIONS( /* c */ epsilon = 0.25 -- d\n) COUNT(*) FROM t",
        f"/* leading comment */ {DP}(epsilon=0.25) COUNT(*) FROM t",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.25,) COUNT(*) FROM t",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.25) COUNT(*) FROM t;",
    ],
    ids=[
        "lower",
        "mixed_case",
        "newlines",
        "tabs",
        "comments",
        "leading_comment",
        "trailing_comma",
        "semicolon",
    ],
)
def test_clause_is_lifted_in_any_layout(sql: str) -> None:
    parsed = parse(sql)
    assert parsed.options == {"epsilon": 0.25}
    generated = parsed.expression.sql()
    assert "DIFFERENTIAL_PRIVACY" not in generated.upper()
    assert "OPTIONS" not in generated.upper()
    assert isinstance(parsed.expression, exp.Select)
    assert [e.sql() for e in parsed.expression.expressions] == ["COUNT(*)"]


def test_clause_without_options_is_lifted_with_no_options() -> None:
    assert parse("SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM t").options == {}
    assert parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS() COUNT(*) FROM t").options == {}


def test_no_clause_no_options() -> None:
    parsed = parse("SELECT COUNT(*) FROM t WHERE x > 1")
    assert parsed.options == {}
    assert parsed.expression.sql() == "SELECT COUNT(*) FROM t WHERE x > 1"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM t WHERE s = 'SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(bogus=1)'",
        "SELECT COUNT(*) FROM t WHERE s = 'it''s SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(x=1)'",
        "SELECT COUNT(*) FROM t WHERE s = $$SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(bogus=1)$$",
        "SELECT COUNT(*) FROM t -- SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(bogus=1)",
        "SELECT COUNT(*) FROM t /* SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(bogus=1) */",
        "SELECT COUNT(*) AS differential_privacy FROM t",
    ],
    ids=["string", "escaped_string", "dollar_string", "line_comment", "block_comment", "alias"],
)
def test_clause_words_inside_strings_or_comments_are_left_alone(sql: str) -> None:
    parsed = parse(sql)
    assert parsed.options == {}
    assert parsed.text == sql
    assert "DIFFERENTIAL_PRIVACY" in parsed.expression.sql().upper()


def test_string_literal_with_clause_words_survives_next_to_a_real_clause() -> None:
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1) COUNT(*) FROM t "
        "WHERE s = 'SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=9)'"
    )
    parsed = parse(sql)
    assert parsed.options == {"epsilon": 1.0}
    (literal,) = [lit for lit in parsed.expression.find_all(exp.Literal) if lit.is_string]
    assert literal.this == "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=9)"


def test_bigquery_dialect() -> None:
    parsed = parse(
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-5) COUNT(*) FROM `t`",
        dialect="bigquery",
    )
    assert parsed.options == {"epsilon": 1.0, "delta": 1e-5}
    assert parsed.dialect == "bigquery"
    assert parsed.expression.sql(dialect="bigquery") == "SELECT COUNT(*) FROM `t`"


def test_parsed_query_is_frozen_and_keeps_tokens() -> None:
    parsed = parse("SELECT COUNT(*) FROM t")
    assert isinstance(parsed, ParsedQuery)
    assert [t.text for t in parsed.tokens] == ["SELECT", "COUNT", "(", "*", ")", "FROM", "t"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.text = "other"  # type: ignore[misc]


def test_positions_of_nodes_refer_to_the_original_text() -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY\n  OPTIONS(epsilon=1)\nCOUNT(x) FROM t\nWHERE yy > 3"
    parsed = parse(sql)
    column = next(c for c in parsed.expression.find_all(exp.Column) if c.name == "yy")
    assert parsed.position(column) == _at(sql, "yy") == (4, 7)
    table = parsed.expression.find(exp.Table)
    assert table is not None
    assert parsed.position(table) == _at(sql, "t\n")


# --- errors in the clause ----------------------------------------------------------------------


def test_unknown_option_is_rejected_with_its_position() -> None:
    sql = f"{DP}(epsilon=1, max_groups_contributed=2) COUNT(*) FROM t"
    with pytest.raises(UnsupportedQueryError, match="unknown differential privacy") as caught:
        parse(sql)
    assert "'max_groups_contributed'" in str(caught.value)
    assert "known: accuracy, confidence, delta, epsilon" in str(caught.value)
    assert _position(caught.value) == _at(sql, "max_groups") == (1, 53)


def test_unknown_option_on_a_later_line() -> None:
    sql = f"SELECT\n  {DP[7:]}(\n    epsilon = 1,\n    privacy_unit = 2\n  ) COUNT(*) FROM t"
    with pytest.raises(UnsupportedQueryError) as caught:
        parse(sql)
    assert _position(caught.value) == (4, 5)


@pytest.mark.parametrize(
    "options",
    ["epsilon=1, epsilon=2", "epsilon=1, EPSILON=2", "delta=1e-6, epsilon=1, Delta=1e-7"],
)
def test_duplicate_option_is_rejected_with_the_position_of_the_repeat(options: str) -> None:
    sql = f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS({options}) COUNT(*) FROM t"
    with pytest.raises(SqlSyntaxError, match="given twice") as caught:
        parse(sql)
    repeated = options.split(", ")[-1].split("=")[0].lower()
    assert _position(caught.value) == _at(sql.lower(), repeated + "=", occurrence=2)


def test_duplicate_option_on_a_later_line() -> None:
    sql = f"{DP}(\n  epsilon = 1,\n  delta = 0,\n  epsilon = 2\n)"
    with pytest.raises(SqlSyntaxError, match="option 'epsilon' given twice") as caught:
        parse(sql)
    assert _position(caught.value) == (4, 3)


def test_options_without_parenthesis() -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS epsilon=1 COUNT(*) FROM t"
    with pytest.raises(SqlSyntaxError, match=r"expected '\(' after OPTIONS") as caught:
        parse(sql)
    assert _position(caught.value) == _at(sql, "OPTIONS") == (1, 34)


def test_option_without_equals() -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon 1) COUNT(*) FROM t"
    with pytest.raises(SqlSyntaxError, match="expected '=' after option 'epsilon'") as caught:
        parse(sql)
    assert _position(caught.value) == _at(sql, "epsilon")


@pytest.mark.parametrize("value", ["x", ")", "-", "NULL"])
def test_option_value_that_is_not_a_number_or_string(value: str) -> None:
    sql = f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon={value}) COUNT(*) FROM t"
    with pytest.raises(SqlSyntaxError, match="expected a number or string in OPTIONS") as caught:
        parse(sql)
    assert caught.value.line == 1
    assert caught.value.column is not None
    assert caught.value.column >= _at(sql, "=")[1] + 1


def test_option_string_that_is_not_a_number_names_the_option() -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon='lots') COUNT(*) FROM t"
    with pytest.raises(ParameterError, match="option epsilon must be a float, got 'lots'"):
        parse(sql)


def test_unclosed_options_is_a_syntax_error() -> None:
    with pytest.raises(SqlSyntaxError, match=r"unclosed OPTIONS\("):
        parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1")
    with pytest.raises(SqlSyntaxError):
        parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(")


def test_unclosed_options_reports_a_full_position() -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1"
    with pytest.raises(SqlSyntaxError) as caught:
        parse(sql)
    assert "None" not in str(caught.value)
    assert caught.value.line == 1
    assert caught.value.column in (_at(sql, "OPTIONS")[1], _at(sql, "(")[1])


# --- malformed SQL -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "needle", "occurrence"),
    [
        ("SELECT COUNT(*) FROM t WHERE x = = 1", "=", 2),
        ("SELECT COUNT(*) FROM t\nWHERE x = = 1", "=", 2),
        ("SELECT COUNT(*\nFROM t", "FROM", 1),
        ("SELECT COUNT(*) FROM t\r\nWHERE x = = 1", "=", 2),
        ("SELECT COUNT(*)\n\tFROM t\n\tWHERE x = = 1", "=", 2),
        ('SELECT COUNT(*) AS "ééé" FROM t WHERE x = = 1', "=", 2),
        ('SELECT COUNT(*) AS "😀" FROM t\nWHERE x = = 1', "=", 2),
        ("SELECT COUNT(*) FROM t\nWHERE x >= 1 AND", "AND", 1),
        ("SELECT COUNT(*) FROM t WHERE x = 1)", ")", 2),
        (f"{DP}(epsilon=1) COUNT(*) FROM t WHERE x = = 1", "=", 3),
        (
            "SELECT WITH DIFFERENTIAL_PRIVACY\n  OPTIONS(epsilon = 1,\n          delta = 1e-6)\n"
            "  COUNT(*) FROM t WHERE x = = 1",
            "= =",
            1,
        ),
    ],
    ids=[
        "one_line",
        "second_line",
        "unclosed_parenthesis",
        "crlf",
        "tabs",
        "non_ascii",
        "astral_plane",
        "dangling_and",
        "extra_parenthesis",
        "after_dp_clause",
        "after_multiline_dp_clause",
    ],
)
def test_malformed_sql_points_at_the_original_text(sql: str, needle: str, occurrence: int) -> None:
    with pytest.raises(SqlSyntaxError, match="malformed SQL") as caught:
        parse(sql)
    expected = _at(sql, needle, occurrence)
    if needle == "= =":
        expected = (expected[0], expected[1] + 2)
    assert _position(caught.value) == expected
    assert str(caught.value).endswith(f"(line {expected[0]}, column {expected[1]})")
    assert "<Token" not in str(caught.value)
    assert "<class" not in str(caught.value)


def test_unterminated_string_is_a_syntax_error() -> None:
    with pytest.raises(SqlSyntaxError, match="cannot tokenize"):
        parse("SELECT COUNT(*) FROM t WHERE s = 'abc")
    with pytest.raises(SqlSyntaxError, match="cannot tokenize"):
        parse("SELECT COUNT(*) FROM t /* never closed")


def test_unterminated_string_reports_its_position() -> None:
    sql = "SELECT COUNT(*) FROM t\nWHERE s = 'abc"
    with pytest.raises(SqlSyntaxError) as caught:
        parse(sql)
    assert _position(caught.value) == _at(sql, "'") == (2, 11)


# --- statements --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM t; SELECT COUNT(*) FROM u",
        "SELECT COUNT(*) FROM t;\nDROP TABLE t",
        "SELECT COUNT(*) FROM t; DELETE FROM t;",
    ],
)
def test_multiple_statements_are_rejected(sql: str) -> None:
    with pytest.raises(UnsupportedQueryError, match="expected exactly one statement, got 2"):
        parse(sql)


def test_trailing_semicolons_are_one_statement() -> None:
    assert parse("SELECT COUNT(*) FROM t;").expression.sql() == "SELECT COUNT(*) FROM t"
    assert parse("SELECT COUNT(*) FROM t;;\n").expression.sql() == "SELECT COUNT(*) FROM t"


@pytest.mark.parametrize("sql", ["", " ", "\n\t  \r\n"])
def test_empty_query_is_rejected(sql: str) -> None:
    with pytest.raises(SqlSyntaxError, match="the query is empty"):
        parse(sql)


@pytest.mark.parametrize("sql", ["-- only a comment", "/* nothing */", ";"])
def test_query_without_a_statement_is_rejected(sql: str) -> None:
    with pytest.raises(QueryError):
        parse(sql)


def test_non_string_query_is_rejected() -> None:
    with pytest.raises(SqlSyntaxError):
        parse(None)  # type: ignore[arg-type]
    with pytest.raises(SqlSyntaxError):
        parse(b"SELECT 1")  # type: ignore[arg-type]


def test_unknown_dialect_is_a_parameter_error() -> None:
    with pytest.raises(ParameterError, match="unknown SQL dialect 'klingon'"):
        parse("SELECT COUNT(*) FROM t", dialect="klingon")


def test_errors_belong_to_the_query_error_tree() -> None:
    assert issubclass(SqlSyntaxError, QueryError)
    assert issubclass(UnsupportedQueryError, QueryError)
    assert issubclass(ParameterError, ValueError)


@pytest.mark.parametrize("text", ["'\ud800'", "'\udfff'", "1 -- \udc80"])
def test_lone_surrogates_are_refused_with_their_position(text: str) -> None:
    """A lone surrogate raised UnicodeEncodeError (a traceback): now a precise refusal."""
    with pytest.raises(SqlSyntaxError, match="not valid Unicode text") as caught:
        parse(f"SELECT COUNT(*) FROM t WHERE name = {text}")
    assert caught.value.line == 1 and caught.value.column is not None


@pytest.mark.parametrize(
    "where",
    [
        "(" * 3000 + "a = 1" + ")" * 3000,
        "NOT " * 3000 + "a = 1",
        "(NOT " * 500 + "a = 1" + ")" * 500,
        " OR ".join(f"(a = {i} AND NOT (b = 1))" for i in range(3000)),
        "CASE WHEN a = 1 THEN " * 3000 + "1" + " END" * 3000 + " = 1",
        "abs(" * 3000 + "a" + ")" * 3000 + " = 1",
    ],
    ids=["parentheses", "nots", "mixed", "or_chain", "case", "functions"],
)
def test_deep_nesting_is_refused_not_a_recursion_error(where: str) -> None:
    """Deep nesting raised RecursionError (a traceback): now a precise refusal."""
    with pytest.raises(UnsupportedQueryError, match="nested too deeply"):
        parse(f"SELECT COUNT(*) FROM t WHERE {where}")
