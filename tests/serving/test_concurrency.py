"""Concurrency at the cap: many clients on two workers never pass the dataset cap together."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from dpsql.accountant.units import Cost
from dpsql.engine.demo import DEMO_POLICY
from tests.serving.conftest import serve, stop
from tests.serving.load import hammer

EPSILON = 0.1
ADMITTED = 30  # the cap admits exactly this many queries of EPSILON
# Allocations of 2.0 each (20 queries) over a cap of 3.0 (30 queries): the cap binds.
CAPPED = DEMO_POLICY.replace("epsilon = 10.0", f"epsilon = {ADMITTED * EPSILON:.1f}").replace(
    "epsilon = 4.0", "epsilon = 2.0"
)
QUERY = {"sql": "SELECT COUNT(*) AS n FROM requests", "epsilon": EPSILON}


def test_exactly_the_cap_is_answered(tmp_path: Path) -> None:
    server = serve(tmp_path, "--workers", "2", "--rate-limit", "100000", policy=CAPPED)
    try:
        replies = hammer(
            server.url, [server.alice, server.bob], clients=16, per_client=50, body=QUERY
        )
        statuses = Counter(reply.status for reply in replies)
        assert statuses == {200: ADMITTED, 409: 16 * 50 - ADMITTED}
        entries = server.entries()  # verified on open
        charges = [e for e in entries if e["kind"] == "charge"]
        assert len(charges) == ADMITTED
        assert (
            sum(e["epsilon_units"] for e in charges)
            == Cost.cap(ADMITTED * EPSILON, 0).epsilon_units
        )
        answered = {reply.body["ledger_entry"] for reply in replies if reply.status == 200}
        assert answered == {e["seq"] for e in charges}
    finally:
        stop(server.process)


def live_workers(pid: int) -> list[int]:
    """The worker processes under the server (uvicorn's supervisor) that are running."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    alive = []
    for child in children:
        status, command = Path(f"/proc/{child}/status"), Path(f"/proc/{child}/cmdline")
        try:  # multiprocessing's resource tracker is a child too; workers run spawn_main
            if b"spawn_main" in command.read_bytes() and "State:\tZ" not in status.read_text():
                alive.append(int(child))
        except FileNotFoundError:
            continue
    return alive


def test_a_killed_worker_leaves_no_answer_without_a_charge(tmp_path: Path) -> None:
    server = serve(tmp_path, "--workers", "2", "--rate-limit", "100000", rows=200_000)
    try:
        workers = live_workers(server.process.pid)
        assert len(workers) == 2
        replies: list = []
        body = {**QUERY, "epsilon": 0.01}
        load = threading.Thread(
            target=lambda: replies.extend(
                hammer(server.url, [server.alice], clients=4, per_client=40, body=body)
            )
        )
        load.start()
        deadline = time.monotonic() + 60
        while len(server.entries()) < 12 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(workers[0], signal.SIGKILL)
        assert load.is_alive(), "the load ended before the kill"
        load.join()
        charges = {e["seq"]: e for e in server.entries() if e["kind"] == "charge"}
        answered = [reply.body["ledger_entry"] for reply in replies if reply.status == 200]
        assert answered and all(charges[seq]["analyst"] == "alice" for seq in answered)
        assert len(answered) == len(set(answered)) and len(charges) >= len(answered)
        assert {reply.status for reply in replies} <= {200, 0}
        while len(live_workers(server.process.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # uvicorn's supervisor replaces the dead worker
        assert len(live_workers(server.process.pid)) == 2
        after = hammer(server.url, [server.alice], clients=4, per_client=3, body=QUERY)
        assert {reply.status for reply in after} == {200}
    finally:
        stop(server.process)
