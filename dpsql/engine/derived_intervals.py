"""Intervals for columns computed from released values: ratios, rates, differences, windows.

A post-processed column is a function ``f`` of released noisy values (``dpsql.engine.derived``).
Its interval must cover ``f`` of the *true* (bounded) values with the answer's confidence ``c``;
it is derived from the noise laws of the released components (``dpsql.engine.noise_laws``) and
the released values alone, never from the data. Each column says which kind it got
(``details["intervals"]``):

- **exact** — the law of the column's noise is known: a monotone function of one released value
  (the image of its interval, same level), or a linear combination ``Σ w_i x_i + constant`` of
  discrete-Laplace values (sums, differences, ``COUNT(*) - LAG(COUNT(*)) OVER (...)``, products
  with constants): the value ± the ``c`` quantile of ``|Σ w_i X_i|``, exact for two noises.
- **approximate** — a linear combination of three or more noises: that quantile simulated from
  the noise laws, with a stated Monte Carlo error (``noise_laws.MONTE_CARLO_FAILURE``).
- **conservative** — anything else this module can bound (ratios, rates, products, STDDEV and
  VARIANCE from the released moments, windows over the released rows): each of the ``k`` released
  cells the column reads gets its interval at level ``1 - (1 - c) / k``, so all hold at once with
  probability at least ``c`` (a union bound), and interval arithmetic maps that box to an interval
  that contains ``f`` of every point of it. Arithmetic is monotone in each end (a division by an
  interval that contains 0 is unbounded, shown as a missing end), CASE is decided on the box (a
  branch that may or may not be taken joins the intervals of both), and windows must be ordered
  and partitioned by public keys (the released order of noisy values is no fact about the truth).

The bounds run in the post-processing sandbox in the same query as the values, so a window sees
the same rows in the same order. A column none of this bounds gets no interval, and says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import sqlglot
from sqlglot import exp

from dpsql.engine.noise_laws import DiscreteLaplaceLaw, combination_half_width

__all__ = ["ColumnInterval", "IntervalPlan", "plan_intervals"]


_POSITIONAL = (exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue, exp.NthValue)
_WINDOW_AGGREGATES = (exp.Sum, exp.Avg, exp.Min, exp.Max)
_MOST_BRANCHES = 4
"""CASE branches bounded (each undecided branch doubles the bound's SQL)."""


class _NoInterval(Exception):
    """Why a column gets no interval."""


@dataclass(frozen=True)
class ColumnInterval:
    """How one output column's interval is computed: ``kind`` exact / conservative /
    approximate, in words ``method``; ``half_width`` (value ± it) or ``ends`` (the SQL of the
    two ends, over the extra columns ``levels`` asks for: component -> level)."""

    name: str
    kind: str
    method: str
    half_width: float | None = None
    ends: tuple[str, str] | None = None
    levels: dict[str, float] = field(default_factory=dict)
    image_of: str | None = None
    """The one component whose interval this is the image of (its caveats carry over)."""
    stages: tuple[tuple[int, str, str], ...] = ()
    """(depth, column name, SQL) of the intermediate ends ``ends`` names."""

    def describe(self, confidence: float) -> dict[str, Any]:
        return {"kind": self.kind, "method": self.method, "confidence": confidence}


@dataclass(frozen=True)
class IntervalPlan:
    """Every derived column's interval (``columns``) and why the others have none
    (``missing``: name -> reason)."""

    columns: tuple[ColumnInterval, ...]
    missing: dict[str, str]

    def extra_columns(self) -> dict[str, tuple[str, float]]:
        """Name of each extra column of the released table -> (component, level); its values
        are the component's low (``__dp_lo``) or high (``__dp_hi``) end at that level."""
        extra: dict[str, tuple[str, float]] = {}
        for index, column in enumerate(self.columns):
            for component, level in column.levels.items():
                extra[_end_name("lo", index, component)] = (component, level)
                extra[_end_name("hi", index, component)] = (component, level)
        return extra


def _end_name(side: str, index: int, component: str) -> str:
    return f"__dp_{side}{index}_{component}"


def _quoted(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _sql(node: exp.Expression) -> str:
    return node.sql(dialect="duckdb")


def _guarded(function: str, values: list[str]) -> str:
    """``function`` (LEAST or GREATEST) of ``values``, NULL (unbounded) if any is NULL: DuckDB's
    own LEAST and GREATEST skip NULLs."""
    nulls = " OR ".join(f"({v}) IS NULL" for v in values)
    return f"(CASE WHEN {nulls} THEN NULL ELSE {function}({', '.join(values)}) END)"


@dataclass(frozen=True)
class _Ends:
    """The SQL of an expression's two ends: inline for a constant, else the names of columns
    computed at stage ``depth`` (0: the released table's own)."""

    low: str
    high: str
    constant: bool = False
    depth: int | None = None


class _Arithmetic:
    """Interval arithmetic over one expression of the outer query: the SQL of its two ends
    from the ends of each component (``ends(component)`` = its (low, high) column names), the
    released cells it reads (``cells``), and the stages that compute it (``stages``).

    Each operation's ends are columns of their own stage (a ``SELECT *, ...`` over the one
    before), so an end's SQL names its operands' ends instead of repeating their SQL: the text
    grows with the expression, not exponentially with its depth."""

    def __init__(
        self,
        components: set[str],
        ends: Callable[[str], tuple[str, str]],
        windows: Mapping[str, exp.Expression],
        rows: int,
        keys: set[str],
        prefix: str,
    ):
        self.components = components
        self.ends = ends
        self.windows = windows
        self.rows = rows
        self.keys = keys
        self.prefix = prefix
        self.cells: set[tuple[str, str]] = set()
        self.window_cells = 0
        self.read: set[str] = set()
        """Every component the expression reads."""
        self.stages: list[tuple[int, str, str]] = []
        """(depth, column name, SQL) of every end computed."""
        self._deepest = 0

    def uses(self, node: exp.Expression) -> bool:
        return any(c.name in self.components for c in node.find_all(exp.Column))

    def bounds(self, node: exp.Expression) -> _Ends:
        if not self.uses(node):
            text = f"({_sql(node)})"
            return _Ends(text, text, constant=True)
        handler = getattr(self, f"_{type(node).__name__.lower()}", None)
        if handler is None:
            raise _NoInterval(f"{_sql(node)} is not a function dpsql bounds")
        outside, self._deepest = self._deepest, 0
        try:
            ends = handler(node)
            if ends.depth is None:
                ends = self.stage(ends, self._deepest + 1)
        finally:
            self._deepest = max(outside, self._deepest)
        self._deepest = max(self._deepest, ends.depth or 0)
        return ends

    def stage(self, ends: _Ends, depth: int) -> _Ends:
        """``ends`` computed as two columns at stage ``depth``."""
        names = [f"{self.prefix}{len(self.stages)}", f"{self.prefix}{len(self.stages) + 1}"]
        self.stages += [(depth, names[0], ends.low), (depth, names[1], ends.high)]
        return _Ends(_quoted(names[0]), _quoted(names[1]), depth=depth)

    # columns and arithmetic ---------------------------------------------------------------------
    def _column(self, node: exp.Column) -> _Ends:
        self.cells.add((node.name, ""))
        self.read.add(node.name)
        low, high = self.ends(node.name)
        return _Ends(_quoted(low), _quoted(high), depth=0)

    def _paren(self, node: exp.Paren) -> _Ends:
        return self.bounds(node.this)

    def _neg(self, node: exp.Neg) -> _Ends:
        inner = self.bounds(node.this)
        return _Ends(f"(-{inner.high})", f"(-{inner.low})")

    def _add(self, node: exp.Add) -> _Ends:
        a, b = self.bounds(node.this), self.bounds(node.expression)
        return _Ends(f"({a.low} + {b.low})", f"({a.high} + {b.high})")

    def _sub(self, node: exp.Sub) -> _Ends:
        a, b = self.bounds(node.this), self.bounds(node.expression)
        return _Ends(f"({a.low} - {b.high})", f"({a.high} - {b.low})")

    def _mul(self, node: exp.Mul) -> _Ends:
        if _sql(node.this) == _sql(node.expression):
            a = self.bounds(node.this)  # a square: never below 0
            low = (
                f"(CASE WHEN {a.low} >= 0 THEN {a.low} * {a.low} WHEN {a.high} <= 0 "
                f"THEN {a.high} * {a.high} WHEN {a.low} IS NULL OR {a.high} IS NULL THEN NULL "
                "ELSE 0 END)"
            )
            return _Ends(low, _guarded("GREATEST", [f"{a.low} * {a.low}", f"{a.high} * {a.high}"]))
        a, b = self.bounds(node.this), self.bounds(node.expression)
        corners = [f"{x} * {y}" for x in _sides(a) for y in _sides(b)]
        return _Ends(_guarded("LEAST", corners), _guarded("GREATEST", corners))

    def _div(self, node: exp.Div) -> _Ends:
        if node.args.get("typed"):
            raise _NoInterval(f"{_sql(node)} is an integer division")
        a, b = self.bounds(node.this), self.bounds(node.expression)
        corners = [f"{x} / {y}" for x in _sides(a) for y in _sides(b)]
        apart = f"({b.low} > 0 OR {b.high} < 0)"
        return _Ends(
            f"(CASE WHEN {apart} THEN {_guarded('LEAST', corners)} END)",
            f"(CASE WHEN {apart} THEN {_guarded('GREATEST', corners)} END)",
        )

    _safedivide = _div

    # functions ----------------------------------------------------------------------------------
    def _monotone(self, node: exp.Expression) -> _Ends:
        if any(
            self.uses(v)
            for k, v in node.args.items()
            if k != "this" and isinstance(v, exp.Expression)
        ):
            raise _NoInterval(f"{_sql(node)}: only its first argument may be a released value")
        inner = self.bounds(node.this)
        return _Ends(*(_replaced(node, end) for end in (inner.low, inner.high)))

    _round = _floor = _ceil = _sign = _monotone

    def _cast(self, node: exp.Cast) -> _Ends:
        if not node.to.is_type(*exp.DataType.NUMERIC_TYPES):
            raise _NoInterval(f"{_sql(node)} is not a cast to a number")
        return self._monotone(node)

    _trycast = _cast

    def _abs(self, node: exp.Abs) -> _Ends:
        a = self.bounds(node.this)
        low = (
            f"(CASE WHEN {a.low} >= 0 THEN {a.low} WHEN {a.high} <= 0 THEN -{a.high} "
            f"WHEN {a.low} IS NULL OR {a.high} IS NULL THEN NULL ELSE 0 END)"
        )
        return _Ends(low, _guarded("GREATEST", [f"-{a.low}", f"{a.high}"]))

    def _sqrt(self, node: exp.Sqrt) -> _Ends:
        a = self.bounds(node.this)
        # GREATEST skips a NULL (unbounded) low end: sqrt's low end is then 0, as it should.
        return _Ends(
            f"SQRT(GREATEST({a.low}, 0))", f"(CASE WHEN {a.high} >= 0 THEN SQRT({a.high}) END)"
        )

    def _exp(self, node: exp.Exp) -> _Ends:
        a = self.bounds(node.this)
        return _Ends(f"COALESCE(EXP({a.low}), 0)", f"EXP({a.high})")

    def _ln(self, node: exp.Expression) -> _Ends:
        a = self.bounds(node.this)
        return _Ends(
            f"(CASE WHEN {a.low} > 0 THEN {_replaced(node, a.low)} END)",
            f"(CASE WHEN {a.high} > 0 THEN {_replaced(node, a.high)} END)",
        )

    def _log(self, node: exp.Log) -> _Ends:
        if node.expression is not None:
            raise _NoInterval(f"{_sql(node)}: a logarithm with a base is not bounded")
        return self._ln(node)

    def _pow(self, node: exp.Pow) -> _Ends:
        if self.uses(node.expression):
            raise _NoInterval(f"{_sql(node)}: the exponent must not be a released value")
        a = self.bounds(node.this)
        power = f"({_sql(node.expression)})"
        corners = [f"POW({a.low}, {power})", f"POW({a.high}, {power})"]
        positive = f"{a.low} > 0"
        return _Ends(
            f"(CASE WHEN {positive} THEN {_guarded('LEAST', corners)} END)",
            f"(CASE WHEN {positive} THEN {_guarded('GREATEST', corners)} END)",
        )

    def _extremes(self, node: exp.Expression, function: str) -> _Ends:
        parts = [self.bounds(v) for v in [node.this, *node.expressions]]
        lows, highs = [p.low for p in parts], [p.high for p in parts]
        # An unbounded (NULL) low end of GREATEST's argument does not lower it, nor a high end
        # of LEAST's raise it: DuckDB's skipping of NULLs is right there, and wrong on the
        # other side.
        if function == "GREATEST":
            return _Ends(f"GREATEST({', '.join(lows)})", _guarded("GREATEST", highs))
        return _Ends(_guarded("LEAST", lows), f"LEAST({', '.join(highs)})")

    def _greatest(self, node: exp.Greatest) -> _Ends:
        return self._extremes(node, "GREATEST")

    def _least(self, node: exp.Least) -> _Ends:
        return self._extremes(node, "LEAST")

    # CASE ---------------------------------------------------------------------------------------
    def _case(self, node: exp.Case) -> _Ends:
        operand = node.this
        branches = []
        for branch in node.args.get("ifs") or []:
            condition = branch.this
            if operand is not None:
                condition = exp.EQ(this=operand.copy(), expression=condition.copy())
            branches.append((condition, branch.args["true"]))
        if len(branches) > _MOST_BRANCHES:
            raise _NoInterval(f"a CASE of more than {_MOST_BRANCHES} branches is not bounded")
        return self._branches(branches, node.args.get("default"))

    def _if(self, node: exp.If) -> _Ends:
        return self._branches([(node.this, node.args["true"])], node.args.get("false"))

    def _branches(
        self, branches: list[tuple[exp.Expression, exp.Expression]], default: exp.Expression | None
    ) -> _Ends:
        if not branches:
            if default is None or isinstance(default, exp.Null):
                return _Ends("NULL", "NULL")  # the true value may be NULL: no interval
            return self.bounds(default)
        (condition, value), rest = branches[0], branches[1:]
        true, false = self.truth(condition)
        taken, other = self.bounds(value), self._branches(rest, default)
        low = _guarded("LEAST", [taken.low, other.low])
        high = _guarded("GREATEST", [taken.high, other.high])
        return _Ends(
            f"(CASE WHEN {true} THEN {taken.low} WHEN {false} THEN {other.low} ELSE {low} END)",
            f"(CASE WHEN {true} THEN {taken.high} WHEN {false} THEN {other.high} "
            f"ELSE {high} END)",
        )

    def truth(self, node: exp.Expression) -> tuple[str, str]:
        """SQL of "``node`` holds for every point of the box" and of "for none"."""
        if not self.uses(node):
            text = f"COALESCE(({_sql(node)}), FALSE)"
            return text, f"(NOT {text})"
        if isinstance(node, exp.Paren):
            return self.truth(node.this)
        if isinstance(node, exp.Not):
            true, false = self.truth(node.this)
            return false, true
        if isinstance(node, (exp.And, exp.Or)):
            (t1, f1), (t2, f2) = self.truth(node.this), self.truth(node.expression)
            if isinstance(node, exp.And):
                return f"({t1} AND {t2})", f"({f1} OR {f2})"
            return f"({t1} OR {t2})", f"({f1} AND {f2})"
        if isinstance(node, exp.Between):
            low = exp.GTE(this=node.this.copy(), expression=node.args["low"].copy())
            high = exp.LTE(this=node.this.copy(), expression=node.args["high"].copy())
            return self.truth(exp.And(this=low, expression=high))
        comparisons = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
        if type(node) in comparisons or isinstance(node, (exp.EQ, exp.NEQ)):
            a, b = self.bounds(node.this), self.bounds(node.expression)
            if isinstance(node, (exp.LT, exp.LTE)):
                a, b = b, a  # a < b is b > a
            if isinstance(node, (exp.GT, exp.LT)):
                true, false = f"{a.low} > {b.high}", f"{a.high} <= {b.low}"
            elif isinstance(node, (exp.GTE, exp.LTE)):
                true, false = f"{a.low} >= {b.high}", f"{a.high} < {b.low}"
            else:
                true = f"({a.low} = {a.high} AND {b.low} = {b.high} AND {a.low} = {b.low})"
                false = f"({a.high} < {b.low} OR {a.low} > {b.high})"
                if isinstance(node, exp.NEQ):
                    true, false = false, true
            return f"COALESCE({true}, FALSE)", f"COALESCE({false}, FALSE)"
        raise _NoInterval(f"the condition {_sql(node)} is not one dpsql decides on intervals")

    # windows over the released rows ---------------------------------------------------------------
    def _window(self, node: exp.Window) -> _Ends:
        specs = [node] + ([self.windows.get(node.alias)] if node.alias else [])
        if any(spec is None for spec in specs) or any(
            self.uses(part)
            for spec in specs
            for part in (spec.args.get("partition_by") or []) + [spec.args.get("order")]
            if part is not None
        ):
            raise _NoInterval(
                "a window ordered or partitioned by a released value: the released order of "
                "noisy values says nothing about the order of the true ones"
            )
        function = node.this
        over = _over(node)
        if isinstance(function, exp.IgnoreNulls | exp.RespectNulls):
            raise _NoInterval(f"{_sql(node)}: IGNORE NULLS is not bounded")
        rows_frame = any(
            isinstance(spec.args.get("spec"), exp.WindowSpec)
            and str(spec.args["spec"].args.get("kind", "")).upper() == "ROWS"
            for spec in specs
        )
        ordered = {
            c.name
            for spec in specs
            for part in (spec.args.get("partition_by") or []) + [spec.args.get("order")]
            if part is not None
            for c in part.find_all(exp.Column)
        }
        if (isinstance(function, _POSITIONAL) or rows_frame) and not self.keys <= ordered:
            raise _NoInterval(
                f"{_sql(node)}: its order may tie released rows (order or partition by every "
                "group column), so which row it reads is not fixed"
            )
        if isinstance(function, _POSITIONAL):
            if any(
                self.uses(v)
                for k, v in function.args.items()
                if k != "this" and isinstance(v, exp.Expression)
            ):
                raise _NoInterval(f"{_sql(function)}: its offset must be a constant")
            inner, read = self.apart(function.this)
            self.cells |= {(c, f"{_sql(function)} {over}") for c in read}
            return _Ends(
                f"{_replaced(function, inner.low)} {over}",
                f"{_replaced(function, inner.high)} {over}",
            )
        if isinstance(function, _WINDOW_AGGREGATES):
            inner, read = self.apart(function.this)
            self.window_cells += self.rows * len(read)
            value = _sql(function.this)
            complete = (
                f"COUNT({value}) {over} = COUNT({inner.low}) {over} AND "
                f"COUNT({value}) {over} = COUNT({inner.high}) {over}"
            )
            return _Ends(
                f"(CASE WHEN {complete} THEN {_replaced(function, inner.low)} {over} END)",
                f"(CASE WHEN {complete} THEN {_replaced(function, inner.high)} {over} END)",
            )
        raise _NoInterval(f"{_sql(function)} over released values is not bounded")

    def apart(self, node: exp.Expression) -> tuple[_Ends, set[str]]:
        """``node``'s ends inside a window function, and the components it reads (the cells
        are other rows': the window counts them)."""
        saved, self.cells = self.cells, set()
        try:
            ends = self.bounds(node)
            return ends, {c for c, _ in self.cells}
        finally:
            self.cells = saved

    @property
    def count(self) -> int:
        """The released cells the expression reads, as a union bound counts them."""
        return len(self.cells) + self.window_cells


def _has_spec(node: exp.Window) -> bool:
    return any(node.args.get(k) for k in ("partition_by", "order", "spec"))


def _sides(ends: _Ends) -> list[str]:
    return [ends.low] if ends.constant else [ends.low, ends.high]


def _replaced(node: exp.Expression, text: str) -> str:
    """``node``'s SQL with its first argument replaced by the SQL ``text``."""
    copy = node.copy()
    copy.set("this", exp.column("__dp_placeholder"))
    return _sql(copy).replace('"__dp_placeholder"', text).replace("__dp_placeholder", text)


def _over(node: exp.Window) -> str:
    """``OVER (...)`` of a window function, as DuckDB spells it."""
    copy = node.copy()
    copy.set("this", exp.column("__dp_placeholder"))
    text = _sql(copy)
    return text[text.index("__dp_placeholder") + len("__dp_placeholder") :].lstrip('" ')


# linear combinations ---------------------------------------------------------------------------
def _literal(node: exp.Expression) -> Fraction | None:
    """A numeric literal's exact value (through parentheses and minus), else None."""
    if isinstance(node, exp.Paren):
        return _literal(node.this)
    if isinstance(node, exp.Neg):
        inner = _literal(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return Fraction(node.this)
        except (ValueError, ZeroDivisionError):
            return None
    return None


class _Linear:
    """``Σ w_i x_i + constant``: the weight of each released cell (component, position), or
    None when the expression is not such a combination with literal weights."""

    def __init__(self, components: set[str]):
        self.components = components
        self.window: str | None = None

    def uses(self, node: exp.Expression) -> bool:
        return any(c.name in self.components for c in node.find_all(exp.Column))

    def weights(self, node: exp.Expression, position: str = "") -> dict[tuple[str, str], Fraction]:
        if not self.uses(node):
            return {}
        if isinstance(node, exp.Column):
            return {(node.name, position): Fraction(1)}
        if isinstance(node, exp.Paren):
            return self.weights(node.this, position)
        if isinstance(node, exp.Neg):
            return {k: -w for k, w in self.weights(node.this, position).items()}
        if isinstance(node, (exp.Add, exp.Sub)):
            sign = 1 if isinstance(node, exp.Add) else -1
            total = dict(self.weights(node.this, position))
            for key, weight in self.weights(node.expression, position).items():
                total[key] = total.get(key, Fraction(0)) + sign * weight
            return total
        if isinstance(node, exp.Mul):
            for factor, other in ((node.this, node.expression), (node.expression, node.this)):
                value = _literal(factor)
                if value is not None:
                    return {k: w * value for k, w in self.weights(other, position).items()}
            raise _NoInterval("not linear")
        if isinstance(node, exp.Div):
            value = _literal(node.expression)
            if value:
                return {k: w / value for k, w in self.weights(node.this, position).items()}
            raise _NoInterval("not linear")
        if isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.DOUBLE):
            return self.weights(node.this, position)
        if isinstance(node, exp.Window) and isinstance(node.this, (exp.Lag, exp.Lead)):
            return self.shifted(node, position)
        raise _NoInterval("not linear")

    def shifted(self, node: exp.Window, position: str) -> dict[tuple[str, str], Fraction]:
        """LAG/LEAD(x, k) over one window for all of them, without a default: the cell ``k``
        rows away (a different row, so independent noise)."""
        function = node.this
        offset = _literal(function.args["offset"]) if function.args.get("offset") else 1
        over = _over(node)
        if (
            position
            or function.args.get("default") is not None
            or offset is None
            or offset.denominator != 1
            or offset <= 0
            or (node.alias and not _has_spec(node))
            or (self.window is not None and self.window != over)
        ):
            raise _NoInterval("not linear")
        self.window = over
        sign = -1 if isinstance(function, exp.Lag) else 1
        return self.weights(function.this, str(sign * int(offset)))


# the plan ---------------------------------------------------------------------------------------
def plan_intervals(
    outer: exp.Select,
    names: list[str],
    components: set[str],
    laws: Mapping[str, Any],
    kinds: Mapping[str, str],
    exact: set[str],
    rows: int,
    level: float,
    wanted: set[str],
    keys: set[str],
) -> IntervalPlan:
    """The interval of each of ``names`` (items of the outer query ``outer``, in order) that is
    computed from the released ``components``; ``laws`` maps a component to its noise law
    (``dpsql.engine.noise_laws``; absent: its released interval at ``level`` is all that is
    known), ``kinds`` to its interval's kind; ``exact`` names the columns that are a monotone
    function of one released value; ``rows`` is the number of released rows; only the columns
    ``wanted`` (those derived, not copied) are planned; ``keys`` are the released group columns."""
    windows = {w.alias: w for w in outer.args.get("windows") or []}
    planned: list[ColumnInterval] = []
    missing: dict[str, str] = {}
    for item, name in zip(outer.expressions, names, strict=False):
        body = item.this if isinstance(item, exp.Alias) else item
        if name not in wanted or not any(c.name in components for c in body.find_all(exp.Column)):
            continue  # a group key or an expression of keys: no noise
        index = len(planned)
        try:
            planned.append(
                _plan_column(
                    body,
                    name,
                    index,
                    components,
                    laws,
                    kinds,
                    name in exact,
                    windows,
                    rows,
                    level,
                    keys,
                )
            )
        except _NoInterval as reason:
            missing[name] = str(reason)
    return IntervalPlan(tuple(planned), missing)


def _plan_column(
    body: exp.Expression,
    name: str,
    index: int,
    components: set[str],
    laws: Mapping[str, Any],
    kinds: Mapping[str, str],
    monotone: bool,
    windows: Mapping[str, exp.Expression],
    rows: int,
    level: float,
    keys: set[str],
) -> ColumnInterval:
    linear = None if monotone else _linear_interval(body, name, components, laws, level)
    if linear is not None:
        return linear
    arithmetic = _Arithmetic(
        components,
        lambda c: (_end_name("lo", index, c), _end_name("hi", index, c)),
        windows,
        rows,
        keys,
        f"__dp_s{index}_",
    )
    ends = arithmetic.bounds(body)
    read = arithmetic.read
    count = arithmetic.count
    if count <= 1:
        (component,) = read
        source = kinds.get(component, "as released")
        once = sum(c.name == component for c in body.find_all(exp.Column)) == 1
        image = monotone or (once and body.find(exp.Case, exp.If) is None)
        kind = source if image else "conservative"
        method = (
            "the image of the released interval (it reads one released value once: interval "
            "arithmetic gives the exact range of the function over that interval)"
            if image
            else "interval arithmetic over the released interval"
        )
        return ColumnInterval(
            name,
            kind,
            method,
            ends=(ends.low, ends.high),
            levels={c: level for c in read},
            image_of=component if image else None,
            stages=tuple(arithmetic.stages),
        )
    lawless = sorted(c for c in read if c not in laws)
    if lawless:
        raise _NoInterval(
            f"it combines several released values, and the noise law of {', '.join(lawless)} "
            "is not one dpsql can state at another level"
        )
    cell_level = 1 - (1 - level) / count
    return ColumnInterval(
        name,
        "conservative",
        f"interval arithmetic over the {count} released cells it reads, each at level "
        f"{cell_level:.6g} (a union bound: all hold at once with the answer's confidence)",
        ends=(ends.low, ends.high),
        levels={c: cell_level for c in read},
        stages=tuple(arithmetic.stages),
    )


def _linear_interval(
    body: exp.Expression,
    name: str,
    components: set[str],
    laws: Mapping[str, Any],
    level: float,
) -> ColumnInterval | None:
    """The value ± the law of ``Σ w_i X_i`` when ``body`` is linear in discrete-Laplace cells."""
    try:
        weights = _Linear(components).weights(body)
    except _NoInterval:
        return None
    if not weights or any(not isinstance(laws.get(c), DiscreteLaplaceLaw) for c, _ in weights):
        return None
    terms = [(float(w), laws[c]) for (c, _), w in weights.items()]
    combined = combination_half_width(terms, level)
    if combined is None:
        return None
    cells = len([w for w in weights.values() if w != 0])
    return ColumnInterval(
        name,
        combined.kind,
        f"the value ± the {level:g} quantile of its noise, a linear combination of {cells} "
        f"independent discrete Laplace noise(s): {combined.method}",
        half_width=combined.half_width,
    )


def component_ends(
    extra: Mapping[str, tuple[str, float]],
    values: Mapping[str, np.ndarray],
    laws: Mapping[str, Any],
    released: Mapping[str, list[tuple[Any, Any]]],
    level: float,
) -> dict[str, list[Any]]:
    """The values of each extra column (``IntervalPlan.extra_columns``): a component's end at
    the level asked, from its law, or its released interval at the answer's ``level``."""
    columns: dict[str, list[Any]] = {}
    for name, (component, at) in extra.items():
        side = 0 if name.startswith("__dp_lo") else 1
        law = laws.get(component)
        if law is not None and at != level:
            array = np.asarray(values[component], dtype=np.float64)
            ends = law.intervals(array, at)
            columns[name] = [float(v) for v in ends[side]]
        else:
            pairs = released.get(component) or [(None, None)] * len(values[component])
            columns[name] = [None if p[side] is None else float(p[side]) for p in pairs]
    return columns


def parse_outer(text: str) -> exp.Select:
    """The outer query (DuckDB SQL) as a tree."""
    parsed = sqlglot.parse_one(text, dialect="duckdb")
    assert isinstance(parsed, exp.Select)
    return parsed
