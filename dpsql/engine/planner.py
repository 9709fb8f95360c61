"""Turn an accepted query shape into noisy measurements, sensitivities and a priced event.

Everything here is computed from the shape and the policy alone, before any data is read:
sensitivity = declared value bounds x contribution bounds, never a property of the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.accountant.regions import Region
from dpsql.accountant.units import Cost
from dpsql.engine.policy import Policy, PublicKey, TablePolicy
from dpsql.errors import ParameterError, PolicyError, SchemaError, UnsupportedQueryError
from dpsql.mechanisms.laplace import choose_grid, noise_scale
from dpsql.sql.generate import Bounds, Measure, MeasureKind
from dpsql.sql.partition import partition_region
from dpsql.sql.shape import AggregateKind, ColumnKind, QueryShape

__all__ = ["MAX_GROUPS", "MeasurementPlan", "QueryPlan", "key_literal", "plan_query"]

MAX_GROUPS = 10_000_000
"""Largest public key domain (product over group columns) one query may answer."""

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


@dataclass(frozen=True)
class QueryPlan:
    """Everything needed to charge, run and noise one query."""

    shape: QueryShape
    table: TablePolicy
    measurements: tuple[MeasurementPlan, ...]
    key_domain: dict[str, tuple[Any, ...]]
    key_literals: dict[str, tuple[exp.Expression, ...]]
    bounds: Bounds
    epsilon: float
    delta: float
    confidence: float
    partition: tuple[str, Region] | None = None
    """(family, region) when the WHERE clause confines the table's partition column."""

    @property
    def groups(self) -> int:
        return math.prod(len(v) for v in self.key_domain.values()) if self.key_domain else 1

    @property
    def event(self) -> SequentialEvent:
        """The cost tree: one discrete-Laplace leaf per measurement, composed sequentially."""
        return SequentialEvent(
            tuple(
                MechanismEvent(
                    MECHANISM,
                    m.epsilon,
                    0.0,
                    m.label,
                    (
                        ("groups", self.groups),
                        ("l1_sensitivity", m.sensitivity_units * m.grid),
                        ("noise_scale", float(m.scale) * m.grid),
                    ),
                )
                for m in self.measurements
            )
        )

    def summary(self) -> dict[str, Any]:
        """What the ledger and EXPLAIN show: table, grouping, bounds and each measurement."""
        return {
            "table": self.shape.table,
            "group_by": list(self.shape.group_by),
            "groups": self.groups,
            "where": self.shape.where.sql(dialect="duckdb") if self.shape.where else None,
            "privacy_unit": self.bounds.unit,
            "contribution_bounds": {
                "max_groups_per_unit": self.bounds.max_groups_per_unit,
                "max_rows_per_group": self.bounds.max_rows_per_group,
                "max_rows_per_unit": self.bounds.max_rows_per_unit,
            },
            "partition": (
                None
                if self.partition is None
                else {
                    "family": self.partition[0],
                    "region": self.partition[1].describe(self.table.partition_column or ""),
                }
            ),
            "mechanism": MECHANISM,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "measurements": [
                {
                    "label": m.label,
                    "epsilon": m.epsilon,
                    "l1_sensitivity": m.sensitivity_units * m.grid,
                    "grid": m.grid,
                    "noise_scale": float(m.scale) * m.grid,
                }
                for m in self.measurements
            ],
        }


def key_literal(value: PublicKey, kind: ColumnKind, column: str) -> tuple[Any, exp.Expression]:
    """A public key as a Python value and a typed SQL literal for ``column``'s type."""
    problem = f"public key {value!r} of column {column!r} does not match its type ({kind.value})"
    if kind is ColumnKind.STRING and isinstance(value, str):
        return value, exp.Literal.string(value)
    if kind is ColumnKind.BOOLEAN and isinstance(value, bool):
        return value, exp.Boolean(this=value)
    if kind.numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
        if kind is ColumnKind.INTEGER and float(value) != int(value):
            raise PolicyError(problem)
        if kind is ColumnKind.INTEGER:
            return int(value), exp.cast(exp.Literal.number(int(value)), "BIGINT")
        return float(value), exp.cast(exp.Literal.number(repr(float(value))), "DOUBLE")
    if kind in (ColumnKind.DATE, ColumnKind.TIMESTAMP) and isinstance(value, str):
        target = "DATE" if kind is ColumnKind.DATE else "TIMESTAMP"
        return value, exp.cast(exp.Literal.string(value), target)
    raise PolicyError(problem)


def _partition(shape: QueryShape, table: TablePolicy) -> tuple[str, Region] | None:
    column = table.partition_column
    if column is None:
        return None
    region = partition_region(shape.where, column)
    return None if region is None else (f"{shape.table}.{column}", region)


def _split(epsilon: float, parts: int) -> list[float]:
    """Split ``epsilon`` into ``parts`` shares that sum exactly to it in ledger units."""
    units = Cost.of(epsilon).epsilon_units
    base, extra = divmod(units, parts)
    if base == 0:
        raise ParameterError(
            f"epsilon {epsilon} is too small to split among {parts} noisy measurements"
        )
    return [Cost(base + (i < extra), 0).epsilon for i in range(parts)]


def plan_query(shape: QueryShape, policy: Policy, *, epsilon: float, delta: float) -> QueryPlan:
    """Check the shape against the policy and price it; raises before any data is read."""
    table = policy.table(shape.table)
    if table is None:
        raise PolicyError(f"table {shape.table!r} is not covered by the privacy policy")
    if table.privacy_unit not in shape.columns:
        raise SchemaError(
            f"the policy's privacy unit {table.privacy_unit!r} is not a column "
            f"of table {shape.table!r}"
        )
    key_domain: dict[str, tuple[Any, ...]] = {}
    key_literals: dict[str, tuple[exp.Expression, ...]] = {}
    for column in shape.group_by:
        keys = table.column(column).public_keys
        if keys is None:
            raise UnsupportedQueryError(
                f"GROUP BY {column!r} needs a public key set: declare "
                f"[tables.{shape.table}.columns.{column}] public_keys = [...] in the policy "
                "(releasing keys found in the data is not supported yet)"
            )
        pairs = [key_literal(k, shape.columns[column], column) for k in keys]
        key_domain[column] = tuple(p[0] for p in pairs)
        key_literals[column] = tuple(p[1] for p in pairs)
    if math.prod(len(v) for v in key_domain.values()) > MAX_GROUPS:
        raise UnsupportedQueryError(f"the public key domain has more than {MAX_GROUPS} groups")

    grouped = bool(shape.group_by)
    rows_per_unit = (
        min(table.max_groups_per_unit * table.max_rows_per_group, table.max_rows_per_unit)
        if grouped
        else table.max_rows_per_unit
    )

    wanted: dict[Measure, str] = {}
    for aggregate in shape.aggregates:
        column = aggregate.column
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

    shares = _split(epsilon, len(wanted))
    measurements = []
    for index, ((draft, label), share) in enumerate(zip(wanted.items(), shares, strict=True)):
        grid, units = 1.0, rows_per_unit
        clamp = None
        if draft.clamp is not None:
            low, high, _ = draft.clamp
            largest = max(abs(low), abs(high))
            if draft.kind is MeasureKind.SUM:
                if largest == 0:
                    raise PolicyError(f"bounds of {draft.column!r} are [0, 0]; nothing to sum")
                grid = choose_grid(rows_per_unit * largest, share)
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
        bounds=Bounds(
            table.privacy_unit,
            table.max_groups_per_unit,
            table.max_rows_per_group,
            table.max_rows_per_unit,
            table.partition_column,
        ),
        partition=_partition(shape, table),
        epsilon=epsilon,
        delta=delta,
        confidence=policy.dataset.confidence,
    )
