"""Charges per second through the ledger, with 1 and 8 concurrent processes.

Each process opens the ledger and records ``--charges`` charges (check-and-charge in one
``BEGIN IMMEDIATE`` transaction with ``synchronous=FULL``). The baseline is a plain SQLite INSERT
with the same durability settings, measured in the same run.

    python benchmarks/bench_ledger.py --charges 300

It then times a small partitioned charge after ``K`` earlier charges that each touched 3,500
partition values (an analyst's long ``IN`` list), against the same charge on a fresh ledger: the
running totals make a charge cost O(values it touches), so the ratio stays near 1 as K grows (it
grew quadratically before). Last, a query's ledger work (read the policy in force, charge) after
N earlier charges: an index on (kind, seq) keeps it flat in N (it grew linearly before).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sqlite3
import tempfile
import time
from pathlib import Path

from dpsql.accountant.events import MechanismEvent
from dpsql.accountant.ledger import Ledger
from dpsql.accountant.limits import Limits
from dpsql.accountant.units import Cost


def _charges(path: str, count: int) -> None:
    ledger = Ledger(path, dataset="bench")
    event = MechanismEvent("discrete_laplace", 0.001, label="COUNT(*)")
    for _ in range(count):
        ledger.charge(
            analyst="a", event=event, query="SELECT COUNT(*) FROM t", plan={}, mechanism="m"
        )
    ledger.close()


def _inserts(path: str, count: int) -> None:
    connection = sqlite3.connect(path, timeout=60, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    for i in range(count):
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO plain VALUES (?, ?)", (i, "x"))
        connection.execute("COMMIT")
    connection.close()


def run(target, path: str, processes: int, count: int) -> float:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=target, args=(path, count)) for _ in range(processes)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return processes * count / (time.perf_counter() - start)


def _partitioned_charge_seconds(directory: str, history: int, repeats: int = 50) -> float:
    """Mean seconds of one single-value partitioned charge after ``history`` charges of 3,500
    values each (in the process that keeps the ledger open, as a server does)."""
    ledger = Ledger(str(Path(directory) / f"p{history}.sqlite"), dataset="bench")
    ledger.set_policy({}, Limits(Cost.cap(1e6), {"a": Cost.cap(1e6)}))
    event = MechanismEvent("discrete_laplace", 0.001, label="COUNT(*)")
    wide = ("t.p", tuple(str(v) for v in range(3_500)))
    for _ in range(history):
        ledger.charge(analyst="a", event=event, query="q", plan={}, mechanism="m", partition=wide)
    start = time.perf_counter()
    for i in range(repeats):
        ledger.charge(
            analyst="a", event=event, query="q", plan={}, mechanism="m",
            partition=("t.p", (str(i),)),
        )
    elapsed = (time.perf_counter() - start) / repeats
    ledger.close()
    return elapsed


def _query_ledger_work_seconds(directory: str, history: int, repeats: int = 50) -> float:
    """Mean seconds of a query's ledger work (read the policy in force, then charge) after
    ``history`` earlier one-query charges since the policy was set (written without fsync, to
    build the history quickly; the timed charges use the ledger's own durability)."""
    ledger = Ledger(str(Path(directory) / f"q{history}.sqlite"), dataset="bench")
    ledger.set_policy({}, Limits(Cost.cap(1e9), {"a": Cost.cap(1e9)}))
    event = MechanismEvent("discrete_laplace", 0.001, label="COUNT(*)")
    ledger._connection.execute("PRAGMA synchronous=OFF")
    for _ in range(history):
        ledger.charge(analyst="a", event=event, query="q", plan={}, mechanism="m")
    ledger._connection.execute("PRAGMA synchronous=FULL")
    start = time.perf_counter()
    for _ in range(repeats):
        ledger.policy()
        ledger.charge(analyst="a", event=event, query="q", plan={}, mechanism="m")
    elapsed = (time.perf_counter() - start) / repeats
    ledger.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=300, help="charges per process")
    args = parser.parse_args()
    print(f"{'processes':>9} {'ledger/s':>10} {'insert/s':>10} {'ratio':>7}")
    for processes in (1, 8):
        with tempfile.TemporaryDirectory() as directory:
            ledger_file = str(Path(directory) / "ledger.sqlite")
            ledger = Ledger(ledger_file, dataset="bench")
            ledger.set_policy({}, Limits(Cost.cap(1e6), {"a": Cost.cap(1e6)}))
            ledger.close()
            plain_file = str(Path(directory) / "plain.sqlite")
            sqlite3.connect(plain_file).execute(
                "CREATE TABLE plain (i INTEGER, s TEXT)"
            ).connection.close()
            charges = run(_charges, ledger_file, processes, args.charges)
            inserts = run(_inserts, plain_file, processes, args.charges)
            print(f"{processes:>9} {charges:>10.0f} {inserts:>10.0f} {inserts / charges:>6.2f}x")
    print(f"\n{'earlier 3,500-value charges':>28} {'ms/charge':>10} {'vs none':>8}")
    with tempfile.TemporaryDirectory() as directory:
        baseline = _partitioned_charge_seconds(directory, 0)
        for history in (0, 10, 100):
            seconds = _partitioned_charge_seconds(directory, history)
            print(f"{history:>28} {seconds * 1e3:>10.2f} {seconds / baseline:>7.2f}x")
    print(f"\n{'earlier one-query charges':>28} {'ms/query':>10} {'vs none':>8}")
    with tempfile.TemporaryDirectory() as directory:
        baseline = _query_ledger_work_seconds(directory, 0)
        for history in (0, 1_000, 10_000, 30_000):
            seconds = _query_ledger_work_seconds(directory, history)
            print(f"{history:>28} {seconds * 1e3:>10.2f} {seconds / baseline:>7.2f}x")


if __name__ == "__main__":
    main()
