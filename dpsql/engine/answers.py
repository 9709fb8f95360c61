"""Turning a plan and the database's aggregated rows into a released, noised answer.

Everything here runs after the charge: it adds noise with the plan's mechanism, computes intervals,
applies HAVING to released values (post-processing) and wraps the result. Nothing reads the
database or the ledger.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from dpsql.accountant.ledger import LedgerEntry
from dpsql.engine.planner import MECHANISM, QUANTILE_WEIGHT, QueryPlan, literal_text
from dpsql.engine.results import QueryResult
from dpsql.mechanisms import (
    adaptive_selection,
    combined,
    gaussian_threshold,
    sketch_split,
    svt,
    threshold,
    weighted_selection,
)
from dpsql.mechanisms.combined import CombinedRelease
from dpsql.mechanisms.hashing import hash_keys, new_seed
from dpsql.mechanisms.laplace import interval_half_width, release_counts, release_grid_sums
from dpsql.mechanisms.quantile import release_quantiles
from dpsql.sql.generate import MeasureKind
from dpsql.sql.shape import AggregateKind, ColumnKind, GroupKey

__all__ = [
    "ALP_ROWS_PER_KEY",
    "QUANTILE_WEIGHT",
    "key_answer",
    "laplace_answer",
    "plain",
    "quantile_answer",
    "range_answer",
]



ALP_ROWS_PER_KEY = sketch_split.ROWS_PER_KEY
"""Sketch rows per expected key: collision probability about 0.1 (the paper's Fig. 3 setting)."""


def _aligned(plan: QueryPlan, frame: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple]]:
    """True aggregates for every public key combination (absent keys count zero), matched on
    the database's own spelling of each key (the generated SQL returns keys as text)."""
    group_by = list(plan.shape.group_by)
    names = [m.measure.name for m in plan.measurements]
    if not group_by:
        if frame.empty:
            frame = pd.DataFrame({n: [0] for n in names})
        return frame[names].astype("int64"), [()]
    texts = [[literal_text(v) for v in plan.key_literals[c]] for c in group_by]
    if len(texts) == 1:
        index = pd.Index(texts[0], name=group_by[0], dtype=object)
    else:
        index = pd.MultiIndex.from_product(texts, names=group_by)
    frame = frame.astype({c: object for c in group_by})
    aligned = frame.set_index(group_by)[names].reindex(index, fill_value=0).astype("int64")
    shown = itertools.product(*(plan.key_domain[c] for c in group_by))
    keys = [tuple(plain(v) for v in k) for k in shown]
    return aligned, keys


def laplace_answer(
    plan: QueryPlan,
    frame: pd.DataFrame,
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
) -> QueryResult:
    """Discrete-Laplace answers for every public key combination, AVG intervals, HAVING."""
    aligned, keys = _aligned(plan, frame)
    confidence = plan.confidence
    noisy: dict[str, np.ndarray] = {}
    intervals: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    scales: dict[str, float] = {}
    half_widths_for_ratio: dict[str, float] = {}
    for m in plan.measurements:
        exact = aligned[m.measure.name].to_numpy()
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
        half_widths_for_ratio[m.label] = interval_half_width(m.scale, (1 + confidence) / 2) * m.grid

    columns: dict[str, list[Any]] = {}
    result_intervals: dict[str, list[tuple[float, float]]] = {}
    result_scales: dict[str, float] = {}
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
            values, lower, upper = _ratio(
                noisy[label],
                noisy[count_label],
                half_widths_for_ratio[label],
                half_widths_for_ratio[count_label],
                low,
                high,
            )
            result_scales[output.name] = float("nan")
        else:
            values = noisy[label]
            lower, upper = intervals[label]
            result_scales[output.name] = scales[label]
        columns[output.name] = [plain(v) for v in values]
        result_intervals[output.name] = [
            (plain(a), plain(b)) for a, b in zip(lower, upper, strict=True)
        ]
    names = list(plan.shape.column_names)
    rows = list(zip(*(columns[n] for n in names), strict=True))
    rows, result_intervals = _having(plan, names, rows, result_intervals)
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
    )


def _groups(plan: QueryPlan) -> tuple[pd.Index | None, list[tuple]]:
    """The database's spelling of every public key combination, and the keys as shown."""
    group_by = list(plan.shape.group_by)
    if not group_by:
        return None, [()]
    texts = [[literal_text(v) for v in plan.key_literals[c]] for c in group_by]
    index = pd.MultiIndex.from_product(texts, names=group_by)
    shown = itertools.product(*(plan.key_domain[c] for c in group_by))
    return index, [tuple(plain(v) for v in k) for k in shown]


def quantile_answer(
    plan: QueryPlan,
    frames: dict[str, pd.DataFrame],
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
) -> QueryResult:
    """Permute-and-flip quantiles for every public key combination from the bounded histograms
    (``frames``: per column, rows of group keys, ``__bin`` and ``m0``); no interval: the rank
    error bound is in ``details``, the interval is (None, None)."""
    index, keys = _groups(plan)
    values: dict[str, np.ndarray] = {}
    for spec in plan.quantiles:
        frame = frames[spec.column]
        histograms = np.zeros((len(keys), spec.candidates), dtype=np.int64)
        if not frame.empty:
            if index is None:
                rows = np.zeros(len(frame), dtype=np.int64)
            else:
                columns = [frame[c].astype(object) for c in plan.shape.group_by]
                rows = index.get_indexer(pd.MultiIndex.from_arrays(columns))
            bins = frame["__bin"].to_numpy(dtype=np.int64)
            np.add.at(histograms, (rows, bins), frame["m0"].to_numpy(dtype=np.int64))
        released = release_quantiles(
            histograms,
            q=spec.q,
            low=spec.low,
            high=spec.high,
            epsilon=spec.epsilon,
            sensitivity=spec.sensitivity,
            weight=QUANTILE_WEIGHT,
            confidence=plan.confidence,
            rng=rng,
        )
        values[spec.name] = released.values
    columns: dict[str, list[Any]] = {}
    for output in plan.shape.outputs:
        if isinstance(output, GroupKey):
            position = plan.shape.group_by.index(output.column)
            columns[output.name] = [k[position] for k in keys]
        else:
            columns[output.name] = [plain(v) for v in values[output.name]]
    names = list(plan.shape.column_names)
    return QueryResult(
        columns=names,
        rows=list(zip(*(columns[n] for n in names), strict=True)),
        intervals={p.name: [(None, None)] * len(keys) for p in plan.quantiles},
        noise_scale={},
        confidence=plan.confidence,
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        mechanism=plan.mechanism,
        analyst=analyst,
        ledger_entry=entry.seq,
        details={"quantiles": [p.describe(plan.confidence) for p in plan.quantiles]},
    )


def key_answer(
    plan: QueryPlan,
    frame: pd.DataFrame,
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
    second_round: Callable[[np.ndarray], pd.DataFrame] | None = None,
) -> tuple[QueryResult, CombinedRelease | None]:
    """Release the heavy keys of a GROUP BY without public keys; with the combined structure,
    also return it (the caller stores it as a synopsis). ``mad2r`` reads its round-2 weights
    with ``second_round`` (the bounded aggregation without round 1's keys: key, ``weight``)."""
    structure = None
    spec = plan.key_release
    assert spec is not None
    column = spec.column
    kind = plan.shape.columns[column]
    # The database returns groups in any order; sort so a seeded generator reproduces a release.
    frame = frame.sort_values(column, kind="stable", ignore_index=True)
    keys = frame[column].to_numpy(dtype=object if kind is ColumnKind.STRING else np.int64)
    counts = frame[plan.measurements[0].measure.name].to_numpy(dtype=np.int64)
    common: dict[str, Any] = {
        "epsilon": plan.epsilon,
        "delta": spec.delta,
        "domain": spec.domain,
        "max_groups_per_unit": plan.bounds.max_groups_per_unit,
        "max_rows_per_group": plan.bounds.max_rows_per_group,
        "max_rows_per_unit": plan.bounds.max_rows_per_unit,
        "confidence": plan.confidence,
        "rng": rng,
    }
    gaussian: dict[str, Any] = {  # the zCDP mechanisms' own parameters
        "epsilon": plan.epsilon,
        "delta": spec.delta,
        "bounds": _contribution(plan),
        "confidence": plan.confidence,
        "rng": rng,
    }
    seed = spec.key_hash_seed if spec.key_hash_seed is not None else new_seed(rng)
    if spec.mechanism == "mad2r":
        assert spec.weighted is not None and second_round is not None

        def round_two(found: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # Sorted as round 1's keys are: a seeded generator then reproduces round 2's noise.
            second = second_round(found).sort_values(column, kind="stable", ignore_index=True)
            values = second[column].to_numpy(dtype=keys.dtype)
            return values, second["weight"].to_numpy(dtype=np.int64)

        released = adaptive_selection.release(
            keys,
            counts,
            frame["weight"].to_numpy(dtype=np.int64),
            round_two,
            selection_share=spec.weighted.selection_share,
            **gaussian,
        )
    elif spec.mechanism == "weighted":
        assert spec.weighted is not None
        released = weighted_selection.release(
            keys,
            counts,
            frame["weight"].to_numpy(dtype=np.int64),
            selection_share=spec.weighted.selection_share,
            **gaussian,
        )
    elif spec.mechanism == "threshold_gaussian":
        released = gaussian_threshold.release(keys, counts, **gaussian)
    elif spec.mechanism == "threshold":
        released = threshold.release(keys, counts, seed=seed, **common)
    else:
        assert spec.sketch is not None
        structure = combined.release(
            keys,
            counts,
            s=ALP_ROWS_PER_KEY * spec.expected_keys,
            seed=seed,
            split=spec.sketch.split,
            alpha=spec.sketch.alpha,
            **common,
        )
        released = structure.threshold
    # What was charged and shown in EXPLAIN is what was used (else the one after-charge failure).
    assert (released.scale, released.tau) == (spec.scale, spec.tau)
    shown, seed = _shown_keys(released, hashed=spec.hashed, seed=seed)
    lower, upper = released.lower, released.upper
    names = list(plan.shape.column_names)
    by_output = {plan.shape.outputs[0].name: shown, plan.shape.outputs[1].name: released.values}
    rows = [
        tuple(plain(v) for v in row) for row in zip(*(by_output[n] for n in names), strict=True)
    ]
    count_name = next(o.name for o in plan.shape.outputs if not isinstance(o, GroupKey))
    intervals = {count_name: [(plain(a), plain(b)) for a, b in zip(lower, upper, strict=True)]}
    rows, intervals = _having(plan, names, rows, intervals)
    result = QueryResult(
        columns=names,
        rows=rows,
        intervals=intervals,
        noise_scale={count_name: float(released.scale)},
        confidence=plan.confidence,
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        mechanism=spec.mechanism,
        analyst=analyst,
        ledger_entry=entry.seq,
        details={} if seed is None else {"key_hash_seed": seed},
    )
    return result, structure


def _contribution(plan: QueryPlan) -> threshold.Contribution:
    bounds = plan.bounds
    return threshold.Contribution(
        bounds.max_groups_per_unit, bounds.max_rows_per_group, bounds.max_rows_per_unit
    )


def _shown_keys(
    released: threshold.ThresholdRelease, *, hashed: bool, seed: int
) -> tuple[list[Any], int | None]:
    """The released keys as shown, and the public seed of their hashes when shown as hashes.

    A pure release over the hash domain holds hashes already; with ``key_domain = "hash64"`` an
    approximate release (keys present in the data) is hashed under the plan's public ``seed``
    (drawn before the charge and recorded in the ledger) before it is shown, a post-processing
    step: the analyst can check a key they know
    (``dpsql.mechanisms.hashing.hash_keys([key], seed)``) but reads no key they did not.
    """
    if released.key_kind == "hash":
        assert released.seed is not None
        return [f"0x{int(k):016x}" for k in released.keys], released.seed
    if not hashed:
        return [plain(k) for k in released.keys], None
    return [f"0x{int(k):016x}" for k in hash_keys(released.keys, seed)], seed


def range_answer(
    plan: QueryPlan,
    groups: pd.DataFrame,
    counts: pd.DataFrame,
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
) -> QueryResult:
    """NumericSparse over the public ranges (``groups``, in the public table's order) given
    their bounded counts."""
    ranges = plan.range_queries
    assert ranges is not None
    shape = plan.shape
    columns = list(shape.group_by)
    merged = groups.merge(counts, on=columns, how="left")
    answers = merged["m0"].fillna(0).to_numpy(dtype=np.int64)
    released = svt.numeric_sparse_release(
        answers,
        threshold=ranges.threshold,
        epsilon=ranges.svt.epsilon,
        c=ranges.max_answers,
        delta=plan.delta,
        sensitivity=ranges.sensitivity,
        monotone=True,
        beta=1 - plan.confidence,
        rng=rng,
    )
    value_scale = ranges.svt.value_scale
    assert value_scale is not None and released.values is not None
    half = interval_half_width(value_scale, plan.confidence)
    count_name = shape.having.name if shape.having is not None else "COUNT(*)"
    rows = []
    for index, value in zip(released.indices, released.values, strict=True):
        keys = {c: plain(merged[c].iloc[index]) for c in columns}
        rows.append(
            tuple(
                keys.get(o.column) if isinstance(o, GroupKey) else int(value) for o in shape.outputs
            )
        )
    return QueryResult(
        columns=list(shape.column_names),
        rows=rows,
        intervals={count_name: [(int(v) - half, int(v) + half) for v in released.values]},
        noise_scale={count_name: float(value_scale)},
        confidence=plan.confidence,
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        mechanism=plan.mechanism,
        analyst=analyst,
        ledger_entry=entry.seq,
        details={
            "ranges_scanned": released.queries_scanned,
            "ranges_in_table": len(merged),
            "halted_at_max_answers": released.halted,
            "max_answers": ranges.max_answers,
            "threshold": ranges.threshold,
            "alpha": released.alpha,
            "beta": released.beta,
            "accuracy": "with probability >= 1 - beta: a reported range has count >= "
            "threshold - alpha, an unreported scanned range count <= threshold + alpha, and "
            "each released value is within alpha of its count",
        },
    )


def _having(
    plan: QueryPlan,
    names: list[str],
    rows: list[tuple[Any, ...]],
    intervals: dict[str, list[tuple[Any, Any]]],
) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, Any]]]]:
    """Keep the rows whose noisy COUNT(*) passes HAVING (post-processing of released values)."""
    having = plan.shape.having
    if having is None:
        return rows, intervals
    position = names.index(having.name)
    keep = [i for i, row in enumerate(rows) if row[position] >= having.integer_threshold]
    return [rows[i] for i in keep], {k: [v[i] for i in keep] for k, v in intervals.items()}


def _ratio(
    sums: np.ndarray,
    counts: np.ndarray,
    sum_half: float,
    count_half: float,
    low: float,
    high: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AVG = noisy SUM / noisy COUNT, clamped to the bounds; the interval joins the two
    (1+c)/2 intervals (union bound), so it covers with probability at least c. Where the count's
    interval reaches below one row (an empty group, say) nothing rules out any mean: the
    interval is the whole bounds and the value their midpoint, not whichever bound the ratio of
    two noisy numbers happens to hit."""
    values = np.clip(sums / np.maximum(counts, 1), low, high)
    count_low = counts - count_half
    count_high = counts + count_half
    corners = np.stack(
        [
            (sums + s) / c
            for s in (-sum_half, sum_half)
            for c in (np.maximum(count_low, 1), np.maximum(count_high, 1))
        ]
    )
    lower = np.where(count_low >= 1, np.clip(corners.min(axis=0), low, high), low)
    upper = np.where(count_low >= 1, np.clip(corners.max(axis=0), low, high), high)
    values = np.where(count_low >= 1, values, (low + high) / 2)
    return values, lower, upper


def plain(value: Any) -> Any:
    """NumPy and pandas scalars as plain Python values (dates as ISO strings)."""
    if isinstance(value, pd.Timestamp):
        return value.isoformat() if value.time() != dt.time() else value.date().isoformat()
    if isinstance(value, np.generic):
        return value.item()
    return value
