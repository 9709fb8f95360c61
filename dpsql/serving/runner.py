"""Engine calls off the event loop, one at a time per worker process, with a time limit.

DuckDB lets a process hold one read-only, configuration-locked connection to a database file,
and SQLite connections may not move between threads. So each worker runs every engine call on
one thread that owns one backend (opened from the policy when the first call arrives), shared by
one session per analyst (opening a session verifies the whole ledger, so it is done once).
DuckDB parallelises inside a query; the service scales across queries with ``--workers``.

A call that passes its time limit is interrupted inside DuckDB; if it was charged, the charge
stands, as everywhere in dpsql. A policy change that adds file sources needs a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.session import Session, show_policy

__all__ = ["EngineRunner", "RunnerTimeout"]

T = TypeVar("T")


class RunnerTimeout(Exception):
    """An engine call passed its time limit (it was interrupted, or never started)."""


class EngineRunner:
    """Runs engine work on the worker's one engine thread."""

    def __init__(self, database: str | Path):
        self.database = Path(database)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dpsql-engine")
        self._backend: DuckDBBackend | None = None
        self._sessions: dict[str, Session] = {}

    def close(self) -> None:
        """Stop a running query, then close the sessions and the backend (on the engine thread,
        which owns them)."""
        self._interrupt()
        self._executor.submit(self._close).result()
        self._executor.shutdown()

    def _close(self) -> None:
        for session in self._sessions.values():
            session.close()  # closing the shared backend again is harmless
        self._sessions.clear()
        if self._backend is not None:
            self._backend.close()

    def _session(self, analyst: str) -> Session:
        session = self._sessions.get(analyst)
        if session is None:
            if self._backend is None:
                self._backend = DuckDBBackend.for_policy(self.database, show_policy(self.database))
            session = Session(self.database, analyst=analyst, backend=self._backend)
            self._sessions[analyst] = session
        return session

    def _run(self, work: Callable[[Session | None], T], analyst: str | None) -> T:
        return work(None if analyst is None else self._session(analyst))

    def _interrupt(self) -> None:
        # DuckDBBackend keeps its connection private; interrupting it is the one way to stop a
        # running scan from another thread (the engine then raises ExecutionError).
        connection = getattr(self._backend, "_connection", None)
        if connection is not None:
            connection.interrupt()

    async def run(
        self, work: Callable[[Session | None], T], *, analyst: str | None, timeout: float
    ) -> T:
        """``work(session)`` on the engine thread (``session`` is None without ``analyst``).

        Raise ``RunnerTimeout`` past ``timeout`` seconds (time queued included).
        """
        future = self._executor.submit(self._run, work, analyst)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            if not future.cancel():  # running: stop it; queued: it never starts
                self._interrupt()
            raise RunnerTimeout from None
