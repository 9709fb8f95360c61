"""Automatic bounds: SUM/AVG over a column without declared bounds.

A share of epsilon (``auto_bounds_share``) buys AboveThreshold over clipped-sum differences on an
exponential grid of candidate bounds 2**b (Dwork and Roth 2014, Algorithm 1, AboveThreshold;
the grid as in *Programming Differential Privacy*, ch. 10); the aggregates then get the rest of
epsilon with discrete Laplace noise at the chosen bound. The whole cost is charged before the
data is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.accountant.units import Cost
from dpsql.engine.plans.base import Family, MeasurementPlan, laplace_leaves
from dpsql.engine.policy import Policy, TablePolicy
from dpsql.engine.release import read
from dpsql.errors import ParameterError, UnsupportedQueryError
from dpsql.mechanisms import svt
from dpsql.sql.generate import clipping_profile
from dpsql.sql.shape import AggregateKind, QueryShape

if TYPE_CHECKING:
    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.policy import ColumnPolicy
    from dpsql.engine.release import ReleaseContext
    from dpsql.engine.results import QueryResult

__all__ = ["AUTO_BOUND_EXPONENTS", "AutoBounds", "AutomaticBounds", "plan_automatic_bounds"]

AUTO_BOUND_EXPONENTS = tuple(range(-10, 63))
"""Candidate bounds 2**b for automatic clipping (an exponential grid, Programming DP ch. 10)."""


@dataclass(frozen=True)
class AutoBounds:
    """SUM/AVG over a column without declared bounds: AboveThreshold picks U on a 2**b grid."""

    column: str
    mode: str
    epsilon: float
    rest: float


def plan_automatic_bounds(
    shape: QueryShape, table: TablePolicy, policy: Policy, epsilon: float
) -> AutoBounds | None:
    """The automatic-bounds step for SUM/AVG over a column the policy lets dpsql bound itself."""
    columns = sorted(
        {
            a.column
            for a in shape.aggregates
            if a.kind is not AggregateKind.COUNT
            and a.column is not None
            and table.column(a.column).bounds is None
            and table.column(a.column).auto_bounds is not None
        }
    )
    if not columns:
        return None
    if len(columns) > 1:
        raise UnsupportedQueryError(
            f"automatic bounds are chosen for one column per query; {columns} have none declared"
        )
    units = Cost.of(epsilon).epsilon_units
    share = max(1, int(units * policy.dataset.auto_bounds_share))
    if share >= units:
        raise ParameterError(f"epsilon {epsilon} is too small to also choose automatic bounds")
    mode = table.column(columns[0]).auto_bounds or "symmetric"
    return AutoBounds(columns[0], mode, Cost(share).epsilon, Cost(units - share).epsilon)


@dataclass(frozen=True)
class AutomaticBounds(Family):
    """AboveThreshold chooses the bound, then discrete Laplace on each aggregate."""

    auto: AutoBounds

    def reason(self, plan: QueryPlan) -> str:
        return (
            f"no declared bounds for {self.auto.column}: AboveThreshold over "
            "clipped-sum differences on a 2**b grid spends "
            f"epsilon={self.auto.epsilon:g} to choose the bound, the aggregates get "
            f"epsilon={self.auto.rest:g} with discrete Laplace noise"
        )

    def event(self, plan: QueryPlan) -> SequentialEvent:
        choose = MechanismEvent(
            "above_threshold",
            self.auto.epsilon,
            0.0,
            f"automatic bounds for {self.auto.column}",
            (("grid", "2**b, b in [-10, 62]"), ("mode", self.auto.mode)),
        )
        return SequentialEvent((choose, *laplace_leaves(plan, auto=True)))

    def clamp(self, rules: ColumnPolicy | None) -> str:
        return "automatic bounds (see details)"

    def summary(self, plan: QueryPlan) -> dict[str, Any]:
        return {
            **super().summary(plan),
            "auto_bounds": {
                "column": self.auto.column,
                "mode": self.auto.mode,
                "epsilon": self.auto.epsilon,
                "rest": self.auto.rest,
            },
        }

    def measurement(self, plan: QueryPlan, m: MeasurementPlan) -> dict[str, Any]:
        return {
            **super().measurement(plan, m),
            "l1_sensitivity": "set by the automatic bound",
            "noise_scale": None,
        }

    def error(self, plan: QueryPlan, kind: AggregateKind, column: str | None, level: float) -> None:
        return None  # the sensitivity is only known once the bound is chosen

    def release(
        self, plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
    ) -> tuple[QueryResult, QueryPlan]:
        bounded, details = with_automatic_bounds(self.auto, plan, context)
        result, bounded = bounded.family.release(bounded, entry, context)
        return result.model_copy(update={"details": details}), bounded


def with_automatic_bounds(
    auto: AutoBounds, plan: QueryPlan, context: ReleaseContext
) -> tuple[QueryPlan, dict[str, Any]]:
    """Spend the automatic-bounds share on AboveThreshold, then re-plan with the bound.

    The whole query was charged already; the new plan uses the remaining epsilon exactly as
    the charged event split it.
    """
    nonnegative = auto.mode == "nonnegative"
    profile = read(
        context,
        clipping_profile(
            plan.shape,
            column=auto.column,
            unit=plan.bounds.unit,
            max_rows_per_unit=plan.bounds.max_rows_per_unit,
            exponents=AUTO_BOUND_EXPONENTS,
            nonnegative=nonnegative,
            partition=plan.bounds.partition,
            dialect=context.backend.dialect,
        ),
        "choosing bounds",
    )
    answers = -profile.iloc[0].to_numpy(dtype=np.float64)
    found = svt.above_threshold_release(
        answers,
        threshold=0.0,
        epsilon=auto.epsilon,
        sensitivity=plan.bounds.max_rows_per_unit,
        monotone=True,
        rng=context.rng,
    )
    exponent = AUTO_BOUND_EXPONENTS[found.indices[0] if found.indices else -1]
    bound = 2.0**exponent
    chosen = (0.0, bound) if nonnegative else (-bound, bound)
    table = plan.table
    rules = table.column(auto.column).model_copy(update={"bounds": chosen})
    table = table.model_copy(update={"columns": {**table.columns, auto.column: rules}})
    name = next(
        (k for k in context.policy.tables if k.lower() == plan.shape.table.lower()),
        plan.shape.table,  # a relation over several tables (dpsql.engine.relations)
    )
    policy = context.policy.model_copy(update={"tables": {**context.policy.tables, name: table}})
    from dpsql.engine.planner import plan_query  # the planner imports the families

    bounded = plan_query(
        plan.shape,
        policy,
        epsilon=auto.rest,
        delta=plan.delta,
        keys=plan.key_literals,
        partition=plan.partition,
    )
    details = {
        "automatic_bounds": {
            "column": auto.column,
            "bounds": list(chosen),
            "epsilon_for_bounds": auto.epsilon,
            "epsilon_for_aggregates": auto.rest,
            "mechanism": "above_threshold (monotone) over clipped-sum differences",
        }
    }
    return bounded, details
