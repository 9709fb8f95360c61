"""Turning a plan and the database's aggregated rows into a released, noised answer.

Everything here runs after the charge: it adds noise with the plan's mechanism, computes intervals,
applies HAVING to released values (post-processing) and wraps the result. Nothing reads the
database or the ledger.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.accountant.ledger import LedgerEntry
from dpsql.engine.noise_laws import DiscreteLaplaceLaw, RatioLaw, ratio_interval
from dpsql.engine.plans.base import MECHANISM, literal_text
from dpsql.engine.results import QueryResult
from dpsql.mechanisms import (
    sketch_split,
)
from dpsql.mechanisms.laplace import interval_half_width, release_counts, release_grid_sums
from dpsql.memo import Kept
from dpsql.sql.generate import Measure, MeasureKind
from dpsql.sql.shape import AggregateKind, GroupKey

if TYPE_CHECKING:
    from dpsql.engine.backends import Rows
    from dpsql.engine.planner import QueryPlan

__all__ = [
    "ALP_ROWS_PER_KEY",
    "having_kept",
    "having_rows",
    "laplace_answer",
    "plain",
]


ALP_ROWS_PER_KEY = sketch_split.ROWS_PER_KEY
"""Sketch rows per expected key: collision probability about 0.1 (the paper's Fig. 3 setting)."""


def _aligned(plan: QueryPlan, rows: Rows) -> tuple[dict[str, np.ndarray], list[tuple]]:
    """True aggregates (int64 arrays by measure name) for every public key combination (absent
    keys count zero), matched on the database's own spelling of each key (the generated SQL
    returns keys as text)."""
    group_by = plan.shape.group_by
    names = [m.measure.name for m in plan.measurements]
    where = {name: rows.columns.index(name) for name in names}
    if not group_by:
        if not rows.data:
            return {n: np.zeros(1, dtype=np.int64) for n in names}, [()]
        (row,) = rows.data
        return {n: np.array([row[where[n]]], dtype=np.int64) for n in names}, [()]
    # A row's place in the product of the key lists, found by the keys' texts; a row whose
    # spelling matches no declared key is left out (whatever the data, never a failure).
    positions, strides, keys = _LAYOUTS.get((plan,), lambda: _layout(plan))
    at = [rows.columns.index(c) for c in group_by]
    found: list[int] = []
    kept: list[tuple[Any, ...]] = []
    for row in rows.data:
        places = [p.get(row[i], -1) for p, i in zip(positions, at, strict=True)]
        if min(places) >= 0:
            found.append(sum(place * stride for place, stride in zip(places, strides, strict=True)))
            kept.append(row)
    aligned = {}
    for n in names:
        values = np.zeros(plan.groups, dtype=np.int64)
        values[found] = np.array([row[where[n]] for row in kept], dtype=np.int64)
        aligned[n] = values
    return aligned, keys


_LAYOUTS: Kept[tuple[list[dict[str, int]], list[int], list[tuple[Any, ...]]]] = Kept(64)
"""Each plan's key layout (``_layout``), kept for a plan asked again (plans never change)."""


def _layout(
    plan: QueryPlan,
) -> tuple[list[dict[str, int]], list[int], list[tuple[Any, ...]]]:
    """For each group column, each key's place by its text; the strides of the key product; and
    every key combination as the answer shows it, in the product's order."""
    group_by = plan.shape.group_by
    positions = [
        {literal_text(v): i for i, v in enumerate(plan.key_literals[c])} for c in group_by
    ]
    strides = [math.prod(len(p) for p in positions[i + 1 :]) for i in range(len(positions))]
    shown = itertools.product(*(plan.key_domain[c] for c in group_by))
    return positions, strides, [tuple(plain(v) for v in k) for k in shown]


def laplace_answer(
    plan: QueryPlan,
    rows: Rows,
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
) -> QueryResult:
    """Discrete-Laplace answers for every public key combination, AVG intervals, HAVING."""
    aligned, keys = _aligned(plan, rows)
    confidence = plan.confidence
    noisy: dict[str, np.ndarray] = {}
    intervals: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    scales: dict[str, float] = {}
    half_widths_for_ratio: dict[str, float] = {}
    measured: dict[str, DiscreteLaplaceLaw] = {}
    for m in plan.measurements:
        exact = aligned[m.measure.name]
        if m.measure.kind is MeasureKind.SUM:
            release = release_grid_sums(
                exact,
                epsilon=m.epsilon,
                sensitivity_units=m.sensitivity_units,
                grid=m.grid,
                rng=rng,
                confidence=confidence,
            )
        else:
            release = release_counts(
                exact,
                epsilon=m.epsilon,
                sensitivity=m.sensitivity_units,
                rng=rng,
                confidence=confidence,
            )
        noisy[m.label] = release.values
        lower, upper = release.lower, release.upper
        if m.measure.kind is not MeasureKind.SUM:
            lower, upper = lower.astype(np.int64), upper.astype(np.int64)
        intervals[m.label] = (lower, upper)
        scales[m.label] = release.scale
        measured[m.label] = DiscreteLaplaceLaw(m.scale, m.grid)
        half_widths_for_ratio[m.label] = interval_half_width(m.scale, (1 + confidence) / 2) * m.grid

    columns: dict[str, list[Any]] = {}
    result_intervals: dict[str, list[tuple[float, float]]] = {}
    result_scales: dict[str, float] = {}
    laws: dict[str, DiscreteLaplaceLaw | RatioLaw] = {}
    ranges: dict[str, tuple[float | None, float | None]] = {}
    for output in plan.shape.outputs:
        if isinstance(output, GroupKey):
            index = plan.shape.group_by.index(output.column)
            columns[output.name] = [k[index] for k in keys]
            continue
        if output.kind is AggregateKind.PERSONS:
            label = next(m.label for m in plan.measurements if m.measure.kind is MeasureKind.UNITS)
        elif output.kind is AggregateKind.COUNT:
            label = next(
                m.label
                for m in plan.measurements
                if m.measure.column == output.column
                and m.measure.clamp is None
                and m.measure.kind is not MeasureKind.SUM
            )
        else:
            label = f"SUM({output.column})"
        if output.kind is AggregateKind.AVG:
            low, high = plan.table.column(output.column or "").bounds  # type: ignore[misc]
            count_label = f"COUNT({output.column}) within bounds"
            values, lower, upper = ratio_interval(
                noisy[label],
                noisy[count_label],
                half_widths_for_ratio[label],
                half_widths_for_ratio[count_label],
                low,
                high,
            )
            result_scales[output.name] = float("nan")
            laws[output.name] = RatioLaw(
                noisy[label], noisy[count_label], measured[label], measured[count_label], low, high
            )
        else:
            values = noisy[label]
            lower, upper = intervals[label]
            result_scales[output.name] = scales[label]
            laws[output.name] = measured[label]
            ranges[output.name] = _true_range(
                next(m.measure for m in plan.measurements if m.label == label)
            )
        columns[output.name] = [plain(v) for v in values]
        result_intervals[output.name] = [
            (plain(a), plain(b)) for a, b in zip(lower, upper, strict=True)
        ]
    names = list(plan.shape.column_names)
    rows = list(zip(*(columns[n] for n in names), strict=True))
    kept = having_kept(plan, names, rows)
    rows, result_intervals = having_rows(plan, names, rows, result_intervals)
    if kept is not None:
        laws = {n: law.kept(kept) if isinstance(law, RatioLaw) else law for n, law in laws.items()}
    return QueryResult(
        columns=names,
        rows=rows,
        intervals=result_intervals,
        noise_scale=result_scales,
        confidence=confidence,
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        mechanism=MECHANISM,
        analyst=analyst,
        ledger_entry=entry.seq,
    ).with_noise_laws(laws, {n: r for n, r in ranges.items() if r != (None, None)})


def _true_range(measure: Measure) -> tuple[float | None, float | None]:
    """The range a COUNT or SUM's true (bounded) value cannot leave: a count is never
    negative, nor a sum of values clamped to ``[low >= 0, high]`` (nor positive when
    ``high <= 0``)."""
    if measure.kind is not MeasureKind.SUM:
        return (0, None)
    if measure.clamp is None:
        return (None, None)
    low, high, _ = measure.clamp
    return (0 if low >= 0 else None, 0 if high <= 0 else None)


def having_kept(plan: QueryPlan, names: list[str], rows: list[tuple[Any, ...]]) -> list[int] | None:
    """The rows whose noisy COUNT(*) passes HAVING (None: no HAVING)."""
    having = plan.shape.having
    if having is None:
        return None
    position = names.index(having.name)
    return [i for i, row in enumerate(rows) if row[position] >= having.integer_threshold]


def having_rows(
    plan: QueryPlan,
    names: list[str],
    rows: list[tuple[Any, ...]],
    intervals: dict[str, list[tuple[Any, Any]]],
) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, Any]]]]:
    """Keep the rows whose noisy COUNT(*) passes HAVING (post-processing of released values)."""
    keep = having_kept(plan, names, rows)
    if keep is None:
        return rows, intervals
    return [rows[i] for i in keep], {k: [v[i] for i in keep] for k, v in intervals.items()}


def plain(value: Any) -> Any:
    """NumPy and pandas scalars as plain Python values (dates as ISO strings)."""
    pandas = sys.modules.get("pandas")  # not imported: no value is one of its timestamps
    if pandas is not None and isinstance(value, pandas.Timestamp):
        return value.isoformat() if value.time() != dt.time() else value.date().isoformat()
    if isinstance(value, np.generic):
        return value.item()
    return value
