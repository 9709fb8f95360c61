"""Two-column moments priced and bounded from the policy: CORR, COVAR_POP, COVAR_SAMP,
REGR_SLOPE and REGR_INTERCEPT (``dpsql.sql.moments`` writes them in released sums).

Before the charge, ``check_bounds`` refuses a statistic over a column without declared bounds,
naming it: each component's sensitivity is its per-row bound from the declared bounds (interval
arithmetic, ``dpsql.engine.virtual_columns``) times the contribution bound, so a column without
bounds has none. The planner splits the query's epsilon evenly over its distinct noisy
measurements (``dpsql.engine.plans.base.split_epsilon``): a CORR alone is six measurements at
epsilon / 6 each, a COVAR four, a REGR_* five.

After the release, ``moment_answers`` gives each select item that is exactly such a statistic a
*conservative* interval: every component's interval at confidence ``1 - (1 - c) / k`` for its
``k`` components (so with probability at least ``c`` all of them cover their true bounded values
at once: a union bound), then the statistic's formula evaluated in interval arithmetic over
those intervals (Moore, *Interval Analysis*, 1966, the fundamental theorem: the interval
extension of a rational expression encloses its range over the box), with outward rounding.
The enclosure is wide where the noise is large next to the spread of the data, and is the whole
line (no interval; [-1, 1] for CORR) where a component's interval reaches a count below two or
a variance at or below zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.errors import PolicyError
from dpsql.sql.moments import INTERVAL, Moment
from dpsql.sql.shape import AggregateKind, ColumnKind

if TYPE_CHECKING:
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.policy import TablePolicy
    from dpsql.sql.shape import QueryShape

__all__ = ["check_bounds", "component_laws", "enclosure", "moment_answers"]

HalfWidth = Callable[[str, float], "float | None"]
"""The half-width of a released column's interval at a confidence level (None: unknown)."""


def check_bounds(shape: QueryShape, table: TablePolicy) -> None:
    """Refuse a two-column statistic over a column without declared bounds (a BOOLEAN column
    is bounded by [0, 1]), naming the statistic and the missing bounds."""
    post = getattr(shape, "post", None)
    for moment in getattr(post, "bivariate", ()):
        missing = []
        for written in dict.fromkeys((moment.x, moment.y)):
            name = next((c for c in shape.columns if c.lower() == written.lower()), written)
            if shape.columns.get(name) is ColumnKind.BOOLEAN:
                continue
            if table.column(name).numeric_bounds is None:
                missing.append(name)
        if missing:
            settings = " and ".join(
                f"[tables.{shape.table}.columns.{name}] bounds = [low, high]" for name in missing
            )
            raise PolicyError(
                f"{moment.text} needs declared bounds on both columns (each sum of products is "
                f"bounded by them); {', '.join(repr(m) for m in missing)} has none: set {settings}"
            )


def component_laws(plan: QueryPlan) -> tuple[HalfWidth | None, dict[str, float]]:
    """For the released columns of ``plan``: the half-width of each one's interval at any level
    (None unless the plan releases discrete-Laplace measurements over public groups, whose
    intervals are the released value +- that half-width), and each one's epsilon."""
    from dpsql.engine.plans.laplace import Laplace

    aggregates = {a.name: a for a in plan.shape.aggregates}
    labels = {m.label: m.epsilon for m in plan.measurements}
    epsilons = {}
    for name, aggregate in aggregates.items():
        label = f"SUM({aggregate.column})" if aggregate.kind is AggregateKind.SUM else name
        if label in labels:
            epsilons[name] = labels[label]
    if type(plan.family) is not Laplace:
        return None, epsilons

    def half_width(column: str, level: float) -> float | None:
        aggregate = aggregates.get(column)
        if aggregate is None:
            return None
        return plan.error(aggregate.kind, aggregate.column, level)

    return half_width, epsilons


@dataclass(frozen=True)
class _Box:
    """Intervals [low, high], one per released row (NumPy arrays)."""

    low: np.ndarray
    high: np.ndarray

    @staticmethod
    def around(values: np.ndarray, half: float) -> _Box:
        return _Box(np.nextafter(values - half, -np.inf), np.nextafter(values + half, np.inf))

    def _outward(self, low: np.ndarray, high: np.ndarray) -> _Box:
        low = np.where(np.isnan(low), -np.inf, np.nextafter(low, -np.inf))
        high = np.where(np.isnan(high), np.inf, np.nextafter(high, np.inf))
        return _Box(low, high)

    def __add__(self, other: _Box) -> _Box:
        return self._outward(self.low + other.low, self.high + other.high)

    def __sub__(self, other: _Box) -> _Box:
        return self._outward(self.low - other.high, self.high - other.low)

    def __mul__(self, other: _Box) -> _Box:
        with np.errstate(invalid="ignore"):
            corners = np.stack(
                [a * b for a in (self.low, self.high) for b in (other.low, other.high)]
            )
        unknown = np.isnan(corners).any(axis=0)  # 0 * inf: no bound
        low = np.where(unknown, -np.inf, np.nanmin(corners, axis=0))
        high = np.where(unknown, np.inf, np.nanmax(corners, axis=0))
        return self._outward(low, high)

    def __truediv__(self, other: _Box) -> _Box:
        """Division by an interval that holds zero (or touches it) bounds nothing; otherwise
        ``1 / x`` is decreasing on the interval's side of zero."""
        safe = (other.low > 0) | (other.high < 0)
        with np.errstate(divide="ignore", over="ignore"):
            inverse = self._outward(1.0 / other.high, 1.0 / other.low)
        inverse = _Box(np.where(safe, inverse.low, -np.inf), np.where(safe, inverse.high, np.inf))
        return self * inverse

    def squared(self) -> _Box:
        """The exact square (not ``self * self``, which forgets both factors are one value)."""
        low_sq, high_sq = self.low**2, self.high**2
        straddles = (self.low <= 0) & (self.high >= 0)
        low = np.where(straddles, 0.0, np.minimum(low_sq, high_sq))
        return self._outward(low, np.maximum(low_sq, high_sq))

    def sqrt(self) -> _Box:
        """Square root of the non-negative part."""
        low = np.sqrt(np.maximum(self.low, 0.0))
        high = np.sqrt(np.maximum(self.high, 0.0))
        return self._outward(low, high)


def enclosure(
    statistic: str, values: Mapping[str, np.ndarray], half_widths: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Low and high ends enclosing ``statistic`` (a ``dpsql.sql.moments.ROLES`` key) over every
    true value of its components within ``values[role] +- half_widths[role]``; infinite where
    the box allows a count below the statistic's minimum or a variance at or below zero (CORR:
    [-1, 1] there, and clipped to it everywhere).

    >>> low, high = enclosure("covar_pop", {"n": np.array([100.0]), "sx": np.array([0.0]),
    ...     "sy": np.array([0.0]), "sxy": np.array([50.0])},
    ...     {"n": 0.0, "sx": 0.0, "sy": 0.0, "sxy": 0.0})
    >>> bool(low[0] <= 0.5 <= high[0]), bool(high[0] - low[0] < 1e-12)
    (True, True)
    """
    box = {
        role: _Box.around(np.asarray(v, dtype=float), half_widths[role])
        for role, v in values.items()
    }
    n, sx, sy = box["n"], box["sx"], box["sy"]
    fewest = 1.0 if statistic == "covar_pop" else 2.0
    enough = n.low >= fewest
    c = box["sxy"] - sx * sy / n
    if statistic == "covar_pop":
        result = c / n
    elif statistic == "covar_samp":
        result = c / (n - _Box(np.ones_like(n.low), np.ones_like(n.low)))
    else:
        vx = box["sxx"] - sx.squared() / n
        if statistic == "corr":
            vy = box["syy"] - sy.squared() / n
            result = c / (vx * vy).sqrt()
            enough &= (vx.low > 0) & (vy.low > 0)
            low = np.where(enough, np.clip(result.low, -1.0, 1.0), -1.0)
            high = np.where(enough, np.clip(result.high, -1.0, 1.0), 1.0)
            return low, high
        slope = c / vx
        enough &= vx.low > 0
        result = slope if statistic == "regr_slope" else (sy - slope * sx) / n
    low = np.where(enough, result.low, -np.inf)
    high = np.where(enough, result.high, np.inf)
    return low, high


def moment_answers(
    moments: Mapping[str, Moment],
    released: Mapping[str, np.ndarray],
    confidence: float,
    half_width: HalfWidth | None,
    epsilons: Mapping[str, float],
) -> tuple[dict[str, list[tuple[Any, Any]]], dict[str, str], dict[str, Any]]:
    """Intervals (one per released row), ``measures`` text and details for the output columns
    in ``moments`` (output name -> statistic with its released columns), from the released
    component values and ``half_width`` (None: the release has no interval to build on).
    ``epsilons`` gives each released column's share of the query's epsilon (for the details)."""
    intervals: dict[str, list[tuple[Any, Any]]] = {}
    measures: dict[str, str] = {}
    details: dict[str, Any] = {}
    for name, moment in moments.items():
        k = len(moment.released)
        level = 1.0 - (1.0 - confidence) / k
        halves = {
            role: half_width(column, level) if half_width is not None else None
            for role, column in moment.released.items()
        }
        parts = ", ".join(f"{role} = {column}" for role, column in moment.released.items())
        described = {
            "statistic": moment.text,
            "components": dict(moment.released),
            "epsilon": {role: epsilons.get(c) for role, c in moment.released.items()},
        }
        if any(h is None for h in halves.values()):
            measures[name] = (
                f"derived from released values: {moment.text} from its components ({parts}); "
                "no interval (the components' noise has no fixed interval here)"
            )
            details[name] = {**described, "interval": None}
            continue
        low, high = enclosure(
            moment.statistic,
            {role: released[column] for role, column in moment.released.items()},
            {role: float(h) for role, h in halves.items()},  # type: ignore[arg-type]
        )
        intervals[name] = [
            (float(a) if np.isfinite(a) else None, float(b) if np.isfinite(b) else None)
            for a, b in zip(low, high, strict=True)
        ]
        clip = "; clipped to [-1, 1]" if moment.statistic == "corr" else ""
        measures[name] = (
            f"derived from released values: {moment.text} from its {k} components ({parts}) of "
            f"the bounded data{clip}; interval {INTERVAL}, here {level:.6g} each"
        )
        details[name] = {**described, "interval": f"{INTERVAL}; {level:.6g} each"}
    return intervals, measures, details
