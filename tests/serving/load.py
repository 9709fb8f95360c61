"""Concurrent clients for the service (used by the tests and ``benchmarks/bench_serve.py``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Reply:
    """One request's status, latency in seconds, and JSON body (None when not JSON)."""

    status: int
    seconds: float
    body: Any


def hammer(
    url: str, tokens: list[str], *, clients: int, per_client: int, body: dict[str, Any]
) -> list[Reply]:
    """``clients`` threads, each with its own keep-alive connection and the token
    ``tokens[i % len(tokens)]``, send ``per_client`` queries each, starting together."""
    replies: list[list[Reply]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients)

    def client(index: int) -> None:
        headers = {"Authorization": f"Bearer {tokens[index % len(tokens)]}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as session:
            start.wait()
            for _ in range(per_client):
                began = time.perf_counter()
                try:
                    response = session.post("/v1/query", json=body)
                except httpx.HTTPError:
                    replies[index].append(Reply(0, time.perf_counter() - began, None))
                    continue
                elapsed = time.perf_counter() - began
                is_json = "json" in response.headers.get("content-type", "")
                replies[index].append(
                    Reply(response.status_code, elapsed, response.json() if is_json else None)
                )

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [reply for per_thread in replies for reply in per_thread]
