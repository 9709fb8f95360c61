"""Binding is linear in the IN list: time to explain a query with n values, against n/4.

Explaining parses, checks and binds the query (every literal converted by DuckDB) and reads no
data. Each literal inside an IN list used to be replaced one at a time, re-parenting the whole
list, so binding was quadratic (8,000 values: 27 s); the ratio printed should be about 4 (linear),
not 16 (quadratic). ``--broken`` runs the quadratic replacement to show the difference.

    python benchmarks/bench_binding.py [--values 10000] [--broken]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import duckdb
from timing import median_seconds

import dpsql
from dpsql.engine import literals
from dpsql.engine.session import set_policy

POLICY = """
[dataset]
epsilon = 1000.0
[analysts.bench]
epsilon = 1000.0
[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 2
"""


def _quadratic(self: literals.Binder, where):  # the replacement binding had before
    where = where.copy()
    exp = literals.exp
    casts = [c for c in where.find_all(exp.Cast) if isinstance(c.this, exp.Literal)]
    for old, new in zip(casts, self.convert(casts, "literal"), strict=True):
        old.replace(new)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=10_000, help="the larger IN list (<= 10000)")
    parser.add_argument("--broken", action="store_true", help="use the quadratic replacement")
    args = parser.parse_args()
    if args.broken:
        literals.Binder._converted = _quadratic  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as directory:
        database = Path(directory) / "bench.duckdb"
        connection = duckdb.connect(str(database))
        connection.execute("CREATE TABLE t AS SELECT range AS uid, range % 9 AS x FROM range(99)")
        connection.close()
        set_policy(database, POLICY)
        with dpsql.connect(database, analyst="bench") as db:
            times = {}
            for n in (args.values // 4, args.values):
                sql = "SELECT COUNT(*) FROM t WHERE x IN (" + ", ".join(map(str, range(n))) + ")"
                times[n] = median_seconds(lambda sql=sql: db.explain(sql, epsilon=1.0), 3)
                print(f"{n:>7,} values: {times[n]:.2f} s")
    small, large = sorted(times)
    print(f"ratio time({large:,}) / time({small:,}) = {times[large] / times[small]:.1f} "
          "(linear: ~4, quadratic: ~16)")


if __name__ == "__main__":
    main()
