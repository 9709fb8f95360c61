"""Budget-audited reports: price a batch of queries, charge it in one ledger entry, run it.

``plan_report`` reads no data: each query is parsed, bound and planned exactly as ``execute``
would (prices from the policy), the report's total is split by its allocation rule
(``dpsql.engine.allocation``), and the batch is compared with what the analyst and the dataset
have left. ``run_report`` charges the whole batch in one ``BEGIN IMMEDIATE`` transaction (one
ledger entry whose event tree holds every query's tree, composed sequentially), so a batch that
does not fit charges nothing; only then does it read data. A failure after the charge is the one
data-independent ``ExecutionError``, and the charge is recorded once.

Partitioned queries are charged sequentially inside a report (not per partition value): an
over-statement of what the batch spends, never an under-statement.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from dpsql.accountant.events import SequentialEvent, event_to_dict, total
from dpsql.accountant.units import Cost, check_budget_value
from dpsql.engine.accuracy import least_epsilon, output_errors, plan_error
from dpsql.engine.allocation import split_units
from dpsql.engine.planner import QueryPlan
from dpsql.engine.query import after_charge, cells, check_ranges, planner
from dpsql.engine.release import answer as release_answer
from dpsql.engine.report_spec import QuerySpec, ReportSpec
from dpsql.engine.results import BudgetStatus, QueryResult
from dpsql.engine.session import Session
from dpsql.errors import BudgetExceededError, ParameterError, PolicyError, QueryError

__all__ = ["PlannedQuery", "ReportPlan", "ReportRun", "plan_report", "run_report"]

_T = TypeVar("_T")

RULE_EXPLANATIONS = {
    "weights": "the total epsilon (less any fixed epsilons) is split in proportion to the "
    "queries' weights (default 1), exactly in ledger units of 1e-9 (largest remainder rounding)",
    "accuracy": "each query gets the least epsilon (in ledger units of 1e-9) whose expected error "
    "(interval half-width at the report's confidence) meets its accuracy target; the report "
    "costs the sum, and any budget not needed stays unspent",
    "minimax": "the total epsilon (less any fixed epsilons) is split to minimise the largest "
    "relative error: a query's error is c/epsilon (c its half-width at epsilon = 1), "
    "relative to its public expected value "
    "(or its accuracy target); the largest ratio is smallest when all are equal, i.e. epsilon "
    "in proportion to c/expected, split exactly in ledger units",
}


@dataclass(frozen=True)
class PlannedQuery:
    """One query of a report at its allocated budget."""

    name: str
    spec: QuerySpec
    sql: str
    plan: QueryPlan
    together: bool = False
    """Whether every interval of its answer holds at once (``simultaneous``)."""

    @property
    def cost(self) -> Cost:
        return total(self.plan.event)

    @property
    def errors(self) -> dict[str, float | None]:
        return output_errors(self.plan)

    @property
    def relative_errors(self) -> dict[str, float | None]:
        """Each output's expected error relative to the query's public ``expected`` value (of
        its ``column``, or of every output when it names none); None without either."""
        expected = self.spec.expected
        return {
            name: None
            if expected is None or error is None or (self.spec.column not in (None, name))
            else error / expected
            for name, error in self.errors.items()
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.spec.title or self.name,
            "sql": self.sql,
            "epsilon": self.cost.epsilon,
            "delta": self.cost.delta,
            "epsilon_units": self.cost.epsilon_units,
            "weight": self.spec.weight,
            "accuracy_target": self.spec.accuracy,
            "expected": self.spec.expected,
            "expected_error": self.errors,
            "relative_error": self.relative_errors,
            "simultaneous": self.simultaneous,
            "mechanism": self.plan.mechanism,
        }

    @property
    def simultaneous(self) -> dict[str, Any] | None:
        """For a simultaneous query: its cells, each interval's level and the level at which
        they all hold at once (None otherwise)."""
        if not (self.together or self.plan.shape.options.get("simultaneous")):
            return None
        count = cells(self.plan)
        return {
            "cells": count,
            "cell_confidence": self.plan.confidence,
            "confidence": 1 - (1 - self.plan.confidence) * count,
        }


@dataclass(frozen=True)
class ReportPlan:
    """A priced report: per-query budgets, the total, and what the budget lines have left."""

    spec: ReportSpec
    analyst: str
    confidence: float
    queries: tuple[PlannedQuery, ...]
    draws_on: tuple[BudgetStatus, ...]

    @property
    def rule(self) -> str:
        return self.spec.rule

    @property
    def total(self) -> Cost:
        result = Cost()
        for query in self.queries:
            result = result + query.cost
        return result

    def shortfalls(self) -> list[str]:
        """Why the batch does not fit, one phrase per short budget line (empty: it fits)."""
        need = self.total
        found = []
        if self.spec.epsilon is not None and need.epsilon_units > Cost.cap(
            self.spec.epsilon
        ).epsilon_units:
            short = need - Cost.cap(self.spec.epsilon)
            found.append(
                f"the report's total epsilon={self.spec.epsilon:g} is short by "
                f"epsilon={short.epsilon:.10g}"
            )
        for line in self.draws_on:
            left = Cost.cap(line.epsilon_remaining, line.delta_remaining)
            if not need.fits_within(left):
                parts = []
                if need.epsilon_units > left.epsilon_units:
                    parts.append(
                        f"epsilon={Cost(need.epsilon_units - left.epsilon_units).epsilon:.10g}"
                    )
                if need.delta_units > left.delta_units:
                    parts.append(f"delta={Cost(0, need.delta_units - left.delta_units).delta:.10g}")
                found.append(
                    f"{line.scope} {line.name!r} has epsilon={line.epsilon_remaining:.10g}, "
                    f"delta={line.delta_remaining:.10g} remaining: short by {', '.join(parts)}"
                )
        return found

    def check_fits(self) -> None:
        """Raise ``BudgetExceededError`` naming every shortfall, or return."""
        problems = self.shortfalls()
        if problems:
            need = self.total
            remaining = min(self.draws_on, key=lambda line: line.epsilon_remaining)
            raise BudgetExceededError(
                f"report {self.spec.title!r} needs epsilon={need.epsilon:.10g}, "
                f"delta={need.delta:.10g}: {'; '.join(problems)}; nothing was charged",
                requested={"epsilon": need.epsilon, "delta": need.delta},
                remaining={
                    "epsilon": remaining.epsilon_remaining,
                    "delta": remaining.delta_remaining,
                },
            )

    def minimax_driver(self) -> dict[str, Any] | None:
        """Under ``minimax``, the query that takes the largest share of the split: its error per
        unit of ε, relative to its expected value, is the largest, so every other query's
        relative error is held at its level (None under other rules)."""
        if self.rule != "minimax":
            return None
        ruled = [q for q in self.queries if q.spec.epsilon is None]
        split = sum(q.cost.epsilon_units for q in ruled)
        if not ruled or not split:
            return None
        driver = max(ruled, key=lambda q: q.cost.epsilon_units)
        scale = driver.spec.expected if driver.spec.expected is not None else driver.spec.accuracy
        error = plan_error(driver.plan, driver.spec.column)
        share = driver.cost.epsilon_units / split
        return {
            "query": driver.name,
            "share_of_epsilon": share,
            "relative_error": error / scale if scale else None,
            "why": f"{driver.name} takes {share:.0%} of the split epsilon: its error per unit of "
            "epsilon, relative to its expected value, is the largest, and minimax gives every "
            "query the same relative error; a larger expected value (or a fixed epsilon, or "
            "leaving it out) for it frees budget for the others",
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.spec.title,
            "analyst": self.analyst,
            "allocation": self.rule,
            "allocation_rule": RULE_EXPLANATIONS[self.rule],
            "minimax_driver": self.minimax_driver(),
            "confidence": self.confidence,
            "total": {
                "epsilon": self.total.epsilon,
                "delta": self.total.delta,
                "epsilon_units": self.total.epsilon_units,
                "delta_units": self.total.delta_units,
            },
            "requested_total_epsilon": self.spec.epsilon,
            "period": self.draws_on[0].period,
            "queries": [q.to_dict() for q in self.queries],
            "draws_on": [line.model_dump() for line in self.draws_on],
            "fits": not self.shortfalls(),
            "shortfalls": self.shortfalls(),
        }


def _planner(
    session: Session, spec: ReportSpec, name: str, query: QuerySpec
) -> tuple[Callable[[float], QueryPlan], str]:
    """A function planning ``query`` at a given epsilon (reads no data), and its normalized SQL.
    The SQL is parsed and bound once; the report's confidence replaces the policy's."""
    bound, normalized, policy, binder = session.bind(query.sql)
    for option in ("epsilon", "delta", "accuracy", "confidence"):
        if option in bound.shape.options:
            raise ParameterError(
                f"the report sets {option}; remove it from OPTIONS(...)"
            )
    check_ranges(bound.shape, policy, session.backend)
    if spec.confidence is not None:
        dataset = policy.dataset.model_copy(update={"confidence": spec.confidence})
        policy = policy.model_copy(update={"dataset": dataset})
    delta = check_budget_value("delta", query.delta, allow_zero=True)
    simultaneous = spec.simultaneous_for(query)
    return planner(
        bound, policy, binder, delta=delta, simultaneous=simultaneous
    ), normalized


def plan_report(session: Session, spec: ReportSpec) -> ReportPlan:
    """Price ``spec`` for ``session``'s analyst and allocate its budget; reads no data, charges
    nothing. Raises for queries dpsql refuses (naming the query) but not for a batch that does
    not fit: ``ReportPlan.shortfalls`` says by how much."""
    planners: dict[str, tuple[Callable[[float], QueryPlan], str]] = {}
    for name, query in spec.queries.items():
        planners[name] = _named(name, lambda n=name, q=query: _planner(session, spec, n, q))
    confidence = spec.confidence or session.policy.dataset.confidence
    rule = spec.rule
    plans: dict[str, QueryPlan] = {}
    fixed = {n: q for n, q in spec.queries.items() if q.epsilon is not None}
    ruled = {n: q for n, q in spec.queries.items() if q.epsilon is None}
    for name, query in fixed.items():
        epsilon = Cost.cap(query.epsilon).epsilon  # type: ignore[arg-type]
        plans[name] = _named(name, lambda n=name, e=epsilon: planners[n][0](e))
    if rule == "accuracy":
        ceiling = session.policy.dataset.epsilon
        for name, query in ruled.items():
            assert query.accuracy is not None
            plans[name] = _named(
                name,
                lambda q=query, n=name: least_epsilon(
                    planners[n][0], q.accuracy, column=q.column, ceiling=ceiling
                ),
            )
    elif ruled:
        assert spec.epsilon is not None
        rest = Cost.cap(spec.epsilon).epsilon_units - sum(
            total(plans[n].event).epsilon_units for n in fixed
        )
        if rest < len(ruled):
            raise ParameterError(
                f"the fixed epsilons ({', '.join(fixed)}) leave nothing of the report's total "
                f"epsilon={spec.epsilon:g} for the other queries"
            )
        weights = [q.weight for q in ruled.values()]
        if rule == "minimax":
            weights = _minimax_weights(ruled, {n: planners[n][0] for n in ruled}, rest)
        for (name, _), share in zip(ruled.items(), split_units(rest, weights), strict=True):
            plans[name] = _named(name, lambda n=name, s=share: planners[n][0](Cost(s).epsilon))
            assert total(plans[name].event).epsilon_units == share
    status = session.budget()
    analyst_line = status.for_analyst(session.analyst)
    assert analyst_line is not None
    return ReportPlan(
        spec=spec,
        analyst=session.analyst,
        confidence=confidence,
        queries=tuple(
            PlannedQuery(
                name, query, planners[name][1], plans[name], spec.simultaneous_for(query)
            )
            for name, query in spec.queries.items()
        ),
        draws_on=(status.dataset, analyst_line),
    )


MINIMAX_ROUNDS = 4
"""Fixed-point rounds of the minimax split: a sum's error is c/ε only approximately (its grid
follows ε), so c is re-measured at each round's ε and the split redone."""


def _minimax_weights(
    queries: dict[str, QuerySpec], plan_at: dict[str, Callable[[float], QueryPlan]], units: int
) -> list[float]:
    """Weights ε_i ∝ c_i / E_i, with c_i = error x ε measured at the query's current share
    (first at an equal split), refined for ``MINIMAX_ROUNDS`` rounds."""
    scale = {n: q.expected if q.expected is not None else q.accuracy for n, q in queries.items()}
    shares = split_units(units, [1.0] * len(queries))
    weights: list[float] = []
    for _ in range(MINIMAX_ROUNDS):
        weights = []
        for (name, query), share in zip(queries.items(), shares, strict=True):
            epsilon = Cost(share).epsilon
            error = _named(
                name, lambda n=name, q=query, e=epsilon: plan_error(plan_at[n](e), q.column)
            )
            weights.append(error * epsilon / scale[name])  # type: ignore[operator]
        shares = split_units(units, weights)
    return weights


def _named(name: str, work: Callable[[], _T]) -> _T:
    """``work()``, with a refusal's message prefixed by the query's name (same error class,
    same position)."""
    try:
        return work()
    except (ParameterError, PolicyError) as error:
        raise type(error)(f"query {name!r}: {error}") from None
    except QueryError as error:
        message = str(error) if error.line is None else str(error).rsplit(" (line ", 1)[0]
        raise type(error)(
            f"query {name!r}: {message}", line=error.line, column=error.column
        ) from None


@dataclass(frozen=True)
class ReportRun:
    """What ``run_report`` produced."""

    plan: ReportPlan
    ledger_entry: dict[str, Any]
    results: dict[str, QueryResult]
    out: Path


def run_report(
    session: Session,
    spec: ReportSpec,
    out: str | Path,
    *,
    render: Callable[[ReportPlan, dict[str, Any], dict[str, QueryResult], Path], None]
    | None = None,
) -> ReportRun:
    """Charge ``spec`` as one ledger entry (all or nothing), answer every query, and write the
    report into ``out`` (a new or empty directory). ``render`` writes the files (default
    ``dpsql.engine.report_html.write_report``)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ParameterError(f"output directory {str(out)!r} exists and is not empty")
    if render is None:
        from dpsql.engine.report_html import write_report

        render = write_report
    plan = plan_report(session, spec)
    plan.check_fits()
    event = SequentialEvent(tuple(q.plan.event for q in plan.queries))
    entry = session.ledger_store.charge(
        analyst=session.analyst,
        event=event,
        query=f"REPORT {spec.title!r}: " + "; ".join(f"{q.name}: {q.sql}" for q in plan.queries),
        plan={
            "report": spec.title,
            "allocation": plan.rule,
            "queries": {q.name: q.plan.summary() for q in plan.queries},
        },
        mechanism="report",
        policy_entry=session.policy_entry,
    )
    ledger_entry = {**entry.to_dict(), "payload": event_to_dict(event)}

    def answer_and_write() -> ReportRun:
        results = {}
        for query in plan.queries:
            answer = release_answer(query.plan, entry, session.release_context()).clamped()
            results[query.name] = answer.model_copy(
                update={"epsilon": query.cost.epsilon, "delta": query.cost.delta}
            )
        session.keep_report(entry.seq, results)  # fetched again by entry and name, for free
        audit = _audit(session, entry.seq)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            render(plan, {"entry": ledger_entry, "period": entry.period, **audit}, results, staging)
            if out.exists():
                out.rmdir()
            staging.rename(out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return ReportRun(plan, ledger_entry, results, out)

    return after_charge(answer_and_write)  # type: ignore[arg-type,return-value]


def _audit(session: Session, seq: int) -> dict[str, Any]:
    """The analyst's ledger entries with their hashes, and the chain's verification."""
    ledger = session.ledger_store
    try:
        count = ledger.verify()
        verified, detail = True, f"hash chain and totals of all {count} entries verified"
    except Exception as error:  # a LedgerError: shown in the report, not hidden
        verified, detail, count = False, str(error), 0
    entries = [e for e in ledger.entries() if e.analyst == session.analyst]
    return {
        "dataset": ledger.dataset,
        "budget_after": [line.model_dump() for line in session.budget().lines[:2]],
        "verify": {
            "verified": verified,
            "entries": count,
            "last_hash": ledger.entries()[-1].hash,
            "detail": detail,
        },
        "entries": [
            {
                "seq": e.seq,
                "time": e.time,
                "kind": e.kind,
                "mechanism": e.mechanism,
                "epsilon": e.cost.epsilon,
                "delta": e.cost.delta,
                "prev_hash": e.prev_hash,
                "hash": e.hash,
                "this_report": e.seq == seq,
            }
            for e in entries
        ],
    }


def results_document(
    plan: ReportPlan, audit: dict[str, Any], results: dict[str, QueryResult]
) -> dict[str, Any]:
    """``results.json``: the plan, every answer and the ledger entry that paid for them."""
    return {
        "report": plan.to_dict(),
        "ledger_entry": {
            k: audit["entry"][k]
            for k in ("seq", "time", "hash", "prev_hash", "epsilon", "delta", "analyst", "period")
        },
        "verify": audit["verify"],
        "period": audit.get("period"),
        "results": {name: result.to_dict() for name, result in results.items()},
        "stored_results": {
            name: {
                "ledger_entry": audit["entry"]["seq"],
                "query": name,
                "cli": f"dpsql result {audit['entry']['seq']} --query {name}",
                "http": f"/v1/results/{audit['entry']['seq']}?query={quote(name)}",
            }
            for name in results
        },
    }


def write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document, indent=2, allow_nan=False, default=str) + "\n")
