"""Query streams: one charge answers an unbounded stream of count queries over declared columns.

A stream is opened over a table and one or more bounded integer, DATE, TIMESTAMP or DECIMAL
columns, each cut into cells of a declared width in the column's own type (the domain is the
product of the cells), and optionally a fixed filter (a WHERE condition on other columns).
Opening it charges its (ε, δ) once and reads a bounded histogram over the domain of the rows the
fixed filter keeps (every person contributes at most ``max_rows_per_unit`` rows, chosen by a
salted order, so the histogram's L1 sensitivity is ``max_rows_per_unit``). Later ``SELECT
COUNT(*) FROM t WHERE ...`` queries whose WHERE is exactly the fixed filter AND conditions on the
stream's columns (compared as canonical conjuncts of the bound tree: ``split_where``) are
answered from it and recorded in the ledger as zero-cost entries naming the stream:

* ``pmw``: online private multiplicative weights (:mod:`dpsql.mechanisms.pmw`), warm-started from
  a noisy tree by default. Each query is compared with the synthetic answer by the sparse
  vector; at most ``updates`` queries spend an update (a fresh noisy count), then the stream is
  exhausted and says so. The state (synthetic distribution, remaining updates, the SVT's noisy
  threshold, all secret or derived from released values) lives in the ``streams`` table of the
  ledger file; each answer's state change is committed, under an exclusive SQLite lock, before
  the answer is returned.
* ``range_tree``: the hierarchical histogram (:mod:`dpsql.mechanisms.hierarchical`) over one
  column; every answer is post-processing of the stored noisy tree, with an exact interval.

What DuckDB decides: the bounds and widths (converted exactly, counted in ticks: ``KINDS``), the
rows the fixed filter keeps and the histogram (``GROUP BY`` cell, in the database), and which
cells a WHERE selects: the conditions on the stream's columns (with their literals already bound
by the database) are evaluated by DuckDB over the cells' values, never by a Python model of SQL.
A cell wider than one tick must be decided the same way for all its values: on a binned column
only direct comparisons with values (``<, <=, >, >=``, ``BETWEEN``) are answered, each checked by
DuckDB to agree at both ends of every cell. Rows whose value lies outside the declared bounds (or
is NULL) are outside the domain: a stream's counts measure the rows inside it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from sqlglot import exp

from dpsql.accountant.events import MechanismEvent
from dpsql.accountant.stores import LedgerFileStore
from dpsql.engine.choices import STREAM_MECHANISMS
from dpsql.errors import LedgerError, ParameterError, PrivacyError
from dpsql.mechanisms.hierarchical import choose_branching
from dpsql.mechanisms.svt import plan as svt_plan
from dpsql.sql.shape import AggregateKind, ColumnKind, QueryShape

if TYPE_CHECKING:
    pass

__all__ = [
    "MAX_CELLS",
    "STREAM_MECHANISMS",
    "Stream",
    "StreamColumn",
    "StreamExhaustedError",
    "StreamStore",
    "open_event",
    "split_where",
    "stream_columns",
    "stream_shaped",
]

MAX_CELLS = 2**20
"""Largest domain (product of the cells) a stream may declare."""
MAX_PMW_CELLS = 2**16
"""Largest PMW domain: its state (weights, one packed mask per update) is rewritten on updates."""
MAX_UPDATES = 1000

DEFAULT_UPDATES = 50
DEFAULT_WARM_SHARE = 0.8
"""Share of a PMW stream's ε spent on its warm start (``dpsql.mechanisms.pmw``)."""
DEFAULT_REPLAYS = 10

_COLUMNS = (
    "name",
    "created",
    "source_table",
    "columns",
    "mechanism",
    "epsilon",
    "delta",
    "ledger_entry",
    "params",
    "data",
    "state",
    "answered",
    "analyst",
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS {table} (
    name TEXT NOT NULL,
    created TEXT NOT NULL,
    source_table TEXT NOT NULL,
    columns TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    ledger_entry INTEGER NOT NULL,
    params TEXT NOT NULL,
    data BLOB NOT NULL,
    state TEXT NOT NULL,
    answered INTEGER NOT NULL DEFAULT 0,
    analyst TEXT NOT NULL,
    PRIMARY KEY (analyst, name)
)
"""
"""Stream names are per analyst: (analyst, name) is the key, the analyst being the one whose
ledger entry paid for the stream. A row with empty ``data`` is a name reserved by a charge whose
stream is being built; it answers nothing and is listed nowhere."""


class StreamExhaustedError(PrivacyError):
    """A PMW stream spent its updates; it answers no further query."""


KINDS = {
    ColumnKind.INTEGER: "integer",
    ColumnKind.DATE: "date",
    ColumnKind.TIMESTAMP: "timestamp",
    ColumnKind.DECIMAL: "decimal",
}
"""The column kinds a stream takes; each counts its values in integer *ticks*: an integer is
itself, a DATE the days since 1970-01-01, a TIMESTAMP the microseconds since then (DuckDB's
``epoch_us``), a DECIMAL(p, s) its value times 10^s. Every tick is a value of the type, so a cell
(a run of ``width`` ticks) is exactly the set of values whose ticks it holds."""
_TIMESTAMP_TYPES = {"TIMESTAMP", "DATETIME", "TIMESTAMP WITHOUT TIME ZONE"}
_MAX_DECIMAL_PRECISION = 18


@dataclass(frozen=True)
class StreamColumn:
    """A declared domain column: the values with ticks ``low..high`` cut into cells of ``width``
    ticks (``kind`` says what a tick is, see ``KINDS``; ``bounds`` are the bounds as DuckDB
    spells them in the column's type, for the kinds that are not integers)."""

    name: str
    type: str
    low: int
    high: int
    width: int
    kind: str = "integer"
    scale: int = 0
    bounds: tuple[str, str] | None = None

    @property
    def cells(self) -> int:
        return (self.high - self.low) // self.width + 1

    def to_dict(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "low": self.low,
            "high": self.high,
            "width": self.width,
        }
        if self.kind != "integer":
            described.update(kind=self.kind, scale=self.scale, bounds=list(self.bounds or ()))
        return described

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamColumn:
        bounds = data.get("bounds")
        return cls(**{**data, "bounds": tuple(bounds) if bounds else None})

    @property
    def unit(self) -> str:
        """What one tick is, in words."""
        return {
            "integer": "1",
            "date": "1 day",
            "timestamp": "1 microsecond",
            "decimal": f"1e-{self.scale}",
        }[self.kind]

    def shown(self) -> str:
        low, high = self.bounds or (str(self.low), str(self.high))
        width = self.width if self.kind == "integer" else f"{self.width}x{self.unit}"
        return f"{self.name}[{low}..{high}/{width}]"


@dataclass(frozen=True)
class Stream:
    """A stored stream: public parameters, ``data`` (the noisy tree, or the PMW's weights and
    measurements) and ``state`` (JSON: the PMW's n̂ and its SVT state, which is secret)."""

    name: str
    created: str
    table: str
    columns: tuple[StreamColumn, ...]
    mechanism: str
    epsilon: float
    delta: float
    ledger_entry: int
    params: dict[str, Any]
    data: bytes
    state: str
    answered: int
    analyst: str = ""
    """Who paid for it (the analyst of its ledger entry); names are unique per analyst."""

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the stream: (analyst, name)."""
        return self.analyst, self.name

    @property
    def cells(self) -> int:
        return math.prod(c.cells for c in self.columns)

    def describe(self, updates_left: int | None = None) -> dict[str, Any]:
        """Everything public, for listings (never the data or the noisy threshold)."""
        described = {
            "name": self.name,
            "kind": "stream",
            "created": self.created,
            "table": self.table,
            "columns": [c.to_dict() for c in self.columns],
            "cells": self.cells,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mechanism": self.mechanism,
            "ledger_entry": self.ledger_entry,
            "params": self.params,
        }
        if self.mechanism == "pmw":
            described["answered"] = self.answered
        if updates_left is not None:
            described["updates_left"] = updates_left
        return described


def _row(row: tuple[Any, ...]) -> Stream:
    (
        name,
        created,
        table,
        columns,
        mechanism,
        epsilon,
        delta,
        entry,
        params,
        data,
        state,
        answered,
        analyst,
    ) = row
    return Stream(
        name,
        created,
        table,
        tuple(StreamColumn.from_dict(c) for c in json.loads(columns)),
        mechanism,
        epsilon,
        delta,
        entry,
        json.loads(params),
        bytes(data),
        state,
        answered,
        analyst,
    )


_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM streams"
_USABLE = "length(data) > 0 AND (? IS NULL OR analyst = ?)"
"""Built streams (not reserved names) of every analyst (None) or of one."""


class StreamStore(LedgerFileStore):
    """The ``streams`` table of a ledger file."""

    def __init__(self, path: str | Path):
        super().__init__(path, schema=_SCHEMA.format(table="streams"), what="stream store")
        try:
            if "analyst" not in self._columns():
                self._key_by_analyst()
        except sqlite3.DatabaseError as error:
            raise LedgerError(f"stream store {str(path)!r} is unreadable ({error})") from None

    def _columns(self) -> set[str]:
        return {row[1] for row in self._connection.execute("PRAGMA table_info(streams)")}

    def _key_by_analyst(self) -> None:
        """Stores written when stream names were global: rebuild the table once, keyed by
        (analyst, name), each stream's analyst being that of the ledger entry that paid for it
        (every name was unique, so every pair is)."""
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            if "analyst" not in self._columns():
                ledgered = connection.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'"
                ).fetchone()
                payer = (
                    "(SELECT analyst FROM entries WHERE seq = streams.ledger_entry)"
                    if ledgered
                    else "NULL"
                )
                kept = ", ".join(_COLUMNS[:-1])
                connection.execute(_SCHEMA.format(table="streams_by_analyst"))
                connection.execute(
                    f"INSERT INTO streams_by_analyst ({kept}, analyst) "
                    f"SELECT {kept}, coalesce({payer}, '') FROM streams"
                )
                connection.execute("DROP TABLE streams")
                connection.execute("ALTER TABLE streams_by_analyst RENAME TO streams")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._connection.close()

    def exists(self, analyst: str, name: str) -> bool:
        """Whether ``analyst`` has a stream (or a reserved name) called ``name``."""
        return (
            self._connection.execute(
                "SELECT 1 FROM streams WHERE analyst = ? AND name = ?", (analyst, name)
            ).fetchone()
            is not None
        )

    @staticmethod
    def reserve(connection: sqlite3.Connection, stream: Stream, automatic: bool) -> str:
        """Inside the charge's own transaction (``connection`` is the ledger's): store
        ``stream`` without data, reserving its name for its analyst, and return the name. An
        ``automatic`` name that the analyst already holds gets the first free suffix (``_2``,
        ...); a chosen one that is taken raises ``ParameterError``, so the charge is not
        recorded. Only the analyst's own names are looked at."""
        name = stream.name
        taken = "SELECT 1 FROM streams WHERE analyst = ? AND name = ?"
        suffix = 1
        while connection.execute(taken, (stream.analyst, name)).fetchone() is not None:
            if not automatic:
                raise ParameterError(f"a stream named {name!r} exists already")
            suffix += 1
            name = f"{stream.name}_{suffix}"
        StreamStore._insert(connection, replace(stream, name=name, data=b""))
        return name

    @staticmethod
    def _insert(connection: sqlite3.Connection, stream: Stream) -> None:
        connection.execute(
            f"INSERT INTO streams ({', '.join(_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(_COLUMNS))})",
            (
                stream.name,
                stream.created,
                stream.table,
                json.dumps([c.to_dict() for c in stream.columns]),
                stream.mechanism,
                stream.epsilon,
                stream.delta,
                stream.ledger_entry,
                json.dumps(stream.params, sort_keys=True),
                stream.data,
                stream.state,
                0,
                stream.analyst,
            ),
        )

    def save(self, stream: Stream) -> None:
        """Store ``stream``: the data and state of its reserved name (which cannot clash: it is
        already held), or a new row when none was reserved."""
        updated = self._connection.execute(
            "UPDATE streams SET data = ?, state = ? WHERE analyst = ? AND name = ? "
            "AND ledger_entry = ? AND length(data) = 0",
            (stream.data, stream.state, stream.analyst, stream.name, stream.ledger_entry),
        )
        if updated.rowcount == 0:
            self._insert(self._connection, stream)

    def release(self, stream: Stream) -> None:
        """Give up a reserved name whose stream was never built."""
        self._connection.execute(
            "DELETE FROM streams WHERE analyst = ? AND name = ? AND length(data) = 0",
            stream.key,
        )

    def all(self, owner: str | None = None) -> list[Stream]:
        """Every stream, or only those paid for by analyst ``owner``."""
        rows = self._connection.execute(
            f"{_SELECT} WHERE {_USABLE} ORDER BY created, analyst, name", (owner, owner)
        )
        return [_row(r) for r in rows.fetchall()]

    def for_table(self, table: str, owner: str | None = None) -> list[Stream]:
        """The streams over ``table`` this owner may use, newest first."""
        rows = self._connection.execute(
            f"{_SELECT} WHERE lower(source_table) = lower(?) AND {_USABLE} "
            "ORDER BY created DESC, ledger_entry DESC",
            (table, owner, owner),
        )
        return [_row(r) for r in rows.fetchall()]

    def advance(
        self, key: tuple[str, str], step: Callable[[Stream], tuple[str, bytes | None, Any]]
    ) -> Any:
        """Under an exclusive lock: read the stream ``key`` (analyst, name), ``step`` it to a new
        state (and new data, or None when unchanged) and a result, store them (and one more
        answered query) and commit; only then return the result. The lock is the ledger file's
        write lock, which every charge waits for: ``step`` computes from the stored state and
        what was read before, never reads the data."""
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            row = connection.execute(
                f"{_SELECT} WHERE analyst = ? AND name = ? AND length(data) > 0", key
            ).fetchone()
            if row is None:
                raise ParameterError(f"no stream named {key[1]!r}")
            state, data, result = step(_row(row))
            connection.execute(
                "UPDATE streams SET state = ?, data = coalesce(?, data), answered = answered + 1 "
                "WHERE analyst = ? AND name = ?",
                (state, data, *key),
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        return result


# --- declaring a stream ---------------------------------------------------------------------------


ColumnSpec = tuple[Any, ...]
"""``(name, width)`` or ``(name, width, low, high)``: the bin width and (optionally, else the
policy's ``bounds``) the domain's bounds, in the column's own type: a DATE's width in days, a
TIMESTAMP's as a fixed-length interval (``'1 hour'``, no months), a DECIMAL's as a decimal
(``'0.5'``); bounds as values of the type (``'2024-01-01'``, ``'12.50'``, ``30``)."""


class Converter(Protocol):
    """What declaring a stream needs from the backend: exact literal conversion
    (``dpsql.engine.literals.Binder``) and DuckDB SQL to run."""

    def convert(self, literals: Sequence[exp.Cast], what: str) -> list[exp.Cast]: ...

    def run(self, sql: str) -> Any: ...


def _kind(name: str, type_name: str) -> tuple[str, int]:
    """The stream kind and decimal scale of a column type, or a refusal naming it."""
    kind = KINDS.get(ColumnKind.of(type_name))
    problem = (
        f"stream column {name!r} has type {type_name}; streams take integer, DATE, TIMESTAMP "
        f"and DECIMAL (precision <= {_MAX_DECIMAL_PRECISION}) columns"
    )
    if kind is None:
        raise ParameterError(problem)
    if kind == "timestamp" and type_name.upper() not in _TIMESTAMP_TYPES:
        raise ParameterError(problem)  # with a time zone, or not in microseconds
    scale = 0
    if kind == "decimal":
        built = exp.DataType.build(type_name, dialect="duckdb")
        sizes = [int(e.this.this) for e in built.expressions]
        precision, scale = [*sizes, 18, 3][:2] if len(sizes) != 1 else (sizes[0], 0)
        if precision > _MAX_DECIMAL_PRECISION:
            raise ParameterError(problem)
    return kind, scale


def ticks_sql(column: StreamColumn, value: str) -> str:
    """The ticks of a value of ``column`` (SQL, exact; see ``KINDS``)."""
    if column.kind == "date":
        return f"({value} - DATE '1970-01-01')"
    if column.kind == "timestamp":
        return f"epoch_us({value})"
    if column.kind == "decimal":
        return f"CAST(CAST({value} AS DECIMAL(38, {column.scale})) * {10**column.scale} AS HUGEINT)"
    return f"CAST({value} AS HUGEINT)"


def value_sql(column: StreamColumn, ticks: str) -> str:
    """The value of ``column``'s type with ``ticks`` (SQL, exact)."""
    if column.kind == "date":
        return f"CAST(DATE '1970-01-01' + CAST({ticks} AS INTEGER) AS DATE)"
    if column.kind == "timestamp":
        return f"make_timestamp(CAST({ticks} AS BIGINT))"
    if column.kind == "decimal":
        one = f"0.{'0' * (column.scale - 1)}1" if column.scale else "1"
        unit = f"CAST('{one}' AS DECIMAL(18, {column.scale}))"
        return f"CAST(CAST({ticks} AS DECIMAL(18, 0)) * {unit} AS {column.type})"
    return f"CAST({ticks} AS {column.type})"


def _literal(value: Any, type_name: str) -> exp.Cast:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ParameterError(f"a stream bound or width is a number or text, got {value!r}")
    text = value if isinstance(value, str) else repr(value)
    target = exp.DataType.build(type_name, dialect="duckdb")
    return exp.Cast(this=exp.Literal.string(text), to=target)


def _resolved(
    name: str, type_name: str, width: Any, low: Any, high: Any, converter: Converter
) -> StreamColumn:
    """The column's bounds and width in ticks, converted and counted by the database."""
    kind, scale = _kind(name, type_name)
    if kind in ("integer", "date") and (
        isinstance(width, bool) or not isinstance(width, int) or width < 1
    ):
        unit = " (days)" if kind == "date" else ""
        raise ParameterError(
            f"bin width of {name!r} must be a positive integer{unit}, got {width!r}"
        )
    if kind == "integer":
        try:
            exact = [not isinstance(b, bool) and float(b).is_integer() for b in (low, high)]
        except (TypeError, ValueError):
            exact = [False]
        if not all(exact):
            raise ParameterError(
                f"stream column {name!r} needs integer bounds, got {low!r}, {high!r}"
            )
        low, high = int(float(low)), int(float(high))
    bounds = converter.convert(
        [_literal(low, type_name), _literal(high, type_name)], f"bound of stream column {name!r}"
    )
    draft = StreamColumn(name, type_name, 0, 0, 1, kind, scale)
    ends = ", ".join(ticks_sql(draft, b.sql(dialect="duckdb")) for b in bounds)
    if kind == "timestamp":
        interval = _literal(width, "INTERVAL").sql(dialect="duckdb")
        step = (
            f"CASE WHEN datepart('year', {interval}) = 0 AND datepart('month', {interval}) = 0 "
            f"THEN epoch_us({interval}) END"
        )
    elif kind == "decimal":
        (converted,) = converter.convert(
            [_literal(width, type_name)], f"bin width of stream column {name!r}"
        )
        step = ticks_sql(draft, converted.sql(dialect="duckdb"))
    else:
        step = str(int(width))
    try:
        row = converter.run(f"SELECT {ends}, TRY_CAST({step} AS BIGINT)").iloc[0]
    except Exception as error:  # the bounds and width are the caller's literals, not data
        raise ParameterError(f"stream column {name!r}: bad bounds or width ({error})") from None
    import pandas as pd
    low_ticks, high_ticks, ticks = (None if pd.isna(v) else int(v) for v in row)
    if ticks is None or ticks < 1:
        raise ParameterError(
            f"bin width of {name!r} must be positive (a TIMESTAMP's a fixed-length interval such "
            f"as '1 hour', without months or years), got {width!r}"
        )
    if low_ticks is None or high_ticks is None or low_ticks > high_ticks:
        raise ParameterError(f"stream column {name!r} needs finite bounds low <= high")
    shown = None if kind == "integer" else (bounds[0].this.this, bounds[1].this.this)
    return StreamColumn(name, type_name, low_ticks, high_ticks, ticks, kind, scale, shown)


def stream_columns(
    specs: Sequence[ColumnSpec],
    columns: dict[str, str],
    bounds: dict[str, Any],
    converter: Converter,
    unit: str | None = None,
) -> tuple[StreamColumn, ...]:
    """Validated domain columns from ``ColumnSpec``s, the table's column types and the policy's
    declared bounds (used when a spec gives none): the domain is public, chosen before any data
    is read. ``unit`` (the privacy unit column) cannot be a stream column."""
    if not specs:
        raise ParameterError("a stream needs at least one column")
    by_lower = {name.lower(): name for name in columns}
    chosen: list[StreamColumn] = []
    for spec in specs:
        if not isinstance(spec, list | tuple) or len(spec) not in (2, 4):
            raise ParameterError(
                f"a stream column is (name, width) or (name, width, low, high), got {spec!r}"
            )
        given, width = spec[0], spec[1]
        name = by_lower.get(str(given).lower())
        if name is None:
            raise ParameterError(f"unknown column {given!r}")
        if any(c.name == name for c in chosen):
            raise ParameterError(f"column {name!r} is given twice")
        if unit is not None and name.lower() == unit.lower():
            raise ParameterError(f"{name!r} is the privacy unit; it cannot be a stream column")
        _kind(name, columns[name])
        if len(spec) == 4:
            low, high = spec[2], spec[3]
        elif (declared := bounds.get(name)) is not None:
            low, high = declared
        else:
            raise ParameterError(
                f"stream column {name!r} needs bounds: give them with the column (name, width, "
                f"low, high) or in the policy (tables.T.columns.{name}.bounds = [low, high]): "
                "the domain is public"
            )
        chosen.append(_resolved(name, columns[name], width, low, high, converter))
    cells = math.prod(c.cells for c in chosen)
    if cells < 2 or cells > MAX_CELLS:
        raise ParameterError(f"a stream's domain must have 2 to {MAX_CELLS} cells, got {cells}")
    return tuple(chosen)


def stream_params(
    mechanism: str,
    columns: tuple[StreamColumn, ...],
    *,
    epsilon: float,
    delta: float,
    sensitivity: int,
    updates: int | None,
    threshold: float | None,
    expected_queries: int,
    warm_share: float | None = None,
) -> dict[str, Any]:
    """The public parameters of a stream, all fixed before any data is read."""
    if mechanism not in STREAM_MECHANISMS:
        raise ParameterError(
            f"unknown stream mechanism {mechanism!r}; choose one of {', '.join(STREAM_MECHANISMS)}"
        )
    if mechanism == "range_tree":
        if len(columns) != 1:
            raise ParameterError("a range_tree stream covers exactly one column")
        if updates is not None or threshold is not None or warm_share is not None:
            raise ParameterError(
                "updates, threshold and warm_share are parameters of 'pmw' streams"
            )
        if delta:
            raise ParameterError("a range_tree stream is pure DP: give delta = 0")
        return {"branching": choose_branching(columns[0].cells), "sensitivity": sensitivity}
    updates = DEFAULT_UPDATES if updates is None else updates
    cells = math.prod(c.cells for c in columns)
    if cells > MAX_PMW_CELLS:
        raise ParameterError(
            f"a pmw stream's domain must have at most {MAX_PMW_CELLS} cells, got {cells}; use "
            "wider bins or fewer columns"
        )
    limit = MAX_UPDATES
    if isinstance(updates, bool) or not isinstance(updates, int) or not 1 <= updates <= limit:
        raise ParameterError(f"updates must be an integer in [1, {limit}], got {updates!r}")
    warm_share = DEFAULT_WARM_SHARE if warm_share is None else warm_share
    if isinstance(warm_share, bool) or not isinstance(warm_share, int | float):
        raise ParameterError(f"warm_share must be a number in [0, 1), got {warm_share!r}")
    if not 0.0 <= warm_share < 1.0:
        raise ParameterError(f"warm_share must be a number in [0, 1), got {warm_share!r}")
    if threshold is None:
        # The comparisons' noise scale times ln(expected queries): about one query in the
        # expected stream passes by noise alone (public parameters only). A warm start takes
        # its share and the row count (no count share); otherwise 5% go to the row count.
        share = (1 - warm_share if warm_share else 0.95) * (1 - 1 / 9)
        comparisons = svt_plan(
            epsilon=epsilon * share, c=updates, delta=delta / 2, sensitivity=sensitivity
        )
        threshold = float(comparisons.query_scale) * math.log(max(expected_queries, 2))
    if not math.isfinite(threshold) or threshold <= 0:
        raise ParameterError(f"threshold must be a positive number of rows, got {threshold!r}")
    return {
        "updates": updates,
        "threshold": float(threshold),
        "sensitivity": sensitivity,
        "replays": DEFAULT_REPLAYS,
        "count_share": 0.05,
        "value_share": 1 / 9,
        "warm_share": float(warm_share),
    }


def open_event(
    mechanism: str, epsilon: float, delta: float, columns: tuple[StreamColumn, ...], params: dict
) -> MechanismEvent:
    """The ledger event of opening a stream (its whole cost)."""
    label = f"stream over {', '.join(c.name for c in columns)}"
    if params.get("filter"):
        label += f" where {' AND '.join(params['filter'])}"
    shown = {k: v for k, v in params.items() if isinstance(v, int | float | str)}
    return MechanismEvent(mechanism, epsilon, delta, label, tuple(shown.items()))




# --- fixed filters --------------------------------------------------------------------------------


def conjuncts(where: exp.Expression | None) -> list[exp.Expression]:
    """The top-level AND operands of a WHERE (parentheses removed)."""
    if where is None:
        return []
    where = where.unnest()
    if isinstance(where, exp.And):
        return conjuncts(where.this) + conjuncts(where.expression)
    return [where]


def _canonical(conjunct: exp.Expression) -> str:
    """One conjunct's canonical DuckDB SQL: columns as quoted identifiers (the analyzer has
    already resolved them to the catalog's spelling), literals as the database converted them."""

    def quoted(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            return exp.column(node.name, quoted=True)
        return node

    return conjunct.transform(quoted).sql(dialect="duckdb")  # transform copies


def split_where(
    where: exp.Expression | None, names: set[str]
) -> tuple[exp.Expression | None, tuple[str, ...]]:
    """``where`` (bound) as (the AND of its conjuncts that use only ``names``, the canonical form
    of the other conjuncts: sorted, each once). Two WHEREs have the same fixed part exactly when
    the canonical forms are equal; AND is commutative and idempotent in SQL, nothing else is
    assumed, so a fixed part written differently is simply not matched."""
    stream: list[exp.Expression] = []
    fixed: set[str] = set()
    for conjunct in conjuncts(where):
        if _only_columns(conjunct, names):
            stream.append(conjunct.copy())
        else:
            fixed.add(_canonical(conjunct))
    return (exp.and_(*stream) if stream else None), tuple(sorted(fixed))


def _only_columns(conjunct: exp.Expression, names: set[str]) -> bool:
    """Whether ``conjunct`` reads no column but ``names`` (a stream's part of a WHERE)."""
    return all(c.name in names for c in conjunct.find_all(exp.Column))


def fixed_filter(stream: Stream) -> tuple[str, ...]:
    """The stream's fixed filter (canonical conjuncts; empty: the whole table)."""
    return tuple(stream.params.get("filter", ()))


def stream_shaped(shape: QueryShape) -> bool:
    """Whether a stream could answer ``shape`` at all: an ungrouped ``COUNT(*)`` (what
    :func:`answerable` asks of the query alone, before any stream is read)."""
    return (
        not shape.group_by
        and shape.having is None
        and shape.range_join is None
        and [(a.kind, a.column) for a in shape.aggregates] == [(AggregateKind.COUNT, None)]
    )


def answerable(shape: QueryShape, stream: Stream) -> bool:
    """An ungrouped ``COUNT(*)`` over the stream's table whose WHERE is exactly the stream's
    fixed filter AND conditions on the stream's columns only."""
    if not stream_shaped(shape) or shape.table.lower() != stream.table.lower():
        return False
    names = {c.name for c in stream.columns}
    wanted = fixed_filter(stream)
    if not wanted:  # split_where's fixed part is empty exactly when no conjunct is outside
        return all(_only_columns(conjunct, names) for conjunct in conjuncts(shape.where))
    _, fixed = split_where(shape.where, names)
    return fixed == wanted


def dense_histogram(frame: Any, cells: int) -> np.ndarray:
    """The histogram as a dense int64 vector from ``histogram_sql``'s rows."""
    histogram = np.zeros(cells, dtype=np.int64)
    if len(frame):
        histogram[frame["cell"].to_numpy(dtype=np.int64)] = frame["n"].to_numpy(dtype=np.int64)
    return histogram
