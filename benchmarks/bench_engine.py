"""dpsql vs raw DuckDB on a generated table: public-key GROUP BY and a range count.

Builds a table of ``--rows`` rows (default 10M) inside DuckDB itself (no download, no Python loop):
``home`` is a fixed attribute of each user (the usual case), ``country`` varies per row, so most
users touch more groups than ``max_groups_per_unit`` (the worst case for contribution bounding);
then times, in the same run, each query through dpsql (parse, plan, charge, bounded SQL, noise) and
the same aggregation run raw on DuckDB without privacy. Prints median seconds and the ratio.

    python benchmarks/bench_engine.py --rows 10000000
"""

from __future__ import annotations

import argparse
import tempfile
import time
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
[tables.requests]
privacy_unit = "user_id"
max_groups_per_unit = 5
max_rows_per_group = 10
max_rows_per_unit = 50
[tables.requests.columns.country]
public_keys = ["DK", "NO", "SE", "FI", "IS", "DE", "NL", "BE", "FR", "ES"]
[tables.requests.columns.home]
public_keys = ["DK", "NO", "SE", "FI", "IS", "DE", "NL", "BE", "FR", "ES"]
[tables.requests.columns.bytes]
bounds = [0, 100000]
"""

QUERIES = {
    "GROUP BY home (1 per unit)": (
        "SELECT home, COUNT(*) FROM requests GROUP BY home",
        "SELECT home, COUNT(*) FROM requests WHERE home IN "
        "('DK','NO','SE','FI','IS','DE','NL','BE','FR','ES') GROUP BY home",
    ),
    "public-key GROUP BY count": (
        "SELECT country, COUNT(*) FROM requests GROUP BY country",
        "SELECT country, COUNT(*) FROM requests WHERE country IN "
        "('DK','NO','SE','FI','IS','DE','NL','BE','FR','ES') GROUP BY country",
    ),
    "range count": (
        "SELECT COUNT(*) FROM requests WHERE age BETWEEN 30 AND 50",
        "SELECT COUNT(*) FROM requests WHERE age BETWEEN 30 AND 50",
    ),
    "public-key GROUP BY sum": (
        "SELECT country, SUM(bytes) FROM requests GROUP BY country",
        "SELECT country, SUM(LEAST(GREATEST(bytes, 0), 100000)) FROM requests WHERE country IN "
        "('DK','NO','SE','FI','IS','DE','NL','BE','FR','ES') GROUP BY country",
    ),
}


def build(path: Path, rows: int, users: int) -> None:
    connection = duckdb.connect(str(path))
    connection.execute(
        f"""
        CREATE TABLE requests AS
        SELECT (hash(i) % {users})::BIGINT AS user_id,
               (['DK','NO','SE','FI','IS','DE','NL','BE','FR','ES'])[1 + (hash(i * 7) % 10)::INT]
                   AS country,
               (['DK','NO','SE','FI','IS','DE','NL','BE','FR','ES'])
                   [1 + ((hash(i) % {users}) % 10)::INT] AS home,
               (18 + hash(i * 13) % 60)::INTEGER AS age,
               (hash(i * 31) % 200000)::BIGINT AS bytes
        FROM range({rows}) t(i)
        """
    )
    connection.close()
    dpsql.set_policy(path, POLICY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bench.duckdb"
        start = time.perf_counter()
        build(path, args.rows, args.users)
        print(
            f"built {args.rows:,} rows, {args.users:,} users in {time.perf_counter() - start:.1f}s"
        )
        raw = duckdb.connect(str(path), read_only=True, config=dict(DUCKDB_CONFIG))
        with dpsql.connect(path, analyst="bench") as session:
            print(f"{'query':30} {'dpsql s':>9} {'raw s':>9} {'ratio':>7}")
            for name, (private, plain) in QUERIES.items():
                session.execute(private, epsilon=1.0)  # warm caches for both
                raw.execute(plain).fetchall()
                dp = median_seconds(lambda q=private: session.execute(q, epsilon=1.0), args.repeats)
                base = median_seconds(lambda q=plain: raw.execute(q).fetchall(), args.repeats)
                print(f"{name:30} {dp:9.3f} {base:9.3f} {dp / base:7.2f}x")
        raw.close()


if __name__ == "__main__":
    main()
