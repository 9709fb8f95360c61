"""Engine calls off the event loop, one at a time per worker process, with a time limit.

DuckDB lets a process hold one read-only, configuration-locked connection to a database file,
and SQLite connections may not move between threads. So each worker runs every engine call on
one thread that owns one backend (opened from the policy when the first call arrives), shared by
one session per analyst (opening a session verifies the whole ledger, so it is done once).
DuckDB parallelises inside a query; the service scales across queries with ``--workers``.

A call that passes its time limit is stopped wherever it is: the call runs as one request of
``dpsql.deadline`` (the time it waited in the queue deducted), so parsing, binding,
post-processing and EXPLAIN check it and every DuckDB connection working for it (the backend's,
the post-processing sandbox's) is interrupted; the worker is then free for the next call. If it
was charged, the charge stands, as everywhere in dpsql.

The backend is opened from the policy (its file sources, its memory limit). Before each call the
runner reads which policy entry is in force (an indexed lookup in the ledger); when the
administrator has set a new one, the sessions and the backend are closed and reopened from it,
so a new source table or memory limit applies from the next call, without a restart.

A local session verifies the whole ledger whenever it opens; a worker's sessions live long, so
the runner re-verifies the chain before a call once ``verify_every`` seconds have passed since
the last check: an edited ledger stops the service within that time (``LedgerError``, 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from dpsql import deadline
from dpsql.accountant.ledger import Ledger
from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.session import Session, ledger_path, show_policy

__all__ = ["EngineRunner", "RunnerTimeout"]

T = TypeVar("T")


class RunnerTimeout(Exception):
    """An engine call passed its time limit (it was interrupted, or never started)."""


class EngineRunner:
    """Runs engine work on the worker's one engine thread."""

    def __init__(self, database: str | Path, *, verify_every: float = 60.0):
        self.database = Path(database)
        self.verify_every = verify_every
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dpsql-engine")
        self._backend: DuckDBBackend | None = None
        self._sessions: dict[str, Session] = {}
        self._ledger: Ledger | None = None  # opened on the engine thread, which owns it
        self._policy_entry: int | None = None
        self._verified = time.monotonic()
        self._request: deadline.Deadline | None = None  # the running call's, set on its thread

    def close(self) -> None:
        """Stop a running query, then close the sessions and the backend (on the engine thread,
        which owns them)."""
        self._interrupt()
        self._executor.submit(self._close).result()
        self._executor.shutdown()

    def _close(self) -> None:
        self._close_engine()
        if self._ledger is not None:
            self._ledger.close()

    def _close_engine(self) -> None:
        for session in self._sessions.values():
            session.close()  # closing the shared backend again is harmless
        self._sessions.clear()
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def backend(self) -> DuckDBBackend:
        """The worker's backend, opened from the policy in force; call it on the engine thread
        (inside ``run``'s work)."""
        if self._backend is None:
            self._backend = DuckDBBackend.for_policy(self.database, show_policy(self.database))
        return self._backend

    def _session(self, analyst: str) -> Session:
        session = self._sessions.get(analyst)
        if session is None:
            session = Session(self.database, analyst=analyst, backend=self.backend())
            self._sessions[analyst] = session
        return session

    def _verify(self) -> Ledger:
        """The runner's ledger, its chain verified within the last ``verify_every`` seconds."""
        if self._ledger is None:
            self._ledger = Ledger(ledger_path(self.database), dataset=self.database.stem)
            self._verified = time.monotonic()  # opening verified it
        elif time.monotonic() - self._verified >= self.verify_every:
            self._ledger.verify()
            self._verified = time.monotonic()
        return self._ledger

    def _follow_policy(self, ledger: Ledger) -> None:
        """Reopen the backend and sessions if a new policy was set since they were opened."""
        entry = ledger.policy_entry()
        if entry != self._policy_entry:
            self._close_engine()
            self._policy_entry = entry

    def _run(self, work: Callable[[Session | None], T], analyst: str | None, ends: float) -> T:
        left = ends - time.monotonic()
        if left <= 0:
            raise RunnerTimeout
        with deadline.within(left) as request:
            self._request = request
            try:
                self._follow_policy(self._verify())
                return work(None if analyst is None else self._session(analyst))
            except Exception:
                if not request.expired:
                    raise
            finally:
                self._request = None
        # The call's time ran out. The request's own deadline and ``run``'s timeout end at the
        # same instant; whichever noticed first, the caller gets the same answer (raised outside
        # the handler: no chain carries the interrupted stage's error).
        raise RunnerTimeout

    def _interrupt(self) -> None:
        request = self._request
        if request is not None:
            request.expire()  # its checks raise, its connections (the sandbox's too) stop
        # Interrupting the backend is the one way to stop a running scan from another thread (the
        # engine then raises ExecutionError).
        if self._backend is not None:
            self._backend.interrupt()

    async def run(
        self, work: Callable[[Session | None], T], *, analyst: str | None, timeout: float
    ) -> T:
        """``work(session)`` on the engine thread (``session`` is None without ``analyst``).

        Raise ``RunnerTimeout`` past ``timeout`` seconds (time queued included).
        """
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        ends = time.monotonic() + timeout

        def call() -> None:  # on the engine thread: hands the outcome straight to the loop
            try:
                outcome = self._run(work, analyst, ends)
            except BaseException as error:
                _hand_over(loop, answer, None, error)
            else:
                _hand_over(loop, answer, outcome, None)

        future = self._executor.submit(call)
        expired = RunnerTimeout()
        timer = loop.call_later(timeout, _settle, answer, None, expired)
        try:
            return await answer
        except RunnerTimeout as error:
            # The loop's timer (not the call's own deadline, which already stopped the call):
            # stop the call if it runs; a queued one never starts.
            if error is expired and not future.cancel():
                self._interrupt()
            raise
        except asyncio.CancelledError:
            future.cancel()  # queued: it never starts
            raise
        finally:
            timer.cancel()


def _settle(answer: asyncio.Future[T], outcome: T | None, error: BaseException | None) -> None:
    """Give ``answer`` its outcome unless it has one (the time limit's, or a cancellation)."""
    if answer.done():
        return
    if error is None:
        answer.set_result(outcome)  # type: ignore[arg-type]
    else:
        answer.set_exception(error)


def _hand_over(
    loop: asyncio.AbstractEventLoop,
    answer: asyncio.Future[T],
    outcome: T | None,
    error: BaseException | None,
) -> None:
    """From the engine thread: settle ``answer`` on its event loop (gone if it closed)."""
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for the answer
        loop.call_soon_threadsafe(_settle, answer, outcome, error)
