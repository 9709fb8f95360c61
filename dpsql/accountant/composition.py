"""Totals of many charges: sequential and parallel composition, and advanced composition.

* **Basic (sequential) composition** always holds: costs add up. Charges confined to values of a
  partition family (a fixed attribute of each privacy unit, see ``partitions``) compose in
  parallel within the family: each person is in one partition, so the family adds its largest
  single-value total. Families are added to each other and to the unpartitioned charges (a person
  is in one partition of *each* family).
* **Advanced composition** (Dwork, Rothblum, Vadhan 2010, Thm. III.3, in the heterogeneous form its
  proof gives through Azuma's inequality): k adaptive mechanisms that are (ε_i, δ_i)-DP are together
  (ε', Σδ_i + δ′)-DP for every δ′ > 0, with ε' = sqrt(2 ln(1/δ′) Σ ε_i²) + Σ ε_i (e^{ε_i} − 1).
  It ignores partitions (an over-statement, still valid). When the policy enables it, a charge fits
  if *either* bound fits the cap; reports show the smaller ε.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpsql.accountant.events import (
    Event,
    MechanismEvent,
    ParallelEvent,
    PostProcessingEvent,
    SequentialEvent,
    total,
)
from dpsql.accountant.partitions import Charge, Totals
from dpsql.accountant.units import Cost

__all__ = ["Charge", "Spend", "advanced_total", "basic_total", "leaves", "spend"]

_MARGIN = 1e-12


@dataclass(frozen=True)
class Spend:
    """Spent budget under basic composition and, when enabled, advanced composition."""

    basic: Cost
    advanced: Cost | None
    zcdp: Cost | None = None
    """Under approximate zCDP (``dpsql.accountant.zcdp``), when enabled and every leaf has a
    curve."""

    def _bounds(self) -> list[tuple[str, Cost]]:
        found = [("basic", self.basic)]
        found += [("advanced", self.advanced)] if self.advanced is not None else []
        found += [("zcdp", self.zcdp)] if self.zcdp is not None else []
        return found

    @property
    def best(self) -> Cost:
        return min(self._bounds(), key=lambda item: item[1].epsilon_units)[1]

    @property
    def rule(self) -> str:
        return min(self._bounds(), key=lambda item: item[1].epsilon_units)[0]

    def fits_within(self, cap: Cost) -> bool:
        return any(bound.fits_within(cap) for _, bound in self._bounds())


def leaves(event: Event) -> tuple[tuple[float, float], ...]:
    """The (ε, δ) steps of an event tree in sequence; a parallel node is one step (its maximum)."""
    if isinstance(event, MechanismEvent):
        return ((event.epsilon, event.delta),)
    if isinstance(event, PostProcessingEvent):
        return ()
    if isinstance(event, SequentialEvent):
        return tuple(step for child in event.events for step in leaves(child))
    assert isinstance(event, ParallelEvent)
    cost = total(event)
    return ((cost.epsilon, cost.delta),) if cost != Cost() else ()


def basic_total(charges: Sequence[Charge]) -> Cost:
    """Sequential composition, with parallel composition over each partition family's values."""
    totals = Totals()
    for charge in charges:
        totals.add(charge)
    return totals.total()


def advanced_total(charges: Sequence[Charge], delta_slack: float) -> Cost | None:
    """The advanced-composition bound over every step of every charge, with slack δ′; None when
    it is beyond any budget (a step of ε ≳ 20 makes ε (e^ε − 1) astronomically large), so only
    the basic bound can apply."""
    steps = [step for charge in charges for step in charge.leaves]
    if not steps:
        return Cost()
    if max(e for e, _ in steps) > _LARGEST_STEP:
        return None
    squares = math.fsum(e * e for e, _ in steps)
    drift = math.fsum(e * math.expm1(e) for e, _ in steps)
    epsilon = math.sqrt(2 * math.log(1 / delta_slack) * squares) + drift
    if epsilon > _LARGEST_TOTAL:
        return None
    delta = math.fsum(d for _, d in steps) + delta_slack
    return Cost.of(epsilon * (1 + _MARGIN) + _MARGIN, min(delta * (1 + _MARGIN), 1.0))


_LARGEST_STEP = 30.0
"""Beyond this ε, one step's drift ε (e^ε − 1) exceeds 10^14, more than any cap: no need to
compute it (and ``expm1`` overflows past ε ≈ 709.8)."""
_LARGEST_TOTAL = 1e9
"""The largest ε the accountant represents (as for any budget value)."""


def spend(charges: Sequence[Charge], *, advanced_delta: float | None) -> Spend:
    """Basic total, and the advanced total when ``advanced_delta`` (δ′) is given."""
    advanced = None if advanced_delta is None else advanced_total(charges, advanced_delta)
    return Spend(basic_total(charges), advanced)
