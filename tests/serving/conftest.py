"""Fixtures: the real service (``dpsql serve`` in a subprocess) on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dpsql.engine.demo import DEMO_POLICY, build_demo
from dpsql.engine.session import database_ledger, set_policy
from dpsql.serving.tokens import TokenStore


@dataclass(frozen=True)
class Server:
    """A running service, its database and tokens."""

    url: str
    database: Path
    alice: str
    bob: str
    auditor: str
    process: subprocess.Popen[bytes]
    pg_port: int | None = None

    def call(self, method: str, path: str, token: str | None, **kwargs) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=60, **kwargs)

    def query(self, token: str, body: dict, **kwargs) -> httpx.Response:
        return self.call("POST", "/v1/query", token, json=body, **kwargs)

    def entries(self) -> list[dict]:
        return database_ledger(self.database)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def demo_database(directory: Path, policy: str = DEMO_POLICY, rows: int = 20_000) -> Path:
    database = build_demo(directory / "demo.duckdb", rows=rows, users=2_000)
    set_policy(database, policy)
    return database


def start(database: Path, *flags: str) -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``dpsql serve`` on ``database`` and wait until it answers /v1/health."""
    port = free_port()
    command = [sys.executable, "-m", "dpsql.cli", "serve", "--db", str(database)]
    process = subprocess.Popen(
        [*command, "--port", str(port), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dpsql serve exited: {process.stderr.read().decode()}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return url, process
        except httpx.HTTPError:
            time.sleep(0.1)
    stop(process)
    raise RuntimeError("dpsql serve did not start within 60 s")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server and its workers (its own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if process.stderr is not None:
        process.stderr.close()


def serve(
    directory: Path,
    *flags: str,
    policy: str = DEMO_POLICY,
    rows: int = 20_000,
    postgres: bool = False,
):
    """A fresh demo database with tokens for alice, bob and an auditor, served with ``flags``
    (and with ``postgres``, on a free PostgreSQL port too)."""
    database = demo_database(directory, policy, rows)
    with TokenStore(database) as store:
        alice, _ = store.create("alice")
        bob, _ = store.create("bob")
        auditor, _ = store.create("carol", "auditor")
    pg_port = free_port() if postgres else None
    if pg_port is not None:
        flags = (*flags, "--pg-port", str(pg_port))
    url, process = start(database, *flags)
    return Server(url, database, alice, bob, auditor, process, pg_port)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One service per test module, with small limits to test them."""
    running = serve(
        tmp_path_factory.mktemp("served"),
        "--max-body-bytes",
        "4096",
        "--max-sql-length",
        "2000",
    )
    try:
        yield running
    finally:
        stop(running.process)
