"""Range JOINs with HAVING: one count per row of a public table of ranges, answered by the
sparse vector technique.

``SELECT r.lo, r.hi, COUNT(*) FROM t JOIN ranges r ON t.x BETWEEN r.lo AND r.hi GROUP BY r.lo,
r.hi HAVING COUNT(*) > T``: NumericSparse over the ranges in the public table's order (Dwork and
Roth 2014, Algorithm 3, NumericSparse, with the monotone-query refinement of Lyu, Su and Li 2017)
pays epsilon for at most ``max_answers`` ranges at or above the threshold, however many it scans.
Each of a unit's rows weighs ``min(1, max_rows_per_unit / n)``, so every range count moves by at
most ``max_rows_per_unit`` between neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.engine.answers import plain
from dpsql.engine.plans.base import Family, MeasurementPlan
from dpsql.engine.policy import Policy, TablePolicy
from dpsql.engine.progress import ADDING_NOISE, DONE
from dpsql.engine.release import read
from dpsql.engine.results import QueryResult
from dpsql.errors import ParameterError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import svt
from dpsql.mechanisms.laplace import interval_half_width
from dpsql.sql.generate import Measure, MeasureKind, public_groups, range_counts
from dpsql.sql.shape import AggregateKind, GroupKey, QueryShape

if TYPE_CHECKING:
    import pandas as pd

    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.release import ReleaseContext
    from dpsql.sql.shape import Aggregate

__all__ = ["DEFAULT_MAX_ANSWERS", "RangeQueries", "Ranges", "plan_ranges", "range_answer"]

@dataclass(frozen=True)
class RangeQueries:
    """A range JOIN with HAVING, answered by NumericSparse over the public table's ranges."""

    table: str
    threshold: int
    max_answers: int
    sensitivity: int
    svt: svt.SparseVectorPlan


DEFAULT_MAX_ANSWERS = 5
"""Cut-off c of the sparse vector technique when the query states none."""


@dataclass(frozen=True)
class Ranges(Family):
    """NumericSparse over the public table's ranges."""

    spec: RangeQueries

    @property
    def mechanism(self) -> str:
        return "numeric_sparse"

    def reason(self, plan: QueryPlan) -> str:
        return (
            "range JOIN with HAVING: the sparse vector technique (NumericSparse, monotone "
            "counts) pays epsilon for at most max_answers ranges at or above the threshold, "
            "however many ranges it scans; noising every range instead would need L1 "
            "sensitivity max_rows_per_unit x the largest number of overlapping ranges"
        )

    def event(self, plan: QueryPlan) -> SequentialEvent:
        ranges = self.spec
        leaf = MechanismEvent(
            "numeric_sparse",
            ranges.svt.epsilon,
            ranges.svt.delta,
            "COUNT(*) per range",
            (
                ("max_answers", ranges.max_answers),
                ("threshold", ranges.threshold),
                ("sensitivity", ranges.sensitivity),
                ("ranges_table", ranges.table),
            ),
        )
        return SequentialEvent((leaf,))

    def per_person(self, plan: QueryPlan) -> str:
        return f"each person's rows weighted to at most {plan.bounds.max_rows_per_unit} in all"

    def measures(self, plan: QueryPlan, output: Aggregate, text: str) -> str:
        return f"rows in the range, {self.per_person(plan)}"

    def summary(self, plan: QueryPlan) -> dict[str, Any]:
        shown = super().summary(plan)
        if shown["having"] is not None:
            shown["having"] = {**shown["having"], "applied": "by the sparse vector technique"}
        return {**shown, "max_answers": self.spec.max_answers}

    def error(
        self, plan: QueryPlan, kind: AggregateKind, column: str | None, level: float
    ) -> float | None:
        scale = self.spec.svt.value_scale
        return None if scale is None else float(interval_half_width(scale, level))

    def release(
        self, plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
    ) -> tuple[QueryResult, QueryPlan]:
        progress = context.stages
        groups = read(context, public_groups(plan.shape, context.backend.dialect), "reading groups")
        counts = read(
            context,
            range_counts(
                plan.shape,
                unit=plan.bounds.unit,
                max_rows_per_unit=plan.bounds.max_rows_per_unit,
                dialect=context.backend.dialect,
            ),
        )
        progress(ADDING_NOISE, None)
        answer = range_answer(
            self.spec, plan, groups, counts, entry, rng=context.rng, analyst=context.analyst
        )
        progress(DONE, 1.0)
        return answer, plan


def plan_ranges(
    shape: QueryShape,
    policy: Policy,
    table: TablePolicy,
    epsilon: float,
    delta: float,
    max_answers: int | None,
) -> tuple[Ranges, MeasurementPlan]:
    """The sparse vector technique's plan for a range JOIN with HAVING, and its one
    measurement (COUNT(*) per range)."""
    join = shape.range_join
    assert join is not None
    if join.table.lower() not in {name.lower() for name in policy.public_tables}:
        raise PolicyError(
            f"table {join.table!r} is not declared public: add [public_tables.{join.table}] to "
            "the policy to use it as a list of ranges"
        )
    if shape.having is None:
        raise UnsupportedQueryError(
            "a range JOIN needs HAVING COUNT(*) > <threshold>: dpsql answers it with the sparse "
            "vector technique"
        )
    if [(a.kind, a.column) for a in shape.aggregates] != [(AggregateKind.COUNT, None)]:
        raise UnsupportedQueryError("a range JOIN supports COUNT(*) only")
    option = shape.options.get("max_answers")
    if max_answers is not None and option is not None and float(max_answers) != option:
        raise ParameterError(
            f"max_answers is given both in OPTIONS ({option:g}) and as an argument ({max_answers})"
        )
    chosen = max_answers if max_answers is not None else option
    if chosen is None:
        chosen = DEFAULT_MAX_ANSWERS
    if float(chosen) != int(chosen) or int(chosen) < 1:
        raise ParameterError(f"max_answers must be a positive integer, got {chosen}")
    sensitivity = table.max_rows_per_unit
    svt_plan = svt.plan(
        epsilon=epsilon,
        c=int(chosen),
        delta=delta,
        sensitivity=sensitivity,
        numeric=True,
        monotone=True,
    )
    ranges = RangeQueries(
        join.table, shape.having.integer_threshold, int(chosen), sensitivity, svt_plan
    )
    measure = MeasurementPlan(
        Measure("m0", MeasureKind.ROWS), "COUNT(*)", epsilon, sensitivity, 1.0
    )
    return Ranges(ranges), measure


def range_answer(
    ranges: RangeQueries,
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
