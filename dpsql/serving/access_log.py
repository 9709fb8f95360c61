"""The service's access log: one JSON line per request, on HTTP and the PostgreSQL port alike,
refusals included.

``AccessLog`` is ASGI middleware outside every other layer, so a request refused by the body
limit (413), the token check (401, 403), the rate limit (429) or the request's validation (400)
is logged like an answered one. A line holds the time, the client's address, the token's id
(never the token), the analyst and role it names, the method and path, the status, the problem
type of a refusal, the ε and δ an answer was charged, the statement's SHA-256 (never SQL text or
literals) and the duration. Endpoints add what they learn to ``scope["dpsql.access"]``
(``note``); the status and problem type are read from the response itself.

The PostgreSQL front door writes the same lines through ``AccessLogFile`` (method ``PG``, the
statement's kind as the endpoint, the HTTP status its refusal stands for and its SQLSTATE).

Lines are appended and flushed one by one through ``logging.handlers.WatchedFileHandler``, which
reopens the path when the file was moved or deleted: rotating by renaming (logrotate's default)
needs no signal, and every worker process follows on its next line.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from logging.handlers import WatchedFileHandler
from pathlib import Path
from typing import Any

__all__ = ["SCOPE_KEY", "AccessLog", "AccessLogFile", "new_line", "note"]

SCOPE_KEY = "dpsql.access"
_PROBLEM = b"application/problem+json"
_log = logging.getLogger("dpsql.serving")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def note(scope: Scope, **fields: Any) -> None:
    """Add ``fields`` to the access-log line of the request of ``scope`` (when logging)."""
    line = scope.get(SCOPE_KEY)
    if line is not None:
        line.update(fields)


def new_line(client: str | None, method: str, endpoint: str) -> dict[str, Any]:
    """A fresh line for a request of ``client`` (its fields filled in as the request goes)."""
    return {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "client": client,
        "token_id": None,
        "analyst": None,
        "role": None,
        "method": method,
        "endpoint": endpoint,
        "status": 500,
        "problem": None,
        "epsilon": 0.0,
        "delta": 0.0,
    }


class AccessLogFile:
    """The log file: one JSON line appended and flushed per ``write``; a renamed file is
    followed by a new one."""

    def __init__(self, path: str | Path):
        self.handler = WatchedFileHandler(path, encoding="utf-8")

    def write(self, line: dict[str, Any]) -> None:
        record = logging.makeLogRecord({"msg": json.dumps(line, separators=(",", ":"))})
        try:
            self.handler.handle(record)  # appends, flushes; reopens a moved file first
        except Exception:  # a full disk must not turn answers into failures
            _log.exception("cannot write the access log")

    def close(self) -> None:
        self.handler.close()


class AccessLog:
    """ASGI middleware appending one JSON line per HTTP request to ``path``."""

    def __init__(self, app: ASGIApp, *, path: str | Path):
        self.app = app
        self.file = AccessLogFile(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        client = scope.get("client")
        line = new_line(client[0] if client else None, scope["method"], scope["path"])
        scope[SCOPE_KEY] = line
        reading_problem = False

        async def sending(message: Message) -> None:
            nonlocal reading_problem
            if message["type"] == "http.response.start":
                line["status"] = message["status"]
                kind = dict(message.get("headers", ())).get(b"content-type", b"")
                reading_problem = kind.startswith(_PROBLEM)
            elif reading_problem and message["type"] == "http.response.body":
                reading_problem = False  # a problem document is sent in one piece
                try:
                    line["problem"] = json.loads(message.get("body", b"")).get("type")
                except (ValueError, AttributeError):
                    line["problem"] = None
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            line["problem"] = line["problem"] or "urn:dpsql:problem:internal"
            raise
        finally:
            line["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
            self.file.write(line)

    def close(self) -> None:
        self.file.close()
