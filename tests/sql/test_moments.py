"""Moments written in released sums (``dpsql.sql.moments``): which DP aggregates a statistic
reads, and that the formula over them is the database's own statistic.

The formula is checked against DuckDB's CORR, COVAR_POP, COVAR_SAMP, REGR_SLOPE and
REGR_INTERCEPT on data with NULLs on either side (noise-free components: the moments the
released sums estimate); a broken twin that counts every row where x is present (not the pairs)
gives other answers.
"""

from __future__ import annotations

import duckdb
import pytest
from sqlglot import exp

from dpsql.errors import UnsupportedQueryError
from dpsql.sql import moments
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse

CATALOG = {"t": {"u": "BIGINT", "x": "DOUBLE", "y": "INTEGER", "g": "VARCHAR", "f": "BOOLEAN"}}
STATISTICS = ["CORR(x, y)", "COVAR_POP(x, y)", "COVAR_SAMP(x, y)", "REGR_SLOPE(y, x)",
              "REGR_INTERCEPT(y, x)", "CORR(y, x)", "REGR_SLOPE(x, y)"]


def _rows() -> str:
    rows = []
    for i in range(40):
        x = "NULL" if i % 7 == 0 else f"{(i * 37) % 23 + 0.5 * i}"
        y = "NULL" if i % 5 == 0 else f"{(i * 11) % 13 + i // 3}"
        rows.append(f"({i}, {x}, {y})")
    return ", ".join(rows)


@pytest.mark.parametrize("statistic", STATISTICS)
def test_the_formula_over_the_components_is_the_databases_statistic(statistic: str) -> None:
    shape = analyze(parse(f"SELECT {statistic} AS s FROM t"), CATALOG)
    connection = duckdb.connect()
    connection.execute(f"CREATE TABLE t AS SELECT * FROM (VALUES {_rows()}) AS v(u, x, y)")
    # The released columns, noise-free: each inner aggregate as the database computes it over
    # the virtual columns (x + 0 * y is x on the rows where y is present).
    virtual = ", ".join(f"{e.sql(dialect='duckdb')} AS {n}" for n, e in shape.virtual.items())
    released = ", ".join(
        f"{a.kind.value}({a.column}) AS {a.name}" for a in shape.aggregates
    )
    connection.execute(
        f"CREATE TABLE released AS SELECT {released}, 0 AS __dp_row "
        f"FROM (SELECT *, {virtual} FROM t) AS v"
    )
    (ours,) = connection.execute(shape.post.outer).fetchone()[:1]
    (theirs,) = connection.execute(f"SELECT {statistic} FROM t").fetchone()
    connection.close()
    assert ours == pytest.approx(theirs, rel=1e-9)


def test_components_are_read_over_pairs_only() -> None:
    """The twin that sums x wherever x is present (not where y is too) is another statistic."""
    twin = dict(moments.components(exp.column("x"), exp.column("y")), sx="SUM(x)")
    connection = duckdb.connect()
    connection.execute(f"CREATE TABLE t AS SELECT * FROM (VALUES {_rows()}) AS v(u, x, y)")
    pairs = moments.components(exp.column("x"), exp.column("y"))
    values = [
        connection.execute(f"SELECT {moments._statistic('covar_pop', parts)} FROM t").fetchone()
        for parts in (pairs, twin)
    ]
    (want,) = connection.execute("SELECT COVAR_POP(x, y) FROM t").fetchone()
    connection.close()
    assert values[0][0] == pytest.approx(want, rel=1e-9)
    assert values[1][0] != pytest.approx(want, rel=1e-3)


def test_statistics_share_their_components() -> None:
    """CORR(x, y) and COVAR_POP(y, x) read one count and one sum of products: six distinct
    noisy aggregates in all, not ten."""
    shape = analyze(parse("SELECT CORR(x, y) AS c, COVAR_POP(y, x) AS v FROM t"), CATALOG)
    assert len(shape.aggregates) == 6
    corr, covar = shape.post.moment_columns["c"], shape.post.moment_columns["v"]
    assert corr.released["n"] == covar.released["n"]
    assert corr.released["sxy"] == covar.released["sxy"]
    assert corr.released["sx"] == covar.released["sy"]


def test_each_statistic_reads_its_components() -> None:
    for statistic, roles in moments.ROLES.items():
        shape = analyze(parse(f"SELECT {statistic.upper()}(x, y) AS s FROM t"), CATALOG)
        assert tuple(shape.post.moment_columns["s"].released) == roles
        assert len(shape.aggregates) == len(roles)


def test_nested_statistics_are_listed_without_an_interval() -> None:
    shape = analyze(
        parse("SELECT g, ROUND(CORR(x, y), 2) AS r FROM t GROUP BY g ORDER BY COVAR_POP(x, f)"),
        CATALOG,
    )
    assert [m.text for m in shape.post.bivariate] == ["CORR(x, y)", "COVAR_POP(x, f)"]
    assert shape.post.moment_columns == {}
    assert "r" in shape.post.derived


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT CORR(x * 2, y) FROM t", "CORR takes two columns"),
        ("SELECT REGR_SLOPE(y, 3) FROM t", "REGR_SLOPE takes two columns"),
        ("SELECT CORR(x, g) FROM t", r"CORR\(x, g\) needs numeric \(or BOOLEAN\) columns; 'g' is"),
    ],
)
def test_statistics_of_anything_but_two_numeric_columns_are_refused(
    sql: str, message: str
) -> None:
    with pytest.raises(UnsupportedQueryError, match=message):
        analyze(parse(sql), CATALOG)
