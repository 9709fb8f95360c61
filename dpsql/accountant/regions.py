"""Sets of partition values a query touches, as unions of intervals over an ordered domain.

A policy may declare a *partition column*: a fixed attribute of each privacy unit (enforced when
the query runs: a unit's rows outside its one partition are dropped). Queries whose WHERE clauses
confine that column to disjoint regions then touch disjoint sets of people, so their costs compose
in parallel: a family's spend is the largest total over any single value, not the sum.

>>> dk = Region.point("DK")
>>> nordic = Region((Interval("DK", True, "SE", True),))
>>> dk.overlaps(Region.point("NO")), dk.overlaps(nordic)
(False, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpsql.accountant.units import Cost

__all__ = ["Interval", "Region", "max_cost_over_points"]

Value = str | int | float


@dataclass(frozen=True)
class Interval:
    """Values between ``low`` and ``high`` (``None``: unbounded), each end open or closed."""

    low: Value | None
    low_closed: bool
    high: Value | None
    high_closed: bool

    def contains(self, value: Value, *, just_above: bool = False) -> bool:
        """Whether ``value`` (or a value infinitesimally above it) lies in the interval."""
        if self.low is not None:
            if just_above:
                if value < self.low:  # type: ignore[operator]
                    return False
            elif value < self.low or (value == self.low and not self.low_closed):  # type: ignore[operator]
                return False
        if self.high is not None:
            if just_above:
                if value >= self.high:  # type: ignore[operator]
                    return False
            elif value > self.high or (value == self.high and not self.high_closed):  # type: ignore[operator]
                return False
        return True

    def intersect(self, other: Interval) -> Interval | None:
        low, low_closed = self.low, self.low_closed
        if other.low is not None and (low is None or other.low > low):  # type: ignore[operator]
            low, low_closed = other.low, other.low_closed
        elif other.low is not None and other.low == low:
            low_closed = low_closed and other.low_closed
        high, high_closed = self.high, self.high_closed
        if other.high is not None and (high is None or other.high < high):  # type: ignore[operator]
            high, high_closed = other.high, other.high_closed
        elif other.high is not None and other.high == high:
            high_closed = high_closed and other.high_closed
        if (
            low is not None
            and high is not None
            and (low > high or (low == high and not (low_closed and high_closed)))  # type: ignore[operator]
        ):
            return None
        return Interval(low, low_closed, high, high_closed)

    def to_list(self) -> list[Any]:
        return [self.low, self.low_closed, self.high, self.high_closed]


@dataclass(frozen=True)
class Region:
    """A union of intervals; the empty tuple is the empty set."""

    intervals: tuple[Interval, ...]

    @classmethod
    def point(cls, value: Value) -> Region:
        return cls((Interval(value, True, value, True),))

    @classmethod
    def everything(cls) -> Region:
        return cls((Interval(None, False, None, False),))

    @property
    def empty(self) -> bool:
        return not self.intervals

    def union(self, other: Region) -> Region:
        return Region(self.intervals + other.intervals)

    def intersect(self, other: Region) -> Region:
        parts = (a.intersect(b) for a in self.intervals for b in other.intervals)
        return Region(tuple(p for p in parts if p is not None))

    def contains(self, value: Value, *, just_above: bool = False) -> bool:
        return any(i.contains(value, just_above=just_above) for i in self.intervals)

    def overlaps(self, other: Region) -> bool:
        return not self.intersect(other).empty

    def endpoints(self) -> set[Value]:
        return {v for i in self.intervals for v in (i.low, i.high) if v is not None}

    def to_list(self) -> list[list[Any]]:
        return [i.to_list() for i in self.intervals]

    @classmethod
    def from_list(cls, data: Sequence[Sequence[Any]]) -> Region:
        return cls(tuple(Interval(a, bool(b), c, bool(d)) for a, b, c, d in data))

    def describe(self, column: str) -> str:
        """SQL-like text, e.g. ``country = 'DK'`` or ``age >= 30 AND age < 40``."""
        texts = []
        for i in self.intervals:
            if i.low is not None and i.low == i.high:
                texts.append(f"{column} = {i.low!r}")
                continue
            parts = []
            if i.low is not None:
                parts.append(f"{column} {'>=' if i.low_closed else '>'} {i.low!r}")
            if i.high is not None:
                parts.append(f"{column} {'<=' if i.high_closed else '<'} {i.high!r}")
            texts.append(" AND ".join(parts) or "any value")
        return " OR ".join(texts) or "no value"


def max_cost_over_points(
    charges: Sequence[tuple[Region, Cost]], within: Region | None = None
) -> tuple[Cost, list[tuple[str, Cost]]]:
    """The componentwise largest total cost over any single value (of ``within``, if given), and
    the total at each probe.

    Probes are every endpoint, just above every endpoint, and below all endpoints: between two
    consecutive probes the set of covering regions does not change, so the maximum is exact.
    """
    regions = [region for region, _ in charges] + ([within] if within is not None else [])
    values = sorted({v for region in regions for v in region.endpoints()}, key=_order)
    probes: list[tuple[Value | None, bool]] = [(None, False)]
    probes += [(v, above) for v in values for above in (False, True)]
    best = Cost()
    totals: list[tuple[str, Cost]] = []
    for value, above in probes:
        if within is not None and not _covers(within, value, above):
            continue
        cost = Cost()
        for region, charge in charges:
            if _covers(region, value, above):
                cost = cost + charge
        best = best.join(cost)
        label = "below all" if value is None else f"{'just above ' if above else ''}{value!r}"
        totals.append((label, cost))
    return best, totals


def _covers(region: Region, value: Value | None, above: bool) -> bool:
    if value is None:
        return any(i.low is None for i in region.intervals)
    return region.contains(value, just_above=above)


def _order(value: Value) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))
