"""Released answers kept beside their ledger entries, so a lost output is fetched, not re-bought.

Each answer is stored in the ledger file's ``results`` table under the sequence number of the
entry that paid for it, as soon as it is released. Fetching it again is a copy of a release, not
a new one: no charge, no new entry. Only the analyst of that entry (or an administrator reading
the file) fetches it; for anyone else an entry without a stored answer and another analyst's
answer look the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpsql.accountant.stores import LedgerFileStore
from dpsql.engine.results import QueryResult
from dpsql.errors import ParameterError

__all__ = ["ResultStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    seq INTEGER PRIMARY KEY,
    result TEXT NOT NULL
)
"""

_OWNED = "(? IS NULL OR seq IN (SELECT seq FROM entries WHERE analyst = ?))"
"""The analyst who paid for a result is the analyst of its ledger entry (same file)."""


class ResultStore(LedgerFileStore):
    """The ``results`` table of a ledger file."""

    def __init__(self, path: str | Path):
        # The ledger commits each charge with fsync (synchronous=FULL) before any data is read;
        # a stored answer is a convenience copy written after the release, so it commits
        # without a second fsync per query: atomic and safe if the process dies, and only an
        # operating-system crash right after a query can lose that query's copy.
        super().__init__(path, schema=_SCHEMA, what="result store", synchronous="NORMAL")

    def save(self, result: QueryResult) -> None:
        """Keep ``result`` under its ledger entry (NaN survives: Python's JSON writes it)."""
        self._connection.execute(
            "INSERT OR REPLACE INTO results VALUES (?, ?)",
            (result.ledger_entry, json.dumps(result.model_dump(), sort_keys=True)),
        )

    def get(self, seq: int, analyst: str | None = None) -> QueryResult:
        """The answer released under ledger entry ``seq``; with ``analyst``, only theirs."""
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise ParameterError(f"a ledger entry number is a positive integer, got {seq!r}")
        row = self._connection.execute(
            f"SELECT result FROM results WHERE seq = ? AND {_OWNED}", (seq, analyst, analyst)
        ).fetchone()
        if row is None:
            whose = "" if analyst is None else f" of analyst {analyst!r}"
            raise ParameterError(f"ledger entry {seq} has no stored answer{whose}")
        return QueryResult.model_validate(json.loads(row[0]))
