"""Stores that live in the ledger file beside the ledger: stored answers, synopses, streams and
service tokens. Each is a table of its own in ``<database>.dpsql.sqlite``, opened the same way:
autocommit (each store writes in its own short statements or explicit transactions), a 60 s wait
for the file's lock, its schema created if missing, and an unreadable file reported as a
``LedgerError`` (which stops queries, as a broken ledger does).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dpsql.errors import LedgerError

__all__ = ["LedgerFileStore"]


class LedgerFileStore:
    """A table of the ledger file, opened with ``schema`` (SQL run once on opening).

    Args:
        path: the ledger file.
        schema: statements creating the store's table(s) if missing.
        what: the store's name in error messages, e.g. "result store".
        synchronous: SQLite's ``synchronous`` for this connection (None: the file's default).
        threads: whether other threads may use the connection (guarded by the caller).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        schema: str,
        what: str,
        synchronous: str | None = None,
        threads: bool = False,
    ):
        try:
            self._connection = sqlite3.connect(
                Path(path), timeout=60, isolation_level=None, check_same_thread=not threads
            )
            if synchronous is not None:
                self._connection.execute(f"PRAGMA synchronous={synchronous}")
            self._connection.executescript(schema)
        except sqlite3.DatabaseError as error:
            raise LedgerError(f"{what} {str(path)!r} is unreadable ({error})") from None

    def close(self) -> None:
        self._connection.close()
