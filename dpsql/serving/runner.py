"""Engine calls on the worker's event-loop thread, one at a time, with a time limit.

DuckDB lets a process hold one read-only, configuration-locked connection to a database file,
and SQLite connections may not move between threads. So each worker owns one backend (opened
from the policy when the first call arrives), shared by one session per analyst (opening a
session verifies the whole ledger, so it is done once), and runs every engine call on the thread
that serves its requests, as a synchronous worker does: the worker answers one request at a time
(DuckDB parallelises inside a query) and the service scales across requests with ``--workers``,
whose idle workers answer health checks and refusals while another runs a query.

Running the call where the request arrived, rather than handing it to an engine thread and back,
saves two thread wake-ups per query: on an idle virtual machine each costs as much as the rest
of the service's work on a request (``benchmarks/bench_serve.py``).

A watchdog thread interrupts DuckDB when a call passes its time limit; a call that ends past the
limit (interrupted or not) is answered with ``RunnerTimeout``, and if it was charged, the charge
stands, as everywhere in dpsql.

The backend is opened from the policy (its file sources, its memory limit). Before each call the
runner reads which policy entry is in force (an indexed lookup in the ledger); when the
administrator has set a new one, the sessions and the backend are closed and reopened from it,
so a new source table or memory limit applies from the next call, without a restart.

A local session verifies the whole ledger whenever it opens; a worker's sessions live long, so
the runner re-verifies the chain before a call once ``verify_every`` seconds have passed since
the last check: an edited ledger stops the service within that time (``LedgerError``, 503).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dpsql.accountant.ledger import Ledger
from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.session import Session, ledger_path, show_policy

__all__ = ["EngineRunner", "RunnerTimeout"]

T = TypeVar("T")


class RunnerTimeout(Exception):
    """An engine call passed its time limit (it was interrupted, or ended too late)."""


class _Watchdog:
    """A thread that calls ``interrupt`` once the armed call passes its deadline.

    Arming, disarming and firing hold one lock, so once ``disarm`` returns the watchdog cannot
    interrupt anything, and ``fired`` says whether it interrupted the call it watched. The
    thread wakes at the armed deadline, or every ``idle`` seconds; arming wakes it only for a
    deadline before its next wake-up, so a call with a long limit costs no thread switch.
    """

    def __init__(self, interrupt: Callable[[], None], idle: float = 1.0):
        self._interrupt = interrupt
        self._idle = idle
        self._condition = threading.Condition()
        self._deadline: float | None = None
        self._wake_at = 0.0
        self._fired = False
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="dpsql-watchdog", daemon=True)
        self._thread.start()

    def arm(self, deadline: float) -> None:
        with self._condition:
            self._deadline, self._fired = deadline, False
            if deadline < self._wake_at:
                self._condition.notify()

    def disarm(self) -> bool:
        """Stop watching; True if the call was interrupted."""
        with self._condition:
            self._deadline = None
            return self._fired

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._thread.join()

    def _watch(self) -> None:
        with self._condition:
            while not self._closed:
                now = time.monotonic()
                if self._deadline is not None and self._deadline <= now:
                    self._deadline, self._fired = None, True
                    self._interrupt()
                    continue
                self._wake_at = min(self._deadline or math.inf, now + self._idle)
                self._condition.wait(self._wake_at - now)


class EngineRunner:
    """Runs engine work on the thread that calls it, within a time limit."""

    def __init__(self, database: str | Path, *, verify_every: float = 60.0):
        self.database = Path(database)
        self.verify_every = verify_every
        self._backend: DuckDBBackend | None = None
        self._sessions: dict[str, Session] = {}
        self._ledger: Ledger | None = None
        self._policy_entry: int | None = None
        self._verified = time.monotonic()
        self._watchdog = _Watchdog(self._interrupt)

    def close(self) -> None:
        """Close the sessions, the backend and the ledger, and stop the watchdog."""
        self._watchdog.close()
        self._close_engine()
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    def _close_engine(self) -> None:
        for session in self._sessions.values():
            session.close()  # closing the shared backend again is harmless
        self._sessions.clear()
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def _session(self, analyst: str) -> Session:
        session = self._sessions.get(analyst)
        if session is None:
            if self._backend is None:
                self._backend = DuckDBBackend.for_policy(self.database, show_policy(self.database))
            session = Session(self.database, analyst=analyst, backend=self._backend)
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

    def _interrupt(self) -> None:
        # DuckDBBackend keeps its connection private; interrupting it is the one way to stop a
        # running scan from another thread (the engine then raises an error, answered as a
        # timeout). Interrupting an idle connection does nothing.
        connection = getattr(self._backend, "_connection", None)
        if connection is not None:
            connection.interrupt()

    def call(
        self, work: Callable[[Session | None], T], *, analyst: str | None, timeout: float
    ) -> T:
        """``work(session)`` (``session`` is None without ``analyst``), here and now.

        Raise ``RunnerTimeout`` if it passes ``timeout`` seconds: DuckDB is interrupted at the
        limit, and a call that ends later (in Python) is refused when it ends.
        """
        deadline = time.monotonic() + timeout
        self._watchdog.arm(deadline)
        try:
            self._follow_policy(self._verify())
            answer = work(None if analyst is None else self._session(analyst))
        except Exception:
            if self._watchdog.disarm():
                raise RunnerTimeout from None
            raise
        if self._watchdog.disarm() or time.monotonic() > deadline:
            raise RunnerTimeout
        return answer

    async def run(
        self, work: Callable[[Session | None], T], *, analyst: str | None, timeout: float
    ) -> T:
        """``call``, from a coroutine on the worker's event loop (which it blocks meanwhile)."""
        return self.call(work, analyst=analyst, timeout=timeout)
