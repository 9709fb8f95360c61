"""dpsql at scale: a generated Parquet table read in place, against raw DuckDB in the same run.

Generates ``--rows`` rows (default 100M) as Parquet files inside DuckDB (no Python loop; in a
child process, so the peak RSS reported below is the querying process's own), with a
high-cardinality ``item`` key (log-uniform over ``--items`` values: a few heavy keys, a long tail)
and a privacy unit ``user_id``. The policy points table ``events`` at the files (a glob); dpsql
reads them through DuckDB without copying. For each query it prints median seconds of:

- ``dpsql``: ``Session.execute`` end to end (parse, plan, charge the ledger, bounded SQL, noise);
- ``bounded``: the same generated, contribution-bounded SQL run raw on DuckDB (the engine's
  overhead is dpsql / bounded; for ``mad2r``, its last read of the rows: the ranked cells
  materialised into a temporary table, or, with "two reads", round 2's bounded aggregation);
- ``floor``: the least any per-person contribution bound costs: the rows aggregated once per
  (person, group), each cell capped, then summed per group, with no choice of which groups a
  person keeps (a lower bound on bounded SQL, not a private query);
- ``plain``: the plain aggregation without privacy (the price of bounding is bounded / plain).

``sql`` is the part of ``dpsql`` spent in the database (the rest is Python: parsing, planning,
the ledger, noise and building the result). The machine is shared, so wall-clock ratios carry the
other processes' load; ``cpu dpsql/floor`` divides this process's CPU seconds (DuckDB runs in
it), which that load moves much less.

Queries: GROUP BY over public keys, a range count, a SUM, and (when the engine supports it) a
GROUP BY over the high-cardinality key whose keys are released by thresholding, and with the
combined threshold + ALP structure; the default (``mad2r`` on this policy) also as it ran before
its cells were kept ("two reads": round 1's keys as SQL literals and the rows read again).
Then the peak RSS of this process.

``--spark`` instead runs the GROUP BY, range count and SUM on ``--spark-rows`` rows (default 2M)
through sessions on the DuckDB and the Spark backend (local mode) with the same seed, and shows
that the true aggregates before noise are identical, that the DP answers are identical too
(same seed, same noise), and how many of the DP answers' 95% intervals hold the true value.

    python benchmarks/bench_scale.py --rows 10000000
    python benchmarks/bench_scale.py --spark
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

import dpsql
from dpsql.engine.backends import SCRATCH_PREFIX, DuckDBBackend
from dpsql.engine.planner import QueryPlan, plan_query
from dpsql.engine.policy import Policy, parse_policy
from dpsql.errors import DpsqlError
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse

COUNTRIES = ["DK", "NO", "SE", "FI", "IS", "DE", "NL", "BE", "FR", "ES"]
IN_LIST = ", ".join(f"'{c}'" for c in COUNTRIES)

POLICY = f"""
[dataset]
epsilon = 1000000.0
delta = 0.001
[analysts.bench]
epsilon = 1000000.0
delta = 0.001
[tables.events]
privacy_unit = "user_id"
source = "events/*.parquet"
max_groups_per_unit = 5
max_rows_per_group = 10
max_rows_per_unit = 50
[tables.events.columns.country]
public_keys = {COUNTRIES!r}
[tables.events.columns.bytes]
bounds = [0, 100000]
[tables.events.columns.item]
expected_keys = 100000
"""

EPSILON, DELTA = 1.0, 1e-7
CONFIDENCE = 0.95

ITEM_FLOOR = (
    "SELECT item, SUM(LEAST(n, 10)) FROM (SELECT user_id, item, COUNT(*) AS n FROM events "
    "GROUP BY user_id, item) GROUP BY item"
)
"""The least any per-person contribution bound must do: one aggregation per (person, group)."""

# name -> (dpsql SQL, plain SQL without privacy, the bounding floor, extra execute() arguments)
QUERIES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "GROUP BY public keys": (
        "SELECT country, COUNT(*) AS n FROM events GROUP BY country",
        f"SELECT country, COUNT(*) AS n FROM events WHERE country IN ({IN_LIST}) GROUP BY country",
        "SELECT country, SUM(LEAST(n, 10)) FROM (SELECT user_id, country, COUNT(*) AS n "
        f"FROM events WHERE country IN ({IN_LIST}) GROUP BY user_id, country) GROUP BY country",
        {},
    ),
    "range count": (
        "SELECT COUNT(*) AS n FROM events WHERE age BETWEEN 30 AND 50",
        "SELECT COUNT(*) AS n FROM events WHERE age BETWEEN 30 AND 50",
        "SELECT SUM(LEAST(n, 50)) FROM (SELECT user_id, COUNT(*) AS n FROM events "
        "WHERE age BETWEEN 30 AND 50 GROUP BY user_id)",
        {},
    ),
    "SUM": (
        "SELECT SUM(bytes) AS s FROM events",
        "SELECT SUM(LEAST(GREATEST(bytes, 0), 100000)) AS s FROM events",
        "SELECT SUM(s * LEAST(n, 50) / n) FROM (SELECT user_id, COUNT(*) AS n, "
        "SUM(LEAST(GREATEST(bytes, 0), 100000)) AS s FROM events GROUP BY user_id)",
        {},
    ),
    "GROUP BY item (threshold)": (
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        ITEM_FLOOR,
        {"delta": DELTA, "mechanism": "threshold"},
    ),
    "GROUP BY item (default)": (
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        ITEM_FLOOR,
        {"delta": DELTA},
    ),
    "GROUP BY item (default, two reads)": (
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        ITEM_FLOOR,
        {"delta": DELTA},
    ),
    "GROUP BY item (weighted)": (
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        ITEM_FLOOR,
        {"delta": DELTA, "mechanism": "weighted"},
    ),
    "GROUP BY item (combined)": (
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        "SELECT item, COUNT(*) AS n FROM events GROUP BY item",
        ITEM_FLOOR,
        {"delta": DELTA, "mechanism": "alp"},
    ),
}
SPARK_QUERIES = ["GROUP BY public keys", "range count", "SUM"]


def generate(directory: Path, rows: int, users: int, items: int) -> None:
    """Write ``rows`` rows as Parquet files under ``directory/events`` (DuckDB, parallel)."""
    (directory / "events").mkdir(parents=True, exist_ok=True)
    connection = duckdb.connect()
    connection.execute(
        f"""
        COPY (
            SELECT (hash(i) % {users})::BIGINT AS user_id,
                   ({COUNTRIES!r})[1 + (hash(i * 7) % 10)::INTEGER] AS country,
                   (18 + hash(i * 13) % 60)::INTEGER AS age,
                   (hash(i * 31) % 200000)::BIGINT AS bytes,
                   (floor(pow({items}, (hash(i * 37) % 1000000) / 1000000.0)) - 1)::BIGINT
                       AS item
            FROM range({rows}) AS t(i)
        ) TO '{directory / "events"}' (FORMAT parquet, PER_THREAD_OUTPUT true, OVERWRITE true)
        """
    )
    connection.close()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(function: Callable[[], object], repeats: int) -> float:
    return timed_with_cpu(function, repeats)[0]


def timed_with_cpu(function: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median wall-clock and median CPU seconds of this process (DuckDB's threads included)."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        function()
        wall.append(time.perf_counter() - start)
        cpu.append(_cpu_seconds() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def _plan(sql: str, backend: Any, policy: Policy) -> QueryPlan:
    return plan_query(analyze(parse(sql), backend.catalog()), policy, epsilon=EPSILON, delta=DELTA)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def run_duckdb(directory: Path, repeats: int, queries: list[str], memory_limit: str | None) -> None:
    database = directory / "bench"  # no database file: the Parquet files are the dataset
    limit = f'memory_limit = "{memory_limit}"\n' if memory_limit else ""
    policy = parse_policy(POLICY.replace("[dataset]\n", f"[dataset]\n{limit}", 1))
    dpsql.set_policy(database, policy)
    # The raw baseline: same files, same views, same memory limit (the policy's), no dpsql on top.
    raw = DuckDBBackend.for_policy(database, policy)
    backend = Recording(DuckDBBackend.for_policy(database, policy), keep_frames=False)
    with dpsql.Session(database, analyst="bench", backend=backend) as db:
        print(
            f"{'query':36} {'dpsql s':>8} {'sql s':>6} {'bounded s':>10} {'floor s':>8} "
            f"{'plain s':>8} {'dpsql/bounded':>14} {'dpsql/floor':>12} {'dpsql/plain':>12} "
            f"{'cpu dpsql/floor':>16}"
        )
        for name in queries:
            private, plain, floor, options = QUERIES[name]
            # mad2r as before its cells were kept: the backend offers no scratch tables.
            backend.two_reads = "two reads" in name
            try:
                db.execute(private, epsilon=EPSILON, **options)  # warm caches for all four
            except DpsqlError as error:
                print(f"{name:36} skipped: {type(error).__name__}: {error}")
                continue
            # The bounded SQL is the last read of the rows dpsql sent (same shape; each query
            # draws its salt): mad2r's materialised cells, or the whole bounded aggregation.
            bounded = backend.bounded
            replay(raw, bounded)
            for warm in (floor, plain):
                raw.run(warm)
            backend.clear()
            dp, dp_cpu = timed_with_cpu(
                lambda q=private, o=options: db.execute(q, epsilon=EPSILON, **o), repeats
            )
            in_sql = sum(backend.seconds) / repeats
            base = timed(lambda b=bounded: replay(raw, b), repeats)
            floor_s, floor_cpu = timed_with_cpu(lambda q=floor: raw.run(q), repeats)
            plain_s = timed(lambda q=plain: raw.run(q), repeats)
            print(
                f"{name:36} {dp:8.2f} {in_sql:6.2f} {base:10.2f} {floor_s:8.2f} {plain_s:8.2f} "
                f"{dp / base:13.2f}x {dp / floor_s:11.2f}x {dp / plain_s:11.2f}x "
                f"{dp_cpu / floor_cpu:15.2f}x",
                flush=True,
            )
            backend.clear()
    raw.close()
    print(
        f"peak RSS of this process (dpsql and the raw baselines): {peak_rss_gib():.2f} GiB; "
        f"DuckDB memory_limit {memory_limit or 'default (80% of RAM)'} each"
    )


def replay(raw: DuckDBBackend, bounded: tuple[bool, str]) -> None:
    """Run a recorded read of the rows on ``raw``: into a temporary table (dropped), or not."""
    into_table, sql = bounded
    if into_table:
        with raw.scratch() as scratch:
            scratch.table(sql)
    else:
        raw.run(sql)


class Recording:
    """A backend that keeps what the wrapped one was sent, how long each query took and (with
    ``keep_frames``) what it returned: the true aggregates before noise. ``bounded`` is the last
    statement that read the rows (True: materialised as a temporary table, mad2r's cells)."""

    def __init__(self, backend: Any, *, keep_frames: bool = True):
        self.backend = backend
        self.dialect = backend.dialect
        self.keep_frames = keep_frames
        self.frames: list[pd.DataFrame] = []
        self.sqls: list[str] = []
        self.seconds: list[float] = []
        self.bounded: tuple[bool, str] = (False, "")
        self.two_reads = False

    def catalog(self) -> dict[str, dict[str, str]]:
        return self.backend.catalog()

    def run(self, sql: str) -> pd.DataFrame:
        start = time.perf_counter()
        frame = self.backend.run(sql)
        self.seconds.append(time.perf_counter() - start)
        self.sqls.append(sql)
        if SCRATCH_PREFIX not in sql:
            self.bounded = (False, sql)
        if self.keep_frames:
            self.frames.append(frame)
        return frame

    @property
    def scratch(self) -> Callable[[], Any] | None:
        """The wrapped backend's scratch (DuckDB), its materialising statements recorded; None
        with ``two_reads`` (the session then reads the rows twice for mad2r)."""
        return None if self.two_reads else self._scratch

    @contextlib.contextmanager
    def _scratch(self) -> Iterator[Any]:
        with self.backend.scratch() as scratch:
            yield _RecordingScratch(self, scratch)

    def clear(self) -> None:
        self.frames, self.sqls, self.seconds = [], [], []

    def close(self) -> None:
        self.backend.close()


class _RecordingScratch:
    def __init__(self, recording: Recording, scratch: Any):
        self.recording, self.scratch = recording, scratch

    def table(self, sql: str, progress: Any = None) -> str:
        start = time.perf_counter()
        name = self.scratch.table(sql, progress)
        self.recording.seconds.append(time.perf_counter() - start)
        self.recording.sqls.append(sql)
        self.recording.bounded = (True, sql)
        return name

    def values(self, *args: Any, **kwargs: Any) -> str:
        return self.scratch.values(*args, **kwargs)


def run_spark(directory: Path, threads: int) -> None:
    from dpsql.engine.spark import SparkBackend, local_spark, spark_unavailable

    reason = spark_unavailable()
    if reason is not None:
        sys.exit(f"--spark needs a local Spark: {reason}")
    database = directory / "bench"
    policy = parse_policy(POLICY)
    dpsql.set_policy(database, policy)
    start = time.perf_counter()
    spark = local_spark(threads)
    print(f"Spark {spark.version} local[{threads}] started in {time.perf_counter() - start:.1f}s")
    results: dict[str, list[Any]] = {}
    truths: dict[str, list[pd.DataFrame]] = {}
    seconds: dict[str, list[float]] = {}
    for name, make in (
        ("duckdb", lambda: DuckDBBackend.for_policy(database, policy)),
        ("spark", lambda: SparkBackend.for_policy(database, policy, spark)),
    ):
        backend = Recording(make())
        with dpsql.Session(
            database, analyst="bench", backend=backend, rng=np.random.default_rng(2024)
        ) as db:
            results[name], seconds[name] = [], []
            for query in SPARK_QUERIES:
                begin = time.perf_counter()
                results[name].append(db.execute(QUERIES[query][0], epsilon=EPSILON))
                seconds[name].append(time.perf_counter() - begin)
        truths[name] = backend.frames
    catalog = DuckDBBackend.for_policy(database, policy)
    grids = {q: _plan(QUERIES[q][0], catalog, policy).measurements[0].grid for q in SPARK_QUERIES}
    catalog.close()
    print(
        f"{'query':22} {'duckdb s':>9} {'spark s':>8}  true aggregates  "
        f"intervals holding the truth ({CONFIDENCE:.0%} each; duckdb, spark)"
    )
    for i, query in enumerate(SPARK_QUERIES):
        on_duckdb, on_spark = (_sorted(truths[n][i]) for n in ("duckdb", "spark"))
        grid = grids[query]
        covered = [_covered(results[n][i], truths[n][i], grid) for n in ("duckdb", "spark")]
        print(
            f"{query:22} {seconds['duckdb'][i]:9.2f} {seconds['spark'][i]:8.2f}  "
            f"{'identical' if on_duckdb.equals(on_spark) else 'DIFFERENT':15}  "
            + ", ".join(f"{hit}/{n}" for hit, n in covered)
        )
        for name, truth in (("duckdb", on_duckdb), ("spark", on_spark)):
            scale = grid if grid != 1.0 else 1  # sums come back in grid units
            rows = [[*row[:-1], row[-1] * scale] for row in truth.to_numpy().tolist()]
            print(f"    {name:6} true {rows}")
            print(f"    {name:6} DP   {results[name][i].rows}")
    spark.stop()


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted, values as plain comparable types."""
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype.kind in "iu":
            frame[column] = frame[column].astype("int64")
        else:
            frame[column] = frame[column].astype(str)
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def _covered(result: Any, truth: pd.DataFrame, grid: float) -> tuple[int, int]:
    """How many DP answers' intervals hold the true (bounded, unnoised) aggregate, of how many.

    One aggregate per query; sums come back from the database in units of the noise grid.
    """
    keys = list(truth.columns[:-1])
    values = {
        tuple(str(v) for v in row[:-1]): float(row[-1]) * grid
        for row in truth.itertuples(index=False)
    }
    column = result.columns[-1]
    hits = sum(
        low <= values.get(tuple(str(v) for v in row[: len(keys)]), 0.0) <= high
        for row, (low, high) in zip(result.rows, result.intervals[column], strict=True)
    )
    return hits, len(result.rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--users", type=int, default=None, help="default: rows / 10")
    parser.add_argument("--items", type=int, default=10_000_000, help="item key cardinality")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--queries", nargs="+", choices=list(QUERIES), default=list(QUERIES), metavar="QUERY"
    )
    parser.add_argument(
        "--memory-limit",
        default="3GB",
        help="DuckDB memory_limit of each of the two DuckDB instances ('' for DuckDB's default)",
    )
    parser.add_argument("--spark", action="store_true", help="compare DuckDB and Spark backends")
    parser.add_argument("--spark-rows", type=int, default=2_000_000)
    parser.add_argument("--threads", type=int, default=2, help="Spark local[threads]")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the temp dir")
    parser.add_argument("--generate-into", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = args.spark_rows if args.spark else args.rows
    users = args.users or max(1, rows // 10)
    if args.generate_into is not None:
        generate(args.generate_into, rows, users, args.items)
        return
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="dpsql-bench-") as name:
        directory = Path(name)
        start = time.perf_counter()
        command = [sys.executable, __file__, "--generate-into", str(directory)]
        command += ["--rows", str(rows), "--users", str(users), "--items", str(args.items)]
        subprocess.run(command, check=True)
        size = sum(p.stat().st_size for p in (directory / "events").glob("*.parquet"))
        print(
            f"generated {rows:,} rows ({users:,} users, {args.items:,} items) as "
            f"{size / 2**30:.2f} GiB of Parquet in {time.perf_counter() - start:.1f}s"
        )
        if args.spark:
            run_spark(directory, args.threads)
        else:
            run_duckdb(directory, args.repeats, args.queries, args.memory_limit or None)


if __name__ == "__main__":
    main()
