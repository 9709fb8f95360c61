"""Expressions inside aggregates (``dpsql.sql.expressions``): the derived bounds are sound.

The sensitivity of a sum over a virtual column comes from its derived bounds, so the values the
database computes must lie inside them for every row an adversary can write: extremes, infinities,
NaN and NULL in every column. Broken twins of the interval arithmetic (a subtraction that pairs
the wrong ends; a product that looks at two corners only) fail the same property.
"""

from __future__ import annotations

import itertools
import math

import duckdb
import pytest
from sqlglot import exp

from dpsql.engine.virtual_columns import with_virtual_bounds
from dpsql.sql import expressions
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse
from dpsql.sql.shape import ColumnKind

CATALOG = {"t": {"uid": "BIGINT", "a": "INTEGER", "b": "DOUBLE", "c": "DOUBLE", "f": "BOOLEAN"}}
BOUNDS = {"a": (-3.0, 5.0), "b": (0.0, 40.0), "c": (-2.5, -0.5)}
KINDS = {n: ColumnKind.of(t) for n, t in CATALOG["t"].items()}
ARGUMENTS = [
    "a * b",
    "b - a",
    "a - b * c",
    "c * c",
    "-a * 2 + b / 4",
    "(a + 1) * (c - 1)",
    "CASE WHEN f THEN a * c WHEN b > 10 THEN 7 ELSE b END",
    "CASE WHEN a > 0 THEN a END - c",
    "f * b",
]
EDGES = {
    "a": [-(2**31), -3, 0, 5, 2**31 - 1, None],
    "b": [-math.inf, -1e308, 0.0, 40.0, 1e308, math.inf, math.nan, None],
    "c": [-math.inf, -2.5, -1.0, 0.0, math.nan, 1e300, None],
    "f": [True, False, None],
}


def _virtual(argument: str) -> exp.Expression:
    shape = analyze(parse(f"SELECT SUM({argument}) FROM t"), CATALOG)
    ((name, expression),) = shape.virtual.items()
    assert shape.aggregates[0].column == name
    return expression


def _values(expression: exp.Expression) -> list[float]:
    """The database's value of the clamped expression on every combination of edge values."""
    run = expressions.clamped(expression, BOUNDS, KINDS).sql(dialect="duckdb")
    connection = duckdb.connect()
    connection.execute("CREATE TABLE t (uid BIGINT, a INTEGER, b DOUBLE, c DOUBLE, f BOOLEAN)")
    rows = list(itertools.product(EDGES["a"], EDGES["b"], EDGES["c"], EDGES["f"]))
    connection.executemany("INSERT INTO t VALUES (1, ?, ?, ?, ?)", rows)
    found = connection.execute(f"SELECT {run} FROM t").fetchall()
    connection.close()
    return [v for (v,) in found if v is not None]


def _sound(bounds_of, argument: str) -> bool:
    expression = _virtual(argument)
    interval = bounds_of(expression, BOUNDS, KINDS)
    assert interval is not None
    low, high = interval
    values = _values(expression)
    assert values, argument
    return all(low - 1e-9 <= v <= high + 1e-9 for v in values)


@pytest.mark.parametrize("argument", ARGUMENTS)
def test_database_values_lie_in_the_derived_bounds(argument: str) -> None:
    assert _sound(expressions.bounds_of, argument)


def _broken_sub(node, bounds, kinds):
    """Twin: ``x - y`` as [lx - ly, hx - hy] (pairs the wrong ends)."""
    if isinstance(node, exp.Sub):
        left = _broken_sub(node.this, bounds, kinds)
        right = _broken_sub(node.expression, bounds, kinds)
        return (left[0] - right[0], left[1] - right[1])
    if isinstance(node, (exp.Add, exp.Mul, exp.Paren, exp.Neg, exp.Case, exp.Div)):
        return _with(node, bounds, kinds, _broken_sub)
    return expressions.bounds_of(node, bounds, kinds)


def _broken_mul(node, bounds, kinds):
    """Twin: ``x * y`` as [lx * ly, hx * hy] (two corners only)."""
    if isinstance(node, exp.Mul):
        left = _broken_mul(node.this, bounds, kinds)
        right = _broken_mul(node.expression, bounds, kinds)
        ends = (left[0] * right[0], left[1] * right[1])
        return (min(ends), max(ends))
    if isinstance(node, (exp.Add, exp.Sub, exp.Paren, exp.Neg, exp.Case, exp.Div)):
        return _with(node, bounds, kinds, _broken_mul)
    return expressions.bounds_of(node, bounds, kinds)


def _with(node, bounds, kinds, twin):
    """``bounds_of`` on ``node`` with its children's bounds from ``twin`` (via literals)."""
    copy = node.copy()
    for child in list(copy.iter_expressions()):
        if isinstance(child, exp.If):
            value = child.args["true"]
            low, high = twin(value, bounds, kinds)
            value.replace(_interval_case(low, high))
            continue
        if child.key in ("this", "expression") or isinstance(child, exp.Expression):
            interval = twin(child, bounds, kinds)
            if interval is not None:
                child.replace(_interval_case(*interval))
    return expressions.bounds_of(copy, bounds, kinds)


def _interval_case(low: float, high: float) -> exp.Expression:
    return exp.Case(
        ifs=[exp.If(this=exp.true(), true=exp.Literal.number(low))],
        default=exp.Literal.number(high),
    )


def test_broken_twins_of_the_interval_arithmetic_fail() -> None:
    assert not all(_sound(_broken_sub, a) for a in ARGUMENTS)
    assert not all(_sound(_broken_mul, a) for a in ARGUMENTS)


def test_sums_without_bounds_are_refused_before_the_charge() -> None:
    from dpsql.engine.policy import TablePolicy
    from dpsql.errors import PolicyError

    shape = analyze(parse("SELECT SUM(a * uid) FROM t"), CATALOG)
    table = TablePolicy.model_validate(
        {"privacy_unit": "uid", "columns": {"a": {"bounds": [0, 1]}}}
    )
    with pytest.raises(PolicyError, match=r"columns\.uid\] bounds"):
        with_virtual_bounds(shape, table)
    counted = analyze(parse("SELECT COUNT(CASE WHEN a > 0 THEN uid END) FROM t"), CATALOG)
    assert with_virtual_bounds(counted, table)[0].virtual


@pytest.mark.parametrize("argument", ARGUMENTS)
def test_a_missing_value_stays_missing(argument: str) -> None:
    """Clamping changes no value's NULL-ness (finite inputs): a NULL column is not read as a
    bound (LEAST and GREATEST skip NULLs; without the IS NULL test, NULL rows counted at the
    lower bound)."""
    expression = _virtual(argument)
    run = expressions.clamped(expression, BOUNDS, KINDS).sql(dialect="duckdb")
    native = expressions.clamped(expression, {}, KINDS).sql(dialect="duckdb")
    connection = duckdb.connect()
    connection.execute("CREATE TABLE t (uid BIGINT, a INTEGER, b DOUBLE, c DOUBLE, f BOOLEAN)")
    finite = {k: [v for v in vs if v is None or math.isfinite(v)] for k, vs in EDGES.items()}
    rows = list(itertools.product(finite["a"], finite["b"], finite["c"], finite["f"]))
    connection.executemany("INSERT INTO t VALUES (1, ?, ?, ?, ?)", rows)
    found = connection.execute(
        f"SELECT ({run}) IS NULL, ({native}) IS NULL FROM t WHERE a IS NULL OR b IS NULL "
        "OR c IS NULL OR f IS NULL"
    ).fetchall()
    connection.close()
    assert found and all(clamped == own for clamped, own in found), argument
