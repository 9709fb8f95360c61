"""Expressions inside aggregates: ``SUM(CASE WHEN ... THEN 1 ELSE 0 END)``, ``AVG(hours * wage)``,
``COUNT(expr)``, and ``agg(...) FILTER (WHERE ...)``.

The analyzer turns each such argument into a *virtual column* (``__dp_e0``, ...) of the table: the
shape's aggregates read it like a column, and ``QueryShape.virtual`` holds its expression. At
planning time (``with_virtual_bounds``) its bounds are derived from the policy alone by interval
arithmetic (Moore, *Interval Analysis*, 1966: the exact range of +, -, and * of intervals, and of
division by a non-zero constant), and the expression the database runs reads every numeric column
*clamped to its declared bounds* (a NaN reads as NULL), so every value of the virtual column lies
in the derived bounds by construction; the generated SQL then clamps it once more, like any
bounded column. The sensitivity of a sum of a virtual column is therefore the planner's usual
one for a column with those bounds: nothing about the data enters it.

Allowed in an argument: numeric literals, columns (numeric or BOOLEAN for sums; any for COUNT),
unary minus, ``+ - *``, division by a non-zero number, parentheses, and
``CASE WHEN <WHERE-style condition> THEN <argument> ... [ELSE <argument>] END``; a missing ELSE is
NULL (ignored by the aggregate). Conditions are checked, typed and bound exactly like WHERE.
``agg(x) FILTER (WHERE c)`` is ``agg(CASE WHEN c THEN x END)``, ``COUNT(*) FILTER (WHERE c)`` is
``COUNT(CASE WHEN c THEN 1 END)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.errors import PolicyError
from dpsql.sql.shape import ColumnKind

if TYPE_CHECKING:
    from dpsql.engine.policy import TablePolicy
    from dpsql.sql.analyze import _Analyzer
    from dpsql.sql.shape import QueryShape

__all__ = ["argument", "bounds_of", "clamped", "unfiltered", "with_virtual_bounds"]

PREFIX = "__dp_e"
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div)


def unfiltered(node: exp.Filter) -> exp.Expression:
    """``agg(x) FILTER (WHERE c)`` as ``agg(CASE WHEN c THEN x END)`` (``COUNT(*)``: ``1``)."""
    aggregate = node.this.copy()
    condition = node.expression.this.copy()
    value = aggregate.this
    if isinstance(value, exp.Star):
        value = exp.Literal.number(1)
    case = exp.Case(ifs=[exp.If(this=condition, true=value.copy())])
    aggregate.set("this", case)
    return aggregate


def argument(analyzer: _Analyzer, node: exp.Expression, what: str) -> exp.Expression:
    """``node`` checked against the allow-list and re-emitted with quoted columns and typed
    literals; ``what`` names the aggregate in messages."""
    if isinstance(node, exp.Paren):
        return exp.Paren(this=argument(analyzer, node.this, what))
    if isinstance(node, exp.Column):
        return exp.column(analyzer.column(node), quoted=True)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return exp.Literal.string(node.this)
        return exp.Literal.number(node.this)
    if isinstance(node, exp.Neg):
        return exp.Neg(this=argument(analyzer, node.this, what))
    if isinstance(node, _ARITHMETIC):
        left = argument(analyzer, node.this, what)
        right = argument(analyzer, node.expression, what)
        if isinstance(node, exp.Div) and not _nonzero_number(right):
            analyzer.reject(node, f"inside {what}, divide by a non-zero number only")
        return type(node)(this=left, expression=right)
    if isinstance(node, exp.Case):
        if node.this is not None:
            analyzer.reject(node, "write CASE WHEN condition THEN ..., not CASE value WHEN")
        branches = [
            exp.If(
                this=analyzer.predicate(branch.this),
                true=argument(analyzer, branch.args["true"], what),
            )
            for branch in node.args.get("ifs") or []
        ]
        default = node.args.get("default")
        emitted = exp.Case(ifs=branches)
        if default is not None and not isinstance(default, exp.Null):
            emitted.set("default", argument(analyzer, default, what))
        return emitted
    analyzer.reject(
        node,
        f"{node.sql()!r} is not supported inside {what}: use columns, numbers, + - * and / by a "
        "number, and CASE WHEN condition THEN ... END (or FILTER (WHERE ...))",
    )
    raise AssertionError


def _nonzero_number(node: exp.Expression) -> bool:
    inner = node.this if isinstance(node, exp.Neg) else node
    if not (isinstance(inner, exp.Literal) and not inner.is_string):
        return False
    try:
        return float(inner.this) != 0.0
    except ValueError:
        return False


Interval = tuple[float, float]


def bounds_of(
    node: exp.Expression, bounds: Mapping[str, Interval | None], kinds: Mapping[str, ColumnKind]
) -> Interval | None:
    """The exact interval-arithmetic range of ``node`` given each column's bounds (None when a
    column has none, or the expression is not numeric)."""
    if isinstance(node, exp.Paren):
        return bounds_of(node.this, bounds, kinds)
    if isinstance(node, exp.Column):
        if kinds.get(node.name) is ColumnKind.BOOLEAN:
            return (0.0, 1.0)
        return bounds.get(node.name)
    if isinstance(node, exp.Literal):
        return None if node.is_string else (float(node.this), float(node.this))
    if isinstance(node, exp.Neg):
        inner = bounds_of(node.this, bounds, kinds)
        return None if inner is None else (-inner[1], -inner[0])
    if isinstance(node, exp.Case):
        parts = [bounds_of(b.args["true"], bounds, kinds) for b in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            parts.append(bounds_of(node.args["default"], bounds, kinds))
        if not parts or any(p is None for p in parts):
            return None
        return (min(p[0] for p in parts), max(p[1] for p in parts))  # type: ignore[index]
    if isinstance(node, _ARITHMETIC):
        left = bounds_of(node.this, bounds, kinds)
        right = bounds_of(node.expression, bounds, kinds)
        if left is None or right is None:
            return None
        if isinstance(node, exp.Add):
            return (left[0] + right[0], left[1] + right[1])
        if isinstance(node, exp.Sub):
            return (left[0] - right[1], left[1] - right[0])
        if isinstance(node, exp.Div):
            right = (1.0 / right[0], 1.0 / right[1])  # a non-zero constant
        products = [a * b for a in left for b in right]
        return (min(products), max(products))
    return None


def clamped(
    node: exp.Expression, bounds: Mapping[str, Interval | None], kinds: Mapping[str, ColumnKind]
) -> exp.Expression:
    """``node`` as the database runs it: numeric columns read as DOUBLE clamped to their bounds
    (NaN as NULL), booleans as 0/1; CASE conditions are left as written."""
    node = node.copy()
    for column in list(node.find_all(exp.Column)):
        if _in_condition(column):
            continue
        kind = kinds.get(column.name)
        name = column.sql(dialect="duckdb")
        if kind is ColumnKind.BOOLEAN:
            column.replace(exp.maybe_parse(f"CAST({name} AS DOUBLE)", dialect="duckdb"))
            continue
        interval = bounds.get(column.name)
        if interval is None or not (kind is not None and kind.numeric):
            continue
        low, high = (repr(float(v)) for v in interval)
        value = f"CAST({name} AS DOUBLE)"
        text = (
            f"(CASE WHEN ISNAN({value}) THEN NULL ELSE LEAST(GREATEST({value}, {low}), {high}) END)"
        )
        column.replace(exp.maybe_parse(text, dialect="duckdb"))
    return node


def _in_condition(column: exp.Column) -> bool:
    """Whether ``column`` sits in a CASE condition (the WHEN part), not in a value."""
    child: exp.Expression = column
    parent = column.parent
    while parent is not None:
        if isinstance(parent, exp.If) and parent.this is child:
            return True
        child, parent = parent, parent.parent
    return False


def with_virtual_bounds(shape: QueryShape, table: TablePolicy) -> tuple[QueryShape, TablePolicy]:
    """``shape`` whose virtual columns read clamped columns, and ``table`` with their derived
    bounds; a virtual column summed or averaged needs bounds on every numeric column it adds."""
    virtual = getattr(shape, "virtual", None) or {}
    if not virtual:
        return shape, table
    declared = {name: rules.bounds for name, rules in table.columns.items()}
    summed = {a.column for a in shape.aggregates if a.kind.value in ("sum", "avg")}
    columns = dict(table.columns)
    runs: dict[str, exp.Expression] = {}
    for name, expression in virtual.items():
        interval = bounds_of(expression, declared, shape.columns)
        if name in summed and interval is None:
            missing = sorted(
                c.name
                for c in expression.find_all(exp.Column)
                if not _in_condition(c)
                and shape.columns.get(c.name) is not ColumnKind.BOOLEAN
                and declared.get(c.name) is None
            )
            detail = (
                f"set [tables.{shape.table}.columns.{missing[0]}] bounds = [low, high]"
                if missing
                else "sum numbers or bounded numeric columns"
            )
            raise PolicyError(f"{expression.sql(dialect='duckdb')!r} has no bounds: {detail}")
        if interval is not None:
            columns[name] = table.column(name).model_copy(update={"bounds": interval})
        runs[name] = clamped(expression, declared, shape.columns)
    table = table.model_copy(update={"columns": columns})
    return replace(shape, virtual=runs), table
