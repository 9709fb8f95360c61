"""Every request runs within its time limit: stopped before the charge it is refused and charges
nothing; stopped after it, the charge stands and the failure is the one ExecutionError."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql import deadline
from dpsql.engine.demo import DEMO_POLICY
from dpsql.engine.session import database_budget, set_policy
from dpsql.errors import (
    FAILED_AFTER_CHARGE,
    ExecutionError,
    PolicyError,
    TimeLimitError,
)
from dpsql.serving.runner import EngineRunner, RunnerTimeout
from dpsql.sql import postprocess

SLOW = "SELECT SUM(a.range * b.range) FROM range(100000000000) a, range(1000) b"
"""10^14 rows streamed past a small build side (nothing spills to disk): hours on any machine;
only an interrupt ends it early."""

POST = "SELECT country, COUNT(*) AS n FROM requests GROUP BY country ORDER BY n DESC"
"""A post-processed query (ORDER BY over the released rows)."""


def _finishes(work, seconds: float = 120.0):
    """Run ``work()`` in a thread and return its outcome; fail (not hang) if it has not ended
    after ``seconds``, a generous guard, not a speed target."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not finish within {seconds} s"
    return outcome


def _in_session(database: Path, work, seconds: float = 1.0) -> dict[str, object]:
    """``work(session)`` in a session opened on the guarded thread (SQLite connections stay on
    the thread that opened them); the outcome also holds the session's ledger afterwards."""

    set_policy(database, DEMO_POLICY.replace("[dataset]", f"[dataset]\ntime_limit = {seconds}", 1))

    def run():
        with dpsql.connect(database, analyst="alice") as db:
            try:
                return {"value": work(db), "ledger": db.ledger()}
            except Exception as error:
                return {"error": error, "ledger": db.ledger()}

    return _finishes(run)["value"]  # type: ignore[return-value]


def _slow_on(module, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``module``'s creation of the released table run ``SLOW`` on the sandbox first."""
    create = module.create_released

    def slow(connection, post):
        connection.execute(SLOW).fetchall()
        create(connection, post)

    monkeypatch.setattr(module, "create_released", slow)


def test_a_watched_connection_is_interrupted_at_the_deadline() -> None:
    connection = duckdb.connect(":memory:")
    with deadline.within(0.5) as limit:

        def work():
            with deadline.watching(connection):
                return connection.execute(SLOW).fetchall()

        outcome = _finishes(lambda: _in_context(limit, work))
    assert isinstance(outcome["error"], duckdb.InterruptException)
    assert limit.expired
    assert connection.execute("SELECT 42").fetchall() == [(42,)]  # usable afterwards


def test_one_watchdog_expires_every_deadline_in_time_order() -> None:
    """Requests start no thread of their own; deadlines opened in any order expire by time,
    and a closed one never expires."""
    deadline.Deadline(60.0).close()  # the watchdog runs from the first deadline on
    threads = threading.active_count()
    many = [deadline.Deadline(60.0) for _ in range(50)]
    assert threading.active_count() == threads
    for limit in many:
        limit.close()
    expired: list[float] = []

    class Clocked:
        def __init__(self, seconds: float) -> None:
            self.seconds = seconds

        def interrupt(self) -> None:
            expired.append(self.seconds)

    opened = []
    for seconds in (0.6, 0.2, 60.0, 0.4):
        limit = deadline.Deadline(seconds)
        limit._watched.append(Clocked(seconds))
        opened.append(limit)
    closed = deadline.Deadline(0.3)
    closed._watched.append(Clocked(0.3))
    closed.close()
    _finishes(lambda: opened[0]._expired.wait(30))
    assert expired == [0.2, 0.4, 0.6]
    assert not opened[2].expired and not closed._expired.is_set()
    for limit in opened:
        limit.close()


def _in_context(limit: deadline.Deadline, work):
    """``work()`` with ``limit`` as the current deadline (threads start with an empty one)."""
    token = deadline._current.set(limit)
    try:
        return work()
    finally:
        deadline._current.reset(token)


def test_check_raises_once_the_time_is_up_and_outer_deadlines_govern() -> None:
    with deadline.within(60.0) as outer:
        with deadline.within(1.0) as inner:
            assert inner is outer
        outer.expire()
        with pytest.raises(deadline.DeadlinePassed):
            deadline.check()
    deadline.check()  # outside a request: no limit


def test_a_stop_before_the_charge_refuses_and_charges_nothing(
    demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The post-processing check runs before the charge: stopped there, nothing is charged."""
    _slow_on(postprocess, monkeypatch)
    outcome = _in_session(demo_db, lambda db: db.execute(POST, epsilon=0.5))
    assert isinstance(outcome["error"], TimeLimitError)
    assert "time limit of 1 s" in str(outcome["error"])
    assert "nothing was charged" in str(outcome["error"])
    assert outcome["ledger"] == []
    explained = _in_session(demo_db, lambda db: db.explain(POST, epsilon=0.5))
    assert isinstance(explained["error"], TimeLimitError)
    assert database_budget(demo_db).dataset.epsilon_spent == 0.0


def test_a_stop_after_the_charge_is_the_one_execution_error(
    demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Post-processing runs after the charge: stopped there, the charge stands, one message, no
    chain; the session answers the next query."""
    from dpsql.engine import derived

    _slow_on(derived, monkeypatch)

    def twice(db: dpsql.Session) -> object:
        with pytest.raises(ExecutionError) as caught:
            db.execute(POST, epsilon=0.5)
        assert str(caught.value) == FAILED_AFTER_CHARGE
        assert caught.value.__cause__ is None and caught.value.__context__ is None
        assert len(db.ledger()) == 1
        monkeypatch.undo()
        return db.execute("SELECT COUNT(*) FROM requests", epsilon=0.5)

    outcome = _in_session(demo_db, twice)
    assert "error" not in outcome, outcome.get("error")
    assert "error" not in outcome, outcome
    assert outcome["value"].rows  # type: ignore[union-attr]
    assert database_budget(demo_db).dataset.epsilon_spent == 1.0


def test_the_time_limit_is_the_policys_positive_number_of_seconds(demo_db: Path) -> None:
    """Like the memory limit, the time limit is the administrator's: no analyst argument sets
    it (a limit the analyst chose could turn the size of one person's rows into a failure)."""
    for bad in ("0", "-1.0", "inf", "nan", "true", "'60'", "100000"):
        with pytest.raises(PolicyError, match="time_limit"):
            set_policy(demo_db, DEMO_POLICY.replace("[dataset]", f"[dataset]\ntime_limit = {bad}"))
    with pytest.raises(TypeError):
        dpsql.connect(demo_db, analyst="alice", time_limit=1.0)  # type: ignore[call-arg]


def test_the_service_runner_stops_post_processing_and_is_free_afterwards(
    demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's timeout reaches the post-processing sandbox (not only the backend): the
    engine thread is free for the next call, which is answered."""
    from dpsql.engine import derived

    _slow_on(derived, monkeypatch)
    runner = EngineRunner(demo_db)

    async def calls() -> object:
        with pytest.raises(RunnerTimeout):
            await runner.run(lambda s: s.execute(POST, epsilon=0.5), analyst="alice", timeout=1.0)
        monkeypatch.undo()
        return await runner.run(
            lambda s: s.execute("SELECT COUNT(*) FROM requests", epsilon=0.5),
            analyst="alice",
            timeout=60.0,
        )

    try:
        outcome = _finishes(lambda: asyncio.run(calls()))
    finally:
        runner.close()
    assert "error" not in outcome, outcome
    assert outcome["value"].rows  # type: ignore[union-attr]
    assert database_budget(demo_db).dataset.epsilon_spent == 1.0  # the stopped one was charged


_UNWATCHED = f"""
import duckdb
from dpsql.sql.postprocess import sandbox
sandbox().execute({SLOW!r}).fetchall()
"""


def test_broken_twin_without_the_deadline_the_sandbox_runs_on(tmp_path: Path) -> None:
    """The deliberately broken twin: the same slow statement on the same sandbox, not watched by
    a deadline, is still running after 5 s (the watched one above stops at its limit)."""
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [sys.executable, "-c", _UNWATCHED], timeout=5, check=False, cwd=tmp_path
        )
