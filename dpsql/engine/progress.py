"""Progress reporting: how a long query tells its caller which stage it is in and how far along.

A ``Progress`` is any callable ``(stage, fraction)``: ``stage`` names what is happening ("reading
data", "adding noise", ...), ``fraction`` is in [0, 1], or ``None`` when the stage cannot say how
far it is. The engine never prints; the CLI turns these calls into a progress bar.

``run_duckdb`` runs a DuckDB query in a worker thread while the calling thread polls DuckDB's own
estimate (``DuckDBPyConnection.query_progress``, a percentage, -1 while unknown). DuckDB releases
the GIL while it executes, so the poll runs alongside; the connection must track progress (see
``DuckDBBackend``: ``progress_bar_time = 0``, printing off), or every poll reads -1.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import duckdb

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ADDING_NOISE",
    "DONE",
    "POLL_SECONDS",
    "READING_DATA",
    "Progress",
    "accepts_progress",
    "no_progress",
    "relabel",
    "run_duckdb",
]

READING_DATA = "reading data"
ADDING_NOISE = "adding noise"
DONE = "done"

POLL_SECONDS = 0.1
"""How often ``run_duckdb`` asks DuckDB how far a query is."""


class Progress(Protocol):
    """Told the current stage and how far it is (``fraction`` in [0, 1], ``None``: unknown)."""

    def __call__(self, stage: str, fraction: float | None, /) -> None: ...


def no_progress(stage: str, fraction: float | None) -> None:
    """The default: report nothing."""


def relabel(progress: Progress, stage: str) -> Progress:
    """``progress`` with every report renamed to ``stage`` (a backend reports "reading data";
    the session knows which read it is)."""

    def report(reported: str, fraction: float | None) -> None:
        progress(stage, fraction)

    return report


def run_duckdb(
    connection: duckdb.DuckDBPyConnection,
    sql: str,
    progress: Progress,
    *,
    stage: str = READING_DATA,
    poll_seconds: float = POLL_SECONDS,
) -> pd.DataFrame:
    """``connection.execute(sql).df()``, reporting ``stage`` with DuckDB's progress estimate.

    Reports ``None`` first, then fractions that never decrease (DuckDB's estimate can fall back
    to -1 between pipelines and while the result is converted; those polls are skipped), and
    1.0 once the rows are in. An exception raised by the query is re-raised here unchanged.
    An exception in the calling thread (``KeyboardInterrupt``) interrupts the query and waits for
    the worker to stop before propagating, so no thread is left running.
    """
    outcome: dict[str, pd.DataFrame] = {}
    failure: list[BaseException] = []
    # Completion is signalled by an Event, not read from the Thread: a KeyboardInterrupt that
    # lands inside Thread.join can leave a running thread marked as stopped (CPython bpo-45274).
    done = threading.Event()

    def work() -> None:
        try:
            outcome["frame"] = connection.execute(sql).df()
        except BaseException as error:  # handed to the calling thread, which re-raises it
            failure.append(error)
        finally:
            done.set()

    worker = threading.Thread(target=work, name="dpsql-duckdb-query", daemon=True)
    progress(stage, None)
    try:
        worker.start()
        shown = 0.0
        while not done.wait(poll_seconds):
            percent = connection.query_progress()
            if percent >= 0 and not done.is_set():
                fraction = min(1.0, percent / 100.0)
                if fraction > shown:
                    shown = fraction
                    progress(stage, fraction)
        worker.join()
    except BaseException:
        _stop(connection, worker, done)
        raise
    if failure:
        raise failure[0]
    progress(stage, 1.0)
    return outcome["frame"]


def _stop(
    connection: duckdb.DuckDBPyConnection, worker: threading.Thread, done: threading.Event
) -> None:
    """Interrupt the query until the worker has finished with the connection.

    ``interrupt`` only affects a running query, and the worker may not have started it yet, so it
    is repeated; a second Ctrl-C while waiting does not abandon the worker.
    """
    while True:
        try:
            if done.is_set() or not worker.ident:  # finished, or never started
                break
            connection.interrupt()
            done.wait(POLL_SECONDS)
        except KeyboardInterrupt:
            continue
    with contextlib.suppress(KeyboardInterrupt, RuntimeError):  # RuntimeError: never started
        worker.join()


def accepts_progress(run: Callable[..., object]) -> bool:
    """Whether a backend's ``run`` takes a ``progress`` keyword (third-party backends written
    against ``run(sql)`` do not, and are then called without it)."""
    try:
        parameters = inspect.signature(run).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get("progress")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
