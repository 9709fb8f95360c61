"""Generate the SQL the database runs: contribution bounding and aggregation, never the user's text.

The query is built from a ``QueryShape`` and explicit bounds, in DuckDB's dialect, and transpiled
with sqlglot to the backend's dialect. Inside the database it:

1. filters rows with the validated WHERE clause and restricts group columns to their public keys;
2. keeps at most ``max_rows_per_group`` rows per (privacy unit, group), at most
   ``max_groups_per_unit`` groups per unit, and at most ``max_rows_per_unit`` rows per unit (window
   functions partitioned by the unit, ordered by a salted hash: an arbitrary choice that depends
   only on that unit's own rows);
3. clamps summed values to their declared bounds and rounds them to the noise grid, as integers;
4. aggregates per group, so only one row per group leaves the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import sqlglot
from sqlglot import exp

from dpsql.sql.shape import QueryShape

__all__ = ["Bounds", "Measure", "MeasureKind", "bounded_aggregate"]


class MeasureKind(Enum):
    ROWS = "rows"
    COUNT = "count"
    SUM = "sum"


@dataclass(frozen=True)
class Measure:
    """One aggregated column: COUNT(*), COUNT(col), or SUM/COUNT of clamped, gridded values."""

    name: str
    kind: MeasureKind
    column: str | None = None
    clamp: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class Bounds:
    """Contribution bounds applied inside the database."""

    unit: str
    max_groups_per_unit: int
    max_rows_per_group: int
    max_rows_per_unit: int


_EXACT = 2**53
"""Sums are clamped to +-2**53 in the database (a 1-Lipschitz map: sensitivity is unchanged), so
they fit a BIGINT and every value converts to float exactly."""


def _identifier(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _number(value: float) -> str:
    return exp.Literal.number(repr(float(value))).sql(dialect="duckdb")


def _value(measure: Measure) -> str:
    column = _identifier(measure.column or "")
    if measure.clamp is None:
        return column
    low, high, grid = measure.clamp
    as_double = f"CAST({column} AS DOUBLE)"
    clamped = f"LEAST(GREATEST({as_double}, {_number(low)}), {_number(high)})"
    return (
        f"CASE WHEN ISNAN({as_double}) THEN NULL "
        f"ELSE CAST(ROUND({clamped} / {_number(grid)}) AS BIGINT) END"
    )


def bounded_aggregate(
    shape: QueryShape,
    *,
    measures: Sequence[Measure],
    bounds: Bounds,
    public_keys: Mapping[str, Sequence[exp.Expression]],
    salt: int,
    dialect: str = "duckdb",
) -> str:
    """SQL returning one row per non-empty group: the group columns, then one column per measure."""
    keys = [f"__key{i}" for i in range(len(shape.group_by))]
    select = [f"{_identifier(bounds.unit)} AS __unit"]
    select += [f"{_identifier(c)} AS {k}" for c, k in zip(shape.group_by, keys, strict=True)]
    select += [
        f"{_value(m)} AS __value{i}"
        for i, m in enumerate(measures)
        if m.kind is not MeasureKind.ROWS
    ]
    hashed = [_identifier(bounds.unit), *(_identifier(c) for c in shape.group_by)]
    hashed += [_identifier(m.column) for m in measures if m.column]
    select.append(f"HASH({', '.join(dict.fromkeys(hashed))}, {int(salt)}) AS __row_hash")

    conditions = []
    if shape.where is not None:
        conditions.append(f"({shape.where.sql(dialect='duckdb')})")
    for column in shape.group_by:
        values = ", ".join(v.sql(dialect="duckdb") for v in public_keys[column])
        conditions.append(f"{_identifier(column)} IN ({values})")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    ctes = [f"source AS (SELECT {', '.join(select)} FROM {_identifier(shape.table)}{where})"]
    previous = "source"
    if keys:
        key_list = ", ".join(keys)
        ctes.append(
            "per_group AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit, "
            f"{key_list} ORDER BY __row_hash) AS __row_in_group FROM source)"
        )
        ctes.append(
            "groups_ranked AS (SELECT *, DENSE_RANK() OVER (PARTITION BY __unit ORDER BY "
            f"HASH({key_list}, {int(salt)}), {key_list}) AS __group_rank FROM per_group "
            f"WHERE __row_in_group <= {int(bounds.max_rows_per_group)})"
        )
        previous = f"groups_ranked WHERE __group_rank <= {int(bounds.max_groups_per_unit)}"
    ctes.append(
        "per_unit AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY __unit ORDER BY __row_hash) "
        f"AS __row_in_unit FROM {previous})"
    )
    aggregates = []
    for i, measure in enumerate(measures):
        if measure.kind is MeasureKind.ROWS:
            aggregates.append(f"COUNT(*) AS {_identifier(measure.name)}")
        elif measure.kind is MeasureKind.COUNT:
            aggregates.append(f"COUNT(__value{i}) AS {_identifier(measure.name)}")
        else:
            total = f"COALESCE(SUM(__value{i}), 0)"
            aggregates.append(
                f"CAST(LEAST(GREATEST({total}, -{_EXACT}), {_EXACT}) AS BIGINT) "
                f"AS {_identifier(measure.name)}"
            )
    outputs = [f"{k} AS {_identifier(c)}" for c, k in zip(shape.group_by, keys, strict=True)]
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    sql = (
        f"WITH {', '.join(ctes)} SELECT {', '.join(outputs + aggregates)} FROM per_unit "
        f"WHERE __row_in_unit <= {int(bounds.max_rows_per_unit)}{group}"
    )
    return sqlglot.transpile(sql, read="duckdb", write=dialect)[0]
