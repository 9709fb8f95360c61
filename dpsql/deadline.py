"""The time limit of one request, honoured by every stage that computes for it.

A request (``Session.execute``, ``Session.explain``, a service call) runs within one
:class:`Deadline`. Python stages that loop over the query (parsing, binding, post-processing)
call :func:`check`; every DuckDB connection that works for the request (the backend's, the
post-processing sandbox's) runs inside :meth:`Deadline.watching`, and a watchdog interrupts it
when the time is up (one daemon thread for the whole process, not one per request: starting a
thread per request cost more than a simple query's own Python work). :meth:`Deadline.expire`
does the same at once (the service calls it when its own time limit passes), so a stopped
request frees its worker.

Whether the limit was passed before or after the charge decides what the caller sees: before,
nothing was charged and the request is refused (:class:`TimeLimitError`); after, the charge stands
and the failure is the one data-independent ``ExecutionError`` (``dpsql.engine.session``).

>>> with within(60.0) as limit:
...     check()
...     limit.expired
False
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from dpsql.errors import FAILED_AFTER_CHARGE, ExecutionError, TimeLimitError

__all__ = [
    "Deadline",
    "DeadlinePassed",
    "check",
    "current",
    "mark_charged",
    "request",
    "watching",
    "within",
]



class Interruptible(Protocol):
    """What a deadline stops: a DuckDB connection."""

    def interrupt(self) -> None: ...


class DeadlinePassed(Exception):
    """Raised by :func:`check` inside a request whose time is up (turned into a refusal before
    the charge, into the one ``ExecutionError`` after it)."""


class Deadline:
    """``seconds`` from now; interrupts the connections it watches when they pass."""

    def __init__(self, seconds: float):
        if not seconds > 0:
            raise ValueError(f"a time limit must be a positive number of seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.charged = False
        """Set by the session once the request's charge is recorded."""
        self._ends = time.monotonic() + self.seconds
        self._expired = threading.Event()
        self._lock = threading.Lock()
        self._watched: list[Interruptible] = []
        self.closed = False
        """Set when the request ends: the watchdog then forgets it."""
        _WATCHDOG.watch(self)

    @property
    def expired(self) -> bool:
        return self._expired.is_set() or time.monotonic() >= self._ends

    def expire(self) -> None:
        """End the request now: interrupt every watched connection; later checks raise."""
        with self._lock:
            self._expired.set()
            watched = list(self._watched)
        for connection in watched:
            with contextlib.suppress(Exception):
                connection.interrupt()

    def check(self) -> None:
        """Raise ``DeadlinePassed`` if the time is up."""
        if self.expired:
            raise DeadlinePassed

    @contextlib.contextmanager
    def watching(self, connection: Interruptible) -> Iterator[None]:
        """Run the block with ``connection`` interrupted when the deadline passes (at once if it
        has passed already: the block's statement then fails)."""
        with self._lock:
            self._watched.append(connection)
        try:
            if self.expired:
                self.expire()
            yield
        finally:
            with self._lock:
                self._watched.remove(connection)

    def refusal(self) -> TimeLimitError:
        """The refusal of a request that passed its limit before its charge."""
        return TimeLimitError(
            f"the request did not finish within its time limit of {self.seconds:g} s and was "
            "stopped before anything was charged; nothing was charged (narrow the query, or "
            "ask the administrator for a longer limit)"
        )

    def close(self) -> None:
        self.closed = True
        _WATCHDOG.forget(self)


class _Watchdog:
    """One daemon thread that expires every open deadline of the process when its time comes
    (the earliest first, from a heap); started on first use, and again in a forked child."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._open = 0
        self._thread: threading.Thread | None = None

    def watch(self, deadline: Deadline) -> None:
        with self._condition:
            entry = (deadline._ends, next(self._order), deadline)
            heapq.heappush(self._heap, entry)
            self._open += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dpsql-deadlines", daemon=True
                )
                self._thread.start()
            elif self._heap[0] is entry:
                self._condition.notify()

    def forget(self, deadline: Deadline) -> None:
        with self._condition:
            self._open -= 1
            if len(self._heap) > 2 * self._open + 64:  # closed ones wait at most this long
                self._heap = [entry for entry in self._heap if not entry[2].closed]
                heapq.heapify(self._heap)

    def _run(self) -> None:
        condition = self._condition
        while True:
            with condition:
                while self._heap and self._heap[0][2].closed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    condition.wait()
                    continue
                ends, _, deadline = self._heap[0]
                left = ends - time.monotonic()
                if left > 0:
                    condition.wait(left)
                    continue
                heapq.heappop(self._heap)
            deadline.expire()  # outside the lock: it interrupts connections


_WATCHDOG = _Watchdog()


_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "dpsql_deadline", default=None
)


def current() -> Deadline | None:
    """The deadline of the request running in this thread, if any."""
    return _current.get()


def check() -> None:
    """Raise ``DeadlinePassed`` if the current request's time is up (no-op outside one)."""
    deadline = _current.get()
    if deadline is not None:
        deadline.check()


@contextlib.contextmanager
def watching(connection: Interruptible) -> Iterator[None]:
    """:meth:`Deadline.watching` of the current request (no limit outside one)."""
    deadline = _current.get()
    if deadline is None:
        yield
        return
    with deadline.watching(connection):
        yield


@contextlib.contextmanager
def within(seconds: float) -> Iterator[Deadline]:
    """Run the block as a request limited to ``seconds``; inside a request already running (a
    service call around a session's ``execute``) the outer deadline governs."""
    outer = _current.get()
    if outer is not None:
        yield outer
        return
    deadline = Deadline(seconds)
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)
        deadline.close()


@contextlib.contextmanager
def request(seconds: float) -> Iterator[Deadline]:
    """:func:`within` for one analyst request: a failure once the time is up and before the
    charge (``Deadline.charged`` unset) becomes the refusal :class:`TimeLimitError`; after the
    charge every failure is the one ``ExecutionError``."""
    with within(seconds) as limit:
        refused = False
        try:
            yield limit
        except Exception as error:
            if not limit.expired or (isinstance(error, ExecutionError) and limit.charged):
                raise
            refused = True
        if refused:  # raised outside the handler: no chain carries the interrupted stage's error
            if limit.charged:
                raise ExecutionError(FAILED_AFTER_CHARGE)
            raise limit.refusal()


def mark_charged() -> None:
    """Record that the current request's charge is written (its failures are now the one
    ``ExecutionError``)."""
    deadline = _current.get()
    if deadline is not None:
        deadline.charged = True
