"""Which values of a partition column a validated WHERE clause confines a query to.

Only conjuncts on the partition column count: equalities, IN lists, BETWEEN and ordered comparisons,
joined by AND and OR. Anything else on that column (NOT, <>, IS NULL) and any OR that mixes in
other columns make the answer "unknown", and the query is charged sequentially.

>>> import sqlglot
>>> where = sqlglot.parse_one("SELECT 1 FROM t WHERE c IN ('DK', 'NO') AND age > CAST(3 AS BIGINT)")
>>> partition_region(where.args["where"].this, "c").to_list()
[['DK', True, 'DK', True], ['NO', True, 'NO', True]]
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.accountant.regions import Interval, Region, Value

__all__ = ["literal_value", "partition_region"]


class _Unknown(Exception):
    pass


def literal_value(node: exp.Expression) -> Value:
    """The Python value of a typed literal produced by ``analyze`` (ValueError if not one)."""
    try:
        return _value(node)
    except _Unknown:
        raise ValueError(f"not a literal: {node.sql()}") from None


def _value(node: exp.Expression) -> Value:
    if isinstance(node, exp.Cast):
        node = node.this
    negative = isinstance(node, exp.Neg)
    if negative:
        node = node.this
    if not isinstance(node, exp.Literal):
        raise _Unknown
    if node.is_string:
        return node.this
    number: Value = float(node.this) if any(c in node.this for c in ".eE") else int(node.this)
    return -number if negative else number


def _on_column(node: exp.Expression, column: str) -> bool:
    return isinstance(node, exp.Column) and node.name == column


def _region(node: exp.Expression, column: str) -> Region | None:
    """The region, or None when the node does not restrict the column."""
    if isinstance(node, exp.Paren):
        return _region(node.this, column)
    if isinstance(node, exp.And):
        left, right = _region(node.this, column), _region(node.expression, column)
        if left is None or right is None:
            return left if right is None else right
        return left.intersect(right)
    if isinstance(node, exp.Or):
        left, right = _region(node.this, column), _region(node.expression, column)
        if left is None or right is None:
            if left is None and right is None and not _mentions(node, column):
                return None
            raise _Unknown
        return left.union(right)
    if not _mentions(node, column):
        return None
    if isinstance(node, exp.EQ) and _on_column(node.this, column):
        return Region.point(_value(node.expression))
    if isinstance(node, exp.In) and _on_column(node.this, column):
        return Region(tuple(Interval(v, True, v, True) for v in map(_value, node.expressions)))
    if isinstance(node, exp.Between) and _on_column(node.this, column):
        low, high = _value(node.args["low"]), _value(node.args["high"])
        return Region((Interval(low, True, high, True),))
    bounds = {
        exp.GT: (False, None),
        exp.GTE: (True, None),
        exp.LT: (None, False),
        exp.LTE: (None, True),
    }
    if type(node) in bounds and _on_column(node.this, column):
        value = _value(node.expression)
        low_closed, high_closed = bounds[type(node)]
        if low_closed is not None:
            return Region((Interval(value, low_closed, None, False),))
        return Region((Interval(None, False, value, bool(high_closed)),))
    raise _Unknown


def _mentions(node: exp.Expression, column: str) -> bool:
    return any(c.name == column for c in node.find_all(exp.Column))


def partition_region(where: exp.Expression | None, column: str) -> Region | None:
    """The non-empty region of ``column`` values the WHERE clause allows, or None if unknown."""
    if where is None:
        return None
    try:
        region = _region(where, column)
    except _Unknown:
        return None
    if region is None or region.empty:
        return None
    return region
