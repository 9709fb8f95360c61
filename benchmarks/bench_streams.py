"""Many range counts from one budget: online PMW and the range tree against per-query Laplace.

Run: ``python benchmarks/bench_streams.py`` (defaults: 10**6 rows, 1,000 queries, ε = 1).

Data: a DuckDB table of ``--rows`` persons (one row each) with two bounded integer columns
``x, y`` in ``[0, 99]`` (a correlated, clustered mixture: 10**4 cells) and one column ``z`` in
``[0, 9999]`` (10**4 cells). The bounded histograms are read once with DuckDB; every mechanism
then answers the same random workload at a total ε (``--epsilon``):

* ``2-D``: ``--queries`` random rectangles ``x BETWEEN a AND b AND y BETWEEN c AND d``;
* ``2-D IN``: ``--queries`` random ``x IN (10 random values) AND y BETWEEN c AND d`` (not
  ranges of the flattened domain: up to 10 row intervals each, and a range_tree stream, which
  covers one column, cannot answer them in the engine);
* ``1-D``: ``--queries`` random ranges ``z BETWEEN a AND b``.

Mechanisms (mean absolute error against the exact counts of the same run):

* ``pmw``: :class:`dpsql.mechanisms.pmw.OnlinePMW`, with the engine's default parameters
  (``dpsql.engine.streams.stream_params``: a warm start with 80% of ε, ``updates = 50``,
  threshold = comparison noise scale × ln(queries), 10 replay sweeps), pure ε; ``pmw cold``
  without the warm start (uniform p̂: the earlier default), ``pmw cold project`` with the
  projection update, ``pmw cold δ, c=400`` with δ = 1e-6 and 400 updates (advanced composition
  inside the sparse vector). A PMW stream that spends its updates stops: its error is over the
  queries it answered, and the count answered is printed;
* ``range tree``: :func:`dpsql.mechanisms.hierarchical.release_hierarchical` over the (row-major
  flattened) domain; a rectangle is a union of row intervals;
* ``laplace ε/k``: discrete Laplace per query at ε/queries (basic composition);
* ``laplace advanced``: per query at the largest ε0 whose k-fold advanced composition
  (Dwork–Rothblum–Vadhan) is at most ε with δ = 1e-6.

Timing (median per answer, same run): PMW ``ask`` and the range tree's answer with its interval,
against a DuckDB ``COUNT(*)`` of the same query on the table; with ``--engine``, also a whole
``Session.execute`` answered from a stream against one charged with fresh Laplace noise, the CPU
of a range-tree answer (routing and the tree's answer) and of a point count answered from the
synopsis an ALP ``GROUP BY`` stored (table ``k``: text keys), each against DuckDB's own count.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from dpsql.engine.streams import (
    DEFAULT_UPDATES,
    StreamColumn,
    StreamExhaustedError,
    stream_params,
)
from dpsql.mechanisms.hierarchical import HierarchicalHistogram, release_hierarchical
from dpsql.mechanisms.laplace import noise_scale, sample_discrete_laplace
from dpsql.mechanisms.pmw import OnlinePMW

SIDE = 100
WIDE = 10_000
DELTA = 1e-6


def _table(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.Generator(np.random.PCG64(seed))
    centres = rng.uniform(10, 90, (6, 2))
    which = rng.integers(0, 6, rows)
    xy = centres[which] + rng.normal(0, 8, (rows, 2)) @ np.array([[1.0, 0.5], [0.0, 0.8]])
    xy = np.clip(np.rint(xy), 0, SIDE - 1).astype(np.int64)
    z = np.clip(np.rint(rng.lognormal(7.5, 0.8, rows)), 0, WIDE - 1).astype(np.int64)
    return pd.DataFrame({"uid": np.arange(rows), "x": xy[:, 0], "y": xy[:, 1], "z": z})


def _histograms(connection: duckdb.DuckDBPyConnection) -> tuple[np.ndarray, np.ndarray]:
    grid = np.zeros(SIDE * SIDE, dtype=np.int64)
    cells, counts = (
        connection.execute(f"SELECT x * {SIDE} + y, COUNT(*) FROM t GROUP BY ALL")
        .fetchnumpy()
        .values()
    )
    grid[cells.astype(np.int64)] = counts
    wide = np.zeros(WIDE, dtype=np.int64)
    cells, counts = (
        connection.execute("SELECT z, COUNT(*) FROM t GROUP BY ALL").fetchnumpy().values()
    )
    wide[cells.astype(np.int64)] = counts
    return grid, wide


def _workloads(queries: int, seed: int) -> dict[str, tuple[list[np.ndarray], list[str]]]:
    rng = np.random.Generator(np.random.PCG64(seed))
    rectangles = np.sort(rng.integers(0, SIDE, (queries, 2, 2)), axis=2)
    masks, sqls = [], []
    index = np.arange(SIDE)
    for (a, b), (c, d) in rectangles:
        rows = (index >= a) & (index <= b)
        cols = (index >= c) & (index <= d)
        masks.append(np.outer(rows, cols).ravel())
        sqls.append(f"SELECT COUNT(*) FROM t WHERE x BETWEEN {a} AND {b} AND y BETWEEN {c} AND {d}")
    in_masks, in_sqls = [], []
    for _ in range(queries):
        values = np.sort(rng.choice(SIDE, 10, replace=False))
        c, d = np.sort(rng.integers(0, SIDE, 2))
        rows = np.isin(index, values)
        cols = (index >= c) & (index <= d)
        in_masks.append(np.outer(rows, cols).ravel())
        listed = ", ".join(str(v) for v in values)
        in_sqls.append(f"SELECT COUNT(*) FROM t WHERE x IN ({listed}) AND y BETWEEN {c} AND {d}")
    ranges = np.sort(rng.integers(0, WIDE, (queries, 2)), axis=1)
    wide = np.arange(WIDE)
    return {
        "2-D": (masks, sqls),
        "2-D IN": (in_masks, in_sqls),
        "1-D": (
            [(wide >= a) & (wide <= b) for a, b in ranges],
            [f"SELECT COUNT(*) FROM t WHERE z BETWEEN {a} AND {b}" for a, b in ranges],
        ),
    }


def _advanced_epsilon(total: float, steps: int, delta: float) -> float:
    """The largest per-step ε0 whose ``steps``-fold advanced composition is at most ``total``."""
    low, high = 0.0, total
    for _ in range(200):
        mid = (low + high) / 2
        bound = math.sqrt(2 * steps * math.log(1 / delta)) * mid + steps * mid * math.expm1(mid)
        low, high = (mid, high) if bound <= total else (low, mid)
    return low


PMW_VARIANTS = (
    ("pmw", 0.0, DEFAULT_UPDATES, "mw", None),
    ("pmw cold", 0.0, DEFAULT_UPDATES, "mw", 0.0),
    ("pmw cold project", 0.0, DEFAULT_UPDATES, "project", 0.0),
    ("pmw cold δ, c=400", DELTA, 400, "mw", 0.0),
)
"""(label, δ, updates, update rule, warm share (None: the engine's)): the engine's default
first."""


def _pmw(histogram, epsilon, delta, updates, update, warm, queries, rng) -> OnlinePMW:
    domain = (StreamColumn("v", "BIGINT", 0, histogram.size - 1, 1),)
    params = stream_params(
        "pmw",
        domain,
        epsilon=epsilon,
        delta=delta,
        sensitivity=1,
        updates=updates,
        threshold=None,
        expected_queries=queries,
        warm_share=warm,
    )
    return OnlinePMW(
        histogram,
        epsilon=epsilon,
        delta=delta,
        updates=updates,
        threshold=params["threshold"],
        replays=params["replays"] if update == "mw" else 5,
        update=update,
        count_share=params["count_share"],
        value_share=params["value_share"],
        warm_share=params["warm_share"],
        rng=rng,
    )


def _errors(answers: list[float], truth: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(answers, dtype=float) - truth)))


def _median_ms(calls: list[Callable[[], object]]) -> float:
    samples = []
    for call in calls:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return 1000 * statistics.median(samples)


def _run_workload(name, histogram, masks, sqls, connection, args, rng) -> None:
    k = len(masks)
    truth = np.array([int(histogram[m].sum()) for m in masks])
    results: dict[str, float] = {}
    timings: dict[str, float] = {}

    for label, delta, updates, update, warm in PMW_VARIANTS:
        pmw = _pmw(histogram, args.epsilon, delta, updates, update, warm, k, rng)
        answers, seconds, answered = [], {True: [], False: []}, 0
        for mask in masks:
            if pmw.halted:
                answers.append(np.nan)
                continue
            start = time.perf_counter()
            answer = pmw.ask(mask)
            seconds[answer.updated].append(time.perf_counter() - start)
            answers.append(answer.value)
            answered += 1
        done = np.isfinite(answers)
        results[label] = _errors(np.asarray(answers)[done], truth[done])
        for updated, kind in ((False, "from p̂"), (True, "update")):
            if seconds[updated]:
                timings[f"{label} ({kind})"] = 1000 * statistics.median(seconds[updated])
        print(
            f"  {label}: {answered}/{k} answered (MAE over those), "
            f"{updates - pmw.updates_left} of {updates} updates spent, threshold "
            f"{pmw.threshold:.0f}, cost {pmw.cost}, alpha(k, 0.05) {pmw.alpha(k):.0f}"
        )

    tree = release_hierarchical(histogram, epsilon=args.epsilon, rng=rng)
    answers = [tree.answer_cells(m).value for m in masks]
    results["range tree"] = _errors(answers, truth)
    timings["range tree"] = _median_ms([lambda m=m: tree.answer_cells(m) for m in masks[:200]])
    widths = [tree.answer_cells(m).upper - tree.answer_cells(m).value for m in masks[:50]]
    print(
        f"  range tree: branching {tree.branching}, height {tree.height}, noise scale "
        f"{float(tree.scale):g}, mean 95% half-width {np.mean(widths):.0f}"
    )

    per_query = noise_scale(1, args.epsilon / k)
    noise = sample_discrete_laplace(per_query, k, rng)
    results[f"laplace ε/{k}"] = _errors(truth + noise, truth)
    step = _advanced_epsilon(args.epsilon, k, DELTA)
    noise = sample_discrete_laplace(noise_scale(1, step), k, rng)
    results[f"laplace advanced (ε0={step:.2e}, δ={DELTA:g})"] = _errors(truth + noise, truth)

    timings["duckdb COUNT(*)"] = _median_ms(
        [lambda s=s: connection.execute(s).fetchone() for s in sqls[: args.timed]]
    )

    baseline = results[f"laplace ε/{k}"]
    print(f"  mean absolute error over {k} queries (ε = {args.epsilon:g} in total):")
    for label, error in results.items():
        print(f"    {label:45s} {error:12.1f}   ({baseline / error:6.1f}x better than ε/k)")
    duck = timings["duckdb COUNT(*)"]
    print("  median time per answer:")
    for label, ms in timings.items():
        print(f"    {label:45s} {ms:9.3f} ms   ({ms / duck:6.3f}x a DuckDB count)")


def _engine(database: Path, table: pd.DataFrame, args) -> None:
    """Whole ``Session.execute`` per answer: from a stream vs freshly charged Laplace."""
    import dpsql

    policy = database.with_suffix(".toml")
    policy.write_text(
        "[dataset]\nepsilon = 1000.0\ndelta = 1e-4\n[analysts.a]\nepsilon = 1000.0\ndelta = 1e-4\n"
        '[tables.t]\nprivacy_unit = "uid"\n'
        "[tables.t.columns.x]\nbounds = [0, 99]\n[tables.t.columns.y]\nbounds = [0, 99]\n"
        "[tables.t.columns.z]\nbounds = [0, 9999]\n"
        '[tables.k]\nprivacy_unit = "uid"\n'
    )
    dpsql.set_policy(database, policy)
    rng = np.random.Generator(np.random.PCG64(3))
    with dpsql.connect(database, analyst="a") as session:
        session.open_stream("t", [("x", 1), ("y", 1)], epsilon=args.epsilon)
        session.open_stream("t", [("z", 1)], epsilon=args.epsilon, mechanism="range_tree")
        rectangles = [
            f"SELECT COUNT(*) FROM t WHERE x BETWEEN {a} AND {a + 20} AND y < {b}"
            for a, b in rng.integers(0, 79, (args.timed, 2))
        ]
        ranges = [
            f"SELECT COUNT(*) FROM t WHERE z BETWEEN {a} AND {a + 500}"
            for a in rng.integers(0, 9000, args.timed)
        ]
        pmw_seconds: dict[bool, list[float]] = {True: [], False: []}
        for sql in rectangles:
            start = time.perf_counter()
            try:
                result = session.execute(sql)
            except StreamExhaustedError:
                break
            pmw_seconds[result.details["updated"]].append(time.perf_counter() - start)
        stream_tree = _median_ms([lambda s=s: session.execute(s) for s in ranges])
        start = time.process_time()
        for sql in ranges:
            session.execute(sql)
        tree_cpu = 1000 * (time.process_time() - start) / len(ranges)
        desk = session._streams
        # Ranges other than those asked above (widths 499 and 498, not 500): their cells are
        # chosen afresh, not found among the session's selections (kept per predicate).
        bound, recorded = (
            [
                session.bind(f"SELECT COUNT(*) FROM t WHERE z BETWEEN {a} AND {a + width}")
                for a in rng.integers(0, 9000, args.timed)
            ]
            for width in (499, 498)
        )
        first = desk.route(bound[0].bound.shape, None)
        assert first is not None and first.stream.mechanism == "range_tree", first
        # The stream's tree as stored, answered here apart from the desk: it computes again the
        # half-width routing stated (the desk's own tree keeps it), so this is an upper bound.
        tree = HierarchicalHistogram.from_bytes(first.stream.data)
        start = time.process_time()
        for query in bound:
            routed = desk.route(query.bound.shape, None)
            tree.answer_cells(routed.selected, 0.95)
        answer_cpu = 1000 * (time.process_time() - start) / len(bound)
        start = time.process_time()
        for query in recorded:
            desk.answer(desk.route(query.bound.shape, None), query.bound.shape, query.normalized)
        recorded_cpu = 1000 * (time.process_time() - start) / len(recorded)
        raw = session.backend._connection  # the session's own DuckDB connection
        start = time.process_time()
        for sql in ranges:
            raw.execute(sql).fetchall()
        duck_cpu = 1000 * (time.process_time() - start) / len(ranges)
        fresh = _median_ms(
            [lambda s=s: session.execute(s, mechanism="laplace", epsilon=0.01) for s in ranges]
        )
        # Point counts from the synopsis an ALP GROUP BY stored (each text asked once).
        session.execute(
            "SELECT key, COUNT(*) FROM k GROUP BY key", epsilon=1.0, delta=1e-6, mechanism="alp"
        )
        points = [f"SELECT COUNT(*) FROM k WHERE key = 'k{i}'" for i in range(1, args.timed + 1)]
        assert session.execute(points[0]).mechanism.startswith("synopsis:")
        start = time.process_time()
        for sql in points:
            session.execute(sql)
        synopsis_cpu = 1000 * (time.process_time() - start) / len(points)
        start = time.process_time()
        for sql in points:
            raw.execute(sql).fetchall()
        point_cpu = 1000 * (time.process_time() - start) / len(points)
    print("engine, median per Session.execute:")
    pmw_rows = [
        (
            f"from the pmw stream ({kind}, {len(pmw_seconds[updated])} answers)",
            1000 * statistics.median(pmw_seconds[updated]),
        )
        for updated, kind in ((False, "from p̂"), (True, "update"))
        if pmw_seconds[updated]
    ]
    for label, ms in (
        *pmw_rows,
        ("from the range-tree stream", stream_tree),
        ("fresh Laplace (charged, reads the table)", fresh),
    ):
        print(f"    {label:45s} {ms:9.3f} ms   ({ms / fresh:6.3f}x fresh Laplace)")
    print("engine, CPU per range-tree answer (target <= 1 ms for the answer itself):")
    for label, ms in (
        ("whole Session.execute (parse, bind, ledger)", tree_cpu),
        ("the answer: cells chosen + tree answer", answer_cpu),
        ("the same with its zero-cost ledger entry", recorded_cpu),
        ("DuckDB's own COUNT(*) of the same query", duck_cpu),
    ):
        print(f"    {label:45s} {ms:9.3f} ms   ({ms / duck_cpu:6.3f}x DuckDB's count)")
    print("engine, CPU per point count from a stored synopsis:")
    for label, ms in (
        ("whole Session.execute (a text asked once)", synopsis_cpu),
        ("DuckDB's own COUNT(*) of the same query", point_cpu),
    ):
        print(f"    {label:45s} {ms:9.3f} ms   ({ms / point_cpu:6.3f}x DuckDB's count)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timed", type=int, default=100, help="queries timed against DuckDB")
    parser.add_argument("--engine", action="store_true", help="also time Session.execute")
    args = parser.parse_args()
    table = _table(args.rows, args.seed)
    with tempfile.TemporaryDirectory() as directory:
        database = Path(directory) / "streams.duckdb"
        connection = duckdb.connect(str(database))
        connection.register("frame", table)
        connection.execute("CREATE TABLE t AS SELECT * FROM frame")
        connection.unregister("frame")
        # Text keys, Zipf-like over 5,000, one row per person: the synopsis an ALP GROUP BY keeps.
        connection.execute(
            f"CREATE TABLE k AS SELECT range AS uid, 'k' || CAST(FLOOR(POW(5000, "
            f"hash(range * 7) % 1000000 / 1000000.0)) AS INT) AS key FROM range({args.rows})"
        )
        grid, wide = _histograms(connection)
        workloads = _workloads(args.queries, args.seed + 1)
        rng = np.random.Generator(np.random.PCG64(args.seed + 2))
        print(f"{args.rows} rows; {args.queries} queries per workload; ε = {args.epsilon:g}")
        for name, histogram in (("2-D", grid), ("2-D IN", grid), ("1-D", wide)):
            masks, sqls = workloads[name]
            print(f"{name} workload ({histogram.size} cells):")
            _run_workload(name, histogram, masks, sqls, connection, args, rng)
        connection.close()
        if args.engine:
            _engine(database, table, args)


if __name__ == "__main__":
    main()
