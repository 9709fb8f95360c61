"""Moments written in released sums: VAR/STDDEV of one column, CORR, COVAR_POP, COVAR_SAMP,
REGR_SLOPE and REGR_INTERCEPT of two.

Post-processing (``dpsql.sql.postprocess``) replaces each such aggregate by an expression over
plain DP aggregates that dpsql releases with noise, and computes the statistic from the noisy
values: nothing more is paid than for those aggregates (Dwork and Roth, *The Algorithmic
Foundations of Differential Privacy*, Proposition 2.1).

A two-column statistic reads the rows where both columns are present, as the database's own
aggregate does, through these components (``x + 0 * y`` is x where y is present, NULL where it is
not; NaN reads as NULL, ``dpsql.sql.expressions.clamped``):

========  ======================  ======================================================
role      aggregate               per-row bound (from the declared bounds, interval arithmetic)
========  ======================  ======================================================
n         ``COUNT(x * y)``        1
sx        ``SUM(x + 0 * y)``      max(|x|) over x's bounds
sy        ``SUM(y + 0 * x)``      max(|y|)
sxy       ``SUM(x * y)``          max(|x * y|) over the box of both bounds
sxx       ``SUM(x * x + 0 * y)``  max(x^2)
syy       ``SUM(y * y + 0 * x)``  max(y^2)
========  ======================  ======================================================

With ``c = sxy - sx sy / n``, ``vx = sxx - sx^2 / n``, ``vy = syy - sy^2 / n``:
``COVAR_POP = c / n``, ``COVAR_SAMP = c / (n - 1)``, ``CORR = c / sqrt(vx vy)`` clipped to
[-1, 1], ``REGR_SLOPE(y, x) = c / vx``, ``REGR_INTERCEPT(y, x) = (sy - REGR_SLOPE sx) / n``; NULL
where the noisy count or a noisy variance leaves the statistic undefined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

__all__ = [
    "BIVARIATE", "INTERVAL", "ROLES", "Moment", "bivariate", "components", "components_of",
    "rewritten",
]

BIVARIATE: dict[type[exp.Expression], str] = {
    exp.Corr: "corr",
    exp.CovarPop: "covar_pop",
    exp.CovarSamp: "covar_samp",
    exp.RegrSlope: "regr_slope",
    exp.RegrIntercept: "regr_intercept",
}
"""The two-column statistics, by sqlglot node."""

ROLES: dict[str, tuple[str, ...]] = {
    "covar_pop": ("n", "sx", "sy", "sxy"),
    "covar_samp": ("n", "sx", "sy", "sxy"),
    "corr": ("n", "sx", "sy", "sxy", "sxx", "syy"),
    "regr_slope": ("n", "sx", "sy", "sxy", "sxx"),
    "regr_intercept": ("n", "sx", "sy", "sxy", "sxx"),
}
"""The released components each statistic reads."""

INTERVAL = (
    "conservative: interval arithmetic on its components' intervals, each at confidence "
    "1 - (1 - c) / k for its k components (a union bound)"
)
"""How a two-column statistic's interval is made (``dpsql.engine.moments``)."""

_SAMPLE = (exp.Variance, exp.Stddev, exp.StddevSamp)
_POPULATION = (exp.VariancePop, exp.StddevPop)
_ROOTS = (exp.Stddev, exp.StddevSamp, exp.StddevPop)

Reject = Callable[[exp.Expression, str], None]


@dataclass(frozen=True)
class Moment:
    """A two-column statistic as written (``text``), over columns ``x`` and ``y`` (for
    ``REGR_*(y, x)``, x is the independent variable); ``released`` maps each component's role to
    the released column holding it, for a select item that is exactly the statistic."""

    statistic: str
    text: str
    x: str
    y: str
    released: dict[str, str] = field(default_factory=dict)


def bivariate(node: exp.Expression) -> Moment | None:
    """``node`` as a ``Moment`` if it is one of the two-column statistics over two columns (None
    otherwise, or inside a window: a window runs over the released rows)."""
    statistic = BIVARIATE.get(type(node))
    if statistic is None or isinstance(node.parent, exp.Window):
        return None
    first, second = node.this, node.expression
    if not isinstance(first, exp.Column) or not isinstance(second, exp.Column):
        return None
    x, y = (second, first) if statistic.startswith("regr_") else (first, second)
    return Moment(statistic, node.sql(dialect="duckdb"), x.name, y.name)


def components(x: exp.Expression, y: exp.Expression) -> dict[str, str]:
    """Each component's aggregate over the rows where both ``x`` and ``y`` are present, as
    DuckDB SQL (see the module docstring)."""
    a, b = x.sql(dialect="duckdb"), y.sql(dialect="duckdb")
    first, second = sorted((a, b))  # CORR(x, y) and COVAR_POP(y, x) share n and sxy
    return {
        "n": f"COUNT({first} * {second})",
        "sx": f"SUM({a} + 0 * {b})",
        "sy": f"SUM({b} + 0 * {a})",
        "sxy": f"SUM({first} * {second})",
        "sxx": f"SUM({a} * {a} + 0 * {b})",
        "syy": f"SUM({b} * {b} + 0 * {a})",
    }


def components_of(node: exp.Expression) -> dict[str, str]:
    """The components ``ROLES`` names for the two-column statistic ``node`` (a ``BIVARIATE``
    node over two columns), as DuckDB SQL."""
    statistic = BIVARIATE[type(node)]
    first, second = node.this, node.expression
    x, y = (second, first) if statistic.startswith("regr_") else (first, second)
    parts = components(x, y)
    return {role: parts[role] for role in ROLES[statistic]}


def _statistic(statistic: str, parts: dict[str, str]) -> str:
    """The SQL of ``statistic`` over the component aggregates ``parts``."""
    n, sx, sy = parts["n"], parts["sx"], parts["sy"]
    c = f"({parts['sxy']} - {sx} * {sy} / {n})"
    vx = f"({parts.get('sxx')} - {sx} * {sx} / {n})"
    if statistic == "covar_pop":
        return f"CASE WHEN {n} > 0 THEN {c} / {n} END"
    if statistic == "covar_samp":
        return f"CASE WHEN {n} > 1 THEN {c} / ({n} - 1) END"
    if statistic == "corr":
        vy = f"({parts['syy']} - {sy} * {sy} / {n})"
        return (
            f"CASE WHEN {n} > 1 AND {vx} > 0 AND {vy} > 0 "
            f"THEN GREATEST(-1.0, LEAST(1.0, {c} / SQRT({vx} * {vy}))) END"
        )
    if statistic == "regr_slope":
        return f"CASE WHEN {n} > 1 AND {vx} > 0 THEN {c} / {vx} END"
    return f"CASE WHEN {n} > 1 AND {vx} > 0 THEN ({sy} - {c} / {vx} * {sx}) / {n} END"


def _univariate(found: exp.Expression) -> str:
    """VAR/STDDEV (sample or population) of ``x`` in ``COUNT(x)``, ``SUM(x)``, ``SUM(x * x)``:
    ``(S2 - S1 * S1 / n) / (n - 1)`` (``/ n`` for the population), floored at 0, NULL when the
    noisy count leaves too few rows."""
    value = found.this.sql(dialect="duckdb")
    n, s1, s2 = f"COUNT({value})", f"SUM({value})", f"SUM(({value}) * ({value}))"
    fewest, divisor = ("1", f"{n} - 1") if isinstance(found, _SAMPLE) else ("0", n)
    variance = (
        f"CASE WHEN {n} > {fewest} THEN GREATEST(({s2} - {s1} * {s1} / {n}) / ({divisor}), 0) END"
    )
    return f"SQRT({variance})" if isinstance(found, _ROOTS) else variance


def rewritten(node: exp.Expression, reject: Reject) -> exp.Expression:
    """``node`` with every moment aggregate written in released moments (see the module
    docstring); ``reject(node, message)`` refuses a two-column statistic whose arguments are not
    two columns. Moments inside a window are left alone (they run over the released rows)."""
    kinds = (*_SAMPLE, *_POPULATION, *BIVARIATE)
    for found in list(node.find_all(*kinds)):
        if isinstance(found.parent, exp.Window):
            continue
        if type(found) in BIVARIATE:
            moment = bivariate(found)
            if moment is None:
                name = found.sql(dialect="duckdb").split("(", 1)[0]
                reject(
                    found,
                    f"{name} takes two columns with declared bounds, e.g. {name}(x, y); write "
                    "an expression as a column of a view",
                )
                raise AssertionError
            text = _statistic(moment.statistic, components_of(found))
        elif found.args.get("expressions"):
            continue
        else:
            text = _univariate(found)
        replacement = exp.maybe_parse(text, dialect="duckdb")
        written = {a.name: a.meta for a in found.iter_expressions() if isinstance(a, exp.Column)}
        for column in replacement.find_all(exp.Column):
            column.meta.update(written.get(column.name, found.this.meta))
        if found is node:
            return replacement
        found.replace(replacement)
    return node
