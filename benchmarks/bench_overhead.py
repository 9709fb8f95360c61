"""Per-query overhead: a simple charged query's CPU in dpsql against DuckDB's own CPU for the SQL
dpsql generated, measured in the same run.

For each query shape (COUNT(*); SUM with WHERE literals; GROUP BY public keys), dpsql's
``Session.execute`` is timed (process CPU: parse, bind, price, charge, read, release, result),
then the generated SQL it ran is timed on a plain DuckDB connection to the same file (process
CPU of ``execute(...).fetchall()``). The difference is dpsql's Python overhead; the target is at
most 1 ms. The ledger's fsync is a durability choice: ``execute`` is timed with the ledger's
``synchronous=FULL`` (as shipped) and again with ``synchronous=OFF`` (benchmark only), and the
difference is reported separately, in CPU and in wall time.

    python benchmarks/bench_overhead.py [--rows 100000] [--queries 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

import dpsql
from dpsql.engine.backends import DUCKDB_CONFIG, DuckDBBackend
from dpsql.engine.demo import DEMO_POLICY, build_demo

SHAPES = {
    "COUNT(*)": "SELECT COUNT(*) FROM requests",
    "SUM, WHERE literals": "SELECT SUM(bytes) FROM requests "
    "WHERE age BETWEEN 30 AND 50 AND device = 'mobile'",
    "GROUP BY public keys": "SELECT country, COUNT(*) FROM requests GROUP BY country",
}


class RecordingBackend(DuckDBBackend):
    """The DuckDB backend, remembering the last SQL it ran (the query's bounded aggregate)."""

    last: str = ""

    def run(self, sql, progress=None):  # type: ignore[no-untyped-def]
        self.last = sql
        return super().run(sql, progress)


def per_call(function: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """Median over ``repeats`` blocks of ``calls`` calls: (CPU, wall) milliseconds per call."""
    cpu, wall = [], []
    for _ in range(repeats):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            function()
        cpu.append((time.process_time() - start_cpu) * 1000 / calls)
        wall.append((time.perf_counter() - start_wall) * 1000 / calls)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200, help="calls per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks (median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        database = Path(directory) / "demo.duckdb"
        build_demo(database, rows=args.rows, users=max(args.rows // 10, 1))
        policy = DEMO_POLICY.replace("epsilon = 10.0", "epsilon = 1000000.0")
        dpsql.set_policy(database, policy.replace("epsilon = 4.0", "epsilon = 1000000.0"))
        backend = RecordingBackend(database)
        raw = duckdb.connect(str(database), read_only=True, config=DUCKDB_CONFIG)
        print(f"{args.rows:,} rows; CPU ms per query, median of {args.repeats} blocks of "
              f"{args.queries}")
        print(f"{'shape':22s} {'dpsql':>8s} {'duckdb':>8s} {'overhead':>9s} {'ratio':>7s}"
              f" {'no fsync':>9s} {'fsync cpu':>10s} {'fsync wall':>11s}")
        with dpsql.Session(database, analyst="alice", backend=backend) as session:
            ledger = session.ledger_store._connection
            for label, sql in SHAPES.items():
                def query(sql: str = sql) -> object:
                    return session.execute(sql, epsilon=0.01)

                for _ in range(20):
                    query()
                generated = backend.last

                def own(generated: str = generated) -> object:
                    return raw.execute(generated).fetchall()

                for _ in range(20):
                    own()
                ours, ours_wall = per_call(query, args.queries, args.repeats)
                theirs, _ = per_call(own, args.queries, args.repeats)
                ledger.execute("PRAGMA synchronous=OFF")
                unsynced, unsynced_wall = per_call(query, args.queries, args.repeats)
                ledger.execute("PRAGMA synchronous=FULL")
                overhead = unsynced - theirs
                print(
                    f"{label:22s} {ours:8.3f} {theirs:8.3f} {overhead:9.3f} "
                    f"{unsynced / theirs:6.1f}x {unsynced:9.3f} {ours - unsynced:10.3f} "
                    f"{ours_wall - unsynced_wall:11.3f}"
                )
        raw.close()
    print(
        "overhead = dpsql without fsync - DuckDB's own CPU for the generated SQL (target <= 1 "
        "ms); ratio = dpsql without fsync / DuckDB; fsync columns: with - without synchronous"
    )


if __name__ == "__main__":
    main()
