"""Read and release: the stages after the charge.

``answer`` has the charged plan's family (``dpsql.engine.plans``) read its bounded aggregates
from the backend (the SQL that ``dpsql.sql.generate`` builds from the plan, never the analyst's
text) and release them, and says what each output measures. What a family needs besides the
plan and the ledger entry is a ``ReleaseContext``: the backend, the session's secure generator,
the analyst, the policy in force, a progress callback and the synopsis store a key release is
kept in; ``read`` and ``bounded_sql`` are the reads the families share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.engine.backends import Backend, Rows, rows_of
from dpsql.engine.policy import Policy
from dpsql.engine.progress import (
    READING_DATA,
    Progress,
    accepts_progress,
    no_progress,
    relabel,
)
from dpsql.engine.synopses import SynopsisStore
from dpsql.memo import Kept
from dpsql.sql.generate import SaltedSql, bounded_aggregate

if TYPE_CHECKING:
    import pandas as pd

    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.results import QueryResult

__all__ = [
    "ReleaseContext",
    "aggregation",
    "answer",
    "bounded_sql",
    "read",
    "read_rows",
    "release",
    "reporting",
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
    def stages(self) -> Progress:
        """Where a release reports its stages (nowhere without a callback)."""
        return self.progress if self.progress is not None else no_progress

    @property
    def reports_progress(self) -> bool:
        """Whether the backend's ``run`` reports its own progress."""
        return accepts_progress(self.backend.run)


def release(
    plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
) -> tuple[QueryResult, QueryPlan]:
    """The answer and the plan it was released under (automatic bounds re-plan): the plan's
    family reads and releases (``dpsql.engine.plans``)."""
    return plan.family.release(plan, entry, context)


def answer(plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext) -> QueryResult:
    """Read the charged plan's aggregates and release them, saying what they measure (and
    warning of what the policy's bounds make them measure: ``QueryPlan.warnings``)."""
    answer, released = release(plan, entry, context)
    update: dict[str, Any] = {"measures": released.measures()}
    if warnings := released.warnings():
        update["details"] = {**answer.details, "warnings": warnings}
    return answer.model_copy(update=update)


def bounded_sql(plan: QueryPlan, salt: int, dialect: str, cells_table: str | None = None) -> str:
    """The plan's bounded aggregation (reading materialised ranked cells with
    ``cells_table``).

    In DuckDB's dialect the text is written once per plan with slots where the salt goes
    (``dpsql.sql.generate.SaltedSql``), and each call fills in its own salt: the same text,
    without writing it again (a test compares the two for every kind of plan)."""

    def written(salt: int) -> str:
        return bounded_aggregate(
            plan.shape, **aggregation(plan, salt), dialect=dialect, cells_table=cells_table
        )

    if dialect != "duckdb":
        return written(salt)
    # What the text depends on besides the salt (a plan given a fresh key-hash seed for each
    # query shares these with the plan it came from).
    inputs = (plan.shape, plan.measurements, plan.bounds, plan.key_literals)
    weights = plan.family.unit_weights()
    kept = _SALTED.get(
        (*inputs, None if weights is None else repr(tuple(weights)), cells_table), _PlanSql
    )
    kept.uses += 1
    if kept.uses == 1:  # a fresh text's plan is mostly used once: no template for it
        return written(salt)
    if kept.uses == 2:
        kept.template = SaltedSql.of(written)
    return written(salt) if kept.template is None else kept.template.fill(salt)


@dataclass
class _PlanSql:
    """How often a plan's SQL was asked for, and its template from the second time on."""

    uses: int = 0
    template: SaltedSql | None = None


_SALTED: Kept[_PlanSql] = Kept(128)


def read(context: ReleaseContext, sql: str, stage: str = READING_DATA) -> pd.DataFrame:
    """The backend's rows for generated ``sql``, reported as ``stage`` (with the backend's
    estimate when its ``run`` takes ``progress``). Without a callback the backend is called
    exactly as before (DuckDB: no worker thread)."""
    progress = reporting(context, stage)
    if progress is None:
        return context.backend.run(sql)
    return context.backend.run(sql, progress=progress)


def read_rows(context: ReleaseContext, sql: str, stage: str = READING_DATA) -> Rows:
    """The backend's rows for generated ``sql`` whose result is small (an aggregated answer),
    as Python values (``dpsql.engine.backends.rows_of``), reported as ``read`` reports."""
    return rows_of(context.backend, sql, reporting(context, stage))


def reporting(context: ReleaseContext, stage: str) -> Progress | None:
    """What to give a backend's ``run`` as ``progress`` for ``stage``: None without a
    callback, or when the backend does not report (then ``stage`` is reported here)."""
    if context.progress is None:
        return None
    if context.reports_progress:
        return relabel(context.progress, stage)
    context.progress(stage, None)
    return None


def aggregation(plan: QueryPlan, salt: int) -> dict[str, Any]:
    """The arguments of the plan's bounded aggregation besides its shape and dialect."""
    return {
        "measures": [m.measure for m in plan.measurements],
        "bounds": plan.bounds,
        "public_keys": plan.key_literals,
        "salt": salt,
        "weights": plan.family.unit_weights(),
    }
