"""Sessions: the one path from an analyst's SQL to a charged, noised answer.

``execute`` parses and checks the SQL, plans and prices it from the policy, charges the ledger
atomically, and only then runs the generated SQL and adds noise. Anything that fails before the
charge charges nothing; once charged, the charge stands even if the answer is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpsql import deadline
from dpsql.accountant.events import Event, PostProcessingEvent, total
from dpsql.accountant.ledger import Ledger, LedgerEntry, plan_text
from dpsql.accountant.limits import Limits
from dpsql.accountant.units import Cost
from dpsql.engine.accuracy import (
    least_epsilon,
    output_errors,
)
from dpsql.engine.answers import (
    ALP_ROWS_PER_KEY,
)
from dpsql.engine.backends import Backend, DuckDBBackend
from dpsql.engine.calendars import calendar_bounds
from dpsql.engine.choices import DEFAULT_EXPECTED_QUERIES
from dpsql.engine.literals import Binder
from dpsql.engine.planner import (
    QueryPlan,
    with_key_hash_seed,
)
from dpsql.engine.policy import Policy, load_policy, parse_policy
from dpsql.engine.progress import (
    Progress,
)
from dpsql.engine.query import (
    BoundQueries,
    BoundQuery,
    after_charge,
    check_ranges,
    planner,
    resolve_budget,
    summary,
    visible_catalog,
)
from dpsql.engine.release import ReleaseContext, answer, read
from dpsql.engine.results import BudgetReport, BudgetStatus, QueryResult
from dpsql.engine.schema import describe_schema
from dpsql.engine.stored_results import ResultStore
from dpsql.engine.stream_desk import StreamDesk, list_streams
from dpsql.engine.streams import StreamStore
from dpsql.engine.synopses import (
    PointQuery,
    Synopsis,
    SynopsisStore,
    point_queries,
)
from dpsql.errors import (
    ParameterError,
    PolicyError,
)
from dpsql.mechanisms.combined import CombinedRelease
from dpsql.mechanisms.random import session_generator
from dpsql.memo import Kept
from dpsql.sql.expressions import explained
from dpsql.sql.generate import (
    contribution_profile,
)
from dpsql.sql.shape import ColumnKind, QueryShape

__all__ = [
    "Session",
    "connect",
    "database_budget",
    "database_ledger",
    "database_synopses",
    "ledger_path",
    "set_policy",
    "show_policy",
]


def ledger_path(database: str | Path) -> Path:
    """Where the ledger of ``database`` lives: beside it, named ``<database>.dpsql.sqlite``."""
    return Path(f"{database}.dpsql.sqlite")


def _dataset_name(database: str | Path, policy: Policy | None) -> str:
    if policy is not None and policy.dataset.name:
        return policy.dataset.name
    return Path(database).stem


def _limits(policy: Policy) -> Limits:
    advanced = policy.dataset.advanced_delta if policy.dataset.composition == "advanced" else None
    zcdp = policy.dataset.advanced_delta if policy.dataset.composition == "zcdp" else None
    return Limits(
        Cost.cap(policy.dataset.epsilon, policy.dataset.delta),
        {name: Cost.cap(a.epsilon, a.delta) for name, a in policy.analysts.items()},
        advanced,
        zcdp_delta=zcdp,
        period=None if policy.dataset.period == "none" else policy.dataset.period,
    )


def _check_against_schema(policy: Policy, backend: Backend) -> None:
    """Tables, columns and types of the policy against the database; public keys converted to
    their column's type by the database itself, each value listed once."""
    catalog = backend.catalog()
    binder = Binder(backend, catalog)
    for table_name, table in policy.tables.items():
        matches = [t for t in catalog if t.lower() == table_name.lower()]
        if not matches:
            raise PolicyError(f"policy table {table_name!r} does not exist in the database")
        columns = catalog[matches[0]]
        if table.privacy_unit not in columns:
            raise PolicyError(
                f"privacy unit {table.privacy_unit!r} is not a column of table {table_name!r}"
            )
        if table.partition_column is not None and table.partition_column not in columns:
            raise PolicyError(
                f"partition column {table.partition_column!r} is not a column of "
                f"table {table_name!r}"
            )
        for name, rules in table.columns.items():
            if name not in columns:
                raise PolicyError(f"policy column {table_name}.{name} does not exist")
            kind = ColumnKind.of(columns[name])
            if rules.public_keys is not None:
                binder.keys(matches[0], name, rules.public_keys)
            if rules.calendar_bounds is not None:
                calendar_bounds(binder, matches[0], name, columns[name], rules.calendar_bounds)
            elif rules.bounds is not None and not kind.numeric:
                raise PolicyError(
                    f"bounds on {table_name}.{name} need a numeric column (or dates for a DATE "
                    f"or TIMESTAMP column), it is {columns[name]}"
                )


def set_policy(database: str | Path, policy: Policy | str | Path) -> LedgerEntry:
    """Validate ``policy`` (a model, TOML text or a path) against the database and record it."""
    if isinstance(policy, Path) or (isinstance(policy, str) and Path(policy).suffix == ".toml"):
        policy = load_policy(policy)
    elif isinstance(policy, str):
        policy = parse_policy(policy)
    backend = DuckDBBackend.for_policy(database, policy)
    try:
        backend.check_sources()
        _check_against_schema(policy, backend)
    finally:
        backend.close()
    ledger = Ledger(ledger_path(database), dataset=_dataset_name(database, policy))
    try:
        return ledger.set_policy(policy.model_dump(mode="json"), _limits(policy))
    finally:
        ledger.close()


def show_policy(database: str | Path) -> Policy:
    """The policy in force for ``database``."""
    ledger = _open_ledger(database)
    try:
        document = ledger.policy()
    finally:
        ledger.close()
    if document is None:
        raise PolicyError(f"no privacy policy is set for {str(database)!r}")
    return Policy.model_validate(document)


class Session:
    """An analyst's connection to one database and its ledger.

    ``progress`` (see ``dpsql.engine.progress``) is told the stages of ``execute`` after the
    charge: "reading data" (with the backend's estimate when its ``run`` takes ``progress``),
    then "building <mechanism> release" or "adding noise", then "done" (``mad2r`` also reports
    "aggregating cells" and "reading round 2"). The default DuckDB
    backend's memory limit is the policy's (``[dataset] memory_limit``), never the caller's: a
    limit an analyst could choose would let one person's rows decide whether a query fails.
    The policy's ``[dataset] time_limit`` bounds each ``execute`` and ``explain`` (like the memory
    limit, it is the administrator's, never the caller's): passed before the charge, the query is
    refused and nothing is charged; after it, the charge stands (``dpsql.deadline``).
    """

    def __init__(
        self,
        database: str | Path,
        *,
        analyst: str,
        dialect: str = "duckdb",
        backend: Backend | None = None,
        progress: Progress | None = None,
    ):
        if not isinstance(analyst, str) or not analyst:
            raise ParameterError(f"analyst must be a non-empty name, got {analyst!r}")
        self.database = Path(database)
        self.analyst = analyst
        self.dialect = dialect
        if backend is None and not self.database.is_file() and not ledger_path(database).exists():
            raise ParameterError(f"database file {str(database)!r} does not exist")
        self.rng = session_generator()
        self.ledger_store = Ledger(ledger_path(database), dataset=self.database.stem)
        self._policy_entry = self.ledger_store.policy_entry()
        self.policy = self._load_policy()
        self.ledger_store.dataset = _dataset_name(database, self.policy)
        # The policy may point tables at Parquet/CSV files: the backend exposes exactly those.
        self.backend = (
            backend if backend is not None else DuckDBBackend.for_policy(database, self.policy)
        )
        if analyst not in self.policy.analysts:
            raise PolicyError(f"analyst {analyst!r} has no allocation in the policy")
        self.progress = progress
        self.binder = Binder(self.backend, self.backend.catalog())
        self._bound = BoundQueries()
        self._priced: Kept[QueryPlan] = Kept()
        """Plans of bound queries asked again with the same arguments under the same policy
        (a plan is a function of those alone), and their summaries (``Kept``)."""
        self._shown: Kept[tuple[dict[str, Any], str]] = Kept()
        self._synopsis_releases: Kept[CombinedRelease] = Kept(size=16)
        """Stored synopses read back, by name, ledger entry and creation time: a stored
        synopsis is never changed (its name is the table's key, and it is only inserted)."""
        # Released answers and synopses live in the ledger file too: opened once per session,
        # not once per query.
        self._results = ResultStore(ledger_path(database))
        self._synopsis_store = SynopsisStore(ledger_path(database))
        self._streams = StreamDesk(self, StreamStore(ledger_path(database)))

    def _load_policy(self) -> Policy:
        document = self.ledger_store.policy()
        if document is None:
            raise PolicyError(
                f"no privacy policy is set for {str(self.database)!r}; run "
                "`dpsql policy set --db DB --file policy.toml`"
            )
        return Policy.model_validate(document)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.backend.close()
        self._results.close()
        self._synopsis_store.close()
        self._streams.close()
        self.ledger_store.close()

    # planning -----------------------------------------------------------------------------------
    def refresh_policy(self) -> Policy:
        """The policy in force (the administrator may have set a new one): read and validated
        again only when the ledger's latest policy entry is not the one last loaded (a policy
        entry is never changed, and the model is frozen)."""
        entry = self.ledger_store.policy_entry()
        if entry is None or entry != self._policy_entry:
            self._policy_entry = entry
            self.policy = self._load_policy()
        return self.policy

    def bind(self, sql: str, dialect: str | None = None) -> BoundQuery:
        """``sql`` checked and bound under the policy in force (``dpsql.engine.query.bind``); a
        text bound before under the same policy and catalog is not bound again
        (``dpsql.engine.query.BoundQueries``)."""
        return self._bound.bound(
            sql,
            dialect=dialect or self.dialect,
            policy=self.refresh_policy(),
            backend=self.backend,
            binder=self.binder,
        )

    def plan(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
        max_answers: int | None = None,
        accuracy: float | None = None,
    ) -> QueryPlan:
        """The plan ``execute`` would charge for ``sql`` (reads no data, charges nothing)."""
        return self._plan(self.bind(sql), epsilon, delta, mechanism, max_answers, accuracy)

    def _plan(
        self,
        query: BoundQuery,
        epsilon: float | None,
        delta: float | None,
        mechanism: str | None,
        max_answers: int | None,
        accuracy: float | None,
    ) -> QueryPlan:
        asked = (epsilon, delta, mechanism, max_answers, accuracy)
        return self._priced.get(
            (query, self.policy, *asked), lambda: self._plan_now(query, *asked)
        )

    def _plan_now(self, query: BoundQuery, *asked: Any) -> QueryPlan:
        """``_plan`` computed (``asked``: its arguments after the query, in order)."""
        epsilon, delta, mechanism, max_answers, accuracy = asked
        shape, policy = query.bound.shape, query.policy
        check_ranges(shape, policy, self.backend)
        budget = resolve_budget(
            shape, policy, epsilon=epsilon, delta=delta, accuracy=accuracy
        )
        plan_at = planner(
            query.bound,
            policy,
            query.binder,
            delta=budget.delta,
            mechanism=mechanism,
            max_answers=max_answers,
        )
        if budget.epsilon is None:
            ceiling = min(policy.dataset.epsilon, policy.analysts[self.analyst].epsilon)
            return least_epsilon(plan_at, budget.target, ceiling=ceiling)
        return plan_at(budget.epsilon)

    def release_context(self) -> ReleaseContext:
        """What reading and releasing a charged plan needs from this session."""
        return ReleaseContext(
            backend=self.backend,
            rng=self.rng,
            analyst=self.analyst,
            policy=self.policy,
            progress=self.progress,
            synopses=self._synopsis_store,
        )

    def explain(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
        max_answers: int | None = None,
        accuracy: float | None = None,
        dialect: str | None = None,
    ) -> dict[str, Any]:
        """Plan, mechanism, sensitivities, expected error and cost of ``sql``, without reading
        data or charging. With ``accuracy`` (or ``OPTIONS(accuracy=...)``), the least epsilon
        meeting it. Bounded by the policy's ``time_limit`` like ``execute``; ``dialect`` (default:
        the session's) is the SQL dialect ``sql`` is written in."""
        with deadline.request(self.policy.dataset.time_limit):
            shaped = self.bind(sql, dialect)
            return self._explain(shaped, epsilon, delta, mechanism, max_answers, accuracy)

    def _explain(
        self,
        shaped: BoundQuery,
        epsilon: float | None,
        delta: float | None,
        mechanism: str | None,
        max_answers: int | None,
        accuracy: float | None,
    ) -> dict[str, Any]:
        synopsis = self._synopsis_for(shaped.bound.shape, mechanism, accuracy)
        if synopsis is not None:
            return {
                "query": shaped.normalized,
                "plan": {"mechanism": "synopsis", "synopsis": synopsis[0].describe()},
                "cost": {"epsilon": 0.0, "delta": 0.0},
                "draws_on": [],
            }
        if self._streams_for(shaped.bound.shape, accuracy):
            routed = self._streams.route(shaped.bound.shape, mechanism)
            if routed is not None:
                return self._streams.explain(routed, shaped.normalized)
            if wanted := self._streams.requested(shaped.bound.shape, mechanism):
                opening = self._streams.plan_for_query(shaped.bound.shape, wanted, epsilon, delta)
                return self._streams.explain_opening(opening, shaped.normalized)
        plan = self._plan(shaped, epsilon, delta, mechanism, max_answers, accuracy)
        cost = total(plan.event)
        status = self.budget()
        return {
            "query": shaped.normalized,
            "plan": summary(plan, shaped.bound.shape, accuracy) | explained(plan.shape),
            "expected_error": _shown_errors(plan),
            "cost": {"epsilon": cost.epsilon, "delta": cost.delta},
            "draws_on": [
                status.dataset.model_dump(),
                status.for_analyst(self.analyst).model_dump(),
            ],  # type: ignore[union-attr]
        }

    # execution ----------------------------------------------------------------------------------
    def execute(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
        max_answers: int | None = None,
        accuracy: float | None = None,
        dialect: str | None = None,
    ) -> QueryResult:
        """Answer ``sql`` with differential privacy, charging the analyst's budget first.

        ``mechanism`` ("laplace", "threshold", "alp") chooses how keys of a GROUP BY column without
        public keys are released. A point count that a stored synopsis covers is answered from it,
        for free, unless ``mechanism="laplace"`` asks for fresh noise. ``accuracy`` (or
        ``OPTIONS(accuracy=..., confidence=...)``) replaces epsilon: the least epsilon whose
        intervals are at most ±accuracy wide is charged (``details["accuracy"]``). ``dialect``
        (default: the session's) is the SQL dialect ``sql`` is written in.
        """
        with deadline.request(self.policy.dataset.time_limit):
            shaped = self.bind(sql, dialect)
            return self._execute(shaped, epsilon, delta, mechanism, max_answers, accuracy)

    def _execute(
        self,
        shaped: BoundQuery,
        epsilon: float | None,
        delta: float | None,
        mechanism: str | None,
        max_answers: int | None,
        accuracy: float | None,
    ) -> QueryResult:
        synopsis = self._synopsis_for(shaped.bound.shape, mechanism, accuracy)
        if synopsis is not None:
            return self._from_synopsis(synopsis, shaped)
        if self._streams_for(shaped.bound.shape, accuracy):
            answered = self._from_stream(shaped, mechanism, epsilon, delta)
            if answered is not None:
                return answered
        plan = self._plan(shaped, epsilon, delta, mechanism, max_answers, accuracy)
        plan = with_key_hash_seed(plan, self.rng)
        shown, shown_text = self._shown.get(
            (plan, accuracy), lambda: _summary_and_text(plan, shaped.bound.shape, accuracy)
        )
        entry = self.ledger_store.charge(
            analyst=self.analyst,
            event=plan.event,
            query=shaped.normalized,
            plan=shown_text,
            mechanism=plan.mechanism,
            partition=plan.partition,
            policy_entry=self._policy_entry,
        )
        post = plan.shape.post

        def released() -> QueryResult:
            result = answer(plan, entry, self.release_context())
            if "accuracy" in shown:
                details = {**result.details, "accuracy": shown["accuracy"]}
                result = result.model_copy(update={"details": details})
            if post is not None:
                from dpsql.engine.derived import post_processed  # a post-processed query only

                result = post_processed(result, post, plan)
            return self._kept(result.clamped())

        return after_charge(released)

    @staticmethod
    def _streams_for(shape: QueryShape, accuracy: float | None) -> bool:
        """Whether a query stream may answer: not for post-processed queries or an accuracy
        target (a stream's error is its own)."""
        return (
            shape.post is None
            and accuracy is None
            and "accuracy" not in shape.options
            and shape.relation is None
        )

    def _from_stream(
        self,
        shaped: BoundQuery,
        mechanism: str | None,
        epsilon: float | None,
        delta: float | None,
    ) -> QueryResult | None:
        """The answer from the query stream that covers the query, opening one first if
        ``mechanism`` asks for it; None when no stream answers it."""
        routed, opened = self._streams.route(shaped.bound.shape, mechanism), {}
        if routed is None and (wanted := self._streams.requested(shaped.bound.shape, mechanism)):
            opening = self._streams.plan_for_query(shaped.bound.shape, wanted, epsilon, delta)
            entry = self._streams.charge(opening)
            opened = after_charge(lambda: self._streams.build(opening, entry))  # type: ignore[arg-type,return-value]
            routed = self._streams.route(shaped.bound.shape, mechanism)
        if routed is None:
            return None
        answer = self._streams.answer(routed, shaped.bound.shape, shaped.normalized)
        if opened:
            details = {**answer.details, "opened_stream": opened}
            answer = answer.model_copy(update={"details": details})
        return self._kept(answer)

    def open_stream(
        self,
        table: str,
        columns: Sequence[tuple[Any, ...]],
        *,
        epsilon: float,
        mechanism: str = "pmw",
        delta: float = 0.0,
        updates: int | None = None,
        threshold: float | None = None,
        expected_queries: int = DEFAULT_EXPECTED_QUERIES,
        name: str | None = None,
        filter: str | None = None,
        warm_share: float | None = None,
    ) -> dict[str, Any]:
        """Open a query stream over ``table``'s ``columns`` (``(name, bin width)`` or ``(name,
        bin width, low, high)``: integer, DATE, TIMESTAMP or DECIMAL columns), charging
        ``(epsilon, delta)`` once; later COUNT queries whose WHERE is ``filter`` (a fixed WHERE
        condition on other columns; none: the whole table) AND conditions on those columns are
        answered from it (``dpsql.engine.streams``). ``warm_share`` (pmw; default 0.8) is the
        share of epsilon that buys the PMW's warm start."""
        plan = self._streams.plan(
            table,
            list(columns),
            mechanism=mechanism,
            epsilon=epsilon,
            delta=delta,
            updates=updates,
            threshold=threshold,
            expected_queries=expected_queries,
            name=name,
            filter=filter,
            warm_share=warm_share,
        )
        entry = self._streams.charge(plan)
        return after_charge(lambda: self._streams.build(plan, entry))  # type: ignore[arg-type,return-value]

    def _kept(self, result: QueryResult) -> QueryResult:
        """Store a released answer under its ledger entry (``dpsql result N``), return it."""
        self._results.save(result)
        return result

    def result(self, seq: int, query: str | None = None) -> QueryResult:
        """An answer this analyst already paid for (ledger entry ``seq``; of a report, its query
        named ``query``), again, for free."""
        return self._results.get(seq, self.analyst, query)

    def keep_report(self, seq: int, results: dict[str, QueryResult]) -> None:
        """Store a report's answers under its ledger entry ``seq`` (``result(seq, name)``)."""
        self._results.save_report(seq, results)

    def contributions(
        self,
        table: str,
        *,
        group_by: Sequence[str] = (),
        epsilon: float | None = None,
        suggest: bool = False,
        coverage: float = 0.95,
    ) -> QueryResult:
        """How much the policy's contribution bounds cut ``table``, privately: noisy counts of the
        persons and of those over each bound (or, with ``suggest``, noisy histograms of each
        person's rows, groups and largest group, and the smallest powers of two covering
        ``coverage`` of the persons in ``details["suggested"]``). Charged like any query, at
        ``epsilon`` (default ``contributions.DEFAULT_EPSILON`` = 0.1)."""
        from dpsql.engine.contributions import contribution_answer, plan_contributions

        plan = plan_contributions(
            self.refresh_policy(),
            visible_catalog(self.backend, self.policy),
            table,
            group_by=group_by,
            epsilon=epsilon,
            suggest=suggest,
            coverage=coverage,
        )
        entry = self.ledger_store.charge(
            analyst=self.analyst,
            event=plan.event,
            query=plan.query,
            plan=plan.summary(),
            mechanism="discrete_laplace",
            policy_entry=self._policy_entry,
        )
        profile = contribution_profile(
            plan.table, bounds=plan.bounds, group_by=plan.group_by, dialect=self.backend.dialect
        )
        return after_charge(
            lambda: self._kept(
                contribution_answer(
                    plan,
                    read(self.release_context(), profile),
                    entry,
                    rng=self.rng,
                    analyst=self.analyst,
                )
            )
        )

    def synopsis_owner(self) -> str | None:
        """Whose synopses answer this analyst: their own, or everyone's if the policy shares."""
        return None if self.policy.dataset.share_synopses else self.analyst

    def synopses(self) -> list[dict[str, Any]]:
        """The stored synopses this analyst may use (parameters only, never the bytes)."""
        listed = [s.describe() for s in self._synopsis_store.all(self.synopsis_owner())]
        return listed + self._streams.listing()

    def _synopsis_for(
        self, shape: QueryShape, mechanism: str | None, accuracy: float | None = None
    ) -> tuple[Synopsis, PointQuery] | None:
        if (mechanism or shape.options.get("mechanism")) == "laplace" or shape.post is not None:
            return None
        if accuracy is not None or "accuracy" in shape.options:
            return None  # a synopsis's error is its own: an accuracy target asks for fresh noise
        readings = point_queries(shape)
        if not readings:
            return None
        for query in readings:
            found = self._synopsis_store.find(
                shape.table, query.column, query.filters, self.synopsis_owner()
            )
            if found is not None:
                return found, query
        return None

    def _from_synopsis(
        self, found: tuple[Synopsis, PointQuery], shaped: BoundQuery
    ) -> QueryResult:
        synopsis, query = found
        shape, normalized = shaped.bound.shape, shaped.normalized
        release = self._synopsis_releases.get(
            (synopsis.name, synopsis.ledger_entry, synopsis.created),
            lambda: CombinedRelease.from_bytes(synopsis.data),
        )
        keys = np.array(query.keys, dtype=object if isinstance(query.keys[0], str) else None)
        answer = release.answer(
            keys, confidence=self.policy.dataset.confidence, keys_per_row=1 / ALP_ROWS_PER_KEY
        )
        event = PostProcessingEvent(f"synopsis:{synopsis.name}", "COUNT(*)")
        entry = self.ledger_store.charge(
            analyst=self.analyst,
            event=event,
            query=normalized,
            plan={"synopsis": synopsis.name, "keys": list(query.keys)},
            mechanism="synopsis",
            policy_entry=self._policy_entry,
        )
        value = answer.value
        (name,) = shape.column_names
        result = QueryResult(
            columns=[name],
            rows=[(int(value) if value.is_integer() else value,)],
            intervals={name: [(answer.lower, answer.upper)]},
            noise_scale={name: float(release.threshold.scale)},
            confidence=self.policy.dataset.confidence,
            details={
                "released_by_threshold": answer.released.tolist(),
                "tau": int(release.threshold.tau),
                "unreleased_count_at_most": answer.unreleased_ceiling,
                "sketch_expected_error_bound": answer.sketch_error_bound,
                "sketch_beats_zero": answer.sketch_beats_zero,
                "guarantee": "a key the threshold released: its noisy count, ± the noise's "
                "half-width; a key it did not: true count in [0, unreleased_count_at_most] (the "
                "ALP estimate is clamped into it), expected error at most "
                "sketch_expected_error_bound if the table has at most expected_keys keys "
                "(Aumüller, Lebeda, Pagh, full version); when sketch_beats_zero is false, 0 is "
                "as good an answer for such keys",
            },
            measures={
                name: f"rows with the key(s), {_synopsis_bounds(synopsis)}, as bounded when the "
                "synopsis was released"
            },
            epsilon=0.0,
            delta=0.0,
            mechanism=f"synopsis:{synopsis.name}",
            analyst=self.analyst,
            ledger_entry=entry.seq,
        )
        return self._kept(result)

    def charge(
        self, event: Event, *, query: str, plan: dict[str, Any], mechanism: str
    ) -> LedgerEntry:
        """Charge a release made outside ``execute`` (e.g. a published table) to this analyst.

        Check-and-record is atomic; raise ``BudgetExceededError`` and record nothing when a limit
        would be passed. Call it before the release leaves the engine.
        """
        return self.ledger_store.charge(
            analyst=self.analyst,
            event=event,
            query=query,
            plan=plan,
            mechanism=mechanism,
            policy_entry=self._policy_entry,
        )

    @property
    def policy_entry(self) -> int | None:
        """The ledger entry of the policy this session last read (``refresh_policy``): its
        charges are refused if another policy is in force by then (``Ledger.charge``)."""
        return self._policy_entry

    def act_as(self, actor: dict[str, Any] | None) -> None:
        """Record ``actor`` (e.g. the operating-system user and a service token's id) in the
        entries this session writes from now on; None restores the operating-system user."""
        self.ledger_store.actor = actor

    # budget and ledger --------------------------------------------------------------------------
    def budget(self) -> BudgetReport:
        """Cap, spent and remaining for the dataset and this analyst."""
        return budget_report(self.ledger_store, self.analyst)

    def schema(self) -> dict[str, Any]:
        """The tables this analyst may query, their columns, types and rules, the dataset's
        query defaults and this analyst's budget (``dpsql.engine.schema``); reads no row."""
        return describe_schema(
            self.refresh_policy(),
            self.backend,
            dataset=self.ledger_store.dataset,
            budget=self.budget(),
        )

    def ledger(self) -> list[dict[str, Any]]:
        """This analyst's own ledger entries, oldest first (the whole ledger is the
        administrator's and the auditor's: ``database_ledger``)."""
        return [e.to_dict() for e in self.ledger_store.entries() if e.analyst == self.analyst]


def _synopsis_bounds(synopsis: Synopsis) -> str:
    bounds = synopsis.params.get("contribution_bounds")
    if not bounds:
        return "per the policy's contribution bounds"
    return (
        f"at most {bounds['max_rows_per_group']} per person per key, in at most "
        f"{bounds['max_groups_per_unit']} keys per person, at most "
        f"{bounds['max_rows_per_unit']} per person in all"
    )


def _summary_and_text(
    plan: QueryPlan, shape: QueryShape, accuracy: float | None
) -> tuple[dict[str, Any], str]:
    """The plan as shown (``dpsql.engine.query.summary``) and as its charge records it."""
    shown = summary(plan, shape, accuracy)
    return shown, plan_text(shown)


def _shown_errors(plan: QueryPlan) -> dict[str, float | None]:
    """Expected errors by the names the analyst sees: a post-processed query's columns that copy
    a released aggregate keep its error; computed columns have none (their error is derived)."""
    errors = output_errors(plan)
    post = plan.shape.post
    if post is None:
        return errors
    return {
        name: errors.get(post.copies[name]) if name in post.copies else None
        for name in post.columns
        if name in post.copies or name in post.exact or name in post.derived
    }


def budget_report(ledger: Ledger, analyst: str | None = None) -> BudgetReport:
    """Budget lines of ``ledger`` as a result model."""
    return BudgetReport(
        lines=[
            BudgetStatus(
                scope=line.scope,
                name=line.name,
                epsilon_cap=line.cap.epsilon,
                delta_cap=line.cap.delta,
                epsilon_spent=line.spent.epsilon,
                delta_spent=line.spent.delta,
                epsilon_remaining=line.remaining.epsilon,
                delta_remaining=line.remaining.delta,
                rule=line.rule,
                period=line.period,
            )
            for line in ledger.budget(analyst)
        ]
    )


def _open_ledger(database: str | Path) -> Ledger:
    path = ledger_path(database)
    if not path.exists():
        raise PolicyError(f"no privacy policy is set for {str(database)!r}")
    ledger = Ledger(path, dataset=Path(database).stem)
    document = ledger.policy()
    if document is not None:
        ledger.dataset = _dataset_name(database, Policy.model_validate(document))
    return ledger


def database_budget(database: str | Path, analyst: str | None = None) -> BudgetReport:
    """Budget of a database's dataset and analysts (or one analyst), without a session."""
    ledger = _open_ledger(database)
    try:
        return budget_report(ledger, analyst)
    finally:
        ledger.close()


def database_ledger(database: str | Path, analyst: str | None = None) -> list[dict[str, Any]]:
    """Every ledger entry of a database, oldest first (verified on open); with ``analyst``, only
    that analyst's own entries (what an analyst is shown)."""
    ledger = _open_ledger(database)
    try:
        entries = ledger.entries()
    finally:
        ledger.close()
    return [e.to_dict() for e in entries if analyst is None or e.analyst == analyst]


def database_result(
    database: str | Path, seq: int, analyst: str | None = None, query: str | None = None
) -> QueryResult:
    """The answer stored under ledger entry ``seq`` (of a report: its query ``query``), the
    administrator's view, or with ``analyst`` only if that analyst paid for it; the ledger is
    verified first."""
    _open_ledger(database).close()
    store = ResultStore(ledger_path(database))
    try:
        return store.get(seq, analyst, query)
    finally:
        store.close()


def database_synopses(database: str | Path, analyst: str | None = None) -> list[dict[str, Any]]:
    """Every stored synopsis of a database (parameters only), without a session; with
    ``analyst``, those that analyst may use under the policy's ``share_synopses``."""
    ledger = _open_ledger(database)
    try:
        document = ledger.policy()
    finally:
        ledger.close()
    shared = document is not None and Policy.model_validate(document).dataset.share_synopses
    store = SynopsisStore(ledger_path(database))
    streams = StreamStore(ledger_path(database))
    try:
        owner = None if shared else analyst
        return [s.describe() for s in store.all(owner)] + list_streams(streams, owner)
    finally:
        store.close()
        streams.close()


def connect(
    database: str | Path,
    *,
    analyst: str,
    dialect: str = "duckdb",
    progress: Progress | None = None,
) -> Session:
    """Open a session on a DuckDB database file whose policy has been set.

    ``dialect`` is the SQL dialect the analyst writes in (any sqlglot dialect); noise always comes
    from the secure generator (no caller can choose it); ``progress`` is told the
    stages of each ``execute`` (``dpsql.engine.progress``). Nothing an analyst passes here
    changes what is private: the generator, memory limit and backend are the engine's and the
    policy's.
    """
    return Session(database, analyst=analyst, dialect=dialect, progress=progress)
