"""Budget totals with parallel composition over partition values, kept incrementally.

A policy may declare a *partition column*: a fixed attribute of each privacy unit (enforced when
the query runs: a unit's rows outside its one partition are dropped) with a public, finite set of
values. A query that confines that column is charged to the exact set of declared values whose
rows it may read (the database itself evaluates the WHERE clause over the declared values, and
the generated SQL reads only those values, see ``dpsql.sql.partition``). Each person lies in one
value, so within a family the spend of a person is the total of the charges whose value set holds
their value: the family adds its largest single-value total, not the sum of its charges.

``Totals`` keeps those per-value totals and each family's largest one as charges arrive, so
pricing a new charge costs O(values it touches), never O(history).

>>> totals = Totals()
>>> totals.add(Charge("a", Cost.of(1.0), ((1.0, 0.0),), "t.country", ("DK",)))
>>> totals.total_with(Charge("a", Cost.of(1.0), ((1.0, 0.0),), "t.country", ("NO",))).epsilon
1.0
>>> totals.total_with(Charge("a", Cost.of(1.0), ((1.0, 0.0),), "t.country", ("DK", "NO"))).epsilon
2.0
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dpsql.accountant.units import Cost

__all__ = ["Charge", "Totals"]


@dataclass(frozen=True)
class Charge:
    """What totals need from one ledger entry: its cost, its (ε, δ) steps for advanced
    composition, and, for a partitioned charge, its family and the values it touched."""

    analyst: str | None
    cost: Cost
    leaves: tuple[tuple[float, float], ...]
    family: str | None = None
    values: tuple[str, ...] | None = None
    curves: tuple[tuple[float, float], ...] | None = None
    """Its leaves' zCDP curves ``(ρ, δ)`` (``dpsql.accountant.zcdp``), None when unknown."""

    @property
    def partitioned(self) -> bool:
        return self.family is not None and bool(self.values)


@dataclass
class Totals:
    """Sequential composition, with parallel composition over the values of each family."""

    sequential: Cost = field(default_factory=Cost)
    values: dict[str, dict[str, Cost]] = field(default_factory=dict)
    peaks: dict[str, Cost] = field(default_factory=dict)

    def add(self, charge: Charge) -> None:
        """Record a charge: O(values it touches)."""
        if not charge.partitioned:
            self.sequential = self.sequential + charge.cost
            return
        family = charge.family
        assert family is not None and charge.values is not None
        totals = self.values.setdefault(family, {})
        peak = self.peaks.get(family, Cost())
        for value in set(charge.values):
            totals[value] = totals.get(value, Cost()) + charge.cost
            peak = peak.join(totals[value])
        self.peaks[family] = peak

    def total(self) -> Cost:
        """The largest spend of any one person: the sequential part plus every family's peak."""
        result = self.sequential
        for peak in self.peaks.values():
            result = result + peak
        return result

    def total_with(self, charge: Charge) -> Cost:
        """``total()`` as it would be after ``add(charge)``, without recording it."""
        if not charge.partitioned:
            return self.total() + charge.cost
        family = charge.family
        assert family is not None and charge.values is not None
        totals = self.values.get(family, {})
        peak = self.peaks.get(family, Cost())
        for value in set(charge.values):
            peak = peak.join(totals.get(value, Cost()) + charge.cost)
        return self.total() - self.peaks.get(family, Cost()) + peak

    def at(self, family: str, values: Iterable[str]) -> Cost:
        """The largest spend of a person whose ``family`` value is one of ``values``."""
        others = self.total() - self.peaks.get(family, Cost())
        totals = self.values.get(family, {})
        peak = Cost()
        for value in values:
            peak = peak.join(totals.get(value, Cost()))
        return others + peak

    def per_value(self) -> list[tuple[str, str, Cost]]:
        """(family, value, spend of the people with that value) for every touched value."""
        lines = []
        for family in sorted(self.values):
            others = self.total() - self.peaks[family]
            for value, cost in sorted(self.values[family].items()):
                lines.append((family, value, others + cost))
        return lines
