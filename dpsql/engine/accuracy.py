"""How accurate a planned query is, before any data is read, and the least ε meeting a target.

A noisy COUNT or SUM is its true (bounded) value plus noise whose distribution the plan fixes,
so the half-width of its interval at a confidence level is known from the plan alone: the same
``interval_half_width`` of the same noise scale (times the sum's grid) that the answer's interval
uses. That is the *expected error* dpsql prints and the quantity an accuracy target bounds
("±50 at 95%": every group's interval half-width is at most 50).

An ``AVG`` is a ratio of two noisy values; its error depends on the count, which is data. Given a
public guess of the count (``OPTIONS(expected_count=N)`` or the policy's ``expected_rows``), its
expected error is a conservative bound that holds whenever each group averages at least that
many rows (``dpsql.engine.plans.base.average_error``); without one it has none. Nor has a SUM
whose bounds are chosen privately at run time (automatic bounds). Such outputs have ``None`` as
their error. ``OPTIONS(simultaneous=true)`` makes a target hold for every cell of the answer at
once (``dpsql.engine.query.cell_confidence``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from dpsql.accountant.events import total
from dpsql.accountant.units import Cost
from dpsql.engine.allocation import least_units
from dpsql.engine.planner import QueryPlan
from dpsql.engine.policy import Policy
from dpsql.errors import DpsqlError, ParameterError
from dpsql.sql.shape import AggregateKind, GroupKey

__all__ = [
    "accuracy_details",
    "accuracy_target",
    "least_epsilon",
    "output_errors",
    "plan_error",
    "with_confidence",
]


def output_errors(plan: QueryPlan, confidence: float | None = None) -> dict[str, float | None]:
    """Half-width of each noisy output's interval at ``confidence`` (default the plan's), in the
    output's units; None where it depends on the data (AVG, automatic bounds)."""
    level = plan.confidence if confidence is None else confidence
    errors: dict[str, float | None] = {}
    for output in plan.shape.outputs:
        if isinstance(output, GroupKey):
            continue
        errors[output.name] = _error(plan, output.kind, output.column, level)
    return errors


def _error(
    plan: QueryPlan, kind: AggregateKind, column: str | None, level: float
) -> float | None:
    return plan.error(kind, column, level)


def plan_error(plan: QueryPlan, column: str | None, confidence: float | None = None) -> float:
    """The expected error of output ``column``, or with None the largest over every noisy
    output; refuses outputs whose error depends on the data, naming them."""
    errors = output_errors(plan, confidence)
    if column is not None and column not in errors:
        raise ParameterError(
            f"{column!r} is not a noisy output of the query (outputs: {', '.join(errors)})"
        )
    chosen = errors if column is None else {column: errors[column]}
    unknown = [name for name, error in chosen.items() if error is None]
    if unknown:
        raise ParameterError(
            f"the error of {', '.join(map(repr, unknown))} depends on the data (an AVG is a "
            "ratio of noisy values whose error depends on its count: state a public guess with "
            "OPTIONS(expected_count=N) or the table's expected_rows in the policy; automatically "
            "bounded sums get their bounds at run time): no accuracy can be promised for it "
            "before the data is read; give an epsilon instead"
        )
    return max(error for error in chosen.values() if error is not None)


def least_epsilon(
    plan_at: Callable[[float], QueryPlan],
    target: float,
    *,
    column: str | None = None,
    confidence: float | None = None,
    ceiling: float,
) -> QueryPlan:
    """The plan at the least ε (in ledger units, up to ``ceiling``) whose ``column`` error is at
    most ``target``. ``plan_at(epsilon)`` plans the query (reads no data). Raises naming the
    target when even ``ceiling`` does not meet it."""
    if not target > 0:
        raise ParameterError(f"accuracy must be > 0, got {target}")
    plans: dict[int, QueryPlan] = {}

    def meets(units: int) -> bool:
        try:
            plans[units] = plan_at(Cost(units).epsilon)
        except DpsqlError:
            return False  # e.g. too little ε to split among the measurements
        return plan_error(plans[units], column, confidence) <= target

    plan_error(plan_at(ceiling), column, confidence)  # refuse data-dependent outputs by name
    top = Cost.cap(ceiling).epsilon_units
    units = least_units(meets, ceiling=top)
    if units is None:
        best = plan_error(plan_at(ceiling), column, confidence)
        raise ParameterError(
            f"accuracy ±{target:g} cannot be met: even epsilon={ceiling:g} (the most available) "
            f"gives ±{best:g}"
        )
    plan = plans[units]
    assert total(plan.event).epsilon_units == units
    return plan


def accuracy_target(
    given: float | None, options: Mapping[str, object], epsilon: float | None
) -> float | None:
    """The accuracy target of a query (argument or ``OPTIONS(accuracy=...)``), checked; None when
    absent. A query states an epsilon or an accuracy, never both."""
    option = options.get("accuracy")
    if given is not None and option is not None and float(given) != option:
        raise ParameterError(
            f"accuracy is given both in OPTIONS ({option}) and as an argument ({given}); "
            "give it once"
        )
    value = given if given is not None else option
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ParameterError(f"accuracy must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ParameterError(f"accuracy must be finite, got {value!r}")
    if epsilon is not None or "epsilon" in options:
        raise ParameterError(
            "give an epsilon or an accuracy, not both: with an accuracy dpsql chooses the least "
            "epsilon that meets it"
        )
    return float(value)


def with_confidence(policy: Policy, options: Mapping[str, object]) -> Policy:
    """``policy`` with the interval confidence of ``OPTIONS(confidence=...)`` (a reporting
    level, not a privacy parameter), or unchanged."""
    level = options.get("confidence")
    if level is None:
        return policy
    if not isinstance(level, float) or not 0.5 <= level < 1:
        raise ParameterError(f"confidence must be in [0.5, 1), got {level!r}")
    dataset = policy.dataset.model_copy(update={"confidence": level})
    return policy.model_copy(update={"dataset": dataset})


def accuracy_details(plan: QueryPlan, target: float) -> dict[str, object]:
    """What EXPLAIN, the ledger and the result say about an accuracy-first query."""
    return {
        "target": target,
        "confidence": plan.confidence,
        "expected_error": output_errors(plan),
        "epsilon": plan.epsilon,
        "rule": "the least epsilon, in ledger units of 1e-9, whose interval half-width at the "
        "confidence is at most the target for every noisy output",
    }
