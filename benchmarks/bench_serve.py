"""``dpsql serve`` against the local Python API, in one run, on the demo data.

Latency and throughput of ``POST /v1/query`` (a COUNT over ``--rows`` rows) with 1, 4 and 16
concurrent clients on loopback, and of the same query over the PostgreSQL port (``--pg-port``,
psycopg 3), as ratios against the same query through ``dpsql.connect`` in this process; then
correctness at the cap: 16 clients x 50 queries against a cap that admits exactly K. Every loop
is bounded; the script stops by itself.

    .venv/bin/python benchmarks/bench_serve.py [--rows 100000] [--per-client 200] [--repeats 60]
        [--workers 2] [--runs 1] [--pause-ms 1.0]

The 1-client latency takes the clients (local API, HTTP, remote client, PostgreSQL port) in
rotating blocks of 10 queries, so load from elsewhere on the machine slows all alike; the
concurrency table's ratios are against that local median. What the service adds is measured with
the leanest client (``OneWrite``: one write per request, the response read to its last byte by
httptools); ``http.client`` and ``dpsql.connect(url)`` are shown beside it, and the machine's
load average with each run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test harness starts servers

import psycopg

import dpsql
from dpsql.accountant.units import Cost
from dpsql.engine.demo import DEMO_POLICY
from tests.serving.conftest import Server, demo_database, serve, stop
from tests.serving.load import OneWrite, connection, hammer, query
from tests.serving.test_concurrency import ADMITTED, CAPPED, EPSILON

SQL = "SELECT COUNT(*) AS n FROM requests"
NEW_VALUES = "SELECT COUNT(*) AS n FROM requests WHERE age >= {}"
"""The same query with a new value each call (-1, -2, ...: every row passes): the local API
writes it into the text; psycopg sends it as the extended protocol's parameter ``$1``, which the
port writes into the text as a literal; both are then bound from the query's template."""
LABELS = {
    "one write": "POST /v1/query (one write)",
    "http": "POST /v1/query (http.client)",
    "remote": "dpsql.connect(url) (httpx)",
    "postgres": "PostgreSQL port (psycopg 3)",
}
TABLE = {**LABELS, "postgres, new values": "PostgreSQL port, new values"}
ROOMY = DEMO_POLICY.replace("epsilon = 10.0", "epsilon = 1000000.0").replace(
    "epsilon = 4.0", "epsilon = 1000000.0"
)


def block_latencies(
    server: Server, local_database: Path, repeats: int, pause: float, block: int = 10
) -> dict[str, list[float]]:
    """Queries through each client in turn, in blocks of ``block``, ``repeats`` per client: the
    local API, ``POST /v1/query`` on a keep-alive socket written once per request
    (``OneWrite``) and on a keep-alive ``http.client`` connection, and the remote client
    ``dpsql.connect(url)`` (httpx). Blocks in rotating order spread load from elsewhere on the
    machine over all three alike; within a block the process answering is warm (alternating every
    query would make each process re-read the ledger pages the other just wrote). The local API
    reads ``local_database``, a copy of the service's data and policy with a ledger of its own: as
    in either real set-up, one process writes each ledger (sharing one made every block start by
    re-reading the pages the other process had written).

    "local, new values" and "postgres, new values" ask ``NEW_VALUES`` with another value each
    call (the port's added latency for them is against the local API's).

    A further client, "paused", is the local API again with ``pause`` seconds of idleness (not
    timed) before each query: what the service's engine thread sees between two queries, while
    the answer and the next request cross the network. It measures how much of the service's
    added latency is the machine's cost of waking an idle thread and CPU rather than the service's
    own work."""
    body = {"sql": SQL, "epsilon": 0.001}
    values = itertools.count(1)
    kept = connection(server.url)
    one_write = OneWrite(server.url, server.alice, body)
    with (
        dpsql.connect(local_database, analyst="alice") as local,
        dpsql.connect(server.url, token=server.alice) as remote,
        psycopg.connect(
            host="127.0.0.1",
            port=server.pg_port,
            user="alice",
            password=server.alice,
            dbname="demo",
            autocommit=True,
            options="-c dpsql.epsilon=0.001",
        ) as postgres,
    ):

        def over_http() -> None:
            assert query(kept, server.alice, body).status == 200

        def in_one_write() -> None:
            assert one_write()[0] == 200

        clients = {
            "local": lambda: local.execute(SQL, epsilon=0.001),
            "one write": in_one_write,
            "http": over_http,
            "remote": lambda: remote.execute(SQL, epsilon=0.001),
            "postgres": lambda: postgres.execute(SQL).fetchall(),
            "paused": lambda: local.execute(SQL, epsilon=0.001),
            "local, new values": lambda: local.execute(
                NEW_VALUES.format(-next(values)), epsilon=0.001
            ),
            "postgres, new values": lambda: postgres.execute(
                NEW_VALUES.format("%s"), (-next(values),)
            ).fetchall(),
        }
        samples: dict[str, list[float]] = {name: [] for name in clients}
        rounds = max(1, repeats // block)
        for turn in range(rounds):
            names = list(clients)
            names = names[turn % len(names) :] + names[: turn % len(names)]  # none always first
            for name in names:
                clients[name]()  # the first query of a block warms the process up
                for _ in range(block):
                    if name == "paused":
                        time.sleep(pause)
                    began = time.perf_counter()
                    clients[name]()
                    samples[name].append(time.perf_counter() - began)
    kept.close()
    one_write.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=60, help="requests per concurrency level")
    parser.add_argument(
        "--per-client", type=int, default=200, help="queries per client at 1 client"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--runs", type=int, default=1, help="1-client latency runs (each its own ratio)"
    )
    parser.add_argument(
        "--pause-ms", type=float, default=1.0, help="idleness before each 'paused' local query"
    )
    args = parser.parse_args()
    workers = ("--workers", str(args.workers), "--rate-limit", "1000000")
    with tempfile.TemporaryDirectory() as directory:
        server = serve(Path(directory), *workers, policy=ROOMY, rows=args.rows, postgres=True)
        try:
            print(f"COUNT(*) over {args.rows} rows; service with {args.workers} worker(s)")
            local_database = demo_database(Path(directory) / "local", ROOMY, args.rows)
            per_run: dict[str, list[float]] = {
                "one write": [], "http": [], "postgres": [], "postgres, new values": []
            }  # fmt: skip
            loads = []
            for run in range(args.runs):
                samples = block_latencies(
                    server, local_database, args.per_client, args.pause_ms / 1e3
                )
                local_median = statistics.median(samples["local"])
                for name in LABELS:
                    if name in per_run:
                        per_run[name].append(statistics.median(samples[name]) - local_median)
                loads.append(os.getloadavg()[0])
                print(
                    f"1 client, {args.per_client} queries each, in rotating blocks of 10"
                    + (f" (run {run + 1} of {args.runs}" if args.runs > 1 else " (")
                    + f"; load average {loads[-1]:.2f}):"
                )
                print(f"  local Python API:              median {local_median * 1e3:.2f} ms")
                labels = {**LABELS, "paused": f"local, {args.pause_ms:g} ms idle before"}
                for name, label in labels.items():
                    median = statistics.median(samples[name])
                    added = median - local_median
                    print(
                        f"  {label + ':':31s}median {median * 1e3:.2f} ms = "
                        f"{median / local_median:.3f} x local (adds {added * 1e3:.2f} ms)"
                    )
                local_values = statistics.median(samples["local, new values"])
                port_values = statistics.median(samples["postgres, new values"])
                per_run["postgres, new values"].append(port_values - local_values)
                print(
                    f"  {'local, new values:':31s}median {local_values * 1e3:.2f} ms\n"
                    f"  {'PostgreSQL port, new values:':31s}median {port_values * 1e3:.2f} ms = "
                    f"{port_values / local_values:.3f} x local with new values (adds "
                    f"{(port_values - local_values) * 1e3:.2f} ms)"
                )
            if args.runs > 1:
                print(f"load average {min(loads):.2f}-{max(loads):.2f}; added to the local API:")
                for name, differences in per_run.items():
                    print(
                        f"  {TABLE[name] + ':':31s}per run "
                        + ", ".join(f"{d * 1e3:.2f}" for d in differences)
                        + f" ms; median of runs {statistics.median(differences) * 1e3:.2f} ms"
                    )
            body = {"sql": SQL, "epsilon": 0.001}
            print("POST /v1/query with http.client keep-alive connections:")
            print("clients  median ms  p95 ms  req/s  failed  median/local  req/s / local")
            for clients in (1, 4, 16):
                per_client = max(1, args.repeats // clients)
                began = time.perf_counter()
                replies = hammer(
                    server.url, [server.alice], clients=clients, per_client=per_client, body=body
                )
                elapsed = time.perf_counter() - began
                seconds = sorted(r.seconds for r in replies)
                median = statistics.median(seconds)
                p95 = seconds[int(0.95 * (len(seconds) - 1))]
                failed = sum(r.status != 200 for r in replies)
                rate = len(replies) / elapsed
                print(
                    f"{clients:7d}  {median * 1e3:9.2f}  {p95 * 1e3:6.2f}  {rate:5.0f}  "
                    f"{failed:6d}  {median / local_median:12.2f}  {rate * local_median:13.2f}"
                )
        finally:
            stop(server.process)
        capped = serve(Path(directory) / "cap", *workers, policy=CAPPED, rows=args.rows)
        try:
            query = {"sql": SQL, "epsilon": EPSILON}
            began = time.perf_counter()
            replies = hammer(
                capped.url, [capped.alice, capped.bob], clients=16, per_client=50, body=query
            )
            elapsed = time.perf_counter() - began
            statuses = Counter(r.status for r in replies)
            charges = [e for e in capped.entries() if e["kind"] == "charge"]  # verified on open
            units = sum(e["epsilon_units"] for e in charges)
            cap = Cost.cap(ADMITTED * EPSILON, 0).epsilon_units
            print(
                f"at the cap: 16 clients x 50 queries in {elapsed:.1f} s -> {statuses[200]} "
                f"answered (cap admits {ADMITTED}), {statuses[409]} refused (409), "
                f"other {len(replies) - statuses[200] - statuses[409]}; ledger verified; "
                f"charged {units} of {cap} epsilon units"
            )
        finally:
            stop(capped.process)


if __name__ == "__main__":
    main()
