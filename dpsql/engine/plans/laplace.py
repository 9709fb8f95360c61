"""Discrete-Laplace measurements over public groups: the default family.

Each aggregate is a noisy vector, one value per public key combination, with discrete Laplace
noise scaled to its L1 sensitivity (declared bounds x contribution bounds) and epsilon split
evenly across measurements; groups are disjoint, so they compose in parallel
(``dpsql.mechanisms.laplace``: Canonne, Kamath and Steinke 2020, the discrete Laplace
mechanism).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpsql.engine.answers import laplace_answer
from dpsql.engine.plans.base import Family
from dpsql.engine.progress import ADDING_NOISE, DONE
from dpsql.engine.release import bounded_sql, read_rows

if TYPE_CHECKING:
    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.release import ReleaseContext
    from dpsql.engine.results import QueryResult

__all__ = ["LAPLACE", "Laplace"]


@dataclass(frozen=True)
class Laplace(Family):
    """Discrete Laplace on each aggregate over public groups."""

    def release(
        self, plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
    ) -> tuple[QueryResult, QueryPlan]:
        progress = context.stages
        salt = int(context.rng.integers(0, 2**62))
        rows = read_rows(context, bounded_sql(plan, salt, context.backend.dialect))
        progress(ADDING_NOISE, None)
        result = laplace_answer(plan, rows, entry, rng=context.rng, analyst=context.analyst)
        progress(DONE, 1.0)
        return result, plan


LAPLACE = Laplace()
"""The family of plans over public groups (it has no parameters of its own)."""
