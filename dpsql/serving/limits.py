"""Limits the administrator sets on the service: body size, SQL length, rate, query time, and
the PostgreSQL port's address, connections and idle time.

``ServerSettings`` is validated once when the service starts. The rate limit is a token bucket
per access token, shared by the workers through ``<database>.dpsql.rate.sqlite`` (a file of its
own, so that it never waits on the ledger's lock).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BodyLimit", "RateLimiter", "ServerSettings"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ServerSettings(BaseModel):
    """What ``dpsql serve`` runs with; every limit is the administrator's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database: str
    max_body_bytes: int = Field(64 * 1024, ge=1024, description="largest request body")
    max_sql_length: int = Field(20_000, ge=16, description="longest SQL text, in characters")
    rate_per_minute: int = Field(600, ge=1, description="requests per token per minute")
    query_timeout: float = Field(60.0, gt=0, description="seconds a request may wait and run")
    verify_every: float = Field(60.0, ge=0, description="seconds between checks of the chain")
    access_log: str | None = Field(None, description="file of the access log (JSON lines)")
    pg_host: str = Field("127.0.0.1", description="address of the PostgreSQL port")
    pg_port: int | None = Field(None, ge=0, le=65535, description="PostgreSQL port (None: off)")
    pg_reuse_port: bool = Field(False, description="workers share the PostgreSQL port")
    pg_max_connections: int = Field(64, ge=1, description="PostgreSQL connections per worker")
    pg_tls_cert: str | None = Field(None, description="certificate chain of the PostgreSQL port")
    pg_tls_key: str | None = Field(None, description="its private key; with both, TLS is required")
    pg_idle_timeout: float = Field(
        600.0, gt=0, description="seconds a PostgreSQL connection may wait for its next message"
    )


class RateLimiter:
    """A token bucket per key: ``per_minute`` requests a minute, bursts up to ``per_minute``.

    With ``path`` the buckets live in that SQLite file, so every worker of the service draws
    from the same bucket (one short write transaction per request; durability is not needed,
    so it skips fsync). Without it they live in this process's memory.
    """

    def __init__(
        self,
        per_minute: int,
        path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.capacity = float(per_minute)
        self.refill_per_second = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        if path is not None:
            self._connection = sqlite3.connect(
                path, timeout=10, isolation_level=None, check_same_thread=False
            )
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=OFF")
            self._connection.execute(
                "CREATE TABLE IF NOT EXISTS buckets (key TEXT PRIMARY KEY, level REAL, at REAL)"
            )

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def _take(self, level: float, then: float, now: float) -> tuple[float, float | None]:
        level = min(self.capacity, level + max(0.0, now - then) * self.refill_per_second)
        if level >= 1.0:
            return level - 1.0, None
        return level, (1.0 - level) / self.refill_per_second

    def admit(self, key: str) -> float | None:
        """Take one request from ``key``'s bucket: None if admitted, else seconds to wait."""
        with self._lock:
            now = self._clock()
            if self._connection is None:
                level, wait = self._take(*self._buckets.get(key, (self.capacity, now)), now)
                self._buckets[key] = (level, now)
                return wait
            connection = self._connection
            connection.execute("BEGIN IMMEDIATE")
            try:
                row = connection.execute(
                    "SELECT level, at FROM buckets WHERE key = ?", (key,)
                ).fetchone()
                level, wait = self._take(*(row or (self.capacity, now)), now)
                connection.execute(
                    "INSERT OR REPLACE INTO buckets (key, level, at) VALUES (?, ?, ?)",
                    (key, level, now),
                )
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
            return wait


class BodyLimit:
    """ASGI middleware refusing request bodies above ``max_bytes`` with ``too_large`` (413),
    whether the client declares the length or streams the body without one."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        too_large: Callable[[int], ASGIApp],
    ):
        self.app = app
        self.max_bytes = max_bytes
        self.too_large = too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self.too_large(self.max_bytes)(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self.too_large(self.max_bytes)(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
