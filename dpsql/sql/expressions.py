"""Expressions inside aggregates: ``SUM(CASE WHEN ... THEN 1 ELSE 0 END)``, ``AVG(hours * wage)``,
``COUNT(expr)``, and ``agg(...) FILTER (WHERE ...)``.

The analyzer turns each such argument into a *virtual column* (``__dp_e0``, ...) of the table:
the shape's aggregates read it like a column, and ``QueryShape.virtual`` holds its expression.
When the query is priced (``dpsql.engine.virtual_columns``) its bounds are derived from the
policy alone by interval arithmetic (Moore, *Interval Analysis*, 1966: the exact range of +, -
and * of intervals, and of division by a non-zero constant), and the expression the database
runs reads every numeric column *clamped to its declared bounds* (a NaN reads as NULL), so every
value of the virtual column lies in the derived bounds by construction; the generated SQL then
clamps it once more, like any bounded column. The sensitivity of a sum of a virtual column is
therefore the planner's usual one for a column with those bounds: nothing about the data enters.

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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.sql import calendar
from dpsql.sql.shape import ColumnKind

if TYPE_CHECKING:
    from dpsql.sql.analyze import Analyzer
    from dpsql.sql.shape import QueryShape

__all__ = [
    "Bin",
    "argument",
    "bin_domain_sql",
    "bin_ends_sql",
    "bin_of",
    "bin_run",
    "bounds_of",
    "clamped",
    "explained",
    "group_key",
    "in_condition",
    "key_types",
    "normalized",
    "unfiltered",
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


NUMBER = "NUMBER"
"""The kind of a numeric value inside an argument (numbers, numeric and BOOLEAN columns)."""


def argument(analyzer: Analyzer, node: exp.Expression, what: str) -> exp.Expression:
    """``node`` checked against the allow-list and re-emitted with quoted columns and typed
    literals; ``what`` names the aggregate in messages.

    Types are checked here, before any charge, so that nothing the database runs later can fail
    on some rows only: arithmetic takes numbers (literals, numeric and BOOLEAN columns), and the
    values of a CASE are all numbers or all of one column type. The database then runs every
    number as a DOUBLE (``clamped``), whose arithmetic never raises."""
    return _argument(analyzer, node, what)[0]


def _argument(
    analyzer: Analyzer, node: exp.Expression, what: str
) -> tuple[exp.Expression, str]:
    """``argument`` and the kind of its value: ``NUMBER`` or a column's database type."""
    if isinstance(node, exp.Paren):
        inner, kind = _argument(analyzer, node.this, what)
        return exp.Paren(this=inner), kind
    if isinstance(node, exp.Column):
        name = analyzer.column(node)
        kind = analyzer.kind(name)
        numeric = kind.numeric or kind is ColumnKind.BOOLEAN
        return exp.column(name, quoted=True), NUMBER if numeric else analyzer.columns[name]
    if isinstance(node, exp.Literal):
        if node.is_string:
            return exp.Literal.string(node.this), "VARCHAR"
        try:
            finite = math.isfinite(float(node.this))
        except ValueError:
            finite = False
        if not finite:
            analyzer.reject(node, f"{node.sql()!r} inside {what} is not a finite number")
        return exp.Literal.number(node.this), NUMBER
    if isinstance(node, exp.Neg):
        inner = _number_operand(analyzer, node.this, what)
        return exp.Neg(this=inner), NUMBER
    if isinstance(node, _ARITHMETIC):
        left = _number_operand(analyzer, node.this, what)
        right = _number_operand(analyzer, node.expression, what)
        if isinstance(node, exp.Div) and not _nonzero_number(right):
            analyzer.reject(node, f"inside {what}, divide by a non-zero number only")
        return type(node)(this=left, expression=right), NUMBER
    if isinstance(node, exp.Case):
        if node.this is not None:
            analyzer.reject(node, "write CASE WHEN condition THEN ..., not CASE value WHEN")
        branches = []
        kinds: set[str] = set()
        for branch in node.args.get("ifs") or []:
            value, kind = _argument(analyzer, branch.args["true"], what)
            kinds.add(kind)
            branches.append(exp.If(this=analyzer.predicate(branch.this), true=value))
        default = node.args.get("default")
        emitted = exp.Case(ifs=branches)
        if default is not None and not isinstance(default, exp.Null):
            value, kind = _argument(analyzer, default, what)
            kinds.add(kind)
            emitted.set("default", value)
        if len(kinds) > 1:
            analyzer.reject(
                node,
                f"the values of a CASE inside {what} must all be numbers or all of one type, "
                f"got {', '.join(sorted(k.lower() for k in kinds))}",
            )
        return emitted, kinds.pop() if kinds else NUMBER
    analyzer.reject(
        node,
        f"{node.sql()!r} is not supported inside {what}: use columns, numbers, + - * and / by a "
        "number, and CASE WHEN condition THEN ... END (or FILTER (WHERE ...))",
    )
    raise AssertionError


def _number_operand(analyzer: Analyzer, node: exp.Expression, what: str) -> exp.Expression:
    """An operand of arithmetic: it must be a number (refused before the charge otherwise, so
    that no conversion of a string or date can fail on some rows after it)."""
    emitted, kind = _argument(analyzer, node, what)
    if kind != NUMBER:
        analyzer.reject(
            node,
            f"arithmetic inside {what} takes numbers and numeric or BOOLEAN columns; "
            f"{node.sql()!r} is {kind}",
        )
    return emitted


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
    """``node`` as the database runs it: every number in a value is a DOUBLE (numeric columns
    clamped to their bounds when they have them, NULL and NaN as NULL; booleans as 0/1; numeric
    literals as DOUBLE literals), so no arithmetic can overflow or fail on any row (DOUBLE
    arithmetic saturates to infinities); CASE conditions are left as written (they compare
    columns with literals of their own type)."""
    node = exp.Paren(this=node.copy())  # a root of its own, so that ``node`` itself is replaced
    for literal in list(node.find_all(exp.Literal)):
        if literal.is_string or in_condition(literal):
            continue
        value = repr(float(literal.this))
        literal.replace(exp.maybe_parse(f"CAST({value} AS DOUBLE)", dialect="duckdb"))
    for column in list(node.find_all(exp.Column)):
        if in_condition(column):
            continue
        kind = kinds.get(column.name)
        if kind is None or not (kind.numeric or kind is ColumnKind.BOOLEAN):
            continue
        name = column.sql(dialect="duckdb")
        value = f"CAST({name} AS DOUBLE)"
        interval = bounds.get(column.name) if kind.numeric else None
        if interval is None:
            column.replace(exp.maybe_parse(value, dialect="duckdb"))
            continue
        low, high = (repr(float(v)) for v in interval)
        # LEAST and GREATEST skip NULLs (in DuckDB and Spark alike): without the IS NULL test a
        # missing value would read as the lower bound.
        text = (
            f"(CASE WHEN {value} IS NULL OR ISNAN({value}) THEN NULL "
            f"ELSE LEAST(GREATEST({value}, {low}), {high}) END)"
        )
        column.replace(exp.maybe_parse(text, dialect="duckdb"))
    return node.this


def in_condition(node: exp.Expression) -> bool:
    """Whether ``node`` sits in a CASE condition (the WHEN part), not in a value."""
    child: exp.Expression = node
    parent = node.parent
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
    """What EXPLAIN adds for expressions and post-processing: each virtual column (an expression
    inside an aggregate, or a grouping expression) as the database runs it, and the
    post-processing."""
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


MAX_MULTIPLIER = 2**31
"""Largest |m| of a bin ``FLOOR(col / w) * m``: keys stay far inside a BIGINT."""


@dataclass(frozen=True)
class Bin:
    """``FLOOR(column / width) * multiplier``, a GROUP BY key over a bounded numeric column."""

    column: str
    width: float
    multiplier: int


def bin_of(node: exp.Expression) -> Bin | None:
    """``FLOOR(col / w) * m`` (or ``m * FLOOR(col / w)``, or ``FLOOR(col / w)``) as a ``Bin``;
    None for any other shape (or a width that is not a positive finite number, or a multiplier
    that is not an integer of at most ``MAX_MULTIPLIER``)."""
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
    if abs(multiplier_value) > MAX_MULTIPLIER:
        return None
    return Bin(inner.this.name, width, int(multiplier_value))


def _number(node: exp.Expression) -> float | None:
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if isinstance(inner, exp.Literal) and not inner.is_string:
        try:
            value = float(inner.this)
        except ValueError:
            return None
        return -value if negative else value
    return None


def group_key(analyzer: Analyzer, node: exp.Expression) -> str:
    """A GROUP BY expression whose domain is public, as a virtual key column: bins
    ``FLOOR(col / w) * m`` of a bounded numeric column (w > 0, m an integer), calendar keys of a
    bounded DATE or TIMESTAMP column (``dpsql.sql.calendar``), or a condition (TRUE/FALSE). Its
    domain is enumerated by the database over the declared bounds before the query is priced
    (``bin_domain``, ``dpsql.engine.calendars``), one key per distinct value."""
    text = normalized(node)
    if text in analyzer.group_expressions:
        return analyzer.group_expressions[text]
    found = bin_of(node)
    key = calendar.calendar_of(node)
    if key is not None:
        column = node.find(exp.Column)
        assert column is not None
        name = analyzer.column(column)
        kind, type_name = analyzer.kind(name), analyzer.columns[name]
        if kind not in (ColumnKind.DATE, ColumnKind.TIMESTAMP) or calendar.zoned(type_name):
            analyzer.reject(
                column,
                f"{key.text} groups a DATE or TIMESTAMP column (without time zone); {name!r} is "
                f"{type_name}",
            )
        emitted = calendar.emitted(replace(key, column=name), type_name)
    elif found is not None:
        column = node.find(exp.Column)
        assert column is not None
        name = analyzer.column(column)
        if not analyzer.kind(name).numeric:
            analyzer.reject(column, f"bins need a numeric column; {name!r} is not")
        emitted: exp.Expression = exp.Mul(
            this=exp.Floor(
                this=exp.Div(
                    this=exp.column(name, quoted=True),
                    expression=exp.Literal.number(repr(found.width)),
                )
            ),
            expression=exp.Literal.number(found.multiplier),
        )
    elif isinstance(node, _CONDITIONS):
        emitted = exp.Paren(this=analyzer.predicate(node))
    else:
        analyzer.reject(
            node,
            "GROUP BY takes columns, bins FLOOR(column / width) * m of a column with declared "
            f"bounds (width > 0, m an integer within +-{MAX_MULTIPLIER}), calendar keys "
            "(date_trunc to a year, quarter, month, week or day; EXTRACT of the year, quarter, "
            "month, dow or hour) of a DATE or TIMESTAMP column with declared bounds, or "
            "conditions such as column >= 13",
        )
        raise AssertionError
    name = f"{KEY_PREFIX}{sum(k.startswith(KEY_PREFIX) for k in analyzer.virtual)}"
    analyzer.virtual[name] = emitted
    analyzer.group_expressions[text] = name
    return name


def key_types(virtual: Mapping[str, exp.Expression]) -> dict[str, str]:
    """The database type of each virtual key column: BIGINT for bins, a calendar key's type
    (``dpsql.sql.calendar.key_type``), BOOLEAN for conditions."""
    return {
        name: calendar.key_type(expression)
        or ("BIGINT" if bin_of(expression) is not None else "BOOLEAN")
        for name, expression in virtual.items()
        if name.startswith(KEY_PREFIX)
    }


def _bin_index(value: str, found: Bin) -> str:
    """SQL of the bin index ``FLOOR(value / width)`` as a BIGINT (``value`` a DOUBLE)."""
    return f"CAST(FLOOR({value} / {found.width!r}) AS BIGINT)"


def bin_run(found: Bin, interval: Interval, kinds: Mapping[str, ColumnKind]) -> exp.Expression:
    """The expression the database runs for a bin on each row: the column clamped to its bounds
    as a DOUBLE (NaN as NULL), its bin index, times the multiplier. Division by a positive width
    and FLOOR are monotone, so every row's index lies between the indices of the two bounds,
    which ``bin_domain`` enumerates."""
    value = clamped(exp.column(found.column, quoted=True), {found.column: interval}, kinds)
    text = f"{_bin_index(value.sql(dialect='duckdb'), found)} * {found.multiplier}"
    return exp.maybe_parse(text, dialect="duckdb")


def bin_ends_sql(found: Bin, interval: Interval) -> str:
    """SQL of one row: the bin indices of the two declared bounds, as the database computes
    them (a failure here, e.g. an index beyond a BIGINT, refuses the query before the charge)."""
    low, high = (f"CAST({float(v)!r} AS DOUBLE)" for v in interval)
    return f"SELECT {_bin_index(low, found)}, {_bin_index(high, found)}"


def bin_domain_sql(found: Bin, first: int, last: int) -> str:
    """SQL listing the distinct values the database gives ``index * multiplier`` for every bin
    index from ``first`` to ``last``, as it prints them: the bin's key domain, one row per key,
    in order (a multiplier of 0 gives one key, not one per bin)."""
    value = f"CAST(__k AS BIGINT) * {found.multiplier}"
    return (
        f"SELECT DISTINCT CAST({value} AS VARCHAR) AS __key, {value} AS __value "
        f"FROM range({int(first)}, {int(last) + 1}) AS __bins(__k) ORDER BY __value"
    )
