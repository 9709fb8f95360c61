"""Query streams: one charge answers an unbounded stream of count queries over declared columns.

A stream is opened over a table and one or more bounded integer columns, each cut into cells of a
declared width (the domain is the product of the cells). Opening it charges its (ε, δ) once and
reads a bounded histogram over the domain (every person contributes at most ``max_rows_per_unit``
rows, chosen by a salted order, so the histogram's L1 sensitivity is ``max_rows_per_unit``).
Later ``SELECT COUNT(*) FROM t WHERE ...`` queries whose WHERE uses only the stream's columns are
answered from it and recorded in the ledger as zero-cost entries naming the stream:

* ``pmw``: online private multiplicative weights (:mod:`dpsql.mechanisms.pmw`). Each query is
  compared with the synthetic answer by the sparse vector; at most ``updates`` queries spend an
  update (a fresh noisy count), then the stream is exhausted and says so. The state (synthetic
  distribution, remaining updates, the SVT's noisy threshold, all secret or derived from released
  values) lives in the ``streams`` table of the ledger file; each answer's state change is
  committed, under an exclusive SQLite lock, before the answer is returned.
* ``range_tree``: the hierarchical histogram (:mod:`dpsql.mechanisms.hierarchical`) over one
  column; every answer is post-processing of the stored noisy tree, with an exact interval.

What DuckDB decides: the histogram (``GROUP BY`` cell, in the database), and which cells a WHERE
selects: the WHERE (with its literals already bound by the database) is evaluated by DuckDB over
the cells' values, never by a Python model of SQL. A cell wider than one value must be decided
the same way for all its values: comparisons ``<, <=, >, >=`` and ``BETWEEN`` on a binned column
are checked (by DuckDB) to agree at both ends of every cell, and ``=``, ``<>`` and ``IN`` on a
binned column are refused. Rows whose value lies outside the declared bounds (or is NULL) are
outside the domain: a stream's counts measure the rows inside it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.accountant.events import MechanismEvent
from dpsql.errors import LedgerError, ParameterError, PrivacyError, UnsupportedQueryError
from dpsql.mechanisms.hierarchical import choose_branching
from dpsql.mechanisms.svt import plan as svt_plan
from dpsql.sql.shape import AggregateKind, ColumnKind, QueryShape

__all__ = [
    "MAX_CELLS",
    "STREAM_MECHANISMS",
    "Stream",
    "StreamColumn",
    "StreamExhaustedError",
    "StreamStore",
    "cells_selected_sql",
    "histogram_sql",
    "open_event",
    "stream_columns",
]

STREAM_MECHANISMS = ("pmw", "range_tree")
MAX_CELLS = 2**20
"""Largest domain (product of the cells) a stream may declare."""
MAX_PMW_CELLS = 2**16
"""Largest PMW domain: its state (weights, one packed mask per update) is rewritten on updates."""
MAX_UPDATES = 1000

DEFAULT_UPDATES = 50
DEFAULT_REPLAYS = 10
DEFAULT_EXPECTED_QUERIES = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS streams (
    name TEXT PRIMARY KEY,
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
    answered INTEGER NOT NULL DEFAULT 0
)
"""


class StreamExhaustedError(PrivacyError):
    """A PMW stream spent its updates; it answers no further query."""


@dataclass(frozen=True)
class StreamColumn:
    """A declared domain column: integer values ``low..high`` cut into cells of ``width``."""

    name: str
    type: str
    low: int
    high: int
    width: int

    @property
    def cells(self) -> int:
        return (self.high - self.low) // self.width + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "low": self.low,
            "high": self.high,
            "width": self.width,
        }


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
    ) = row
    return Stream(
        name,
        created,
        table,
        tuple(StreamColumn(**c) for c in json.loads(columns)),
        mechanism,
        epsilon,
        delta,
        entry,
        json.loads(params),
        bytes(data),
        state,
        answered,
    )


_OWNED = "(? IS NULL OR ledger_entry IN (SELECT seq FROM entries WHERE analyst = ?))"
"""Who paid for a stream is the analyst of the ledger entry that charged it (same file)."""


class StreamStore:
    """The ``streams`` table of a ledger file."""

    def __init__(self, path: str | Path):
        try:
            self._connection = sqlite3.connect(Path(path), timeout=60, isolation_level=None)
            self._connection.execute(_SCHEMA)
        except sqlite3.DatabaseError as error:
            raise LedgerError(f"stream store {str(path)!r} is unreadable ({error})") from None

    def close(self) -> None:
        self._connection.close()

    def save(self, stream: Stream) -> None:
        self._connection.execute(
            "INSERT INTO streams VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            ),
        )

    def all(self, owner: str | None = None) -> list[Stream]:
        """Every stream, or only those paid for by analyst ``owner``."""
        rows = self._connection.execute(
            f"SELECT * FROM streams WHERE {_OWNED} ORDER BY created, name", (owner, owner)
        )
        return [_row(r) for r in rows.fetchall()]

    def for_table(self, table: str, owner: str | None = None) -> list[Stream]:
        """The streams over ``table`` this owner may use, newest first."""
        rows = self._connection.execute(
            f"SELECT * FROM streams WHERE lower(source_table) = lower(?) AND {_OWNED} "
            "ORDER BY created DESC, ledger_entry DESC",
            (table, owner, owner),
        )
        return [_row(r) for r in rows.fetchall()]

    def advance(self, name: str, step: Callable[[Stream], tuple[str, bytes | None, Any]]) -> Any:
        """Under an exclusive lock: read the stream, ``step`` it to a new state (and new data, or
        None when unchanged) and a result, store them (and one more answered query) and commit;
        only then return the result."""
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            row = connection.execute("SELECT * FROM streams WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise ParameterError(f"no stream named {name!r}")
            state, data, result = step(_row(row))
            connection.execute(
                "UPDATE streams SET state = ?, data = coalesce(?, data), answered = answered + 1 "
                "WHERE name = ?",
                (state, data, name),
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        return result


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


# --- declaring a stream ---------------------------------------------------------------------------


def stream_columns(
    specs: list[tuple[str, int]], columns: dict[str, str], bounds: dict[str, Any]
) -> tuple[StreamColumn, ...]:
    """Validated domain columns from ``(name, width)`` pairs, the table's column types and the
    policy's declared bounds (which must be integers: the domain is public)."""
    if not specs:
        raise ParameterError("a stream needs at least one column")
    by_lower = {name.lower(): name for name in columns}
    chosen: list[StreamColumn] = []
    for given, width in specs:
        name = by_lower.get(given.lower())
        if name is None:
            raise ParameterError(f"unknown column {given!r}")
        if any(c.name == name for c in chosen):
            raise ParameterError(f"column {name!r} is given twice")
        type_name = columns[name]
        if ColumnKind.of(type_name) is not ColumnKind.INTEGER:
            raise ParameterError(
                f"stream column {name!r} has type {type_name}; streams take integer columns"
            )
        declared = bounds.get(name)
        if declared is None:
            raise ParameterError(
                f"stream column {name!r} needs bounds in the policy "
                f"(tables.T.columns.{name}.bounds = [low, high]): the domain is public"
            )
        low, high = declared
        if not (float(low).is_integer() and float(high).is_integer()):
            raise ParameterError(f"stream column {name!r} needs integer bounds, got {declared}")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ParameterError(f"bin width of {name!r} must be a positive integer, got {width!r}")
        chosen.append(StreamColumn(name, type_name, int(low), int(high), width))
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
) -> dict[str, Any]:
    """The public parameters of a stream, all fixed before any data is read."""
    if mechanism not in STREAM_MECHANISMS:
        raise ParameterError(
            f"unknown stream mechanism {mechanism!r}; choose one of {', '.join(STREAM_MECHANISMS)}"
        )
    if mechanism == "range_tree":
        if len(columns) != 1:
            raise ParameterError("a range_tree stream covers exactly one column")
        if updates is not None or threshold is not None:
            raise ParameterError("updates and threshold are parameters of 'pmw' streams")
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
    if threshold is None:
        # The comparisons' noise scale times ln(expected queries): about one query in the
        # expected stream passes by noise alone (public parameters only).
        share = 0.95 * (1 - 1 / 9)
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
    }


def open_event(
    mechanism: str, epsilon: float, delta: float, columns: tuple[StreamColumn, ...], params: dict
) -> MechanismEvent:
    """The ledger event of opening a stream (its whole cost)."""
    label = f"stream over {', '.join(c.name for c in columns)}"
    shown = {k: v for k, v in params.items() if isinstance(v, int | float | str)}
    return MechanismEvent(mechanism, epsilon, delta, label, tuple(shown.items()))


# --- generated SQL --------------------------------------------------------------------------------


def _ident(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _cell_index(column: StreamColumn) -> str:
    value = _ident(column.name)
    return f"(({value} - {column.low}) // {column.width})"


def histogram_sql(
    table: str,
    unit: str,
    max_rows_per_unit: int,
    columns: tuple[StreamColumn, ...],
    salt: int,
) -> str:
    """Cell index (row-major) and bounded count of every non-empty cell: each unit keeps at most
    ``max_rows_per_unit`` of its in-domain rows, chosen by a salted hash of their cells."""
    inside = " AND ".join(f"{_ident(c.name)} BETWEEN {c.low} AND {c.high}" for c in columns)
    index = _cell_index(columns[0])
    for column in columns[1:]:
        index = f"({index} * {column.cells} + {_cell_index(column)})"
    return (
        f"SELECT cell, COUNT(*) AS n FROM (SELECT {index} AS cell, row_number() OVER "
        f"(PARTITION BY {_ident(unit)} ORDER BY hash({index}, {salt}), {index}) AS rank "
        f"FROM {_ident(table)} WHERE {inside}) WHERE rank <= {max_rows_per_unit} "
        "GROUP BY cell ORDER BY cell"
    )


def _at(where: exp.Expression, values: dict[str, str]) -> exp.Expression:
    """``where`` with each column replaced by a SQL value expression."""

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in values:
            return exp.maybe_parse(values[node.name], dialect="duckdb")
        return node

    return where.copy().transform(replace)


def _value(column: StreamColumn, index: str, end: bool) -> str:
    offset = f" + {column.width - 1}" if end and column.width > 1 else ""
    top = f"LEAST({column.low} + {index} * {column.width}{offset}, {column.high})"
    return f"CAST({top} AS {column.type})"


def _monotone_atoms(where: exp.Expression, column: str) -> list[exp.Expression]:
    """The comparisons on ``column`` as monotone atoms (BETWEEN split in two); refuses the
    atoms that can select the inside of a cell but not its ends."""
    atoms: list[exp.Expression] = []
    for node in where.find_all(exp.EQ, exp.NEQ, exp.In, exp.LT, exp.LTE, exp.GT, exp.GTE):
        if not any(c.name == column for c in node.find_all(exp.Column)):
            continue
        if isinstance(node, exp.EQ | exp.NEQ | exp.In):
            raise UnsupportedQueryError(
                f"=, <> and IN on {column!r} are not answered by a stream whose cells are wider "
                "than one value; use ranges aligned with the cells"
            )
        atoms.append(node)
    for node in where.find_all(exp.Between):
        atoms.append(exp.GTE(this=node.this.copy(), expression=node.args["low"].copy()))
        atoms.append(exp.LTE(this=node.this.copy(), expression=node.args["high"].copy()))
    return atoms


def alignment_sql(where: exp.Expression, column: StreamColumn) -> str | None:
    """A query returning TRUE when every comparison on a binned column has the same value at
    both ends of every cell (None when the column's cells are single values)."""
    if column.width == 1:
        return None
    atoms = _monotone_atoms(where, column.name)
    if not atoms:
        return None
    checks = [
        f"bool_and(({_at(a, {column.name: _value(column, 'i', False)}).sql('duckdb')}) IS NOT "
        f"DISTINCT FROM ({_at(a, {column.name: _value(column, 'i', True)}).sql('duckdb')}))"
        for a in atoms
    ]
    return f"SELECT {' AND '.join(checks)} FROM range({column.cells}) AS cells(i)"


def cells_selected_sql(where: exp.Expression, columns: tuple[StreamColumn, ...]) -> str:
    """The row-major index of every cell that satisfies ``where``, evaluated by DuckDB at the
    cell's low end (NULL is not selected, as in a WHERE)."""
    sources = ", ".join(f"range({c.cells}) AS r{i}(i{i})" for i, c in enumerate(columns))
    values = {c.name: _value(c, f"i{i}", False) for i, c in enumerate(columns)}
    index = "i0"
    for i, column in enumerate(columns[1:], start=1):
        index = f"({index} * {column.cells} + i{i})"
    predicate = _at(where, values).sql(dialect="duckdb")
    return f"SELECT {index} AS cell FROM {sources} WHERE ({predicate})"


def answerable(shape: QueryShape, stream: Stream) -> bool:
    """An ungrouped ``COUNT(*)`` over the stream's table whose WHERE uses only its columns."""
    if shape.group_by or shape.having is not None or shape.range_join is not None:
        return False
    if [(a.kind, a.column) for a in shape.aggregates] != [(AggregateKind.COUNT, None)]:
        return False
    if shape.table.lower() != stream.table.lower():
        return False
    if shape.where is None:
        return True
    names = {c.name for c in stream.columns}
    return all(c.name in names for c in shape.where.find_all(exp.Column))


def dense_histogram(frame: Any, cells: int) -> np.ndarray:
    """The histogram as a dense int64 vector from ``histogram_sql``'s rows."""
    histogram = np.zeros(cells, dtype=np.int64)
    if len(frame):
        histogram[frame["cell"].to_numpy(dtype=np.int64)] = frame["n"].to_numpy(dtype=np.int64)
    return histogram
