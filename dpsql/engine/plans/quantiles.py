"""Quantiles: MEDIAN, quantile_cont and percentile_cont, answered by permute-and-flip.

Each quantile is the exponential mechanism over public equal bins of the column's declared
bounds, sampled with permute-and-flip (McKenna and Sheldon 2020, Algorithm 1; its guarantee,
Theorem 1, is that of the exponential mechanism), with the rank utility computed from one bounded
histogram in the database (``dpsql.mechanisms.quantile``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.engine.answers import plain
from dpsql.engine.plans.base import Family, literal_text, split_epsilon
from dpsql.engine.policy import TablePolicy
from dpsql.engine.progress import ADDING_NOISE, DONE
from dpsql.engine.release import read
from dpsql.engine.results import QueryResult
from dpsql.errors import ParameterError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import quantile
from dpsql.mechanisms.quantile import release_quantiles
from dpsql.sql.generate import Histogram, bounded_aggregate
from dpsql.sql.shape import AggregateKind, GroupKey, QueryShape

if TYPE_CHECKING:
    import pandas as pd

    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.release import ReleaseContext

__all__ = ["QUANTILE_WEIGHT", "QuantilePlan", "Quantiles", "plan_quantiles", "quantile_answer"]

@dataclass(frozen=True)
class QuantilePlan:
    """One DP quantile: permute-and-flip over ``candidates`` equal bins of ``[low, high]``, the
    rank utility having sensitivity ``sensitivity`` rows (``dpsql.mechanisms.quantile``)."""

    column: str
    name: str
    q: Fraction
    low: float
    high: float
    candidates: int
    epsilon: float
    sensitivity: int

    def rank_error(self, confidence: float) -> float:
        return quantile.rank_error_bound(
            self.sensitivity, self.epsilon, self.candidates, 1 - confidence, self.q
        )

    def interval_statement(self, confidence: float) -> dict[str, Any]:
        """What the quantile's interval (the chosen bin) covers, and why no more
        (``dpsql.mechanisms.quantile``, Accuracy)."""
        rank = self.rank_error(confidence)
        return {
            "kind": "conservative",
            "method": "the chosen public bin; permute-and-flip's utility bound (McKenna and "
            "Sheldon 2020, Theorem 2)",
            "confidence": confidence,
            "covers": f"a value whose rank is within ±{rank:.4g} rows of q·n (rows as bounded): "
            f"the interval meets the range between the q - {rank:.4g}/n and q + {rank:.4g}/n "
            "quantiles",
            "not_covered": "the exact quantile itself when the column has a gap around it: no "
            "differentially private interval can promise it (one person can move the exact "
            "quantile across a gap); computed from the released bin and public constants only",
        }

    def describe(self, confidence: float) -> dict[str, Any]:
        return {
            "output": self.name,
            "column": self.column,
            "q": str(self.q),
            "bounds": [self.low, self.high],
            "candidates": self.candidates,
            "bin_width": (self.high - self.low) / self.candidates,
            "epsilon": self.epsilon,
            "rank_sensitivity": self.sensitivity,
            f"rank_error_with_probability_{confidence:g}": self.rank_error(confidence),
        }


QUANTILE_WEIGHT = 1024
"""Histogram units per row for quantiles: a cell scaled down by a contribution bound loses less
than 1/1024 row per bin to rounding."""


MAX_CANDIDATES = 2**16
"""Largest grid of quantile candidates (``OPTIONS(quantile_candidates=...)``)."""


@dataclass(frozen=True)
class Quantiles(Family):
    """One permute-and-flip selection per quantile in the select list."""

    specs: tuple[QuantilePlan, ...]

    @property
    def mechanism(self) -> str:
        return "permute_and_flip"

    def reason(self, plan: QueryPlan) -> str:
        return (
            "quantile: the exponential mechanism over public equal bins of the column's "
            "bounds, sampled with permute-and-flip (McKenna & Sheldon 2020); the utility is "
            "minus the distance of q*n from a bin's rank interval, from one bounded histogram "
            "in the database; the chosen bin's midpoint is released; with probability >= "
            "confidence the chosen bin's ranks are within 2*max(q, 1-q)*sensitivity/epsilon*"
            "ln(candidates/(1 - confidence)) rows of q*n"
        )

    def event(self, plan: QueryPlan) -> SequentialEvent:
        return SequentialEvent(
            tuple(
                MechanismEvent(
                    "permute_and_flip",
                    p.epsilon,
                    0.0,
                    p.name,
                    (
                        ("groups", plan.groups),
                        ("candidates", p.candidates),
                        ("rank_sensitivity", p.sensitivity),
                    ),
                )
                for p in self.specs
            )
        )

    def summary(self, plan: QueryPlan) -> dict[str, Any]:
        return {
            **super().summary(plan),
            "quantiles": [p.describe(plan.confidence) for p in self.specs] or None,
        }

    def release(
        self, plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
    ) -> tuple[QueryResult, QueryPlan]:
        progress = context.stages
        by_column = {spec.column: spec for spec in self.specs}
        frames = {
            c: read(context, _histogram_sql(context, plan, s)) for c, s in by_column.items()
        }
        progress(ADDING_NOISE, None)
        answer = quantile_answer(
            self.specs, plan, frames, entry, rng=context.rng, analyst=context.analyst
        )
        progress(DONE, 1.0)
        return answer, plan


def plan_quantiles(
    shape: QueryShape,
    table: TablePolicy,
    epsilon: float,
    sensitivity: int,
    releases_keys: bool,
) -> tuple[QuantilePlan, ...]:
    """One permute-and-flip selection per quantile in the select list, ε split evenly; the
    rank utility's sensitivity is the rows' worth one person keeps (as for COUNT(*))."""
    if releases_keys or shape.having is not None:
        raise UnsupportedQueryError(
            "quantiles are answered without GROUP BY or for GROUP BY over columns with public "
            "keys, without HAVING COUNT(*)"
        )
    if any(a.kind is not AggregateKind.QUANTILE for a in shape.aggregates):
        raise UnsupportedQueryError(
            "a quantile cannot share a query with COUNT, SUM or AVG: ask for them in a separate "
            "query (each is charged on its own)"
        )
    option = shape.options.get("quantile_candidates", quantile.DEFAULT_CANDIDATES)
    if float(option) != int(option) or not 2 <= int(option) <= MAX_CANDIDATES:
        raise ParameterError(
            f"quantile_candidates must be an integer in [2, {MAX_CANDIDATES}], got {option:g}"
        )
    if max(table.max_rows_per_group, table.max_rows_per_unit) * QUANTILE_WEIGHT > 2**31:
        raise PolicyError(
            "quantiles need max_rows_per_group and max_rows_per_unit of at most 2**21 (the "
            "histogram's integer weights must not overflow)"
        )
    shares = split_epsilon(epsilon, len(shape.aggregates))
    plans = []
    for aggregate, share in zip(shape.aggregates, shares, strict=True):
        column = aggregate.column or ""
        bounds = table.column(column).bounds
        text = shape.virtual[column].meta.get("text", column) if column in shape.virtual else column
        if bounds is None:
            raise PolicyError(
                f"a quantile of {text} needs declared bounds: set "
                f"[tables.{shape.table}.columns.{text}] bounds = [low, high]"
            )
        low, high = (float(b) for b in bounds)
        if not low < high:
            raise PolicyError(f"bounds of {text!r} are one point; a quantile needs low < high")
        if not math.isfinite(high - low):
            raise PolicyError(
                f"bounds of {text!r} are too wide for a quantile (high - low overflows)"
            )
        assert aggregate.quantile is not None
        quantile.quantile_fraction(aggregate.quantile)  # the mechanism's precision, refused here
        # Refuses, before the charge, an ε too small for the exact sampler's arithmetic.
        quantile.epsilon_used(
            share, quantile.utility_sensitivity(aggregate.quantile, sensitivity, QUANTILE_WEIGHT)
        )
        plans.append(
            QuantilePlan(
                column, aggregate.name, aggregate.quantile, low, high, int(option), share,
                sensitivity,
            )
        )  # fmt: skip
    return tuple(plans)


def _histogram_sql(context: ReleaseContext, plan: QueryPlan, spec: QuantilePlan) -> str:
    """The bounded histogram a quantile reads (``dpsql.sql.generate.Histogram``)."""
    return bounded_aggregate(
        plan.shape,
        measures=[],
        bounds=plan.bounds,
        public_keys=plan.key_literals,
        salt=int(context.rng.integers(0, 2**62)),
        dialect=context.backend.dialect,
        histogram=Histogram(spec.column, spec.low, spec.high, spec.candidates, QUANTILE_WEIGHT),
    )


def _groups(plan: QueryPlan) -> tuple[pd.Index | None, list[tuple]]:
    """The database's spelling of every public key combination, and the keys as shown."""
    group_by = list(plan.shape.group_by)
    if not group_by:
        return None, [()]
    texts = [[literal_text(v) for v in plan.key_literals[c]] for c in group_by]
    import pandas as pd
    index = pd.MultiIndex.from_product(texts, names=group_by)
    shown = itertools.product(*(plan.key_domain[c] for c in group_by))
    return index, [tuple(plain(v) for v in k) for k in shown]


def quantile_answer(
    quantiles: tuple[QuantilePlan, ...],
    plan: QueryPlan,
    frames: dict[str, pd.DataFrame],
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
) -> QueryResult:
    """Permute-and-flip quantiles for every public key combination from the bounded histograms
    (``frames``: per column, rows of group keys, ``__bin`` and ``m0``); each interval is the
    chosen public bin, which holds a value within the rank error of the quantile
    (``QuantilePlan.interval_statement``)."""
    index, keys = _groups(plan)
    values: dict[str, np.ndarray] = {}
    chosen: dict[str, list[tuple[float, float]]] = {}
    for spec in quantiles:
        frame = frames[spec.column]
        histograms = np.zeros((len(keys), spec.candidates), dtype=np.int64)
        if not frame.empty:
            if index is None:
                rows = np.zeros(len(frame), dtype=np.int64)
            else:
                columns = [frame[c].astype(object) for c in plan.shape.group_by]
                import pandas as pd
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
        chosen[spec.name] = list(zip(released.lower.tolist(), released.upper.tolist(), strict=True))
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
        intervals=chosen,
        noise_scale={},
        confidence=plan.confidence,
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        mechanism=plan.mechanism,
        analyst=analyst,
        ledger_entry=entry.seq,
        details={
            "quantiles": [p.describe(plan.confidence) for p in quantiles],
            "intervals": {p.name: p.interval_statement(plan.confidence) for p in quantiles},
        },
    )
