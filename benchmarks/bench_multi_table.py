"""Twenty everyday queries over a shoppers / purchases / public items schema (not the tests'):
how many dpsql answers, whether grouped answers have the right rows, how often intervals cover
the plain SQL answer, and that every must-refuse query is refused.

    python benchmarks/bench_multi_table.py [--runs 20] [--epsilon 1.0]

Every shopper respects the policy's bounds here, so the bounded answer equals the plain SQL
answer DuckDB gives, and the interval coverage is measured against it (dpsql releases no group
for a NULL key, so those are left out of "rows right").
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import duckdb
import numpy as np

import dpsql
from dpsql.engine.session import set_policy
from dpsql.errors import DpsqlError
from dpsql.mechanisms.random import _seeded_for_tests

POLICY = """
[dataset]
epsilon = 1e9
delta = 0.5
[analysts.analyst]
epsilon = 1e9
delta = 0.5
[tables.shoppers]
privacy_unit = "shopper_id"
[tables.shoppers.columns.age]
bounds = [16, 100]
[tables.shoppers.columns.country]
public_keys = ["DE", "FR", "IT", "ES"]
[tables.purchases]
privacy_unit = "shopper_id"
max_rows_per_unit = 8
max_groups_per_unit = 8
max_rows_per_group = 8
[tables.purchases.columns.amount]
bounds = [0, 500]
[tables.purchases.columns.quantity]
bounds = [1, 10]
[tables.purchases.columns.channel]
public_keys = ["web", "app", "store"]
[tables.purchases.columns.day]
bounds = ["2025-01-01", "2025-12-31"]
[public_tables.items]
"""

QUERIES = [
    "SELECT COUNT(*) FROM purchases p JOIN shoppers s USING (shopper_id)",
    "SELECT s.country, SUM(p.amount) AS revenue FROM purchases p JOIN shoppers s "
    "ON p.shopper_id = s.shopper_id GROUP BY s.country",
    "SELECT i.category, AVG(p.amount) AS mean FROM purchases p JOIN items i "
    "ON p.item_id = i.item_id GROUP BY i.category",
    "SELECT COUNT(*) FROM shoppers s LEFT JOIN purchases p USING (shopper_id) "
    "WHERE p.purchase_id IS NULL",
    "SELECT AVG(n) FROM (SELECT shopper_id, COUNT(*) AS n FROM purchases GROUP BY shopper_id)",
    "SELECT MEDIAN(spent) FROM (SELECT shopper_id, SUM(amount) AS spent FROM purchases "
    "GROUP BY shopper_id)",
    "WITH per AS (SELECT shopper_id, COUNT(*) AS n FROM purchases GROUP BY shopper_id) "
    "SELECT COUNT(*) FROM per WHERE n >= 3",
    "SELECT n, COUNT(*) AS shoppers FROM (SELECT shopper_id, COUNT(*) AS n FROM purchases "
    "GROUP BY shopper_id) GROUP BY n",
    "SELECT COUNT(*) FROM (SELECT shopper_id, ROW_NUMBER() OVER (PARTITION BY shopper_id "
    "ORDER BY day) AS k FROM purchases) WHERE k = 2",
    "SELECT AVG(gap) FROM (SELECT shopper_id, LEAST(GREATEST(day - LAG(day) OVER (PARTITION BY "
    "shopper_id ORDER BY day), 0), 365) AS gap FROM purchases) WHERE gap IS NOT NULL",
    "SELECT prev, channel, COUNT(*) AS n FROM (SELECT shopper_id, channel, LAG(channel) OVER "
    "(PARTITION BY shopper_id ORDER BY day) AS prev FROM purchases) GROUP BY prev, channel",
    "SELECT date_trunc('month', day) AS month, COUNT(*) AS n FROM purchases GROUP BY month",
    "SELECT COUNT(DISTINCT shopper_id) FROM purchases p JOIN items i ON p.item_id = i.item_id "
    "WHERE i.category = 'garden'",
    "SELECT SUM(p.amount) FROM purchases p JOIN items i USING (item_id) WHERE i.price > 50",
    "SELECT AVG(s.age) FROM shoppers s JOIN (SELECT shopper_id, COUNT(*) AS n FROM purchases "
    "GROUP BY shopper_id) t USING (shopper_id)",
    "SELECT CORR(amount, quantity) FROM purchases",
    "SELECT channel, COUNT(*) AS n, SUM(quantity) AS q FROM purchases GROUP BY channel",
    "SELECT s.country, AVG(t.avg_amount) AS a FROM shoppers s JOIN (SELECT shopper_id, "
    "AVG(amount) AS avg_amount FROM purchases GROUP BY shopper_id) t USING (shopper_id) "
    "GROUP BY s.country",
    "SELECT first_category, COUNT(*) AS n FROM (SELECT shopper_id, FIRST_VALUE(category) OVER "
    "(PARTITION BY shopper_id ORDER BY day) AS first_category FROM purchases JOIN items "
    "USING (item_id)) GROUP BY first_category",
    "SELECT EXTRACT(dow FROM day) AS weekday, SUM(amount) AS revenue FROM purchases "
    "GROUP BY weekday",
]

MUST_REFUSE = [
    "SELECT * FROM purchases p JOIN shoppers s USING (shopper_id)",
    "SELECT shopper_id, SUM(amount) FROM purchases GROUP BY shopper_id",
    "SELECT n FROM (SELECT shopper_id, COUNT(*) AS n FROM purchases GROUP BY shopper_id)",
    "SELECT COUNT(*) FROM purchases p JOIN shoppers s ON p.purchase_id = s.shopper_id",
    "SELECT MAX(amount) FROM purchases",
    "SELECT s.country, MAX(p.amount) FROM purchases p JOIN shoppers s USING (shopper_id) "
    "GROUP BY s.country",
]


def build(directory: Path) -> Path:
    path = directory / "shop.duckdb"
    connection = duckdb.connect(str(path))
    rng = np.random.default_rng(2026)
    shoppers = 5_000
    connection.execute(
        "CREATE TABLE shoppers (shopper_id BIGINT, age INTEGER, country VARCHAR)"
    )
    connection.executemany(
        "INSERT INTO shoppers VALUES (?, ?, ?)",
        [
            (i, int(rng.integers(16, 90)), ["DE", "FR", "IT", "ES"][int(rng.integers(0, 4))])
            for i in range(shoppers)
        ],
    )
    connection.execute(
        "CREATE TABLE items AS SELECT i AS item_id, (['garden', 'kitchen', 'toys', 'books'])"
        "[1 + i % 4] AS category, 5.0 + (i * 7) % 120 AS price FROM range(200) AS t(i)"
    )
    counts = rng.poisson(2.5, size=shoppers).clip(0, 8)
    rows = []
    purchase = 0
    for shopper, count in enumerate(counts):
        for _ in range(int(count)):
            rows.append(
                (
                    purchase,
                    shopper,
                    int(rng.integers(0, 200)),
                    float(np.round(rng.gamma(2.0, 40.0), 2).clip(0, 500)),
                    int(rng.integers(1, 11)),
                    ["web", "app", "store"][int(rng.integers(0, 3))],
                    f"2025-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}",
                )
            )
            purchase += 1
    connection.execute(
        "CREATE TABLE purchases (purchase_id BIGINT, shopper_id BIGINT, item_id INTEGER, "
        "amount DOUBLE, quantity INTEGER, channel VARCHAR, day DATE)"
    )
    connection.executemany("INSERT INTO purchases VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    connection.close()
    set_policy(path, POLICY)
    return path


def truth(path: Path, sql: str, width: int) -> dict[tuple, float] | None:
    """The plain SQL answer: the first ``width`` columns (the keys) -> the last column."""
    connection = duckdb.connect(str(path), read_only=True)
    try:
        rows = connection.execute(sql).fetchall()
    except duckdb.Error:
        return None
    finally:
        connection.close()
    return {tuple(str(v) for v in row[:width]): row[-1] for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=1.0)
    arguments = parser.parse_args()
    directory = Path(tempfile.mkdtemp())
    path = build(directory)
    answered, covered, intervals, right_rows = 0, 0, 0, 0
    for sql in QUERIES:
        try:
            with dpsql.connect(path, analyst="analyst") as db:
                db.execute(sql, epsilon=arguments.epsilon, delta=1e-6)
                width = len(db.plan(sql, epsilon=arguments.epsilon, delta=1e-6).shape.group_by)
        except DpsqlError as error:
            print(f"REFUSED  {sql[:70]}...\n         {type(error).__name__}: {str(error)[:150]}")
            continue
        answered += 1
        expected = truth(path, sql, width)
        hits = total = 0
        keys_ok = True
        for run in range(arguments.runs):
            with (
                _seeded_for_tests(np.random.default_rng(run)),
                dpsql.connect(path, analyst="analyst") as db,
            ):
                result = db.execute(sql, epsilon=arguments.epsilon, delta=1e-6)
            found = {tuple(str(v) for v in row[:width]): row[-1] for row in result.rows}
            wanted = {k for k, v in (expected or {}).items() if v and "None" not in k}
            if expected is not None and not set(found) >= wanted:
                keys_ok = False
            column = result.columns[-1]
            for index, key in enumerate(found):
                if column not in result.intervals or expected is None:
                    continue
                low, high = result.intervals[column][index]
                if low is None or high is None:
                    continue
                value = expected.get(key, 0) or 0
                total += 1
                hits += low <= value <= high
        right_rows += keys_ok
        covered += hits
        intervals += total
        share = f"{hits / total:.0%} of {total}" if total else "no interval"
        print(f"ANSWERED {sql[:70]}...\n         coverage {share}; rows right: {keys_ok}")
    refused = 0
    for sql in MUST_REFUSE:
        try:
            with dpsql.connect(path, analyst="analyst") as db:
                db.execute(sql, epsilon=arguments.epsilon, delta=1e-6)
            print(f"NOT REFUSED {sql}")
        except DpsqlError:
            refused += 1
    print(
        f"\nanswered {answered}/{len(QUERIES)} ({answered / len(QUERIES):.0%}); grouped rows right "
        f"in {right_rows}/{answered}; interval coverage {covered}/{intervals} "
        f"({covered / max(intervals, 1):.1%}); must-refuse refused {refused}/{len(MUST_REFUSE)}"
    )


if __name__ == "__main__":
    main()
