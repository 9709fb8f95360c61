"""Concurrent clients for the service (used by the tests and ``benchmarks/bench_serve.py``).

Each client is a keep-alive ``http.client`` connection: the leanest Python HTTP client library,
so that latencies measure the service rather than the client library. ``OneWrite`` is leaner
still, for the benchmark's one-client latency: the least a client must do.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools


@dataclass(frozen=True)
class Reply:
    """One request's status (0: the connection failed), latency in seconds, and JSON body."""

    status: int
    seconds: float
    body: Any


class _Connection(http.client.HTTPConnection):
    """A keep-alive connection that sends small segments at once (TCP_NODELAY), as the server
    and httpx do: ``http.client`` writes a request's headers and body in two segments, and Nagle's
    algorithm would hold the body until the headers are acknowledged."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connection(url: str) -> http.client.HTTPConnection:
    """A keep-alive connection to the service at ``url``."""
    address = urlsplit(url)
    return _Connection(address.hostname or "127.0.0.1", address.port, timeout=120)


class OneWrite:
    """``POST /v1/query`` with one token and body on a keep-alive socket: each request is sent in
    one write and the response read by httptools (the parser uvicorn uses) to its last byte.

    ``http.client`` sends a request's headers and body in two writes, which the server reads
    as two segments, and parses a response's headers with the ``email`` package; this client
    does neither, so that its latency is the service's (the body's JSON is not decoded).
    """

    def __init__(self, url: str, token: str, body: dict[str, Any]):
        address = urlsplit(url)
        payload = json.dumps(body).encode()
        head = (
            f"POST /v1/query HTTP/1.1\r\nHost: {address.netloc}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        self._request = head.encode() + payload
        self._socket = socket.create_connection(
            (address.hostname or "127.0.0.1", address.port or 80), timeout=120
        )
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._complete = False

    def on_body(self, body: bytes) -> None:
        """httptools: a piece of the body arrived."""
        self._body.append(body)

    def on_message_complete(self) -> None:
        """httptools: the response is complete."""
        self._complete = True

    def __call__(self) -> tuple[int, bytes]:
        """Send the query; the response's status and body."""
        self._body.clear()
        self._complete = False
        self._socket.sendall(self._request)
        while not self._complete:
            received = self._socket.recv(65536)
            if not received:
                raise ConnectionError("the service closed the connection")
            self._parser.feed_data(received)
        return self._parser.get_status_code(), b"".join(self._body)

    def close(self) -> None:
        self._socket.close()


def query(connection: http.client.HTTPConnection, token: str, body: dict[str, Any]) -> Reply:
    """``POST /v1/query`` with ``body`` on ``connection``."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return _send(connection, json.dumps(body).encode(), headers)


def _send(connection: http.client.HTTPConnection, payload: bytes, headers: dict) -> Reply:
    began = time.perf_counter()
    try:
        connection.request("POST", "/v1/query", payload, headers)
        response = connection.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException):
        connection.close()  # reconnects on the next request
        return Reply(0, time.perf_counter() - began, None)
    elapsed = time.perf_counter() - began
    is_json = "json" in (response.getheader("content-type") or "")
    return Reply(response.status, elapsed, json.loads(data) if is_json else None)


def hammer(
    url: str, tokens: list[str], *, clients: int, per_client: int, body: dict[str, Any]
) -> list[Reply]:
    """``clients`` threads, each with its own keep-alive connection and the token
    ``tokens[i % len(tokens)]``, send ``per_client`` queries each, starting together."""
    payload = json.dumps(body).encode()
    replies: list[list[Reply]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients)

    def client(index: int) -> None:
        headers = {
            "Authorization": f"Bearer {tokens[index % len(tokens)]}",
            "Content-Type": "application/json",
        }
        kept = connection(url)
        try:
            start.wait()
            replies[index] = [_send(kept, payload, headers) for _ in range(per_client)]
        finally:
            kept.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [reply for per_thread in replies for reply in per_thread]
