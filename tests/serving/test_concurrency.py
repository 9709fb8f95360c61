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


def workers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children]


def test_a_killed_worker_leaves_no_answer_without_a_charge(tmp_path: Path) -> None:
    server = serve(tmp_path, "--workers", "2", "--rate-limit", "100000", rows=200_000)
    try:
        workers = [p for p in workers_of(server.process.pid) if Path(f"/proc/{p}").exists()]
        assert len(workers) >= 2
        killer = threading.Timer(1.0, lambda: os.kill(workers[0], signal.SIGKILL))
        killer.start()
        replies = hammer(
            server.url,
            [server.alice],
            clients=4,
            per_client=15,
            body={**QUERY, "epsilon": 0.01},
        )
        killer.join()
        charges = {e["seq"]: e for e in server.entries() if e["kind"] == "charge"}
        answered = [reply.body["ledger_entry"] for reply in replies if reply.status == 200]
        assert all(charges[seq]["analyst"] == "alice" for seq in answered)
        assert len(answered) == len(set(answered)) and len(charges) >= len(answered)
        assert {reply.status for reply in replies} <= {200, 0}
        time.sleep(2)
        after = hammer(server.url, [server.alice], clients=2, per_client=3, body=QUERY)
        assert {reply.status for reply in after} == {200}
    finally:
        stop(server.process)
