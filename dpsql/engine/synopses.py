"""Stored synopses: released combined structures that answer later point queries for free.

A ``GROUP BY key`` answered with the combined threshold + ALP structure is stored, with its public
parameters, the table, key column and filters it was built under. A later
``SELECT COUNT(*) FROM table WHERE key = 'x' [AND the same filters]`` is answered from it: looking
up a released structure is post-processing, so it costs no budget (the ledger records a zero-cost
entry that names the synopsis). Synopses live in the dpsql store beside the database (the ledger
file), because dpsql opens the data file read-only; the bytes never contain the input.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlglot import exp

from dpsql.accountant.stores import LedgerFileStore
from dpsql.sql.partition import literal_value
from dpsql.sql.shape import AggregateKind, QueryShape

__all__ = ["PointQuery", "Synopsis", "SynopsisStore", "conjuncts", "point_queries"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS synopses (
    name TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    source_table TEXT NOT NULL,
    key_column TEXT NOT NULL,
    filters TEXT NOT NULL,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    mechanism TEXT NOT NULL,
    ledger_entry INTEGER NOT NULL,
    params TEXT NOT NULL,
    data BLOB NOT NULL
)
"""


@dataclass(frozen=True)
class Synopsis:
    """A stored release and what it was built from (all public)."""

    name: str
    created: str
    table: str
    column: str
    filters: tuple[str, ...]
    epsilon: float
    delta: float
    mechanism: str
    ledger_entry: int
    params: dict[str, Any]
    data: bytes

    def describe(self) -> dict[str, Any]:
        """Everything but the bytes, for listings."""
        return {
            "name": self.name,
            "created": self.created,
            "table": self.table,
            "key_column": self.column,
            "filters": list(self.filters),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mechanism": self.mechanism,
            "ledger_entry": self.ledger_entry,
            "params": self.params,
            "bytes": len(self.data),
        }


class SynopsisStore(LedgerFileStore):
    """The ``synopses`` table of a ledger file."""

    def __init__(self, path: str | Path):
        super().__init__(path, schema=_SCHEMA, what="synopsis store")

    def save(self, synopsis: Synopsis) -> None:
        self._connection.execute(
            "INSERT INTO synopses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                synopsis.name,
                synopsis.created,
                synopsis.table,
                synopsis.column,
                json.dumps(list(synopsis.filters)),
                synopsis.epsilon,
                synopsis.delta,
                synopsis.mechanism,
                synopsis.ledger_entry,
                json.dumps(synopsis.params, sort_keys=True),
                synopsis.data,
            ),
        )

    def all(self, owner: str | None = None) -> list[Synopsis]:
        """Every synopsis, or only those paid for by analyst ``owner``."""
        rows = self._connection.execute(
            f"SELECT * FROM synopses WHERE {_OWNED} ORDER BY created, name", (owner, owner)
        )
        return [_synopsis(row) for row in rows.fetchall()]

    def find(
        self, table: str, column: str, filters: tuple[str, ...], owner: str | None = None
    ) -> Synopsis | None:
        """The newest synopsis built for exactly this table, key column and filters (and paid
        for by analyst ``owner``, when given)."""
        row = self._connection.execute(
            "SELECT * FROM synopses WHERE lower(source_table) = lower(?) AND key_column = ? "
            f"AND filters = ? AND {_OWNED} ORDER BY created DESC, ledger_entry DESC LIMIT 1",
            (table, column, json.dumps(list(filters)), owner, owner),
        ).fetchone()
        return None if row is None else _synopsis(row)


_OWNED = "(? IS NULL OR ledger_entry IN (SELECT seq FROM entries WHERE analyst = ?))"
"""Who paid for a synopsis is the analyst of the ledger entry that charged it (same file)."""


def _synopsis(row: tuple[Any, ...]) -> Synopsis:
    name, created, table, column, filters, epsilon, delta, mechanism, entry, params, data = row
    return Synopsis(
        name,
        created,
        table,
        column,
        tuple(json.loads(filters)),
        epsilon,
        delta,
        mechanism,
        entry,
        json.loads(params),
        bytes(data),
    )


def conjuncts(where: exp.Expression | None) -> tuple[str, ...]:
    """The AND-ed terms of a validated WHERE clause as sorted SQL text (order-insensitive)."""
    if where is None:
        return ()
    terms = list(where.flatten()) if isinstance(where, exp.And) else [where]
    return tuple(sorted(t.unnest().sql(dialect="duckdb") for t in terms))


@dataclass(frozen=True)
class PointQuery:
    """``COUNT(*) ... WHERE column = v`` or ``column IN (...)`` plus other filters."""

    column: str
    keys: tuple[str | int | float, ...]
    filters: tuple[str, ...]


def point_queries(shape: QueryShape) -> list[PointQuery]:
    """Readings of an ungrouped ``COUNT(*)`` as a point query: one per WHERE conjunct that pins a
    column to literal keys (``column = v`` or ``column IN (...)``), the rest being filters."""
    if shape.group_by or [(a.kind, a.column) for a in shape.aggregates] != [
        (AggregateKind.COUNT, None)
    ]:
        return []
    where = shape.where
    if where is None:
        return []
    terms = [t.unnest() for t in (where.flatten() if isinstance(where, exp.And) else [where])]
    readings = []
    for index, term in enumerate(terms):
        if isinstance(term, exp.EQ) and isinstance(term.this, exp.Column):
            values = [term.expression]
        elif isinstance(term, exp.In) and isinstance(term.this, exp.Column):
            values = list(term.expressions)
        else:
            continue
        try:
            keys = tuple(literal_value(v) for v in values)
        except ValueError:
            continue
        rest = terms[:index] + terms[index + 1 :]
        filters = tuple(sorted(t.sql(dialect="duckdb") for t in rest))
        readings.append(PointQuery(term.this.name, keys, filters))
    return readings


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
