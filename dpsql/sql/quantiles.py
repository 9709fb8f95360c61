"""Quantile aggregates in the select list: ``MEDIAN(x)``, ``quantile_cont(x, q)`` and
``percentile_cont(q) WITHIN GROUP (ORDER BY x [ASC|DESC])``, with ``FILTER (WHERE ...)``.

Each becomes an ``Aggregate`` of kind QUANTILE with ``q`` as an exact fraction; the engine answers
it with permute-and-flip over a public grid (``dpsql.mechanisms.quantile``). ``quantile_disc``
and ``percentile_disc`` are refused: they return a value of the data, which a bin midpoint is not.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.sql import expressions
from dpsql.sql.shape import Aggregate, AggregateKind

if TYPE_CHECKING:
    from dpsql.sql.analyze import Analyzer

__all__ = ["output"]

_DISCRETE = (exp.PercentileDisc, exp.Quantile, exp.ApproxQuantile)


def _inner(node: exp.Expression) -> exp.Expression:
    """The aggregate under FILTER / WITHIN GROUP."""
    while isinstance(node, (exp.Filter, exp.WithinGroup)):
        node = node.this
    return node


def output(analyzer: Analyzer, node: exp.Expression, name: str) -> Aggregate | None:
    """The QUANTILE aggregate ``node`` is, or None when it is no quantile."""
    inner = _inner(node)
    if isinstance(inner, _DISCRETE):
        analyzer.reject(
            node,
            f"{node.sql(dialect='duckdb')}: a discrete quantile returns a value of the data, "
            "which dpsql does not release; ask for quantile_cont(col, q) (the midpoint of a public "
            "bin of the column's bounds)",
        )
    if not isinstance(inner, (exp.Median, exp.PercentileCont)):
        return None
    condition = node.expression.this if isinstance(node, exp.Filter) else None
    body = node.this if isinstance(node, exp.Filter) else node
    if isinstance(body, exp.WithinGroup):
        order = body.expression.expressions if isinstance(body.expression, exp.Order) else []
        if len(order) != 1 or inner.args.get("expression") is not None:
            analyzer.reject(node, "write percentile_cont(q) WITHIN GROUP (ORDER BY col)")
        value, literal = order[0].this, inner.this
        descending = bool(order[0].args.get("desc"))
    elif isinstance(inner, exp.Median):
        value, literal, descending = inner.this, None, False
    else:
        value, literal, descending = inner.this, inner.args.get("expression"), False
    if isinstance(value, exp.Distinct):
        analyzer.reject(node, "quantiles of DISTINCT values are not supported")
    q = Fraction(1, 2) if literal is None else _fraction(analyzer, literal)
    if descending:
        q = 1 - q
    if condition is not None:
        value = exp.Case(ifs=[exp.If(this=condition.copy(), true=value.copy())])
    if isinstance(value, exp.Column):
        column = analyzer.column(value)
        if not analyzer.kind(column).numeric:
            analyzer.reject(
                node, f"a quantile needs a numeric column; {column!r} is {analyzer.columns[column]}"
            )
        return Aggregate(AggregateKind.QUANTILE, column, name, q)
    column = f"{expressions.PREFIX}{len(analyzer.virtual)}"
    analyzer.virtual[column] = expressions.argument(analyzer, value, "a quantile")
    analyzer.virtual[column].meta["text"] = value.sql(dialect=analyzer.parsed.dialect)
    return Aggregate(AggregateKind.QUANTILE, column, name, q)


def _fraction(analyzer: Analyzer, literal: exp.Expression) -> Fraction:
    if isinstance(literal, exp.Array):
        analyzer.reject(literal, "ask for one quantile per aggregate: quantile_cont(col, q), ...")
    negative = isinstance(literal, exp.Neg)
    number = literal.this if negative else literal
    if not isinstance(number, exp.Literal) or number.is_string:
        analyzer.reject(literal, "a quantile's q must be a number literal in [0, 1]")
    text = f"-{number.this}" if negative else str(number.this)
    try:
        q = Fraction(text)
    except (ValueError, ZeroDivisionError):
        q = None
    if q is None or not 0 <= q <= 1:
        analyzer.reject(literal, f"a quantile must be in [0, 1], got {text}")
        raise AssertionError
    return q  # the mechanism's precision is checked where the quantile is priced
