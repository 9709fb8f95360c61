"""Sessions: the one path from an analyst's SQL to a charged, noised answer.

``execute`` parses and checks the SQL, plans and prices it from the policy, charges the ledger
atomically, and only then runs the generated SQL and adds noise. Anything that fails before the
charge charges nothing; once charged, the charge stands even if the answer is lost.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpsql.accountant.events import Event, PostProcessingEvent, total
from dpsql.accountant.ledger import Ledger, LedgerEntry
from dpsql.accountant.limits import Limits
from dpsql.accountant.units import Cost, check_budget_value
from dpsql.engine.backends import Backend, DuckDBBackend
from dpsql.engine.planner import (
    AUTO_BOUND_EXPONENTS,
    MECHANISM,
    QueryPlan,
    key_literal,
    plan_query,
)
from dpsql.engine.policy import Policy, load_policy, parse_policy
from dpsql.engine.results import BudgetReport, BudgetStatus, QueryResult
from dpsql.engine.synopses import (
    PointQuery,
    Synopsis,
    SynopsisStore,
    conjuncts,
    point_queries,
)
from dpsql.engine.synopses import now as synopsis_time
from dpsql.errors import ParameterError, PolicyError
from dpsql.mechanisms import combined, svt, threshold
from dpsql.mechanisms.combined import CombinedRelease
from dpsql.mechanisms.laplace import interval_half_width, release_counts, release_grid_sums
from dpsql.mechanisms.random import resolve_rng
from dpsql.sql.analyze import analyze
from dpsql.sql.generate import (
    MeasureKind,
    bounded_aggregate,
    clipping_profile,
    public_groups,
    range_counts,
)
from dpsql.sql.parse import parse
from dpsql.sql.shape import AggregateKind, ColumnKind, GroupKey, QueryShape

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


ALP_ROWS_PER_KEY = 10
"""Sketch rows per expected key: collision probability about 0.1 (the paper's Fig. 3 setting)."""


def ledger_path(database: str | Path) -> Path:
    """Where the ledger of ``database`` lives: beside it, named ``<database>.dpsql.sqlite``."""
    return Path(f"{database}.dpsql.sqlite")


def _dataset_name(database: str | Path, policy: Policy | None) -> str:
    if policy is not None and policy.dataset.name:
        return policy.dataset.name
    return Path(database).stem


def _limits(policy: Policy) -> Limits:
    advanced = policy.dataset.advanced_delta if policy.dataset.composition == "advanced" else None
    return Limits(
        Cost.cap(policy.dataset.epsilon, policy.dataset.delta),
        {name: Cost.cap(a.epsilon, a.delta) for name, a in policy.analysts.items()},
        advanced,
    )


def _check_against_schema(policy: Policy, catalog: dict[str, dict[str, str]]) -> None:
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
            for key in rules.public_keys or ():
                key_literal(key, kind, f"{table_name}.{name}")
            if rules.bounds is not None and not kind.numeric:
                raise PolicyError(
                    f"bounds on {table_name}.{name} need a numeric column, it is {columns[name]}"
                )


def set_policy(database: str | Path, policy: Policy | str | Path) -> LedgerEntry:
    """Validate ``policy`` (a model, TOML text or a path) against the database and record it."""
    if isinstance(policy, Path) or (isinstance(policy, str) and Path(policy).suffix == ".toml"):
        policy = load_policy(policy)
    elif isinstance(policy, str):
        policy = parse_policy(policy)
    backend = DuckDBBackend(database)
    try:
        _check_against_schema(policy, backend.catalog())
    finally:
        backend.close()
    ledger = Ledger(ledger_path(database), dataset=_dataset_name(database, policy))
    try:
        return ledger.set_policy(policy.model_dump(mode="json"), _limits(policy))
    finally:
        ledger.close()


def show_policy(database: str | Path) -> Policy:
    """The policy in force for ``database``."""
    path = ledger_path(database)
    if not path.exists():
        raise PolicyError(f"no privacy policy is set for {str(database)!r}")
    ledger = Ledger(path, dataset=Path(database).stem)
    try:
        document = ledger.policy()
    finally:
        ledger.close()
    if document is None:
        raise PolicyError(f"no privacy policy is set for {str(database)!r}")
    return Policy.model_validate(document)


class Session:
    """An analyst's connection to one database and its ledger."""

    def __init__(
        self,
        database: str | Path,
        *,
        analyst: str,
        dialect: str = "duckdb",
        backend: Backend | None = None,
        rng: np.random.Generator | None = None,
    ):
        if not isinstance(analyst, str) or not analyst:
            raise ParameterError(f"analyst must be a non-empty name, got {analyst!r}")
        self.database = Path(database)
        self.analyst = analyst
        self.dialect = dialect
        self.backend = backend if backend is not None else DuckDBBackend(database)
        self.rng = resolve_rng(rng)
        self._ledger = Ledger(ledger_path(database), dataset=self.database.stem)
        self.policy = self._load_policy()
        self._ledger.dataset = _dataset_name(database, self.policy)
        if analyst not in self.policy.analysts:
            raise PolicyError(f"analyst {analyst!r} has no allocation in the policy")

    def _load_policy(self) -> Policy:
        document = self._ledger.policy()
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
        self._ledger.close()

    # planning -----------------------------------------------------------------------------------
    def _shape(self, sql: str) -> tuple[QueryShape, str]:
        parsed = parse(sql, self.dialect)
        shape = analyze(parsed, self.backend.catalog())
        self.policy = self._load_policy()
        return shape, parsed.expression.sql(dialect=self.backend.dialect)

    def _plan(
        self,
        sql: str,
        epsilon: float | None,
        delta: float | None,
        mechanism: str | None = None,
        shaped: tuple[QueryShape, str] | None = None,
        max_answers: int | None = None,
    ) -> tuple[QueryPlan, str]:
        shape, normalized = shaped if shaped is not None else self._shape(sql)
        options = shape.options
        for name, given in (("epsilon", epsilon), ("delta", delta)):
            if given is not None and name in options and options[name] != given:
                raise ParameterError(
                    f"{name} is given both in OPTIONS ({options[name]}) and as "
                    f"an argument ({given}); give it once"
                )
        epsilon = (
            epsilon
            if epsilon is not None
            else options.get("epsilon", self.policy.dataset.default_query_epsilon)
        )
        if epsilon is None:
            raise ParameterError(
                "no epsilon given: pass epsilon=..., use "
                "WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=...), or set "
                "dataset.default_query_epsilon in the policy"
            )
        delta = (
            delta
            if delta is not None
            else options.get("delta", self.policy.dataset.default_query_delta)
        )
        epsilon = check_budget_value("epsilon", epsilon, allow_zero=False)
        delta = check_budget_value("delta", delta, allow_zero=True)
        plan = plan_query(
            shape,
            self.policy,
            epsilon=epsilon,
            delta=delta,
            mechanism=mechanism,
            max_answers=max_answers,
        )
        return plan, normalized

    def explain(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
        max_answers: int | None = None,
    ) -> dict[str, Any]:
        """Plan, mechanism, sensitivities and cost of ``sql``, without reading data or charging."""
        shaped = self._shape(sql)
        synopsis = self._synopsis_for(shaped[0], mechanism)
        if synopsis is not None:
            return {
                "query": shaped[1],
                "plan": {"mechanism": "synopsis", "synopsis": synopsis[0].describe()},
                "cost": {"epsilon": 0.0, "delta": 0.0},
                "draws_on": [],
            }
        plan, normalized = self._plan(sql, epsilon, delta, mechanism, shaped, max_answers)
        cost = total(plan.event)
        status = self.budget()
        return {
            "query": normalized,
            "plan": plan.summary(),
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
    ) -> QueryResult:
        """Answer ``sql`` with differential privacy, charging the analyst's budget first.

        ``mechanism`` ("laplace", "threshold", "alp") chooses how keys of a GROUP BY column without
        public keys are released. A point count that a stored synopsis covers is answered from it,
        for free, unless ``mechanism="laplace"`` asks for fresh noise.
        """
        shaped = self._shape(sql)
        synopsis = self._synopsis_for(shaped[0], mechanism)
        if synopsis is not None:
            return self._from_synopsis(synopsis, shaped)
        plan, normalized = self._plan(sql, epsilon, delta, mechanism, shaped, max_answers)
        entry = self._ledger.charge(
            analyst=self.analyst,
            event=plan.event,
            query=normalized,
            plan=plan.summary(),
            mechanism=plan.mechanism,
            partition=plan.partition,
        )
        if plan.range_queries is not None:
            return self._release_ranges(plan, entry)
        details: dict[str, Any] = {}
        if plan.auto_bounds is not None:
            plan, details = self._with_automatic_bounds(plan)
        salt = int(self.rng.integers(0, 2**62))
        generated = bounded_aggregate(
            plan.shape,
            measures=[m.measure for m in plan.measurements],
            bounds=plan.bounds,
            public_keys=plan.key_literals,
            salt=salt,
            dialect=self.backend.dialect,
        )
        frame = self.backend.run(generated)
        if plan.key_release is not None:
            return self._release_keys(plan, frame, entry)
        result = self._release(plan, frame, entry)
        return result.model_copy(update={"details": details}) if details else result

    def _with_automatic_bounds(self, plan: QueryPlan) -> tuple[QueryPlan, dict[str, Any]]:
        """Spend the automatic-bounds share on AboveThreshold, then re-plan with the bound.

        The whole query was charged already; the new plan uses the remaining epsilon exactly as
        the charged event split it.
        """
        auto = plan.auto_bounds
        assert auto is not None
        nonnegative = auto.mode == "nonnegative"
        profile = self.backend.run(
            clipping_profile(
                plan.shape,
                column=auto.column,
                unit=plan.bounds.unit,
                max_rows_per_unit=plan.bounds.max_rows_per_unit,
                exponents=AUTO_BOUND_EXPONENTS,
                nonnegative=nonnegative,
                dialect=self.backend.dialect,
            )
        )
        answers = -profile.iloc[0].to_numpy(dtype=np.float64)
        found = svt.above_threshold_release(
            answers,
            threshold=0.0,
            epsilon=auto.epsilon,
            sensitivity=plan.bounds.max_rows_per_unit,
            monotone=True,
            rng=self.rng,
        )
        exponent = AUTO_BOUND_EXPONENTS[found.indices[0] if found.indices else -1]
        bound = 2.0**exponent
        chosen = (0.0, bound) if nonnegative else (-bound, bound)
        table = plan.table
        rules = table.column(auto.column).model_copy(update={"bounds": chosen})
        table = table.model_copy(update={"columns": {**table.columns, auto.column: rules}})
        name = next(k for k in self.policy.tables if k.lower() == plan.shape.table.lower())
        policy = self.policy.model_copy(update={"tables": {**self.policy.tables, name: table}})
        bounded = plan_query(plan.shape, policy, epsilon=auto.rest, delta=plan.delta)
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

    # sparse histograms and synopses -------------------------------------------------------------
    def _synopses(self) -> SynopsisStore:
        return SynopsisStore(ledger_path(self.database))

    def synopses(self) -> list[dict[str, Any]]:
        """Every stored synopsis of this database (parameters only, never the bytes)."""
        store = self._synopses()
        try:
            return [s.describe() for s in store.all()]
        finally:
            store.close()

    def _synopsis_for(
        self, shape: QueryShape, mechanism: str | None
    ) -> tuple[Synopsis, PointQuery] | None:
        if (mechanism or shape.options.get("mechanism")) == "laplace":
            return None
        readings = point_queries(shape)
        if not readings:
            return None
        store = self._synopses()
        try:
            for query in readings:
                found = store.find(shape.table, query.column, query.filters)
                if found is not None:
                    return found, query
        finally:
            store.close()
        return None

    def _from_synopsis(
        self, found: tuple[Synopsis, PointQuery], shaped: tuple[QueryShape, str]
    ) -> QueryResult:
        synopsis, query = found
        shape, normalized = shaped
        release = CombinedRelease.from_bytes(synopsis.data)
        keys = np.array(query.keys, dtype=object if isinstance(query.keys[0], str) else None)
        values = release.lookup(keys)
        released = release.released(keys)
        event = PostProcessingEvent(f"synopsis:{synopsis.name}", "COUNT(*)")
        entry = self._ledger.charge(
            analyst=self.analyst,
            event=event,
            query=normalized,
            plan={"synopsis": synopsis.name, "keys": list(query.keys)},
            mechanism="synopsis",
        )
        value = float(values.sum())
        interval: tuple[float | None, float | None] = (None, None)
        if len(keys) == 1 and bool(released[0]):
            half = float(release.threshold.half_width)
            interval = (value - half, value + half)
        (name,) = shape.column_names
        return QueryResult(
            columns=[name],
            rows=[(int(value) if value.is_integer() else value,)],
            intervals={name: [interval]},
            noise_scale={name: float(release.threshold.scale)},
            confidence=release.threshold.confidence,
            epsilon=0.0,
            delta=0.0,
            mechanism=f"synopsis:{synopsis.name}",
            analyst=self.analyst,
            ledger_entry=entry.seq,
        )

    def _release_keys(
        self, plan: QueryPlan, frame: pd.DataFrame, entry: LedgerEntry
    ) -> QueryResult:
        """Release the heavy keys of a GROUP BY without public keys (and store a synopsis)."""
        spec = plan.key_release
        assert spec is not None
        column = spec.column
        kind = plan.shape.columns[column]
        keys = frame[column].to_numpy(dtype=object if kind is ColumnKind.STRING else np.int64)
        counts = frame[plan.measurements[0].measure.name].to_numpy(dtype=np.int64)
        common: dict[str, Any] = {
            "epsilon": plan.epsilon,
            "delta": spec.delta,
            "domain": spec.domain,
            "max_groups_per_unit": plan.bounds.max_groups_per_unit,
            "max_rows_per_group": plan.bounds.max_rows_per_group,
            "confidence": plan.confidence,
            "rng": self.rng,
        }
        if spec.mechanism == "threshold":
            released = threshold.release(keys, counts, **common)
        else:
            seed = int(self.rng.integers(0, 2**63))
            structure = combined.release(
                keys, counts, s=ALP_ROWS_PER_KEY * spec.expected_keys, seed=seed, **common
            )
            released = structure.threshold
            filters = conjuncts(plan.shape.where)
            name = f"{plan.shape.table}_{column}_{entry.seq}"
            store = self._synopses()
            try:
                store.save(
                    Synopsis(
                        name=name,
                        created=synopsis_time(),
                        table=plan.shape.table,
                        column=column,
                        filters=filters,
                        epsilon=plan.epsilon,
                        delta=spec.delta,
                        mechanism="combined",
                        ledger_entry=entry.seq,
                        params={"tau": int(released.tau), "seed": seed, "split": structure.split},
                        data=structure.to_bytes(),
                    )
                )
            finally:
                store.close()
        shown = [
            f"0x{int(k):016x}" if released.key_kind == "hash" else _plain(k) for k in released.keys
        ]
        lower, upper = released.lower, released.upper
        names = list(plan.shape.column_names)
        by_output = {plan.shape.outputs[0].name: shown, plan.shape.outputs[1].name: released.values}
        rows = [
            tuple(_plain(v) for v in row)
            for row in zip(*(by_output[n] for n in names), strict=True)
        ]
        count_name = next(o.name for o in plan.shape.outputs if not isinstance(o, GroupKey))
        intervals = {
            count_name: [(_plain(a), _plain(b)) for a, b in zip(lower, upper, strict=True)]
        }
        rows, intervals = _having(plan, names, rows, intervals)
        return QueryResult(
            columns=names,
            rows=rows,
            intervals=intervals,
            noise_scale={count_name: float(released.scale)},
            confidence=plan.confidence,
            epsilon=entry.cost.epsilon,
            delta=entry.cost.delta,
            mechanism=spec.mechanism,
            analyst=self.analyst,
            ledger_entry=entry.seq,
        )

    def _release_ranges(self, plan: QueryPlan, entry: LedgerEntry) -> QueryResult:
        """NumericSparse over the public ranges, in the public table's order."""
        ranges = plan.range_queries
        assert ranges is not None
        shape = plan.shape
        groups = self.backend.run(public_groups(shape, self.backend.dialect))
        counts = self.backend.run(
            range_counts(
                shape,
                unit=plan.bounds.unit,
                max_rows_per_unit=plan.bounds.max_rows_per_unit,
                dialect=self.backend.dialect,
            )
        )
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
            rng=self.rng,
        )
        value_scale = ranges.svt.value_scale
        assert value_scale is not None and released.values is not None
        half = interval_half_width(value_scale, plan.confidence)
        count_name = shape.having.name if shape.having is not None else "COUNT(*)"
        rows = []
        for index, value in zip(released.indices, released.values, strict=True):
            keys = {c: _plain(merged[c].iloc[index]) for c in columns}
            rows.append(
                tuple(
                    keys.get(o.column) if isinstance(o, GroupKey) else int(value)
                    for o in shape.outputs
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
            analyst=self.analyst,
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

    def _aligned(self, plan: QueryPlan, frame: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple]]:
        """True aggregates for every public key combination (absent keys count zero)."""
        group_by = list(plan.shape.group_by)
        names = [m.measure.name for m in plan.measurements]
        if not group_by:
            if frame.empty:
                frame = pd.DataFrame({n: [0] for n in names})
            return frame[names].astype("int64"), [()]
        domains = []
        for column in group_by:
            values = list(plan.key_domain[column])
            if plan.shape.columns[column] in (ColumnKind.DATE, ColumnKind.TIMESTAMP):
                frame[column] = pd.to_datetime(frame[column])
                values = [pd.Timestamp(v) for v in values]
            domains.append(values)
        if len(domains) == 1:
            index = pd.Index(domains[0], name=group_by[0])
        else:
            index = pd.MultiIndex.from_product(domains, names=group_by)
        aligned = frame.set_index(group_by)[names].reindex(index, fill_value=0).astype("int64")
        keys = [
            tuple(_plain(v) for v in (k if isinstance(k, tuple) else (k,))) for k in index.to_list()
        ]
        return aligned, keys

    def _release(self, plan: QueryPlan, frame: pd.DataFrame, entry: LedgerEntry) -> QueryResult:
        aligned, keys = self._aligned(plan, frame)
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
                    rng=self.rng,
                    confidence=confidence,
                )
            else:
                release = release_counts(
                    exact,
                    epsilon=m.epsilon,
                    sensitivity=m.sensitivity_units,
                    rng=self.rng,
                    confidence=confidence,
                )
            noisy[m.label] = release.values
            lower, upper = release.lower, release.upper
            if m.measure.kind is not MeasureKind.SUM:
                lower, upper = lower.astype(np.int64), upper.astype(np.int64)
            intervals[m.label] = (lower, upper)
            scales[m.label] = release.scale
            half_widths_for_ratio[m.label] = (
                interval_half_width(m.scale, (1 + confidence) / 2) * m.grid
            )

        columns: dict[str, list[Any]] = {}
        result_intervals: dict[str, list[tuple[float, float]]] = {}
        result_scales: dict[str, float] = {}
        for output in plan.shape.outputs:
            if isinstance(output, GroupKey):
                index = plan.shape.group_by.index(output.column)
                columns[output.name] = [k[index] for k in keys]
                continue
            if output.kind is AggregateKind.COUNT:
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
            columns[output.name] = [_plain(v) for v in values]
            result_intervals[output.name] = [
                (_plain(a), _plain(b)) for a, b in zip(lower, upper, strict=True)
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
            analyst=self.analyst,
            ledger_entry=entry.seq,
        )

    def charge(
        self, event: Event, *, query: str, plan: dict[str, Any], mechanism: str
    ) -> LedgerEntry:
        """Charge a release made outside ``execute`` (e.g. a published table) to this analyst.

        Check-and-record is atomic; raise ``BudgetExceededError`` and record nothing when a limit
        would be passed. Call it before the release leaves the engine.
        """
        return self._ledger.charge(
            analyst=self.analyst, event=event, query=query, plan=plan, mechanism=mechanism
        )

    # budget and ledger --------------------------------------------------------------------------
    def budget(self) -> BudgetReport:
        """Cap, spent and remaining for the dataset and this analyst."""
        return budget_report(self._ledger, self.analyst)

    def ledger(self) -> list[dict[str, Any]]:
        """Every ledger entry, oldest first."""
        return [entry.to_dict() for entry in self._ledger.entries()]


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


def database_ledger(database: str | Path) -> list[dict[str, Any]]:
    """Every ledger entry of a database, oldest first (verified on open)."""
    ledger = _open_ledger(database)
    try:
        return [entry.to_dict() for entry in ledger.entries()]
    finally:
        ledger.close()


def database_synopses(database: str | Path) -> list[dict[str, Any]]:
    """Every stored synopsis of a database (parameters only), without a session."""
    _open_ledger(database).close()
    store = SynopsisStore(ledger_path(database))
    try:
        return [s.describe() for s in store.all()]
    finally:
        store.close()


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
    (1+c)/2 intervals (union bound), so it covers with probability at least c."""
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
    return values, lower, upper


def _plain(value: Any) -> Any:
    """NumPy and pandas scalars as plain Python values (dates as ISO strings)."""
    if isinstance(value, pd.Timestamp):
        return value.isoformat() if value.time() != dt.time() else value.date().isoformat()
    if isinstance(value, np.generic):
        return value.item()
    return value


def connect(
    database: str | Path,
    *,
    analyst: str,
    dialect: str = "duckdb",
    rng: np.random.Generator | None = None,
) -> Session:
    """Open a session on a DuckDB database file whose policy has been set.

    ``dialect`` is the SQL dialect the analyst writes in (any sqlglot dialect); ``rng`` a seeded
    generator for reproducible tests (default: the secure generator).
    """
    return Session(database, analyst=analyst, dialect=dialect, rng=rng)
