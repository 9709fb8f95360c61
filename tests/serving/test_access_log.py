"""``dpsql serve --access-log``: one JSON line per request, refusals included, no SQL text, and a
file renamed by log rotation is followed by a new one."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving.conftest import Server, serve, stop

SECRET_LITERAL = "NO"
SQL = f"SELECT COUNT(*) AS n FROM requests WHERE country = '{SECRET_LITERAL}'"


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    directory = tmp_path_factory.mktemp("logged")
    log = directory / "access.jsonl"
    running = serve(
        directory, "--access-log", str(log), "--max-body-bytes", "2048", "--rate-limit", "12",
        "--workers", "2",
    )  # fmt: skip
    try:
        yield running, log
    finally:
        stop(running.process)


def lines(log: Path, count: int, *, probes: bool = False) -> list[dict]:
    """The log's lines once it has at least ``count`` (a line is written as the response ends);
    without ``probes``, leaving out /v1/health, whose lines from the fixture's readiness probes
    may land after a test starts counting."""
    ends = time.monotonic() + 10
    while True:
        found = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if not probes:
            found = [line for line in found if line.get("endpoint") != "/v1/health"]
        if len(found) >= count or time.monotonic() > ends:
            return found
        time.sleep(0.05)


def _settled(log: Path) -> int:
    """The log's line count once no line has arrived for half a second (each worker writes its
    line as its response ends, which may be after the client has the response)."""
    count, ends = -1, time.monotonic() + 10
    while time.monotonic() < ends:
        now = len(log.read_text().splitlines()) if log.exists() else 0
        if now == count:
            return count
        count = now
        time.sleep(0.5)
    return count


def test_every_request_is_one_line_without_sql(logged: tuple[Server, Path]) -> None:
    server, log = logged
    before = len(lines(log, 0))
    answered = server.query(server.alice, {"sql": SQL, "epsilon": 0.1})
    assert answered.status_code == 200
    server.call("GET", "/v1/budget", None)  # 401: no token
    server.call("GET", "/v1/budget", "dpsql_0000_forged")  # 401: invalid token
    server.call("GET", "/v1/ledger/verify", server.alice)  # 403: wrong role
    server.query(server.alice, {"sql": "x" * 4000})  # 413: body too long
    server.call("POST", "/v1/query", server.alice, content=b"{not json",
                headers={"Content-Type": "application/json"})  # fmt: skip  # 400 malformed
    server.query(server.alice, {"sql": "SELECT COUNT(*) FROM salaries", "epsilon": 0.1})  # 400
    server.call("GET", "/v1/nowhere", None)  # 404
    statuses = [server.call("GET", "/v1/me", server.bob).status_code for _ in range(14)]
    assert 429 in statuses
    found = lines(log, before + 22)[before:]
    assert len(found) == 22
    text = log.read_text()
    assert SECRET_LITERAL not in text.replace('"NO"', "") and "country" not in text
    assert server.alice not in text and server.bob not in text  # token ids only
    assert "salaries" not in text

    query = found[0]
    assert query["endpoint"] == "/v1/query" and query["method"] == "POST"
    assert query["status"] == 200 and query["problem"] is None
    assert query["analyst"] == "alice" and query["role"] == "analyst"
    assert server.alice.startswith(f"dpsql_{query['token_id']}_")
    assert query["epsilon"] == pytest.approx(0.1) and query["delta"] == 0
    assert query["sql_sha256"] == hashlib.sha256(SQL.encode()).hexdigest()
    assert query["client"] == "127.0.0.1" and query["duration_ms"] > 0
    assert query["ledger_entry"] == answered.json()["ledger_entry"]

    refusals = [(line["status"], line["problem"], line["analyst"]) for line in found[1:8]]
    kind = "urn:dpsql:problem:"
    assert refusals == [
        (401, kind + "unauthorized", None),
        (401, kind + "unauthorized", None),
        (403, kind + "forbidden", "alice"),
        (413, kind + "too-large", None),
        (400, kind + "parameter", "alice"),
        (400, kind + "schema", "alice"),
        (404, kind + "not-found", None),
    ]
    assert all(line["epsilon"] == 0 for line in found[1:])
    limited = [line for line in found[8:] if line["status"] == 429]
    assert limited and {line["problem"] for line in limited} == {kind + "rate-limited"}
    assert {line["analyst"] for line in found[8:]} == {"bob"}


def test_a_renamed_log_is_followed_by_a_new_file(logged: tuple[Server, Path]) -> None:
    server, log = logged
    server.call("GET", "/v1/health", None)
    count = _settled(log)
    rotated = log.with_suffix(".1")
    log.rename(rotated)  # what logrotate does, without copytruncate or a signal
    for _ in range(4):  # reaches both workers
        assert server.call("GET", "/v1/health", None).status_code == 200
    fresh = lines(log, 4, probes=True)
    assert len(fresh) == 4 and {line["endpoint"] for line in fresh} == {"/v1/health"}
    assert len(rotated.read_text().splitlines()) == count  # nothing more went to the old file
