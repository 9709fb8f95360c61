"""What every plan family shares: measurements, key literals, and the ``Family`` protocol.

A query's plan (``dpsql.engine.planner.QueryPlan``) holds the shape, the policy's bounds and
one *family* object that knows the mechanism: its privacy map (the mechanism's name, why it was
chosen, its cost event, what each output measures, its expected errors) beside its release (read
the bounded aggregates, add noise). The defaults here describe discrete-Laplace measurements over
public groups; each family overrides what differs, and ``dpsql.engine.planner.plan_query`` is
the one place that picks a family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.accountant.units import Cost
from dpsql.engine.policy import PublicKey, TablePolicy
from dpsql.errors import ParameterError, PolicyError
from dpsql.mechanisms.laplace import interval_half_width, noise_scale
from dpsql.sql.generate import Bounds, Measure, MeasureKind
from dpsql.sql.shape import AggregateKind, ColumnKind

if TYPE_CHECKING:
    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.policy import ColumnPolicy
    from dpsql.engine.release import ReleaseContext
    from dpsql.engine.results import QueryResult
    from dpsql.sql.shape import Aggregate

__all__ = [
    "MECHANISM",
    "Family",
    "MeasurementPlan",
    "average_error",
    "count_guess",
    "key_literal",
    "laplace_leaves",
    "literal_text",
    "split_epsilon",
    "table_bounds",
]

MECHANISM = "discrete_laplace"


@dataclass(frozen=True)
class MeasurementPlan:
    """One noisy vector (one value per group) and what it costs."""

    measure: Measure
    label: str
    epsilon: float
    sensitivity_units: int
    grid: float

    @property
    def scale(self) -> Fraction:
        """Noise scale in integer units (grid units for sums)."""
        return noise_scale(self.sensitivity_units, self.epsilon)


def key_literal(value: PublicKey, kind: ColumnKind, column: str) -> tuple[Any, exp.Expression]:
    """A public key as a Python value and a draft typed literal for ``column``'s type, for callers
    without a backend (the session converts keys with ``dpsql.engine.literals.Binder``)."""
    problem = f"public key {value!r} of column {column!r} does not match its type ({kind.value})"
    if kind is ColumnKind.STRING and isinstance(value, str):
        return value, exp.Literal.string(value)
    if kind is ColumnKind.BOOLEAN and isinstance(value, bool):
        return value, exp.Boolean(this=value)
    if kind.numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
        if kind is ColumnKind.INTEGER and float(value) != int(value):
            raise PolicyError(problem)
        if kind is ColumnKind.INTEGER:
            return int(value), exp.cast(exp.Literal.string(str(int(value))), "BIGINT")
        return float(value), exp.cast(exp.Literal.string(repr(float(value))), "DOUBLE")
    if kind in (ColumnKind.DATE, ColumnKind.TIMESTAMP) and isinstance(value, str):
        target = "DATE" if kind is ColumnKind.DATE else "TIMESTAMP"
        return value, exp.cast(exp.Literal.string(value), target)
    raise PolicyError(problem)


def literal_text(literal: exp.Expression) -> str:
    """How the database prints the value of a typed literal (``CAST(x AS VARCHAR)``)."""
    if isinstance(literal, exp.Boolean):
        return "true" if literal.this else "false"
    if isinstance(literal, exp.Cast):
        return str(literal.this.this)
    return str(literal.this)


def split_epsilon(epsilon: float, parts: int) -> list[float]:
    """Split ``epsilon`` into ``parts`` shares that sum exactly to it in ledger units."""
    units = Cost.of(epsilon).epsilon_units
    base, extra = divmod(units, parts)
    if base == 0:
        raise ParameterError(
            f"epsilon {epsilon} is too small to split among {parts} noisy measurements"
        )
    return [Cost(base + (i < extra), 0).epsilon for i in range(parts)]


def table_bounds(table: TablePolicy) -> Bounds:
    """The contribution bounds the generated SQL applies for ``table``."""
    return Bounds(
        table.privacy_unit,
        table.max_groups_per_unit,
        table.max_rows_per_group,
        table.max_rows_per_unit,
        table.partition_column,
    )


def laplace_leaves(plan: QueryPlan, *, auto: bool = False) -> tuple[MechanismEvent, ...]:
    """One discrete-Laplace leaf per measurement (with automatic bounds, the sensitivities are
    only known after the bound is chosen, so the leaves record the groups only)."""
    return tuple(
        MechanismEvent(
            MECHANISM,
            m.epsilon,
            0.0,
            m.label,
            (("groups", plan.groups), ("bounds", "automatic"))
            if auto
            else (
                ("groups", plan.groups),
                ("l1_sensitivity", m.sensitivity_units * m.grid),
                ("noise_scale", float(m.scale) * m.grid),
            ),
        )
        for m in plan.measurements
    )


def count_guess(plan: QueryPlan) -> tuple[float, str] | None:
    """The public guess of the rows an AVG averages over, and where it comes from: the query's
    ``OPTIONS(expected_count=...)``, else the policy's ``expected_rows`` (None: no guess)."""
    given = plan.shape.options.get("expected_count")
    if given is not None:
        if not (math.isfinite(given) and given >= 1):
            raise ParameterError(f"expected_count must be a number >= 1, got {given:g}")
        return float(given), "OPTIONS(expected_count)"
    if plan.table.expected_rows is not None:
        return float(plan.table.expected_rows), f"[tables.{plan.shape.table}] expected_rows"
    return None


def average_error(plan: QueryPlan, column: str | None, level: float) -> float | None:
    """The expected error of ``AVG(column)`` at ``level`` if each group averages at least the
    guessed count ``n`` of rows (``count_guess``), else None.

    The answer is S/C with S and C the noisy sum and count, each within its half-width h_s, h_c
    at level (1 + level)/2 (as the answer's own interval: a union bound), and clamped to the
    bounds [low, high]. With the true sum s and count c >= n > h_c, and |s/c| <= M = max(|low|,
    |high|): |(s + a)/(c + b) - s/c| = |a - b s/c| / (c + b) <= (h_s + M h_c) / (n - h_c); and never
    more than high - low (the clamp). A conservative bound from the noise laws and public values.
    """
    guess = count_guess(plan)
    if guess is None:
        return None
    n = guess[0]
    sums = [m for m in plan.measurements if m.measure.kind is MeasureKind.SUM]
    counts = [m for m in plan.measurements if m.measure.kind is MeasureKind.COUNT]
    total = next(m for m in sums if m.measure.column == column)
    rows = next(m for m in counts if m.measure.column == column and m.measure.clamp is not None)
    assert total.measure.clamp is not None
    low, high, _ = total.measure.clamp
    widest = high - low
    half = (1 + level) / 2
    h_sum = float(interval_half_width(total.scale, half)) * total.grid
    h_count = float(interval_half_width(rows.scale, half)) * rows.grid
    if n <= h_count:
        return widest
    return min((h_sum + max(abs(low), abs(high)) * h_count) / (n - h_count), widest)


@dataclass(frozen=True)
class Family:
    """A mechanism family's privacy map and release. The defaults are those of discrete-Laplace
    measurements over public groups (``dpsql.engine.plans.laplace``); a family overrides what
    differs."""

    @property
    def mechanism(self) -> str:
        return MECHANISM

    def reason(self, plan: QueryPlan) -> str:
        """Why this mechanism: what EXPLAIN shows."""
        if plan.shape.having is not None:
            return (
                "HAVING over public keys: every group is noised once under parallel composition "
                "(cost epsilon whatever the number of groups) and the noisy counts are filtered "
                "(post-processing); cheaper than the sparse vector technique, whose noise grows "
                "with the number of answers"
            )
        return "discrete Laplace on each aggregate; parallel composition across disjoint groups"

    def event(self, plan: QueryPlan) -> SequentialEvent:
        """The cost tree: one discrete-Laplace leaf per measurement, composed sequentially."""
        return SequentialEvent(laplace_leaves(plan))

    def per_person(self, plan: QueryPlan) -> str:
        """How much of one person's rows a bounded aggregate keeps, in words."""
        bounds = plan.bounds
        if not plan.shape.group_by:
            return f"at most {bounds.max_rows_per_unit} per person"
        text = (
            f"at most {bounds.max_rows_per_group} per person per group, in at most "
            f"{bounds.max_groups_per_unit} groups per person"
        )
        if bounds.max_rows_per_unit < bounds.max_groups_per_unit * bounds.max_rows_per_group:
            text += f", at most {bounds.max_rows_per_unit} per person in all"
        return text

    def clamp(self, rules: ColumnPolicy | None) -> str:
        """The bounds an output's values are clamped to, in words."""
        if rules is None or rules.bounds is None:
            return "automatic bounds (see details)"
        return f"[{rules.bounds[0]:g}, {rules.bounds[1]:g}]"

    def measures(self, plan: QueryPlan, output: Aggregate, text: str) -> str:
        """What ``output`` measures, given the words shared by every family."""
        return text

    def summary(self, plan: QueryPlan) -> dict[str, Any]:
        """The family's own entries of the plan's summary (EXPLAIN and the ledger)."""
        having = plan.shape.having
        return {
            "having": None
            if having is None
            else {
                "count_at_least": having.integer_threshold,
                "applied": "to the noisy counts (post-processing)",
            },
            "max_answers": None,
            "auto_bounds": None,
            "key_release": None,
            "quantiles": None,
        }

    def measurement(self, plan: QueryPlan, m: MeasurementPlan) -> dict[str, Any]:
        """One measurement's epsilon, sensitivity and noise scale, as the summary shows them."""
        return {
            "label": m.label,
            "epsilon": m.epsilon,
            "l1_sensitivity": m.sensitivity_units * m.grid,
            "grid": m.grid,
            "noise_scale": float(m.scale) * m.grid,
        }

    def error(
        self, plan: QueryPlan, kind: AggregateKind, column: str | None, level: float
    ) -> float | None:
        """Half-width of an output's interval at ``level`` (None where it depends on the data)."""
        if kind is AggregateKind.AVG:
            return average_error(plan, column, level)
        if kind is AggregateKind.QUANTILE:
            return None  # a chosen value: its error is a rank error (see the plan's quantiles)
        for m in plan.measurements:
            is_sum = m.measure.kind is MeasureKind.SUM
            if m.measure.column == column and is_sum == (kind is AggregateKind.SUM) and (
                is_sum or m.measure.clamp is None
            ):
                return float(interval_half_width(m.scale, level)) * m.grid
        raise AssertionError(f"no measurement for {kind.value}({column})")  # pragma: no cover

    def unit_weights(self) -> tuple[int, ...] | None:
        """The per-unit weights the generated SQL sums (a weighted key selection), else None."""
        return None

    def seeded(self, rng: Any) -> Family:
        """This family with any public seed it needs drawn from ``rng`` before the charge."""
        return self

    def release(
        self, plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
    ) -> tuple[QueryResult, QueryPlan]:
        """Read the charged plan's aggregates and release them: the answer and the plan it was
        released under."""
        raise NotImplementedError
