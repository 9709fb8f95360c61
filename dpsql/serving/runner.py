"""Engine calls off the event loop, with a time limit.

Sessions hold a DuckDB connection and a SQLite connection, neither of which may move between
threads, so each engine thread keeps its own session per analyst (opened once: opening verifies
the whole ledger). A call that passes its time limit is interrupted inside DuckDB and its session
discarded; if it was charged, the charge stands, as everywhere in dpsql.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from dpsql.engine.session import Session, connect
from dpsql.errors import ServiceError

__all__ = ["EngineRunner"]

T = TypeVar("T")


class _Call:
    """One engine call: the session it runs in, and whether it was interrupted."""

    def __init__(self, analyst: str | None):
        self.analyst = analyst
        self.session: Session | None = None
        self.interrupted = False
        self._lock = threading.Lock()

    def interrupt(self) -> None:
        with self._lock:
            self.interrupted = True
            session = self.session
        if session is not None:
            # DuckDBBackend keeps its connection private; interrupting it is the one way to stop
            # a running scan from another thread (the scan then raises inside the engine).
            connection = getattr(session.backend, "_connection", None)
            if connection is not None:
                connection.interrupt()


class EngineRunner:
    """Runs engine work on ``threads`` threads, each with its own sessions."""

    def __init__(self, database: str | Path, threads: int):
        self.database = Path(database)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="dpsql-engine")
        self._local = threading.local()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _sessions(self) -> dict[str, Session]:
        if not hasattr(self._local, "sessions"):
            self._local.sessions = {}
        return self._local.sessions

    def _run(self, call: _Call, work: Callable[[Session | None], T]) -> T:
        if call.analyst is None:
            return work(None)
        sessions = self._sessions()
        session = sessions.get(call.analyst)
        if session is None:
            session = sessions[call.analyst] = connect(self.database, analyst=call.analyst)
        with call._lock:
            if call.interrupted:
                raise ServiceError("interrupted before it started", status=504)
            call.session = session
        try:
            return work(session)
        finally:
            with call._lock:
                call.session = None
                if call.interrupted:
                    sessions.pop(call.analyst, None)
                    session.close()

    async def run(
        self, work: Callable[[Session | None], T], *, analyst: str | None, timeout: float
    ) -> T:
        """``work(session)`` in an engine thread (``session`` is None without ``analyst``).

        Past ``timeout`` seconds raise one data-independent ``ServiceError`` (504).
        """
        call = _Call(analyst)
        future = self._executor.submit(self._run, call, work)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            call.interrupt()
            raise ServiceError(
                f"the request did not finish within the time limit of {timeout:g} s; "
                "a query that was charged stays charged",
                status=504,
            ) from None
