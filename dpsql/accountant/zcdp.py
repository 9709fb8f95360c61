"""Composition under (approximate) zero-concentrated DP: the tightest rule for Gaussian releases.

A mechanism is δ-approximately ρ-zCDP (Bun and Steinke, TCC 2016, Def. 8.1) if for neighbours there
are events of probability at least 1 − δ under which the Rényi divergences of every order α are at
most ρα. Such guarantees compose adaptively by adding the ρ's and the δ's (ibid., Lemma 8.3), and
ρ-zCDP gives (ε, δ′)-DP for every δ′ > 0 (Canonne, Kamath, Steinke 2020, Prop. 12 / Cor. 13,
computed by Google's ``dp-accounting``). Each ledger leaf gives its curve:

- a leaf with ``zcdp_rho`` and ``zcdp_delta`` parameters (discrete Gaussian thresholds and weighted
  selection: the Gaussian part's ρ, and the new-key release probability) is that;
- any pure ε-DP leaf (δ = 0) is ``ε²/2``-zCDP (ibid., Prop. 3.3);
- a Laplace threshold or combined-structure leaf (``threshold``, ``combined``) is δ-approximately
  ``ε²/2``-zCDP: conditioned on no new key being released (probability ≥ 1 − δ, independent of
  the rest), its output is the ε-DP release of the shared keys;
- any other leaf with δ > 0 has no known curve, and then the rule does not apply to the scope.

The total is ``(ε(Σρ, δ′), Σδ + δ′)``, over every leaf of every charge (parallel composition over
partitions is ignored: an over-statement, still valid). The ledger checks caps with it as a privacy
filter: each charge is admitted only if the total including it fits the cap, with a fixed δ′, which
is a fixed bound on Σρ and on Σδ. Fully adaptive composition (parameters chosen after earlier
outputs) is valid under such filters for Rényi/zCDP budgets (Feldman and Zrnic, NeurIPS 2021,
"Individual privacy accounting via a Rényi filter"; Whitehouse, Ramdas, Rogers, Wu, 2023, "Fully
adaptive composition in differential privacy") and for the basic δ sum (Rogers, Roth, Ullman,
Vadhan, NeurIPS 2016, "Privacy odometers and filters").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpsql.accountant.events import (
    Event,
    MechanismEvent,
    ParallelEvent,
    PostProcessingEvent,
    SequentialEvent,
)
from dpsql.accountant.units import Cost

__all__ = ["Curve", "curves", "zcdp_total"]

Curve = tuple[float, float]
"""``(ρ, δ)``: δ-approximately ρ-zCDP."""

_APPROXIMATE_PURE = frozenset({"threshold", "combined"})
_ORDERS = 1.0 + np.geomspace(1e-3, 1e4, 3000)
_MARGIN = 1e-9
_LARGEST_TOTAL = 1e9


def _leaf(event: MechanismEvent) -> Curve | None:
    params = dict(event.params)
    if "zcdp_rho" in params:
        return float(params["zcdp_rho"]), float(params.get("zcdp_delta", event.delta))
    if event.delta == 0:
        return event.epsilon**2 / 2, 0.0
    if event.mechanism in _APPROXIMATE_PURE:
        return event.epsilon**2 / 2, event.delta
    return None


def curves(event: Event) -> tuple[Curve, ...] | None:
    """The zCDP curves of an event tree's leaves in sequence, or None when one has none (a
    parallel node is its largest ρ and δ: one person is in one branch)."""
    if isinstance(event, MechanismEvent):
        curve = _leaf(event)
        return None if curve is None else (curve,)
    if isinstance(event, PostProcessingEvent):
        return ()
    if isinstance(event, SequentialEvent):
        found: list[Curve] = []
        for child in event.events:
            part = curves(child)
            if part is None:
                return None
            found.extend(part)
        return tuple(found)
    assert isinstance(event, ParallelEvent)
    branches = [curves(child) for child in event.events]
    if any(b is None for b in branches):
        return None
    totals = [(sum(r for r, _ in b), sum(d for _, d in b)) for b in branches if b]
    if not totals:
        return ()
    return ((max(r for r, _ in totals), max(d for _, d in totals)),)


def zcdp_total(steps: Sequence[tuple[Curve, ...] | None], delta_slack: float) -> Cost | None:
    """``(ε(Σρ, δ′), Σδ + δ′)`` over every step (module doc), or None when a step has no curve
    or the total is beyond any budget.

    >>> zcdp_total([((0.5, 0.0),)], 1e-6).epsilon > 5
    True
    """
    if any(step is None for step in steps):
        return None
    flat = [curve for step in steps for curve in step]  # type: ignore[union-attr]
    rho = float(np.sum([r for r, _ in flat])) if flat else 0.0
    delta = float(np.sum([d for _, d in flat])) if flat else 0.0
    if rho == 0.0:
        return Cost()
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    epsilon, _ = compute_epsilon(_ORDERS, _ORDERS * rho, delta_slack)
    if not np.isfinite(epsilon) or epsilon > _LARGEST_TOTAL:
        return None
    return Cost.of(
        float(epsilon) * (1 + _MARGIN) + _MARGIN, min((delta + delta_slack) * (1 + _MARGIN), 1.0)
    )
