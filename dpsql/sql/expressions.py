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

import math
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

__all__ = [
    "argument",
    "bounds_of",
    "clamped",
    "explained",
    "group_key",
    "key_types",
    "normalized",
    "unfiltered",
    "with_virtual_bounds",
]

PREFIX = "__dp_e"
KEY_PREFIX = "__dp_k"
MAX_BINS = 10_000
"""Most bins one grouping expression may enumerate (the planner caps all groups further)."""
_CONDITIONS = (
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.Between,
    exp.In,
    exp.Is,
    exp.Not,
    exp.And,
    exp.Or,
    exp.Like,
    exp.ILike,
    exp.StartsWith,
)
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


def nearest_rewrite(node: exp.Expression) -> str | None:
    """The refusal of an aggregate dpsql does not answer that names what to ask instead."""
    name = node.sql(dialect="duckdb")
    if isinstance(node, (exp.Min, exp.Max)):
        q = "0.01" if isinstance(node, exp.Min) else "0.99"
        return (
            f"{name} is not released: the value of one person decides it. The declared bounds "
            "of the column are public in the policy; for the edges of the distribution ask for "
            f"a DP quantile, e.g. quantile_cont(col, {q}), or a histogram, e.g. "
            "SELECT FLOOR(col / w) * w AS bin, COUNT(*) ... GROUP BY bin"
        )
    return None


def explained(shape: QueryShape) -> dict[str, object]:
    """What EXPLAIN adds for the shapes of this issue: each virtual column (an expression inside
    an aggregate, or a grouping expression) as the database runs it, and the post-processing."""
    extra: dict[str, object] = {}
    if shape.virtual:
        extra["virtual_columns"] = {n: e.sql(dialect="duckdb") for n, e in shape.virtual.items()}
    if shape.post is not None:
        extra["post_processing"] = shape.post.describe()
    return extra


# GROUP BY expressions with public domains ------------------------------------------------------
def normalized(node: exp.Expression) -> str:
    """A spelling of ``node`` that ignores table qualifiers and the case of unquoted names."""
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        column.set("table", None)
    return copy.sql(dialect="duckdb", normalize=True).lower()


def _bin(node: exp.Expression) -> tuple[exp.Column, float, int] | None:
    """``FLOOR(col / w) * m`` (or ``m * FLOOR(col / w)``, or ``FLOOR(col / w)``): the column, the
    width ``w`` and the integer multiplier ``m``; None for any other shape."""
    multiplier: exp.Expression = exp.Literal.number(1)
    if isinstance(node, exp.Mul):
        floor, multiplier = node.this, node.expression
        if isinstance(multiplier, exp.Floor):
            floor, multiplier = multiplier, floor
        node = floor
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Floor) or node.args.get("decimals"):
        return None
    inner = node.this
    if not isinstance(inner, exp.Div) or not isinstance(inner.this, exp.Column):
        return None
    width, multiplier_value = _number(inner.expression), _number(multiplier)
    if width is None or multiplier_value is None:
        return None
    if not (width > 0 and math.isfinite(width)) or multiplier_value != int(multiplier_value):
        return None
    return inner.this, width, int(multiplier_value)


def _number(node: exp.Expression) -> float | None:
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this)
        except ValueError:
            return None
    return None


def group_key(analyzer: _Analyzer, node: exp.Expression) -> str:
    """A GROUP BY expression whose domain is public, as a virtual key column: bins
    ``FLOOR(col / w) * m`` of a bounded numeric column (w > 0, m an integer), or a condition
    (TRUE/FALSE); the domain is enumerated from the policy when the query is planned."""
    text = normalized(node)
    if text in analyzer.group_expressions:
        return analyzer.group_expressions[text]
    found = _bin(node)
    if found is not None:
        column, width, multiplier = found
        name = analyzer.column(column)
        if not analyzer.kind(name).numeric:
            analyzer.reject(column, f"bins need a numeric column; {name!r} is not")
        emitted: exp.Expression = exp.Mul(
            this=exp.Floor(
                this=exp.Div(
                    this=exp.column(name, quoted=True), expression=exp.Literal.number(repr(width))
                )
            ),
            expression=exp.Literal.number(multiplier),
        )
    elif isinstance(node, _CONDITIONS) or (isinstance(node, exp.Column) and False):
        emitted = exp.Paren(this=analyzer.predicate(node))
    else:
        analyzer.reject(
            node,
            "GROUP BY takes columns, bins FLOOR(column / width) * width of a column with "
            "declared bounds, or conditions such as column >= 13",
        )
        raise AssertionError
    name = f"{KEY_PREFIX}{sum(k.startswith(KEY_PREFIX) for k in analyzer.virtual)}"
    analyzer.virtual[name] = emitted
    analyzer.group_expressions[text] = name
    return name


def key_types(virtual: Mapping[str, exp.Expression]) -> dict[str, str]:
    """The database type of each virtual key column: BIGINT for bins, BOOLEAN for conditions."""
    return {
        name: "BIGINT" if _bin(expression) is not None else "BOOLEAN"
        for name, expression in virtual.items()
        if name.startswith(KEY_PREFIX)
    }


def _key(
    name: str, expression: exp.Expression, table: TablePolicy, shape: QueryShape
) -> tuple[exp.Expression, list[object]]:
    """The expression the database runs for a virtual key, and its public domain."""
    found = _bin(expression)
    if found is None:
        return expression, [False, True]
    column, width, multiplier = found
    interval = table.column(column.name).bounds
    if interval is None:
        raise PolicyError(
            f"GROUP BY bins of {column.name!r} need its bounds: set "
            f"[tables.{shape.table}.columns.{column.name}] bounds = [low, high]"
        )
    first, last = (math.floor(v / width) for v in interval)
    if last - first + 1 > MAX_BINS:
        raise PolicyError(
            f"GROUP BY bins of {column.name!r} of width {width:g} over its bounds give "
            f"{last - first + 1} groups (at most {MAX_BINS}); widen the bins"
        )
    value = clamped(exp.Paren(this=column), {column.name: interval}, shape.columns)
    value = value.sql(dialect="duckdb")
    runs = exp.maybe_parse(
        f"CAST(FLOOR({value} / {width!r}) AS BIGINT) * {multiplier}", dialect="duckdb"
    )
    return runs, [k * multiplier for k in range(first, last + 1)]


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
        if name.startswith(KEY_PREFIX):
            runs[name], domain = _key(name, expression, table, shape)
            columns[name] = table.column(name).model_copy(update={"public_keys": domain})
            continue
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
