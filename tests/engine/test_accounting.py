"""The ledger under real use: parallel composition across queries, advanced composition,
many processes at once, and processes killed mid-query."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest

import dpsql
from dpsql.accountant.ledger import Ledger
from dpsql.engine.session import database_budget, database_ledger, ledger_path
from dpsql.errors import BudgetExceededError
from dpsql.sql.analyze import analyze
from dpsql.sql.generate import Bounds, Measure, MeasureKind, bounded_aggregate
from dpsql.sql.parse import parse
from tests.conftest import make_database

PARTITIONED = """
[dataset]
epsilon = 1.0
delta = 1e-6
[analysts.a]
epsilon = 1.0
[analysts.b]
epsilon = 1.0
[tables.visits]
privacy_unit = "user_id"
partition_column = "country"
max_rows_per_unit = 5
[tables.visits.columns.country]
public_keys = ["DK", "NO", "SE"]
"""


def visits() -> pd.DataFrame:
    """Users with a fixed home country, plus user 99 who has rows in both DK and NO."""
    rows = [(u, ["DK", "NO", "SE"][u % 3], u % 50) for u in range(60) for _ in range(2)]
    rows += [(99, "DK", 1), (99, "NO", 2), (99, "NO", 3)]
    return pd.DataFrame(rows, columns=["user_id", "country", "age"])


@pytest.fixture
def partitioned(tmp_path: Path) -> Path:
    return make_database(tmp_path / "p.duckdb", {"visits": visits()}, PARTITIONED)


def test_disjoint_partitions_are_charged_in_parallel(partitioned: Path) -> None:
    with dpsql.connect(partitioned, analyst="a") as db:
        db.execute("SELECT COUNT(*) FROM visits WHERE country = 'DK'", epsilon=1.0)
        db.execute("SELECT COUNT(*) FROM visits WHERE country = 'NO' AND age > 3", epsilon=1.0)
        db.execute("SELECT COUNT(*) FROM visits WHERE country IN ('SE')", epsilon=0.6)
        with pytest.raises(BudgetExceededError) as refused:
            db.execute("SELECT COUNT(*) FROM visits WHERE country IN ('SE', 'DK')", epsilon=0.1)
        assert "epsilon=0, delta=1e-06 remaining for the people where country is one of " \
            "[DK, SE]" in str(refused.value)
        with pytest.raises(BudgetExceededError) as refused:
            db.execute("SELECT COUNT(*) FROM visits WHERE country = 'SE'", epsilon=0.5)
        assert "epsilon=0.4, delta=1e-06 remaining for the people where country is one of " \
            "[SE]" in str(refused.value)
        with pytest.raises(BudgetExceededError):
            db.execute("SELECT COUNT(*) FROM visits", epsilon=0.1)  # touches every partition
        db.execute("SELECT COUNT(*) FROM visits WHERE country = 'SE'", epsilon=0.4)
    report = database_budget(partitioned)
    assert report.dataset.epsilon_spent == 1.0
    partitions = {s.name: s.epsilon_spent for s in report.lines if s.scope == "partition"}
    assert partitions == {
        "visits.country = 'DK'": 1.0,
        "visits.country = 'NO'": 1.0,
        "visits.country = 'SE'": 1.0,
    }
    entry = database_ledger(partitioned)[1]
    assert entry["partition"] == {"family": "visits.country", "values": ["DK"]}


def test_partitions_bind_across_analysts(partitioned: Path) -> None:
    with dpsql.connect(partitioned, analyst="a") as db:
        db.execute("SELECT COUNT(*) FROM visits WHERE country = 'DK'", epsilon=0.7)
    with dpsql.connect(partitioned, analyst="b") as db:
        db.execute("SELECT COUNT(*) FROM visits WHERE country = 'NO'", epsilon=1.0)
        with pytest.raises(BudgetExceededError, match="dataset 'p' cap"):
            db.execute("SELECT COUNT(*) FROM visits WHERE country = 'DK'", epsilon=0.5)


def test_an_analyst_sees_only_their_own_partition_spending(partitioned: Path, capsys) -> None:
    """An analyst's budget view (session, ``database_budget`` with the analyst, ``dpsql budget
    --analyst``) lists only the partition values they spent on, against their allocation; the
    administrator's view lists everyone's against the dataset cap."""
    from dpsql.cli import main

    with dpsql.connect(partitioned, analyst="a") as db:
        db.execute("SELECT COUNT(*) FROM visits WHERE country = 'DK'", epsilon=0.7)
    with dpsql.connect(partitioned, analyst="b") as db:
        db.execute("SELECT COUNT(*) FROM visits WHERE country = 'NO'", epsilon=0.4)
        db.execute("SELECT COUNT(*) FROM visits WHERE country IN ('NO', 'SE')", epsilon=0.2)
        own = db.budget()

    def partitions(lines) -> dict[str, tuple[float, float]]:
        return {
            line.name: (round(line.epsilon_spent, 9), line.epsilon_cap)
            for line in lines
            if line.scope == "partition"
        }

    assert partitions(own.lines) == {
        "visits.country = 'NO'": (0.6, 1.0),
        "visits.country = 'SE'": (0.2, 1.0),
    }
    assert partitions(database_budget(partitioned, "a").lines) == {
        "visits.country = 'DK'": (0.7, 1.0)
    }
    assert partitions(database_budget(partitioned).lines) == {
        "visits.country = 'DK'": (0.7, 1.0),
        "visits.country = 'NO'": (0.6, 1.0),
        "visits.country = 'SE'": (0.2, 1.0),
    }
    assert main(["budget", "--db", str(partitioned), "--analyst", "a", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)["lines"]
    assert [line["name"] for line in shown if line["scope"] == "partition"] == [
        "visits.country = 'DK'"
    ]


def test_overlapping_predicates_are_charged_sequentially(partitioned: Path) -> None:
    with dpsql.connect(partitioned, analyst="a") as db:
        db.execute("SELECT COUNT(*) FROM visits WHERE country >= 'DK'", epsilon=0.5)
        db.execute("SELECT COUNT(*) FROM visits WHERE country <= 'NO'", epsilon=0.5)
        with pytest.raises(BudgetExceededError):  # NO lies in both
            db.execute("SELECT COUNT(*) FROM visits WHERE country = 'NO'", epsilon=0.1)
        db.execute("SELECT COUNT(*) FROM visits WHERE country > 'NO'", epsilon=0.5)  # only SE


def test_a_unit_spread_over_partitions_counts_in_one_only(partitioned: Path) -> None:
    """The partition column is not fixed for user 99; it is enforced: 99 stays in DK (its min)."""
    catalog = {"visits": {"user_id": "BIGINT", "country": "VARCHAR", "age": "BIGINT"}}
    connection = duckdb.connect(str(partitioned), read_only=True)
    try:
        counts = {}
        for country in ("DK", "NO"):
            shape = analyze(
                parse(f"SELECT COUNT(*) FROM visits WHERE user_id = 99 AND country = '{country}'"),
                catalog,
            )
            sql = bounded_aggregate(
                shape,
                measures=[Measure("n", MeasureKind.ROWS)],
                bounds=Bounds("user_id", 1, 1, 5, "country"),
                public_keys={},
                salt=1,
            )
            counts[country] = connection.execute(sql).fetchone()[0]
    finally:
        connection.close()
    assert counts == {"DK": 1, "NO": 0}


def test_advanced_composition_admits_more_small_queries(tmp_path: Path) -> None:
    policy = """
[dataset]
epsilon = 1.0
delta = 1e-6
composition = "advanced"
advanced_delta = 1e-7
[analysts.a]
epsilon = 1.0
delta = 1e-6
[tables.t]
privacy_unit = "u"
"""
    database = make_database(tmp_path / "adv.duckdb", {"t": pd.DataFrame({"u": [1, 2]})}, policy)
    with dpsql.connect(database, analyst="a") as db:
        for _ in range(150):  # basic composition would stop at 100
            db.execute("SELECT COUNT(*) FROM t", epsilon=0.01)
        status = db.budget().for_analyst("a")
    assert status is not None and status.rule == "advanced"
    assert 0.6 < status.epsilon_spent < 1.0
    assert status.delta_spent == pytest.approx(1e-7)


def _charge_loop(database: str, analyst: str, attempts: int, queue) -> None:
    ok = refused = 0
    with dpsql.connect(database, analyst=analyst) as db:
        for _ in range(attempts):
            try:
                db.execute("SELECT COUNT(*) FROM t", epsilon=0.1)
                ok += 1
            except BudgetExceededError:
                refused += 1
    queue.put((ok, refused))


def test_eight_processes_never_pass_the_cap(tmp_path: Path) -> None:
    policy = """
[dataset]
epsilon = 2.0
[analysts.a]
epsilon = 2.0
[tables.t]
privacy_unit = "u"
"""
    database = make_database(tmp_path / "c.duckdb", {"t": pd.DataFrame({"u": range(10)})}, policy)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [
        context.Process(target=_charge_loop, args=(str(database), "a", 5, queue)) for _ in range(8)
    ]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert sum(ok for ok, _ in results) == 20  # 2.0 / 0.1 exactly
    assert sum(refused for _, refused in results) == 20
    entries = [e for e in database_ledger(database) if e["kind"] == "charge"]
    assert len(entries) == 20 and sum(e["epsilon_units"] for e in entries) == 2 * 10**9


_LOOP = """
import sys, dpsql
with dpsql.connect(sys.argv[1], analyst="a") as db:
    while True:
        result = db.execute("SELECT COUNT(*) FROM t", epsilon=0.001)
        print(result.ledger_entry, flush=True)
"""


def test_killed_processes_leave_a_verified_ledger_that_covers_every_answer(tmp_path: Path) -> None:
    policy = """
[dataset]
epsilon = 1000.0
[analysts.a]
epsilon = 1000.0
[tables.t]
privacy_unit = "u"
"""
    database = make_database(tmp_path / "k.duckdb", {"t": pd.DataFrame({"u": range(10)})}, policy)
    chooser = random.Random(5)
    answered: list[int] = []
    for _ in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", _LOOP, str(database)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )
        first = child.stdout.readline()  # wait until it answers once, then kill at a random point
        assert first.strip().isdigit()
        time.sleep(chooser.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
        answered += [int(line) for line in [first, *rest.splitlines()] if line.strip().isdigit()]
    ledger = Ledger(ledger_path(database), dataset="k")
    try:
        count = ledger.verify()
        charged = {e.seq for e in ledger.entries() if e.kind == "charge"}
    finally:
        ledger.close()
    assert count == len(charged) + 1
    assert set(answered) <= charged  # no answer was ever released without its charge
    assert len(answered) >= 6
    json.dumps(answered)
