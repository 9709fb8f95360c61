"""500 overlapping range counts filtered by a threshold: dpsql (SVT) vs raw DuckDB.

Builds ``--rows`` sales (default 10M) and a public table of 500 overlapping price ranges inside
DuckDB, then times in the same run the DP query (bounded range counts in the database, NumericSparse
in dpsql, ledger charge) against the same range counts computed raw, without privacy.

    python benchmarks/bench_ranges.py --rows 10000000
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import duckdb
from timing import median_seconds

import dpsql
from dpsql.engine.backends import DUCKDB_CONFIG

POLICY = """
[dataset]
epsilon = 1000000.0
[analysts.bench]
epsilon = 1000000.0
[tables.sales]
privacy_unit = "user_id"
max_rows_per_unit = 10
[public_tables.price_ranges]
"""

PRIVATE = (
    "SELECT r.lo, r.hi, COUNT(*) AS n FROM sales s JOIN price_ranges r "
    "ON s.price BETWEEN r.lo AND r.hi GROUP BY r.lo, r.hi HAVING COUNT(*) > {threshold}"
)
RAW = PRIVATE


def build(path: Path, rows: int, users: int) -> None:
    connection = duckdb.connect(str(path))
    connection.execute(
        f"""
        CREATE TABLE sales AS
        SELECT (hash(i) % {users})::BIGINT AS user_id,
               (hash(i * 7) % 100000)::DOUBLE / 100 AS price
        FROM range({rows}) t(i)
        """
    )
    connection.execute(
        "CREATE TABLE price_ranges AS SELECT (i * 2)::DOUBLE AS lo, (i * 2 + 40)::DOUBLE AS hi "
        "FROM range(500) t(i)"
    )
    connection.close()
    dpsql.set_policy(path, POLICY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    threshold = int(args.rows * 40 / 1000 * 1.003)  # a few ranges hold slightly more than average
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "ranges.duckdb"
        build(path, args.rows, args.users)
        raw = duckdb.connect(str(path), read_only=True, config=dict(DUCKDB_CONFIG))
        with dpsql.connect(path, analyst="bench") as session:
            private = PRIVATE.format(threshold=threshold)
            plain = RAW.format(threshold=threshold)
            result = session.execute(private, epsilon=1.0, max_answers=5)
            raw.execute(plain).fetchall()
            dp = median_seconds(
                lambda: session.execute(private, epsilon=1.0, max_answers=5), args.repeats
            )
            base = median_seconds(lambda: raw.execute(plain).fetchall(), args.repeats)
        raw.close()
    print(f"{args.rows:,} rows, 500 overlapping ranges, threshold {threshold:,}, c = 5")
    print(f"dpsql (SVT) {dp:.3f}s   raw DuckDB {base:.3f}s   ratio {dp / base:.2f}x")
    print(
        f"released {len(result.rows)} ranges; alpha = {result.details['alpha']:.0f}; "
        f"scanned {result.details['ranges_scanned']} of {result.details['ranges_in_table']}"
    )


if __name__ == "__main__":
    main()
