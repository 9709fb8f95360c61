"""Turn an accepted query shape into a priced plan: measurements, sensitivities, and the one
mechanism family (``dpsql.engine.plans``) that answers it.

Everything here is computed from the shape and the policy alone, before any data is read:
sensitivity = declared value bounds x contribution bounds, never a property of the data.
``plan_query`` is the one place that picks a family; the family holds the privacy map (event,
reason, what each output measures) beside its release.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlglot import exp

from dpsql.accountant.events import SequentialEvent
from dpsql.engine.choices import MECHANISM_NAMES, MECHANISMS
from dpsql.engine.plans.auto_bounds import (
    AUTO_BOUND_EXPONENTS,
    AutomaticBounds,
    plan_automatic_bounds,
)
from dpsql.engine.plans.base import (
    MECHANISM,
    Family,
    MeasurementPlan,
    key_literal,
    literal_text,
    split_epsilon,
    table_bounds,
)
from dpsql.engine.plans.keys import Keys, plan_key_release
from dpsql.engine.plans.laplace import LAPLACE
from dpsql.engine.plans.quantiles import QUANTILE_WEIGHT, QuantilePlan, Quantiles, plan_quantiles
from dpsql.engine.plans.ranges import plan_ranges
from dpsql.engine.policy import Policy, TablePolicy
from dpsql.engine.virtual_columns import with_virtual_bounds
from dpsql.errors import ParameterError, PolicyError, SchemaError, UnsupportedQueryError
from dpsql.mechanisms.laplace import MAX_GRID, choose_grid
from dpsql.sql.generate import Bounds, Measure, MeasureKind, where_sql
from dpsql.sql.shape import AggregateKind, GroupKey, QueryShape

__all__ = [
    "AUTO_BOUND_EXPONENTS",
    "MAX_GROUPS",
    "MECHANISM",
    "MECHANISM_NAMES",
    "QUANTILE_WEIGHT",
    "MeasurementPlan",
    "QuantilePlan",
    "QueryPlan",
    "key_literal",
    "literal_text",
    "plan_query",
    "unit_weights_of",
    "with_key_hash_seed",
]

MAX_GROUPS = 10_000_000
"""Largest public key domain (product over group columns) one query may answer."""


@dataclass(frozen=True)
class QueryPlan:
    """Everything needed to charge, run and noise one query: the shape, the policy's bounds,
    the measurements, and the mechanism family that prices and releases them
    (``dpsql.engine.plans``)."""

    shape: QueryShape
    table: TablePolicy
    measurements: tuple[MeasurementPlan, ...]
    key_domain: dict[str, tuple[Any, ...]]
    key_literals: dict[str, tuple[exp.Expression, ...]]
    bounds: Bounds
    epsilon: float
    delta: float
    confidence: float
    partition: tuple[str, tuple[str, ...]] | None = None
    """(family, values) when the WHERE clause reads only these declared partition values."""
    family: Family = LAPLACE
    """The mechanism family: its privacy map and its release."""

    @property
    def mechanism(self) -> str:
        return self.family.mechanism

    @property
    def reason(self) -> str:
        """Why this mechanism: what EXPLAIN shows."""
        return self.family.reason(self)

    @property
    def groups(self) -> int:
        return math.prod(len(v) for v in self.key_domain.values()) if self.key_domain else 1

    @functools.cached_property
    def event(self) -> SequentialEvent:
        """The cost tree of the family's release (one object per plan: the ledger keeps what it
        records of a tree by its identity)."""
        return self.family.event(self)

    def per_person(self) -> str:
        """How much of one person's rows a bounded aggregate keeps, in words."""
        return self.family.per_person(self)

    def measures(self) -> dict[str, str]:
        """What each noisy output column measures: the *bounded* quantity its interval covers,
        which differs from the plain SQL answer whenever a person exceeds a bound."""
        return dict(self._measures)

    @functools.cached_property
    def _measures(self) -> dict[str, str]:
        """``measures()``, worded once per plan."""
        per_person = self.per_person()
        described: dict[str, str] = {}
        for output in self.shape.outputs:
            if isinstance(output, GroupKey):
                continue
            column = output.column
            rules = None if column is None else self.table.column(column)
            if column in self.shape.virtual:
                column = self.shape.virtual[column].meta.get("text", column)
            clamp = self.family.clamp(rules)
            if output.kind is AggregateKind.QUANTILE:
                text = (
                    f"the {output.quantile} quantile of {column} clamped to {clamp}: the midpoint "
                    "of a public bin chosen by permute-and-flip, over rows "
                    f"{per_person}; the interval is that bin, which holds a value within the "
                    "rank error (the plan's quantiles) of the quantile, not surely the quantile"
                )
            elif output.kind is AggregateKind.PERSONS:
                text = f"persons with a row kept under the bounds ({per_person})"
            elif output.kind is AggregateKind.COUNT:
                what = "rows" if column is None else f"rows with a non-NULL {column}"
                text = f"{what}, {per_person}"
            elif output.kind is AggregateKind.SUM:
                text = f"sum of {column} clamped to {clamp}, over rows {per_person}"
            else:
                text = (
                    f"mean of {column} clamped to {clamp} (bounded sum / bounded count), over "
                    f"rows {per_person}"
                )
            if self.shape.relation is not None:
                text = f"{text}; {self.shape.relation.rule}"
            described[output.name] = self.family.measures(self, output, text)
        return described

    def warnings(self) -> list[str]:
        """Traps in what the answer measures, from the shape and the policy alone: a GROUP BY
        whose per-group row bound is below the per-person one keeps few rows of a person
        whose rows all share one key (a column fixed per person counts persons, not rows)."""
        bounds = self.bounds
        if not self.shape.group_by or bounds.max_rows_per_group >= bounds.max_rows_per_unit:
            return []
        names = [
            self.shape.virtual[c].meta.get("text", c) if c in self.shape.virtual else c
            for c in self.shape.group_by
        ]
        rows = bounds.max_rows_per_group
        kept = f"{rows} row" if rows == 1 else f"{rows} rows"
        fixed = [n for n, c in zip(names, self.shape.group_by, strict=True)
                 if c == bounds.partition]  # fmt: skip
        if fixed:
            who = (
                f"{fixed[0]} is fixed per person (the table's partition column), so each "
                f"person's rows share one group"
            )
        else:
            who = (
                f"wherever {' and '.join(names)} is the same for all of a person's rows (a "
                "column fixed per person, like sex or birth year)"
            )
        return [
            f"GROUP BY {', '.join(names)} keeps at most {kept} per person per group "
            f"(max_rows_per_group = {rows} < max_rows_per_unit = {bounds.max_rows_per_unit}): "
            f"{who}, COUNT(*) counts persons (each at most {rows} time(s)), not rows, and "
            f"SUM and AVG read only {kept} of each person; to count rows, raise "
            f"max_rows_per_group (up to {bounds.max_rows_per_unit}) in the policy"
        ]

    def summary(self) -> dict[str, Any]:
        """What the ledger and EXPLAIN show: table, grouping, bounds and each measurement."""
        family = self.family.summary(self)
        return {
            "table": self.shape.table,
            "group_by": list(self.shape.group_by),
            "groups": self.groups,
            "where": where_sql(self.shape.where) if self.shape.where else None,
            "privacy_unit": self.bounds.unit,
            "contribution_bounds": {
                "max_groups_per_unit": self.bounds.max_groups_per_unit,
                "max_rows_per_group": self.bounds.max_rows_per_group,
                "max_rows_per_unit": self.bounds.max_rows_per_unit,
            },
            "partition": (
                None
                if self.partition is None
                else {"family": self.partition[0], "values": list(self.partition[1])}
            ),
            "mechanism": self.mechanism,
            "reason": self.reason,
            "measures": self.measures(),
            "having": family["having"],
            "max_answers": family["max_answers"],
            "auto_bounds": family["auto_bounds"],
            "key_release": family["key_release"],
            "quantiles": family["quantiles"],
            "epsilon": self.epsilon,
            "delta": self.delta,
            "measurements": [self.family.measurement(self, m) for m in self.measurements],
            "warnings": self.warnings(),
        }

    def error(self, kind: AggregateKind, column: str | None, level: float) -> float | None:
        """Half-width of an output's interval at ``level`` (None where it depends on data)."""
        return self.family.error(self, kind, column, level)




def _mechanism_option(shape: QueryShape, given: str | None) -> str | None:
    option = shape.options.get("mechanism")
    if given is not None and option is not None and given != option:
        raise ParameterError(
            f"mechanism is given both in OPTIONS ({option!r}) and as an argument ({given!r})"
        )
    chosen = given if given is not None else option
    if chosen == "mad":
        raise ParameterError(
            "mechanism 'mad' (one-round MAD) is not available: the one-round rerouting's "
            "sensitivity dpsql can prove costs more noise than it gains "
            "(docs/partition_selection.md); use 'mad2r', the two-round adaptive weighting"
        )
    if chosen is not None and chosen not in MECHANISMS:
        raise ParameterError(
            f"unknown mechanism {chosen!r}; choose one of {', '.join(sorted(MECHANISMS))}"
        )
    return chosen


def with_key_hash_seed(plan: QueryPlan, rng: Any) -> QueryPlan:
    """``plan`` with any public seed its family needs (released key hashes) drawn from ``rng``
    before the charge (data-independent), so the ledger entry, the result and any synopsis name
    it; ``plan`` itself when its family needs none."""
    family = plan.family.seeded(rng)
    return plan if family is plan.family else replace(plan, family=family)


def unit_weights_of(plan: QueryPlan) -> tuple[int, ...] | None:
    """The per-unit weights the generated SQL sums for a weighted selection, else None."""
    return plan.family.unit_weights()


def plan_query(
    shape: QueryShape,
    policy: Policy,
    *,
    epsilon: float,
    delta: float,
    mechanism: str | None = None,
    max_answers: int | None = None,
    keys: Mapping[str, Sequence[exp.Expression]] | None = None,
    partition: tuple[str, tuple[str, ...]] | None = None,
) -> QueryPlan:
    """Check the shape against the policy and price it; raises before any data is read.

    ``mechanism`` (or ``OPTIONS(mechanism=...)``) chooses how keys without a public key set are
    released: "threshold" or "alp" (the combined threshold + ALP synopsis). ``keys`` are the
    public keys of group columns as the database converted them, and ``partition`` the partition
    values the (restricted) WHERE clause reads (see ``dpsql.engine.literals``).
    """
    table = policy.table(shape.table)
    if table is None:
        raise PolicyError(f"table {shape.table!r} is not covered by the privacy policy")
    shape, table = with_virtual_bounds(shape, table)
    if table.privacy_unit not in shape.columns:
        raise SchemaError(
            f"the policy's privacy unit {table.privacy_unit!r} is not a column "
            f"of table {shape.table!r}"
        )
    key_domain: dict[str, tuple[Any, ...]] = {}
    key_literals: dict[str, tuple[exp.Expression, ...]] = {}
    mechanism = _mechanism_option(shape, mechanism)
    if shape.range_join is not None:
        ranges, measure = plan_ranges(shape, policy, table, epsilon, delta, max_answers)
        return QueryPlan(
            shape=shape,
            table=table,
            measurements=(measure,),
            key_domain={},
            key_literals={},
            bounds=table_bounds(table),
            epsilon=epsilon,
            delta=delta,
            confidence=policy.dataset.confidence,
            family=ranges,
        )
    if max_answers is not None or "max_answers" in shape.options:
        raise UnsupportedQueryError(
            "max_answers applies to a range JOIN with HAVING (the sparse vector technique)"
        )
    release = plan_key_release(shape, table, epsilon, delta, mechanism, policy.dataset.confidence)
    converted = keys
    for column in shape.group_by:
        keys = table.column(column).public_keys
        if keys is None:
            continue
        key_domain[column] = tuple(keys)
        if converted is not None and column in converted:
            key_literals[column] = tuple(converted[column])
        else:
            key_literals[column] = tuple(
                key_literal(k, shape.columns[column], column)[1] for k in keys
            )
    if math.prod(len(v) for v in key_domain.values()) > MAX_GROUPS:
        raise UnsupportedQueryError(f"the public key domain has more than {MAX_GROUPS} groups")

    grouped = bool(shape.group_by)
    rows_per_unit = (
        min(table.max_groups_per_unit * table.max_rows_per_group, table.max_rows_per_unit)
        if grouped
        else table.max_rows_per_unit
    )
    if any(a.kind is AggregateKind.QUANTILE for a in shape.aggregates):
        return QueryPlan(
            shape=shape,
            table=table,
            measurements=(),
            key_domain=key_domain,
            key_literals=key_literals,
            bounds=table_bounds(table),
            partition=partition,
            epsilon=epsilon,
            delta=delta,
            confidence=policy.dataset.confidence,
            family=Quantiles(
                plan_quantiles(shape, table, epsilon, rows_per_unit, release is not None)
            ),
        )

    auto = plan_automatic_bounds(shape, table, policy, epsilon)
    if auto is not None:
        rules = table.column(auto.column)
        placeholder = (0.0, 1.0) if auto.mode == "nonnegative" else (-1.0, 1.0)
        columns = {**table.columns, auto.column: rules.model_copy(update={"bounds": placeholder})}
        table = table.model_copy(update={"columns": columns})
    main_epsilon = epsilon if auto is None else auto.rest

    wanted: dict[Measure, str] = {}
    for aggregate in shape.aggregates:
        column = aggregate.column
        if aggregate.kind is AggregateKind.PERSONS:
            if column != table.privacy_unit:
                raise UnsupportedQueryError(
                    f"COUNT(DISTINCT {column}) is supported for the privacy unit only "
                    f"(COUNT(DISTINCT {table.privacy_unit}) counts persons)"
                )
            wanted.setdefault(Measure("", MeasureKind.UNITS, column), aggregate.name)
            continue
        if aggregate.kind is AggregateKind.COUNT:
            kind = MeasureKind.ROWS if column is None else MeasureKind.COUNT
            wanted.setdefault(Measure("", kind, column), aggregate.name)
            continue
        bounds = table.column(column or "").bounds
        if bounds is None:
            raise PolicyError(
                f"{aggregate.kind.value.upper()}({column}) needs declared bounds: "
                f"set [tables.{shape.table}.columns.{column}] bounds = [low, high]"
            )
        wanted.setdefault(Measure("", MeasureKind.SUM, column, (*bounds, 0.0)), f"SUM({column})")
        if aggregate.kind is AggregateKind.AVG:
            wanted.setdefault(
                Measure("", MeasureKind.COUNT, column, (*bounds, 0.0)),
                f"COUNT({column}) within bounds",
            )

    shares = split_epsilon(main_epsilon, len(wanted))
    measurements = []
    for index, ((draft, label), share) in enumerate(zip(wanted.items(), shares, strict=True)):
        grid, units = 1.0, rows_per_unit
        clamp = None
        if draft.kind is MeasureKind.UNITS:
            # One person adds at most 1 to each of the groups it keeps a row in.
            units = min(table.max_groups_per_unit, rows_per_unit) if grouped else 1
        if draft.clamp is not None:
            low, high, _ = draft.clamp
            largest = max(abs(low), abs(high))
            if draft.kind is MeasureKind.SUM:
                if largest == 0:
                    raise PolicyError(f"bounds of {draft.column!r} are [0, 0]; nothing to sum")
                grid = choose_grid(rows_per_unit * largest, share)
                # The database rounds values to integers of the grid: keep them within 2**52.
                grid = max(grid, math.ldexp(1.0, math.frexp(largest / 2.0**52)[1]))
                if grid > MAX_GRID:
                    raise PolicyError(
                        f"bounds [{low:g}, {high:g}] of {draft.column!r} are too wide to release "
                        f"a sum exactly at epsilon {share:g}: noise would leave the float range; "
                        "narrow the bounds"
                    )
                units = rows_per_unit * max(math.ceil(abs(low) / grid), math.ceil(abs(high) / grid))
            clamp = (low, high, grid if draft.kind is MeasureKind.SUM else 1.0)
        measure = Measure(f"m{index}", draft.kind, draft.column, clamp)
        measurements.append(MeasurementPlan(measure, label, share, units, grid))

    return QueryPlan(
        shape=shape,
        table=table,
        measurements=tuple(measurements),
        key_domain=key_domain,
        key_literals=key_literals,
        bounds=table_bounds(table),
        partition=partition,
        family=(
            Keys(release)
            if release is not None
            else AutomaticBounds(auto)
            if auto is not None
            else LAPLACE
        ),
        epsilon=epsilon,
        delta=delta,
        confidence=policy.dataset.confidence,
    )
