"""A session's streams: open one (charged once), route later counts to it, answer, list.

The session owns one :class:`StreamDesk`. Opening charges the stream's whole (ε, δ) before any
data is read, reserving its name among the analyst's own in the same transaction, and builds it
after the charge; answering records a zero-cost ledger entry naming
the stream before anything about the data is computed, and (PMW) commits the stream's new state
under an exclusive lock before the answer is returned. See :mod:`dpsql.engine.streams`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlglot import exp

from dpsql.accountant.events import PostProcessingEvent
from dpsql.accountant.units import check_budget_value
from dpsql.engine.choices import DEFAULT_EXPECTED_QUERIES, STREAM_MECHANISMS
from dpsql.engine.query import visible_catalog
from dpsql.engine.release import read
from dpsql.engine.results import QueryResult
from dpsql.engine.stream_errors import (
    StatedError,
    opening_errors,
    pmw_interval,
    stated_error,
    warm_tree,
)
from dpsql.engine.stream_sql import (
    alignment_sql,
    cells_selected_sql,
    cells_selected_ticks,
    histogram_sql,
)
from dpsql.engine.streams import (
    KINDS,
    ColumnSpec,
    Stream,
    StreamColumn,
    StreamExhaustedError,
    StreamStore,
    answerable,
    conjuncts,
    dense_histogram,
    fixed_filter,
    open_event,
    split_where,
    stream_columns,
    stream_params,
    stream_shaped,
)
from dpsql.errors import (
    FAILED_AFTER_CHARGE,
    ExecutionError,
    ParameterError,
    UnsupportedQueryError,
)
from dpsql.mechanisms.hierarchical import HierarchicalHistogram, release_hierarchical
from dpsql.mechanisms.pmw import OnlinePMW, PMWState
from dpsql.sql.shape import ColumnKind, QueryShape

if TYPE_CHECKING:
    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.session import Session

__all__ = ["Routed", "StreamDesk", "StreamPlan", "describe_stream", "list_streams"]

_SELECTED_CELLS_KEPT = 2**25
"""Cells of kept selections a session holds at most (then it starts afresh): one byte each."""


@dataclass(frozen=True)
class StreamPlan:
    """Everything about a stream that is fixed before the charge."""

    table: str
    unit: str
    max_rows_per_unit: int
    columns: tuple[Any, ...]
    mechanism: str
    epsilon: float
    delta: float
    params: dict[str, Any]
    name: str | None
    stated: dict[str, Any] = field(default_factory=dict)
    """What the stream will state (``stream_errors.opening_errors``) and warnings about it."""

    @property
    def fixed(self) -> tuple[str, ...]:
        return tuple(self.params.get("filter", ()))

    @property
    def query(self) -> str:
        shown = ", ".join(c.shown() for c in self.columns)
        where = f" WHERE {' AND '.join(self.fixed)}" if self.fixed else ""
        return f"STREAM OPEN {self.mechanism} ON {self.table}({shown}){where}"


class StreamDesk:
    """The streams of one session (see module docstring)."""

    def __init__(self, session: Session, store: StreamStore):
        self._session = session
        self._store = store
        self._histograms: dict[tuple[str, str], np.ndarray] = {}
        self._trees: dict[tuple[str, str], HierarchicalHistogram | None] = {}
        self._pmw: dict[tuple[str, str], OnlinePMW] = {}
        self._reserved: dict[int, str] = {}
        """The name each charge of this session reserved (by ledger entry)."""
        self._selections: dict[tuple[tuple[StreamColumn, ...], str], np.ndarray] = {}
        """Cells each (stream columns, bound predicate) selects, as DuckDB decided them
        (``_selected``)."""
        self._selected_cells = 0
        """The cells of ``_selections``, together."""

    def close(self) -> None:
        self._store.close()

    # --- opening ----------------------------------------------------------------------------------
    def plan(
        self,
        table: str,
        columns: list[ColumnSpec],
        *,
        mechanism: str,
        epsilon: float,
        delta: float,
        updates: int | None,
        threshold: float | None,
        expected_queries: int,
        name: str | None,
        filter: str | None = None,
        fixed: tuple[str, ...] | None = None,
        warm_share: float | None = None,
    ) -> StreamPlan:
        """Check and price a stream from the policy alone (reads no data). Its fixed filter is
        ``filter`` (the text of a WHERE condition, bound like a query's) or ``fixed`` (already
        canonical conjuncts, from a query's WHERE)."""
        session = self._session
        session.refresh_policy()
        catalog = visible_catalog(session.backend, session.policy)
        found = next((t for t in catalog if t.lower() == table.lower()), None)
        policy = session.policy.table(table)
        if found is None or policy is None:
            raise ParameterError(f"unknown table {table!r}")
        declared = {
            column: policy.column(column).bounds
            for column in catalog[found]
            if policy.column(column).bounds is not None
        }
        chosen = stream_columns(
            columns, catalog[found], declared, session.binder, policy.privacy_unit
        )
        if filter is not None:
            fixed = self._fixed_filter(found, filter, chosen)
        epsilon = check_budget_value("epsilon", epsilon, allow_zero=False)
        delta = check_budget_value("delta", delta, allow_zero=True)
        params = stream_params(
            mechanism,
            chosen,
            epsilon=epsilon,
            delta=delta,
            sensitivity=policy.max_rows_per_unit,
            updates=updates,
            threshold=threshold,
            expected_queries=expected_queries,
            warm_share=warm_share,
        )
        if fixed:
            params["filter"] = list(fixed)
        params["salt"] = int(session.rng.integers(0, 2**62))
        named = isinstance(name, str) and name.isidentifier() and len(name) <= 64
        if name is not None and not named:
            raise ParameterError(f"a stream name is an identifier of <= 64 characters: {name!r}")
        # Names are per analyst: only this analyst's own are looked at, here and when the charge
        # reserves the name (``StreamStore.reserve``), so nothing about names fails after it.
        if name is not None and self._store.exists(session.analyst, name):
            raise ParameterError(f"a stream named {name!r} exists already")
        confidence = session.policy.dataset.confidence
        stated = opening_errors(
            mechanism,
            int(np.prod([c.cells for c in chosen])),
            epsilon,
            delta,
            params,
            expected_queries,
            confidence,
        )
        stated["warnings"] = _too_wide(stated, policy.expected_rows, "the table's expected_rows")
        return StreamPlan(
            found,
            policy.privacy_unit,
            policy.max_rows_per_unit,
            chosen,
            mechanism,
            epsilon,
            delta,
            params,
            name,
            stated,
        )

    def plan_for_query(
        self, shape: QueryShape, mechanism: str, epsilon: float | None, delta: float | None
    ) -> StreamPlan:
        """``OPTIONS(mechanism='pmw'|'range_tree')`` on a COUNT(*) that no stream answers: a
        stream over the WHERE's columns (bin width 1) at the query's (ε, δ)."""
        options = shape.options
        dataset = self._session.policy.dataset
        if epsilon is None:
            epsilon = options.get("epsilon", dataset.default_query_epsilon)
        if epsilon is None:
            raise ParameterError(
                f"mechanism {mechanism!r} opens a stream: give its epsilon (epsilon=..., "
                "OPTIONS(epsilon=...)) or set dataset.default_query_epsilon"
            )
        if delta is None:
            delta = options.get("delta", dataset.default_query_delta)
        streamable = self._streamable(shape.table)
        streamed = {
            c.name
            for conjunct in conjuncts(shape.where)
            if all(c.name in streamable for c in conjunct.find_all(exp.Column))
            for c in conjunct.find_all(exp.Column)
        }
        columns = sorted(streamed)
        placeholders = tuple(StreamColumn(c, "", 0, 1, 1) for c in columns)
        _, fixed = split_where(shape.where, set(columns))
        probe = Stream(
            "", "", shape.table, placeholders, mechanism, 0, 0, 0, {"filter": fixed}, b"", "{}", 0
        )
        if not columns or not answerable(shape, probe):
            raise UnsupportedQueryError(
                f"mechanism {mechanism!r} opens a stream from an ungrouped SELECT COUNT(*) with a "
                "WHERE on columns with declared bounds (integer or DECIMAL; the other conditions, "
                "ANDed, become its fixed filter); use `dpsql stream open` for other shapes"
            )
        return self.plan(
            shape.table,
            [(c, 1) for c in columns],
            mechanism=mechanism,
            epsilon=epsilon,
            delta=delta,
            updates=None,
            threshold=None,
            expected_queries=DEFAULT_EXPECTED_QUERIES,
            name=None,
            fixed=fixed,
        )

    def _streamable(self, table: str) -> set[str]:
        """Columns a query may open a width-1 stream over: bounds in the policy, a stream kind,
        not the privacy unit."""
        policy = self._session.policy.table(table)
        types = visible_catalog(self._session.backend, self._session.policy).get(table, {})
        if policy is None:
            return set()
        return {
            name
            for name, type_name in types.items()
            if policy.column(name).bounds is not None
            and ColumnKind.of(type_name) in KINDS
            and name.lower() != policy.privacy_unit.lower()
        }

    def _fixed_filter(
        self, table: str, text: str, columns: tuple[StreamColumn, ...]
    ) -> tuple[str, ...]:
        """A fixed filter given as the text of a WHERE condition, bound by the database exactly
        as a query's WHERE is (literals converted, collations and unit filters checked)."""
        if not isinstance(text, str) or not text.strip():
            raise ParameterError("a stream's filter is the text of a WHERE condition")
        source = exp.to_identifier(table, quoted=True).sql(dialect="duckdb")
        bound = self._session.bind(f"SELECT COUNT(*) FROM {source} WHERE {text}", "duckdb").bound
        shape = bound.shape
        probe = Stream("", "", table, columns, "", 0, 0, 0, {}, b"", "{}", 0)
        stream_part, fixed = split_where(shape.where, {c.name for c in columns})
        if shape.post is not None or shape.options or stream_part is not None or not fixed:
            raise ParameterError(
                f"a stream's filter is one WHERE condition on other columns than the stream's "
                f"({', '.join(c.name for c in columns)}), got {text!r}"
            )
        if not answerable(shape, replace(probe, params={"filter": fixed})):
            raise ParameterError(f"a stream's filter is one WHERE condition, got {text!r}")
        return fixed

    def explain_opening(self, plan: StreamPlan, normalized: str) -> dict[str, Any]:
        return {
            "query": normalized,
            "plan": {
                "mechanism": "stream",
                "opens": {
                    "mechanism": plan.mechanism,
                    "table": plan.table,
                    "columns": [c.to_dict() for c in plan.columns],
                    "params": {k: v for k, v in plan.params.items() if k != "salt"},
                    "stated_error": plan.stated,
                },
                "why": "OPTIONS(mechanism=...) asks for a stream and none answers this query: "
                "one is opened (charged once) and answers this and later queries",
            },
            "cost": {"epsilon": plan.epsilon, "delta": plan.delta},
            "draws_on": [],
        }

    def charge(self, plan: StreamPlan) -> LedgerEntry:
        """Charge the stream's whole cost and, in the same transaction, reserve its name for
        this analyst (a chosen name taken since ``plan`` refuses the charge; an automatic one
        takes a free suffix), so building it cannot fail on its name."""
        session = self._session
        event = open_event(plan.mechanism, plan.epsilon, plan.delta, plan.columns, plan.params)

        def reserve(connection: sqlite3.Connection, entry: LedgerEntry) -> None:
            stream = self._stream(plan, entry, plan.name or _automatic_name(plan, entry), b"", "{}")
            self._reserved[entry.seq] = StreamStore.reserve(
                connection, stream, automatic=plan.name is None
            )

        return session.ledger_store.charge(
            analyst=session.analyst,
            event=event,
            query=plan.query,
            plan={"columns": [c.to_dict() for c in plan.columns], **plan.params},
            mechanism=f"stream:{plan.mechanism}",
            within=reserve,
            policy_entry=session.policy_entry,
        )

    def _stream(
        self, plan: StreamPlan, entry: LedgerEntry, name: str, data: bytes, state: str
    ) -> Stream:
        return Stream(
            name,
            entry.time,
            plan.table,
            plan.columns,
            plan.mechanism,
            plan.epsilon,
            plan.delta,
            entry.seq,
            plan.params,
            data,
            state,
            0,
            self._session.analyst,
        )

    def build(self, plan: StreamPlan, entry: LedgerEntry) -> dict[str, Any]:
        """Read the bounded histogram and release the structure under the name the charge
        reserved (after the charge); a failure gives the name up again."""
        name = self._reserved.pop(entry.seq)
        reserved = self._stream(plan, entry, name, b"", "{}")
        try:
            return self._build(plan, entry, reserved)
        except BaseException:
            self._store.release(reserved)
            raise

    def _build(self, plan: StreamPlan, entry: LedgerEntry, reserved: Stream) -> dict[str, Any]:
        histogram = self._read_histogram(
            plan.table,
            plan.unit,
            plan.max_rows_per_unit,
            plan.columns,
            plan.params["salt"],
            plan.fixed,
        )
        params = plan.params
        rng = self._session.rng
        if plan.mechanism == "range_tree":
            tree = release_hierarchical(
                histogram,
                epsilon=plan.epsilon,
                sensitivity=params["sensitivity"],
                branching=params["branching"],
                rng=rng,
            )
            data, state = tree.to_bytes(), "{}"
            total = tree.estimate(0, tree.cells)
        else:
            pmw = self._new_pmw(histogram, plan.epsilon, plan.delta, params)
            data, state = pmw.state().arrays(), pmw.state().header()
            total = float(pmw.n_hat)
        stream = replace(reserved, data=data, state=state)
        self._store.save(stream)
        self._histograms[stream.key] = histogram
        stated = dict(plan.stated)
        # The released total (n̂, or the tree's whole-domain estimate): post-processing.
        stated["warnings"] = [
            *plan.stated.get("warnings", []),
            *_too_wide(stated, total, "the stream's released total"),
        ]
        return {**self._describe(stream), "stated_error": stated}

    def _read_histogram(
        self,
        table: str,
        unit: str,
        rows: int,
        columns: tuple[Any, ...],
        salt: int,
        fixed: tuple[str, ...],
    ) -> np.ndarray:
        cells = int(np.prod([c.cells for c in columns]))
        sql = histogram_sql(table, unit, rows, columns, salt, fixed)
        frame = read(self._session.release_context(), sql, "reading the stream's histogram")
        return dense_histogram(frame, cells)

    def _new_pmw(
        self,
        histogram: np.ndarray,
        epsilon: float,
        delta: float,
        params: dict[str, Any],
        state: PMWState | None = None,
    ) -> OnlinePMW:
        return OnlinePMW(
            histogram,
            epsilon=epsilon,
            delta=delta,
            updates=params["updates"],
            threshold=params["threshold"],
            sensitivity=params["sensitivity"],
            count_share=params["count_share"],
            value_share=params["value_share"],
            warm_share=params.get("warm_share", 0.0),
            replays=params["replays"],
            rng=self._session.rng,
            state=state,
        )

    # --- routing and answering --------------------------------------------------------------------
    @staticmethod
    def requested(shape: QueryShape, mechanism: str | None) -> str | None:
        """The stream mechanism the query asks for (argument or OPTIONS), if any."""
        chosen = mechanism or shape.options.get("mechanism")
        return chosen if chosen in STREAM_MECHANISMS else None

    def route(self, shape: QueryShape, mechanism: str | None) -> Routed | None:
        """The stream this analyst may use that states the smallest error for ``shape`` (of
        the mechanism the query asks for, if it names one; ties: the newest), or None (fresh
        noise). Stated errors are public (``dpsql.engine.stream_errors``): no data is read."""
        if (mechanism or shape.options.get("mechanism")) == "laplace" or not stream_shaped(shape):
            return None  # no stream is read for a query no stream answers
        wanted = self.requested(shape, mechanism)
        candidates = [
            s
            for s in self._store.for_table(shape.table, self._session.synopsis_owner())
            if answerable(shape, s) and wanted in (None, s.mechanism)
        ]
        live = [s for s in candidates if s.mechanism == "range_tree" or _updates_left(s) > 0]
        if candidates and not live:
            raise StreamExhaustedError(
                f"stream {candidates[0].name!r} spent its {candidates[0].params['updates']} "
                "updates and answers no further queries; open a new stream or ask with "
                "mechanism='laplace' for a freshly charged answer"
            )
        confidence = self._session.policy.dataset.confidence
        options: list[tuple[Stream, np.ndarray, StatedError]] = []
        refused: UnsupportedQueryError | None = None
        for stream in live:
            try:
                selected = self._selected(shape, stream)
            except UnsupportedQueryError as error:  # splits a cell of this stream
                refused = refused or error
                continue
            stated = stated_error(stream, selected, confidence, self._tree_of(stream))
            options.append((stream, selected, stated))
        if not options:
            if refused is not None:
                raise refused
            return None
        best = min(options, key=lambda option: option[2].half_width)  # stable: the newest
        stream, selected, stated = best
        errors = {s.name: e.half_width for s, _, e in options}
        why = (
            f"stream {stream.name!r} states the smallest error for this query: "
            f"±{stated.half_width:.6g} ({stated.source})"
            + (
                "; the others state "
                + ", ".join(f"{n} ±{e:.6g}" for n, e in errors.items() if n != stream.name)
                if len(errors) > 1
                else ""
            )
        )
        return Routed(stream, selected, stated, errors, why)

    def _tree_of(self, stream: Stream) -> HierarchicalHistogram | None:
        """The stream's released tree (the range tree, or a PMW's warm start), kept per
        session."""
        if stream.key not in self._trees:
            self._trees[stream.key] = (
                HierarchicalHistogram.from_bytes(stream.data)
                if stream.mechanism == "range_tree"
                else warm_tree(stream)
            )
        return self._trees[stream.key]

    def explain(self, routed: Routed, normalized: str) -> dict[str, Any]:
        stream = routed.stream
        return {
            "query": normalized,
            "plan": {
                "mechanism": "stream",
                "stream": self._describe(stream),
                "stated_error": routed.stated.half_width,
                "why": f"a COUNT(*) whose WHERE uses only the columns of stream {stream.name!r}"
                f" is answered from it as post-processing (no budget); {routed.why}",
            },
            "cost": {"epsilon": 0.0, "delta": 0.0},
            "draws_on": [],
        }

    def _selected(self, shape: QueryShape, stream: Stream) -> np.ndarray:
        """The cells the WHERE selects: for plain comparisons of integer ticks with bound
        literals, computed without a round trip (``cells_selected_ticks`` says why that is the
        same), else decided by DuckDB over the cells' values (no data). A selection depends on
        the stream's declared columns and the bound predicate only, so DuckDB's is kept per
        (columns, predicate) for the session; no data, answer or state of a stream enters it.
        ``stream`` answers ``shape`` (``answerable``): without a fixed filter, every conjunct of
        the WHERE is on its columns, and the WHERE is read as it is."""
        if fixed_filter(stream):
            where, _ = split_where(shape.where, {c.name for c in stream.columns})
        else:
            where = shape.where
        if where is None:
            return np.ones(stream.cells, dtype=bool)
        selected = cells_selected_ticks(where, stream.columns)
        if selected is not None:
            selected.flags.writeable = False
            return selected
        key = (stream.columns, where.sql(dialect="duckdb"))
        selected = self._selections.get(key)
        if selected is None:
            selected = self._selected_by_database(where, stream)
            selected.flags.writeable = False
            if self._selected_cells > _SELECTED_CELLS_KEPT:
                self._selections.clear()
                self._selected_cells = 0
            self._selections[key] = selected
            self._selected_cells += selected.size
        return selected

    def _selected_by_database(self, where: exp.Expression, stream: Stream) -> np.ndarray:
        for column in stream.columns:
            check = alignment_sql(where, column)
            if check is not None and not bool(self._session.backend.run(check).iloc[0, 0]):
                raise UnsupportedQueryError(
                    f"the WHERE splits a cell of {column.name!r} (cells of width {column.width} "
                    f"from {column.low}); use bounds on cell edges to be answered by stream "
                    f"{stream.name!r}, or mechanism='laplace'"
                )
        frame = self._session.backend.run(cells_selected_sql(where, stream.columns))
        selected = np.zeros(stream.cells, dtype=bool)
        selected[frame["cell"].to_numpy(dtype=np.int64)] = True
        return selected

    def answer(self, routed: Routed, shape: QueryShape, normalized: str) -> QueryResult:
        """Answer from the routed stream: zero-cost ledger entry first, then the (PMW:
        committed) answer; a count's value and interval are clamped at 0 (``clamped``)."""
        stream, selected = routed.stream, routed.selected
        entry = self._session.charge(
            PostProcessingEvent(f"stream:{stream.name}", "COUNT(*)"),
            query=normalized,
            plan={"stream": stream.name, "owner": stream.analyst},
            mechanism="stream",
        )
        confidence = self._session.policy.dataset.confidence
        if stream.mechanism == "range_tree":
            tree = self._tree_of(stream)
            assert tree is not None
            found = tree.answer_cells(selected, confidence)
            value, interval = found.value, (found.lower, found.upper)
            details: dict[str, Any] = {
                "stream": stream.name,
                "guarantee": "the interval covers the bounded count with the stated confidence "
                "(Chernoff bound on the consistent tree's exact discrete Laplace noise)",
            }
            scale = float(tree.scale)
        else:
            value, interval, details, scale = _one_message(
                lambda: self._ask(stream, selected, confidence)
            )
        (name,) = shape.column_names
        details["routing"] = {
            "answered_by": stream.name,
            "why": routed.why,
            "stated_errors": routed.errors,
        }
        return QueryResult(
            columns=[name],
            rows=[(value,)],
            intervals={name: [interval]},
            noise_scale={name: scale},
            confidence=confidence,
            details=details,
            measures={
                name: f"rows inside stream {stream.name!r}'s domain"
                + (f" where {' AND '.join(fixed_filter(stream))}" if fixed_filter(stream) else "")
                + f", at most {stream.params['sensitivity']} per person"
            },
            epsilon=0.0,
            delta=0.0,
            mechanism=f"stream:{stream.name}",
            analyst=self._session.analyst,
            ledger_entry=entry.seq,
        ).with_noise_laws({}, {name: (0, None)}).clamped()

    def _histogram_for(self, stream: Stream) -> np.ndarray:
        """The stream's bounded histogram: read once per session (a PMW stream opened in an
        earlier session re-reads it, with its stored salt, so it is the same histogram)."""
        histogram = self._histograms.get(stream.key)
        if histogram is None:
            policy = self._session.policy.table(stream.table)
            assert policy is not None
            histogram = self._read_histogram(
                stream.table,
                policy.privacy_unit,
                int(stream.params["sensitivity"]),
                stream.columns,
                stream.params["salt"],
                fixed_filter(stream),
            )
            self._histograms[stream.key] = histogram
        return histogram

    def _pmw_for(self, stream: Stream, histogram: np.ndarray) -> OnlinePMW:
        pmw = self._pmw.get(stream.key)
        if pmw is None:
            state = PMWState.from_parts(stream.state, stream.data)
            pmw = self._new_pmw(histogram, stream.epsilon, stream.delta, stream.params, state)
            self._pmw[stream.key] = pmw
        return pmw

    def _ask(
        self, stream: Stream, selected: np.ndarray, confidence: float
    ) -> tuple[float, tuple[float, float], dict[str, Any], float]:
        # The data are read here, before ``advance`` takes the ledger file's write lock: a scan
        # inside it would hold every other analyst's charge until it ends. Inside the lock only
        # the stored state is read and rewritten.
        histogram = self._histogram_for(stream)

        def step(current: Stream) -> tuple[str, bytes | None, Any]:
            pmw = self._pmw_for(current, histogram)
            pmw.load_state(PMWState.from_parts(current.state, current.data))
            if pmw.halted:
                raise StreamExhaustedError(
                    f"stream {current.name!r} spent its {pmw.plan.c} updates and answers no "
                    "further queries; open a new stream or ask with mechanism='laplace'"
                )
            answer = pmw.ask(selected)
            state = pmw.state()
            return state.header(), state.arrays() if answer.updated else None, (answer, pmw)

        answer, pmw = self._store.advance(stream.key, step)
        alpha = pmw.alpha(max(pmw.queries_seen, 1), 1.0 - confidence)
        value = answer.value
        interval, guarantee = pmw_interval(value, selected, confidence, alpha, pmw.warm_tree)
        details = {
            "stream": stream.name,
            "updated": answer.updated,
            "updates_left": answer.updates_left,
            "alpha": alpha,
            "guarantee": guarantee,
        }
        scale = float(pmw.plan.value_scale or 0)
        return value, interval, details, scale

    # --- listing ----------------------------------------------------------------------------------
    def _describe(self, stream: Stream) -> dict[str, Any]:
        return describe_stream(stream)

    def listing(self) -> list[dict[str, Any]]:
        return list_streams(self._store, self._session.synopsis_owner())


@dataclass(frozen=True, eq=False)
class Routed:
    """The stream chosen for a query, the cells it selects there, what it will state, what
    every answering stream would have stated (name -> half-width) and why, in words."""

    stream: Stream
    selected: np.ndarray
    stated: StatedError
    errors: dict[str, float]
    why: str


def _too_wide(stated: dict[str, Any], total: float | None, what: str) -> list[str]:
    """A warning when the error a stream will state is at least ``total`` (the answers'
    plausible range: a public guess or the released total), else none."""
    error = stated.get("stated", 0.0)
    if total is None or not error >= max(total, 1.0):
        return []
    return [
        f"this stream will state errors of about ±{error:.4g} (see stated_error), as wide as "
        f"{what} (about {total:.4g} rows): its answers will say little; give it more epsilon, "
        "fewer cells or, for ranges over one column, open a range_tree"
    ]


def _automatic_name(plan: StreamPlan, entry: LedgerEntry) -> str:
    """A stream's name when none is given: its table, columns, mechanism and ledger entry."""
    return f"{plan.table}_{'_'.join(c.name for c in plan.columns)}_{plan.mechanism}_{entry.seq}"


def _one_message(work: Callable[[], Any]) -> Any:
    """``work()``; an exhausted stream says so, any other failure (it may depend on the rows the
    stream reads) is the one data-independent ``ExecutionError``, without an exception chain."""
    outcome: Any = None
    try:
        outcome = work()
    except StreamExhaustedError:
        raise
    except Exception:
        outcome = None
    if outcome is None:
        raise ExecutionError(FAILED_AFTER_CHARGE)
    return outcome


def _updates_left(stream: Stream) -> int:
    """Public: how many updates (⊤ answers, which are released) remain."""
    return int(stream.params["updates"]) - int(json.loads(stream.state)["sparse"][1])


def describe_stream(stream: Stream) -> dict[str, Any]:
    """A stream's public description, in the columns ``dpsql synopses`` prints."""
    described = stream.describe(_updates_left(stream) if stream.mechanism == "pmw" else None)
    described.update(
        key_column=", ".join(c.name for c in stream.columns),
        filters=list(fixed_filter(stream)),
        bytes=len(stream.data),
    )
    return described


def list_streams(store: StreamStore, owner: str | None) -> list[dict[str, Any]]:
    """The streams ``owner`` may use (every stream when None), described."""
    return [describe_stream(s) for s in store.all(owner)]
