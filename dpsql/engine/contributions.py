"""Private views of how contribution bounds cut a table: persons over each bound, suggested bounds.

Both are releases like any query: priced from the policy alone (every released count counts each
person at most once, so it moves by at most 1 between neighbours), charged before the table is
read, and noised with exact discrete Laplace. ε is split equally among the released vectors
(sequential composition); a histogram's bins are disjoint, so it is one vector of L1 sensitivity 1
(each person lies in one bin). The suggestion is post-processing of the noisy histograms: the
smallest power of two that covers ``coverage`` of the (noisy) persons, counting bins below their
interval's half-width as empty, as Tumult Analytics' and PipelineDP's contribution-bound helpers
do from a private histogram.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.accountant.ledger import LedgerEntry
from dpsql.accountant.units import Cost, check_budget_value
from dpsql.engine.answers import plain
from dpsql.engine.choices import CONTRIBUTIONS_EPSILON as DEFAULT_EPSILON
from dpsql.engine.policy import Policy
from dpsql.engine.results import QueryResult
from dpsql.errors import ParameterError, PolicyError, SchemaError
from dpsql.mechanisms.laplace import release_counts
from dpsql.sql.generate import PROFILE_EDGES, PROFILE_STATISTICS, Bounds

__all__ = ["DEFAULT_EPSILON", "ContributionPlan", "contribution_answer", "plan_contributions"]


POLICY_KEY = {
    "rows_per_unit": "max_rows_per_unit",
    "groups_per_unit": "max_groups_per_unit",
    "rows_per_group": "max_rows_per_group",
}
MECHANISM = "discrete_laplace"


@dataclass(frozen=True)
class ContributionPlan:
    """What a contribution report (``suggest=False``) or bound suggestion releases, and its cost."""

    table: str
    group_by: tuple[str, ...]
    bounds: Bounds
    epsilon: float
    suggest: bool
    coverage: float
    confidence: float

    def __post_init__(self) -> None:
        self.shares  # noqa: B018 - refuses an epsilon too small to split, before the charge

    @property
    def statistics(self) -> tuple[str, ...]:
        """Per-person statistics released: groups only exist with a GROUP BY."""
        return PROFILE_STATISTICS if self.group_by else PROFILE_STATISTICS[:1]

    @property
    def labels(self) -> tuple[str, ...]:
        """One label per released vector (a count, or a histogram)."""
        if self.suggest:
            return tuple(f"persons by {s}" for s in self.statistics)
        return ("persons", *(f"persons over {POLICY_KEY[s]}" for s in self.statistics))

    @property
    def shares(self) -> tuple[float, ...]:
        units = Cost.of(self.epsilon).epsilon_units
        base, extra = divmod(units, len(self.labels))
        if base == 0:
            raise ParameterError(f"epsilon {self.epsilon} is too small to split")
        return tuple(Cost(base + (i < extra), 0).epsilon for i in range(len(self.labels)))

    @property
    def query(self) -> str:
        """What the ledger records as the query."""
        verb = "SUGGEST BOUNDS" if self.suggest else "CONTRIBUTIONS"
        grouping = f" GROUP BY {', '.join(self.group_by)}" if self.group_by else ""
        return f"{verb} FOR {self.table}{grouping}"

    @property
    def event(self) -> SequentialEvent:
        return SequentialEvent(
            tuple(
                MechanismEvent(MECHANISM, share, 0.0, label, (("l1_sensitivity", 1),))
                for label, share in zip(self.labels, self.shares, strict=True)
            )
        )

    def summary(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "group_by": list(self.group_by),
            "privacy_unit": self.bounds.unit,
            "contribution_bounds": {
                "max_groups_per_unit": self.bounds.max_groups_per_unit,
                "max_rows_per_group": self.bounds.max_rows_per_group,
                "max_rows_per_unit": self.bounds.max_rows_per_unit,
            },
            "mechanism": MECHANISM,
            "releases": list(self.labels),
            "epsilon_each": list(self.shares),
            "l1_sensitivity_each": 1,
            "coverage": self.coverage if self.suggest else None,
        }


def plan_contributions(
    policy: Policy,
    catalog: dict[str, dict[str, str]],
    table: str,
    *,
    group_by: Sequence[str] = (),
    epsilon: float | None = None,
    suggest: bool = False,
    coverage: float = 0.95,
) -> ContributionPlan:
    """Check the request against the policy and the visible catalog; reads no data."""
    rules = policy.table(table)
    if rules is None:
        raise PolicyError(f"table {table!r} is not covered by the privacy policy")
    name = next((t for t in catalog if t.lower() == table.lower()), None)
    if name is None:
        raise SchemaError(f"table {table!r} does not exist")
    for column in group_by:
        if column not in catalog[name]:
            raise SchemaError(f"column {column!r} is not a column of table {name!r}")
    if len(set(group_by)) != len(group_by):
        raise ParameterError(f"group_by names a column twice: {list(group_by)}")
    if isinstance(coverage, bool) or not isinstance(coverage, float | int):
        raise ParameterError(f"coverage must be a number in (0, 1), got {coverage!r}")
    if not 0.0 < float(coverage) < 1.0:
        raise ParameterError(f"coverage must be in (0, 1), got {coverage!r}")
    epsilon = check_budget_value(
        "epsilon", DEFAULT_EPSILON if epsilon is None else epsilon, allow_zero=False
    )
    plan = ContributionPlan(
        table=name,
        group_by=tuple(group_by),
        bounds=Bounds(
            rules.privacy_unit,
            rules.max_groups_per_unit,
            rules.max_rows_per_group,
            rules.max_rows_per_unit,
            rules.partition_column,
        ),
        epsilon=epsilon,
        suggest=suggest,
        coverage=float(coverage),
        confidence=policy.dataset.confidence,
    )
    return plan


def _edge(index: int) -> str:
    return f"<= {PROFILE_EDGES[index]}" if index < len(PROFILE_EDGES) else f"> {PROFILE_EDGES[-1]}"


def contribution_answer(
    plan: ContributionPlan,
    frame: pd.DataFrame,
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
) -> QueryResult:
    """Noise the profile ``frame`` (one row of ``contribution_profile``) as ``plan`` charged."""
    row = frame.iloc[0].fillna(0)
    current = {POLICY_KEY[s]: getattr(plan.bounds, POLICY_KEY[s]) for s in plan.statistics}
    common: dict[str, Any] = {
        "confidence": plan.confidence,
        "epsilon": entry.cost.epsilon,
        "delta": entry.cost.delta,
        "mechanism": MECHANISM,
        "analyst": analyst,
        "ledger_entry": entry.seq,
    }
    if not plan.suggest:
        names = ["persons", *(f"over_{s}" for s in plan.statistics)]
        values, intervals, scales = [], [], []
        for name, share in zip(names, plan.shares, strict=True):
            noisy = release_counts(
                np.array([int(row[name])]),
                epsilon=share,
                sensitivity=1,
                rng=rng,
                confidence=plan.confidence,
            )
            values.append(int(noisy.values[0]))
            intervals.append((plain(noisy.lower[0]), plain(noisy.upper[0])))
            scales.append(noisy.scale)
        return QueryResult(
            columns=["quantity", "persons"],
            rows=list(zip(plan.labels, values, strict=True)),
            intervals={"persons": intervals},
            noise_scale={"persons": max(scales)},
            details={"bounds": current, "epsilon_each": list(plan.shares)},
            measures={
                "persons": f"persons (values of {plan.bounds.unit}) in {plan.table}, and those "
                "with more rows, groups or rows in one group than the policy's bound"
            },
            **common,
        )
    bins = len(PROFILE_EDGES) + 1
    histograms: dict[str, np.ndarray] = {}
    suggested: dict[str, int | None] = {}
    half_widths: dict[str, float] = {}
    scales: dict[str, float] = {}
    for statistic, share in zip(plan.statistics, plan.shares, strict=True):
        exact = np.array([int(row[f"{statistic}_{i}"]) for i in range(bins)], dtype=np.int64)
        noisy = release_counts(
            exact, epsilon=share, sensitivity=1, rng=rng, confidence=plan.confidence
        )
        histograms[statistic] = noisy.values
        half_widths[statistic] = noisy.half_width
        scales[statistic] = noisy.scale
        # Bins indistinguishable from empty (below the interval's half-width) count as empty:
        # otherwise the noise of some thirty empty bins would add up to more than 1 - coverage.
        clipped = np.where(noisy.values > noisy.half_width, noisy.values, 0).cumsum()
        index = int(np.searchsorted(clipped, plan.coverage * clipped[-1]))
        suggested[POLICY_KEY[statistic]] = (
            PROFILE_EDGES[index] if clipped[-1] > 0 and index < len(PROFILE_EDGES) else None
        )
    # Bins up to one past the largest suggestion (the rest is mostly noise around 0).
    shown = min(
        bins - 1,
        1 + max((PROFILE_EDGES.index(v) for v in suggested.values() if v is not None), default=0),
    )
    return QueryResult(
        columns=["persons_with_at_most", *plan.statistics],
        rows=[
            (_edge(i), *(int(histograms[s][i]) for s in plan.statistics)) for i in range(shown + 1)
        ],
        intervals={
            s: [
                (int(v) - half_widths[s], int(v) + half_widths[s])
                for v in histograms[s][: shown + 1]
            ]
            for s in plan.statistics
        },
        noise_scale=scales,
        details={"suggested": suggested, "current": current, "coverage": plan.coverage},
        measures={
            s: f"persons whose {s.replace('_', ' ')} lies in the bin (each person in one bin)"
            for s in plan.statistics
        },
        **common,
    )
