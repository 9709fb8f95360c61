"""Read and release: the stages after the charge.

``answer`` reads the charged plan's bounded aggregates from the backend (the SQL that
``dpsql.sql.generate`` builds from the plan, never the analyst's text) and releases them with the
plan's mechanism (``dpsql.engine.answers``): Laplace over public keys, key releases, range
queries with the sparse vector technique, quantiles, and automatic bounds (AboveThreshold first,
then the aggregates). What it needs besides the plan and the ledger entry is a
``ReleaseContext``: the backend, the session's secure generator, the analyst, the policy in force,
a progress callback and the synopsis store a key release is kept in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpsql.accountant.ledger import LedgerEntry
from dpsql.engine.answers import (
    QUANTILE_WEIGHT,
    key_answer,
    laplace_answer,
    quantile_answer,
    range_answer,
)
from dpsql.engine.backends import Backend, Scratch
from dpsql.engine.planner import (
    AUTO_BOUND_EXPONENTS,
    QuantilePlan,
    QueryPlan,
    plan_query,
    unit_weights_of,
)
from dpsql.engine.policy import Policy
from dpsql.engine.progress import (
    ADDING_NOISE,
    DONE,
    READING_DATA,
    Progress,
    accepts_progress,
    no_progress,
    relabel,
)
from dpsql.engine.results import QueryResult
from dpsql.engine.synopses import Synopsis, SynopsisStore, conjuncts
from dpsql.engine.synopses import now as synopsis_time
from dpsql.mechanisms import svt
from dpsql.mechanisms.combined import CombinedRelease
from dpsql.sql.exclusion import FOUND_COLUMN, second_round_weights, without_keys
from dpsql.sql.generate import (
    Histogram,
    bounded_aggregate,
    clipping_profile,
    public_groups,
    range_counts,
    ranked_cells,
)
from dpsql.sql.shape import ColumnKind

__all__ = [
    "ReleaseContext",
    "aggregation",
    "answer",
    "bounded_sql",
    "read",
    "release",
    "reporting",
    "store_synopsis",
    "with_automatic_bounds",
]


@dataclass(frozen=True)
class ReleaseContext:
    """What reading and releasing a charged plan needs besides the plan and its entry."""

    backend: Backend
    rng: np.random.Generator
    analyst: str
    policy: Policy
    progress: Progress | None = None
    synopses: SynopsisStore | None = None
    """Where a key release's synopsis is kept (None: not kept)."""

    @property
    def reports_progress(self) -> bool:
        """Whether the backend's ``run`` reports its own progress."""
        return accepts_progress(self.backend.run)


def answer(plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext) -> QueryResult:
    """Read the charged plan's aggregates and release them, saying what they measure."""
    answer, released = release(plan, entry, context)
    return answer.model_copy(update={"measures": released.measures()})


def release(
    plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
) -> tuple[QueryResult, QueryPlan]:
    """The answer and the plan it was released under (automatic bounds re-plan)."""
    progress = context.progress if context.progress is not None else no_progress
    if plan.range_queries is not None:
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
        answer = range_answer(plan, groups, counts, entry, rng=context.rng, analyst=context.analyst)
        progress(DONE, 1.0)
        return answer, plan
    if plan.quantiles:
        by_column = {spec.column: spec for spec in plan.quantiles}
        frames = {c: read(context, _histogram_sql(context, plan, s)) for c, s in by_column.items()}
        progress(ADDING_NOISE, None)
        answer = quantile_answer(plan, frames, entry, rng=context.rng, analyst=context.analyst)
        progress(DONE, 1.0)
        return answer, plan
    details: dict[str, Any] = {}
    if plan.auto_bounds is not None:
        plan, details = with_automatic_bounds(context, plan)
    salt = int(context.rng.integers(0, 2**62))
    if plan.key_release is not None:
        with contextlib.ExitStack() as stack:
            scratch = _scratch(context, plan, stack)
            if scratch is None:
                frame = read(context, bounded_sql(plan, salt, context.backend.dialect))
                second_round = _second_round(context, plan, salt)
            else:
                frame, second_round = _kept_cells(context, plan, salt, scratch)
            progress(f"building {plan.mechanism} release", None)
            answer, structure = key_answer(
                plan,
                frame,
                entry,
                rng=context.rng,
                analyst=context.analyst,
                second_round=second_round,
            )
        if structure is not None and context.synopses is not None:
            store_synopsis(context.synopses, plan, entry, structure)
        progress(DONE, 1.0)
        return answer, plan
    frame = read(context, bounded_sql(plan, salt, context.backend.dialect))
    progress(ADDING_NOISE, None)
    result = laplace_answer(plan, frame, entry, rng=context.rng, analyst=context.analyst)
    progress(DONE, 1.0)
    return (result.model_copy(update={"details": details}) if details else result), plan


def bounded_sql(plan: QueryPlan, salt: int, dialect: str, cells_table: str | None = None) -> str:
    """The plan's bounded aggregation (reading materialised ranked cells with
    ``cells_table``)."""
    return bounded_aggregate(
        plan.shape, **aggregation(plan, salt), dialect=dialect, cells_table=cells_table
    )


def _scratch(
    context: ReleaseContext, plan: QueryPlan, stack: contextlib.ExitStack
) -> Scratch | None:
    """Temporary tables for mad2r's cells, when the backend keeps them (DuckDB); dropped
    when ``stack`` closes, however the query ends."""
    release = plan.key_release
    scratch = getattr(context.backend, "scratch", None)
    if release is None or release.mechanism != "mad2r" or not callable(scratch):
        return None
    return stack.enter_context(scratch())


def _kept_cells(
    context: ReleaseContext, plan: QueryPlan, salt: int, scratch: Scratch
) -> tuple[pd.DataFrame, Callable[[Any], pd.DataFrame]]:
    """mad2r in one read of the data: round 1's ranked cells materialised in ``scratch``,
    round 1's aggregation and round 2's weights read from them
    (``dpsql.sql.exclusion.second_round_weights``: the same weights as the bounded
    aggregation without round 1's keys, same salt)."""
    release = plan.key_release
    assert release is not None
    weights = unit_weights_of(plan)
    assert weights is not None
    cells = scratch.table(
        ranked_cells(plan.shape, **aggregation(plan, salt)), reporting(context, READING_DATA)
    )
    frame = read(
        context,
        bounded_sql(plan, salt, context.backend.dialect, cells_table=cells),
        "aggregating cells",
    )
    text = plan.shape.columns[release.column] is ColumnKind.STRING

    def round_two(found: Any) -> pd.DataFrame:
        keys = scratch.values(FOUND_COLUMN, found, text=text)
        return read(
            context, second_round_weights(cells, keys, release.column, weights), "reading round 2"
        )

    return frame, round_two


def _second_round(
    context: ReleaseContext, plan: QueryPlan, salt: int
) -> Callable[[Any], pd.DataFrame] | None:
    """mad2r's round 2 where the backend keeps no cells: the same bounded aggregation (same
    salt) without round 1's keys, only the weights (``dpsql.mechanisms.adaptive_selection``)."""
    release = plan.key_release
    if release is None or release.mechanism != "mad2r":
        return None

    def round_two(found: Any) -> pd.DataFrame:
        sql = bounded_aggregate(
            without_keys(plan.shape, release.column, list(found)),
            **{**aggregation(plan, salt), "measures": []},  # only the weights
            dialect=context.backend.dialect,
        )
        return read(context, sql, "reading round 2")

    return round_two


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


def read(context: ReleaseContext, sql: str, stage: str = READING_DATA) -> pd.DataFrame:
    """The backend's rows for generated ``sql``, reported as ``stage`` (with the backend's
    estimate when its ``run`` takes ``progress``). Without a callback the backend is called
    exactly as before (DuckDB: no worker thread)."""
    progress = reporting(context, stage)
    if progress is None:
        return context.backend.run(sql)
    return context.backend.run(sql, progress=progress)


def reporting(context: ReleaseContext, stage: str) -> Progress | None:
    """What to give a backend's ``run`` as ``progress`` for ``stage``: None without a
    callback, or when the backend does not report (then ``stage`` is reported here)."""
    if context.progress is None:
        return None
    if context.reports_progress:
        return relabel(context.progress, stage)
    context.progress(stage, None)
    return None


def with_automatic_bounds(
    context: ReleaseContext, plan: QueryPlan
) -> tuple[QueryPlan, dict[str, Any]]:
    """Spend the automatic-bounds share on AboveThreshold, then re-plan with the bound.

    The whole query was charged already; the new plan uses the remaining epsilon exactly as
    the charged event split it.
    """
    auto = plan.auto_bounds
    assert auto is not None
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
    name = next(k for k in context.policy.tables if k.lower() == plan.shape.table.lower())
    policy = context.policy.model_copy(update={"tables": {**context.policy.tables, name: table}})
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


def store_synopsis(
    store: SynopsisStore, plan: QueryPlan, entry: LedgerEntry, structure: CombinedRelease
) -> None:
    release = plan.key_release
    assert release is not None
    store.save(
        Synopsis(
            name=f"{plan.shape.table}_{release.column}_{entry.seq}",
            created=synopsis_time(),
            table=plan.shape.table,
            column=release.column,
            filters=conjuncts(plan.shape.where),
            epsilon=plan.epsilon,
            delta=release.delta,
            mechanism="combined",
            ledger_entry=entry.seq,
            params={
                "tau": int(structure.threshold.tau),
                "seed": structure.seed,
                "split": structure.split,
                "contribution_bounds": {
                    "max_groups_per_unit": plan.bounds.max_groups_per_unit,
                    "max_rows_per_group": plan.bounds.max_rows_per_group,
                    "max_rows_per_unit": plan.bounds.max_rows_per_unit,
                },
            },
            data=structure.to_bytes(),
        )
    )


def aggregation(plan: QueryPlan, salt: int) -> dict[str, Any]:
    """The arguments of the plan's bounded aggregation besides its shape and dialect."""
    return {
        "measures": [m.measure for m in plan.measurements],
        "bounds": plan.bounds,
        "public_keys": plan.key_literals,
        "salt": salt,
        "weights": unit_weights_of(plan),
    }
