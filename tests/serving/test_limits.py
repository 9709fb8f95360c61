"""Limits and the runner, in process: rate buckets, time limits, defects without details."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from dpsql.engine.demo import DEMO_POLICY
from dpsql.engine.session import database_ledger, ledger_path, set_policy
from dpsql.errors import LedgerError, SchemaError
from dpsql.serving.app import create_app
from dpsql.serving.limits import RateLimiter, ServerSettings
from dpsql.serving.runner import EngineRunner, RunnerTimeout
from dpsql.serving.tokens import TokenStore
from tests.serving.conftest import demo_database


@pytest.mark.parametrize("shared", [False, True])
def test_rate_limiter_refills_at_the_rate(tmp_path: Path, shared: bool) -> None:
    now = [0.0]
    path = tmp_path / "rate.sqlite" if shared else None
    limiter = RateLimiter(60, path, clock=lambda: now[0])
    assert all(limiter.admit("a") is None for _ in range(60))
    assert limiter.admit("a") == pytest.approx(1.0)
    assert limiter.admit("b") is None
    now[0] = 2.0
    assert limiter.admit("a") is None and limiter.admit("a") is None
    assert limiter.admit("a") is not None
    if shared:  # another worker's limiter sees the same, empty, bucket
        other = RateLimiter(60, path, clock=lambda: now[0])
        assert other.admit("a") is not None
        other.close()
    limiter.close()


def test_a_timeout_after_the_charge_keeps_the_charge(tmp_path: Path) -> None:
    database = demo_database(tmp_path)
    runner = EngineRunner(database)

    def charged_then_slow(session):
        session.execute("SELECT COUNT(*) FROM requests", epsilon=0.1)
        time.sleep(0.5)
        return "answer"

    try:
        with pytest.raises(RunnerTimeout):
            asyncio.run(runner.run(charged_then_slow, analyst="alice", timeout=0.2))
        time.sleep(0.5)
        charges = [e for e in database_ledger(database) if e["kind"] == "charge"]
        assert len(charges) == 1
        answer = asyncio.run(runner.run(lambda s: s.budget(), analyst="alice", timeout=30))
        assert answer.for_analyst("alice").epsilon_spent == pytest.approx(0.1)
    finally:
        runner.close()


def test_a_call_queued_past_its_limit_never_runs(tmp_path: Path) -> None:
    """Time queued counts: a call still waiting for the engine thread when its limit passes is
    answered with a timeout and never starts; the call ahead of it is answered."""
    database = demo_database(tmp_path)
    runner = EngineRunner(database)
    started: list[str] = []

    def slow(session):
        started.append("slow")
        time.sleep(0.6)
        return "slow answer"

    def queued(session):
        started.append("queued")
        return "queued answer"

    async def both():
        return await asyncio.gather(
            runner.run(slow, analyst="alice", timeout=30),
            runner.run(queued, analyst="alice", timeout=0.2),
            return_exceptions=True,
        )

    try:
        began = time.monotonic()
        first, second = asyncio.run(both())
        assert first == "slow answer"
        assert isinstance(second, RunnerTimeout)
        time.sleep(0.2)
        assert started == ["slow"]
        assert time.monotonic() - began < 5
    finally:
        runner.close()


def test_a_running_scan_is_interrupted_at_the_limit(tmp_path: Path) -> None:
    """A call past its limit is answered with a timeout and DuckDB is stopped mid-scan; the
    worker's next call runs normally."""
    database = demo_database(tmp_path)
    runner = EngineRunner(database)
    endless = "SELECT SUM(i) FROM range(10000000000000) AS t(i)"

    def scan(session):
        runner._backend._connection.execute(endless).fetchall()  # the runner's own backend

    try:
        asyncio.run(runner.run(lambda s: s.budget(), analyst="alice", timeout=30))
        with pytest.raises(RunnerTimeout):
            asyncio.run(runner.run(scan, analyst="alice", timeout=0.3))
        started = time.monotonic()
        answer = asyncio.run(
            runner.run(
                lambda s: s.execute("SELECT COUNT(*) FROM requests", epsilon=1.0).rows[0][0],
                analyst="alice",
                timeout=30,
            )
        )
        assert time.monotonic() - started < 10  # the scan was stopped, not run out (hours)
        assert abs(answer - 20_000) <= 1_000  # scale 20 (20 rows a unit): P(|noise| > 800) = e^-40
    finally:
        runner.close()


def test_defects_are_500_without_details(tmp_path: Path, monkeypatch) -> None:
    database = demo_database(tmp_path)
    with TokenStore(database) as store:
        token, _ = store.create("alice")
    app = create_app(ServerSettings(database=str(database)))

    def broken(*args, **kwargs):
        raise RuntimeError("row value 4242 leaked")

    monkeypatch.setattr("dpsql.engine.session.Session.execute", broken)

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(
                "/v1/query",
                json={"sql": "SELECT COUNT(*) FROM requests"},
                headers={"Authorization": f"Bearer {token}"},
            )

    response = asyncio.run(call())
    assert response.status_code == 500
    assert response.json()["type"] == "urn:dpsql:problem:internal"
    assert "4242" not in response.text and "Traceback" not in response.text


def test_settings_are_validated_once() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerSettings(database="x", max_body_bytes=1)
    with pytest.raises(ValueError, match="extra"):
        ServerSettings(database="x", seed=1)


def test_an_edited_ledger_stops_a_running_worker(tmp_path: Path) -> None:
    database = demo_database(tmp_path)
    runner = EngineRunner(database, verify_every=0.0)
    query = "SELECT COUNT(*) FROM requests"
    try:
        asyncio.run(
            runner.run(lambda s: s.execute(query, epsilon=0.1), analyst="alice", timeout=30)
        )
        connection = sqlite3.connect(ledger_path(database))
        connection.execute("DROP TRIGGER entries_no_update")
        connection.execute("UPDATE entries SET epsilon_units = 1 WHERE kind = 'charge'")
        connection.commit()
        connection.close()
        with pytest.raises(LedgerError, match="fails verification at entry 2"):
            asyncio.run(runner.run(lambda s: s.budget(), analyst="alice", timeout=30))
    finally:
        runner.close()


def test_a_new_policy_applies_from_the_next_call_without_a_restart(tmp_path: Path) -> None:
    """The backend follows the policy in force: a table the administrator adds from a file
    source is answered by the running worker's next call."""
    database = demo_database(tmp_path)
    (tmp_path / "visits.csv").write_text(
        "user_id,seconds\n" + "".join(f"{i},{i % 50}\n" for i in range(300))
    )
    runner = EngineRunner(database)
    visits = "SELECT COUNT(*) AS n FROM visits"

    def count(session):
        return session.execute(visits, epsilon=1000.0).rows[0][0]

    try:
        with pytest.raises(SchemaError, match="visits"):
            asyncio.run(runner.run(count, analyst="alice", timeout=30))
        set_policy(
            database,
            DEMO_POLICY.replace("epsilon = 10.0", "epsilon = 100000.0").replace(
                "epsilon = 4.0", "epsilon = 50000.0"
            )
            + '\n[tables.visits]\nprivacy_unit = "user_id"\nsource = "visits.csv"\n'
            'source_columns = [["user_id", "BIGINT"], ["seconds", "BIGINT"]]\n',
        )
        answer = asyncio.run(runner.run(count, analyst="alice", timeout=30))
        assert abs(answer - 300) <= 1  # discrete Laplace of scale 1/1000
        requests = asyncio.run(
            runner.run(
                lambda s: s.execute("SELECT COUNT(*) FROM requests", epsilon=1000.0).rows[0][0],
                analyst="alice",
                timeout=30,
            )
        )
        assert 19_000 < requests <= 20_001  # the database file is still attached
    finally:
        runner.close()
