"""Released answers kept beside their ledger entries, so a lost output is fetched, not re-bought.

Each answer is stored in the ledger file's ``results`` table under the sequence number of the
entry that paid for it, as soon as it is released; the answers of a report (one entry paying for
several queries) are stored in ``report_results`` under that entry and each query's name.
Fetching one again is a copy of a release, not a new one: no charge, no new entry. Only the
analyst of that entry (or an administrator reading the file) fetches it; for anyone else an
entry without a stored answer and another analyst's answer look the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic_core import to_json

from dpsql.accountant.stores import LedgerFileStore
from dpsql.engine.results import QueryResult
from dpsql.errors import ParameterError

__all__ = ["ResultStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    seq INTEGER PRIMARY KEY,
    result TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS report_results (
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    position INTEGER NOT NULL,
    result TEXT NOT NULL,
    PRIMARY KEY (seq, name)
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
        """Keep ``result`` under its ledger entry."""
        self._connection.execute(
            "INSERT OR REPLACE INTO results VALUES (?, ?)", (result.ledger_entry, _text(result))
        )

    def save_report(self, seq: int, results: dict[str, QueryResult]) -> None:
        """Keep a report's answers under its ledger entry ``seq``, by query name, in order."""
        self._connection.executemany(
            "INSERT OR REPLACE INTO report_results VALUES (?, ?, ?, ?)",
            [
                (seq, name, position, _text(result))
                for position, (name, result) in enumerate(results.items())
            ],
        )

    def report_queries(self, seq: int, analyst: str | None = None) -> list[str]:
        """The names of the queries of the report paid for by entry ``seq`` (with ``analyst``,
        only theirs), in the report's order; empty for any other entry."""
        rows = self._connection.execute(
            f"SELECT name FROM report_results WHERE seq = ? AND {_OWNED} ORDER BY position",
            (seq, analyst, analyst),
        ).fetchall()
        return [name for (name,) in rows]

    def get(self, seq: int, analyst: str | None = None, query: str | None = None) -> QueryResult:
        """The answer released under ledger entry ``seq`` (of a report: its query ``query``);
        with ``analyst``, only theirs."""
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise ParameterError(f"a ledger entry number is a positive integer, got {seq!r}")
        whose = "" if analyst is None else f" of analyst {analyst!r}"
        if query is not None:
            row = self._connection.execute(
                f"SELECT result FROM report_results WHERE seq = ? AND name = ? AND {_OWNED}",
                (seq, query, analyst, analyst),
            ).fetchone()
            if row is None:
                raise ParameterError(f"ledger entry {seq} has no stored answer{whose} to {query!r}")
            return QueryResult.model_validate(json.loads(row[0]))
        row = self._connection.execute(
            f"SELECT result FROM results WHERE seq = ? AND {_OWNED}", (seq, analyst, analyst)
        ).fetchone()
        if row is None:
            names = self.report_queries(seq, analyst)
            if names:
                raise ParameterError(
                    f"ledger entry {seq} paid for a report of {len(names)} queries; name one: "
                    + ", ".join(names)
                )
            raise ParameterError(f"ledger entry {seq} has no stored answer{whose}")
        return QueryResult.model_validate(json.loads(row[0]))


def _text(result: QueryResult) -> str:
    """``result`` as JSON that ``json.loads`` reads back whole: NaN and infinities are written as
    Python's JSON writes them (a missing interval end is NaN, not null)."""
    return to_json(result.model_dump(), inf_nan_mode="constants").decode()
