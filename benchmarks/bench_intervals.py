"""Every number with an honest error: coverage of derived intervals, and what streams state.

Run: ``python benchmarks/bench_intervals.py`` (defaults: 3,000 persons x 8 years, 50 runs per
shape, ε = 1 per query; ``--runs``, ``--persons``, ``--epsilon``).

An independent check, through ``dpsql.connect`` like an analyst, against DuckDB's own answer on
the raw rows (the policy's contribution bounds cut nothing on this panel, so the raw answer is
the bounded quantity the intervals cover):

* **Derived columns** (``GROUP BY year``, 8 cells per run): a ratio, a rate, a difference of sums,
  a LAG difference, a product with constants, a combination of three noises, STDDEV, VARIANCE, a
  share of the total (a window), a difference of two AVGs, and MEDIAN. For each: the kind the
  answer states (exact / conservative / approximate), the share of cells whose interval holds
  the truth, and the mean half-width. The median's interval is its chosen bin; it is checked
  against what it states (a value whose rank is within the stated rank error of q·n), and its
  coverage of the exact median is printed too, for honesty.
* **Accuracy targets**: AVG with ``OPTIONS(accuracy=..., expected_count=...)`` (every cell within
  the target), and ``simultaneous=true`` on counts (all cells of a run within the target at once).
* **Streams**: a range tree over ``age``, 1-D range half-widths before and after a 2-D PMW over
  ``(age, income)`` is opened (they must not grow), the PMW's stated intervals against the
  table's size (none may be wider), and their coverage.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from dpsql.engine.backends import DUCKDB_CONFIG
from dpsql.engine.policy import parse_policy
from dpsql.engine.session import set_policy
from tests.conftest import seeded_connect

BUDGET = {"epsilon": 1e9, "delta": 1e-3}
POLICY = {
    "dataset": BUDGET,
    "analysts": {"a": BUDGET},
    "tables": {
        "panel": {
            "privacy_unit": "pid",
            "max_groups_per_unit": 8,
            "max_rows_per_group": 1,  # one row per person and year: nothing is cut
            "max_rows_per_unit": 8,
            "columns": {
                "year": {"public_keys": list(range(2010, 2018))},
                **{c: {"bounds": [0, b]} for c, b in (("x", 100), ("y", 50), ("age", 99))},
                "income": {"bounds": [0, 199]},
            },
        }
    },
}

SHAPES = {
    "ratio SUM(x)/COUNT(*)": "SUM(x) / COUNT(*)",
    "rate FILTER/COUNT(*)": "COUNT(*) FILTER (WHERE flag) * 1.0 / COUNT(*)",
    "difference SUM(x)-SUM(y)": "SUM(x) - SUM(y)",
    "LAG difference": "COUNT(*) - LAG(COUNT(*)) OVER (ORDER BY year)",
    "product with constants": "COUNT(*) * 2.5 - 10",
    "three noises": "SUM(x) - 2 * SUM(y) + COUNT(*)",
    "STDDEV(x)": "STDDEV(x)",
    "VARIANCE(x)": "VARIANCE(x)",
    "share of total (window)": "COUNT(*) / SUM(COUNT(*)) OVER ()",
    "AVG(x) - AVG(y)": "AVG(x) - AVG(y)",
}


def _panel(persons: int, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    years = np.arange(2010, 2018)
    pid = np.repeat(np.arange(persons), years.size)
    size = pid.size
    # Each person is present in a year with probability 0.7 (one row at most: nothing is cut).
    present = rng.random(size) < 0.7
    frame = pd.DataFrame(
        {
            "pid": pid,
            "year": np.tile(years, persons).astype(np.int32),
            "x": np.clip(rng.normal(40, 20, size), 0, 100).round().astype(np.int32),
            "y": rng.integers(0, 51, size).astype(np.int32),
            "flag": rng.random(size) < 0.3,
            "age": np.repeat(rng.integers(0, 100, persons), years.size).astype(np.int32),
            "income": rng.gamma(2.0, 25.0, size).astype(np.int32).clip(0, 199),
        }
    )
    return frame[present].reset_index(drop=True)


def _database(directory: Path, persons: int) -> tuple[Path, duckdb.DuckDBPyConnection]:
    path = directory / "panel.duckdb"
    connection = duckdb.connect(str(path))
    connection.register("frame", _panel(persons))
    connection.execute("CREATE TABLE panel AS SELECT * FROM frame")
    connection.close()
    set_policy(path, parse_policy(POLICY))
    return path, duckdb.connect(str(path), read_only=True, config=DUCKDB_CONFIG)


def _covered(low: object, high: object, truth: float) -> bool:
    return (low is None or low <= truth + 1e-9) and (high is None or truth - 1e-9 <= high)


def derived(session, raw: duckdb.DuckDBPyConnection, runs: int, epsilon: float) -> None:
    print(f"derived columns: {runs} runs x 8 years at epsilon={epsilon:g} per query")
    print(f"{'shape':28} {'kind':13} {'coverage':>9} {'cells':>6} {'mean ±':>12}")
    for label, expression in SHAPES.items():
        sql = f"SELECT year, {expression} AS v FROM panel GROUP BY year ORDER BY year"
        truth = {
            year: None if value is None else float(value)
            for year, value in raw.execute(sql).fetchall()
        }
        covered = cells = 0
        widths: list[float] = []
        kinds: set[str] = set()
        for _ in range(runs):
            result = session.execute(sql, epsilon=epsilon)
            kinds.add(result.details["intervals"]["v"]["kind"])
            for (year, _), (low, high) in zip(result.rows, result.intervals["v"], strict=True):
                if truth[year] is None:
                    continue
                cells += 1
                covered += _covered(low, high, truth[year])
                if low is not None and high is not None:
                    widths.append((high - low) / 2)
        mean = f"{np.mean(widths):.4g}" if widths else "unbounded"
        print(f"{label:28} {'/'.join(sorted(kinds)):13} {covered / cells:9.3f} {cells:6d} "
              f"{mean:>12}")  # fmt: skip
    _median(session, raw, runs, epsilon)


def _median(session, raw: duckdb.DuckDBPyConnection, runs: int, epsilon: float) -> None:
    sql = "SELECT year, MEDIAN(x) AS v FROM panel GROUP BY year ORDER BY year"
    values = {
        year: np.sort(np.array([v for (v,) in raw.execute(
            "SELECT x FROM panel WHERE year = ?", [year]).fetchall()], dtype=float))
        for year in range(2010, 2018)
    }  # fmt: skip
    stated = strict = cells = 0
    for _ in range(runs):
        result = session.execute(sql, epsilon=epsilon)
        rank_error = result.details["quantiles"][0]["rank_error_with_probability_0.95"]
        for (year, _), (low, high) in zip(result.rows, result.intervals["v"], strict=True):
            data = values[year]
            below = np.searchsorted(data, low, side="left")
            through = np.searchsorted(data, high, side="right")
            target = data.size / 2
            stated += below <= target + rank_error and through >= target - rank_error
            strict += low <= float(np.median(data)) <= high
            cells += 1
    print(f"{'MEDIAN(x), as stated':28} {'conservative':13} {stated / cells:9.3f} {cells:6d} "
          f"{'one bin':>12}")  # fmt: skip
    print(f"{'MEDIAN(x), exact median':28} {'(not stated)':13} {strict / cells:9.3f} {cells:6d}")


def targets(session, raw: duckdb.DuckDBPyConnection, runs: int) -> None:
    print("\naccuracy targets (95%)")
    means = dict(raw.execute("SELECT year, AVG(x) FROM panel GROUP BY year").fetchall())
    counts = dict(raw.execute("SELECT year, COUNT(*) FROM panel GROUP BY year").fetchall())
    smallest = min(counts.values())
    avg = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(accuracy=2, expected_count="
        f"{smallest}) year, AVG(x) AS m FROM panel GROUP BY year"
    )
    simultaneous = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(accuracy=50, simultaneous=true) "
        "year, COUNT(*) AS n FROM panel GROUP BY year"
    )
    within = cells = tables = 0
    for _ in range(runs):
        result = session.execute(avg)
        for year, value in result.rows:
            within += abs(value - means[year]) <= 2
            cells += 1
        result = session.execute(simultaneous)
        tables += all(abs(n - counts[y]) <= 50 for y, n in result.rows)
    print(f"AVG(x) within ±2 (expected_count={smallest}): {within / cells:.3f} of {cells} cells")
    print(f"COUNT(*) all 8 cells within ±50 at once (simultaneous): {tables / runs:.3f} of "
          f"{runs} tables")  # fmt: skip


def streams(session, raw: duckdb.DuckDBPyConnection, runs: int, epsilon: float) -> None:
    rows = raw.execute("SELECT COUNT(*) FROM panel").fetchone()[0]
    rng = np.random.default_rng(9)
    ranges = [tuple(sorted(rng.integers(0, 100, 2))) for _ in range(runs)]
    boxes = [
        (*sorted(rng.integers(0, 100, 2)), *sorted(rng.integers(0, 200, 2))) for _ in range(runs)
    ]
    print(f"\nstreams on {rows} rows at epsilon={epsilon:g} each")
    session.open_stream("panel", [("age", 1)], epsilon=epsilon, mechanism="range_tree")

    def one_d() -> list[float]:
        widths = []
        for low, high in ranges:
            result = session.execute(
                f"SELECT COUNT(*) AS n FROM panel WHERE age BETWEEN {low} AND {high}"
            )
            ((a, b),) = result.intervals["n"]
            widths.append((b - a) / 2)
        return widths

    before = one_d()
    started = time.perf_counter()
    opened = session.open_stream("panel", [("age", 4), ("income", 8)], epsilon=epsilon)
    opening = time.perf_counter() - started
    after = one_d()
    worse = sum(b > a + 1e-9 for a, b in zip(before, after, strict=True))
    print(f"1-D ranges: mean ±{np.mean(before):.4g} before the PMW, ±{np.mean(after):.4g} "
          f"after; {worse} of {len(ranges)} wider after")  # fmt: skip
    print(f"PMW opened in {opening:.2f} s; stated at opening: "
          f"±{opened['stated_error']['stated']:.4g} (alpha after "
          f"{opened['stated_error']['expected_queries']} queries "
          f"±{opened['stated_error']['alpha_after_expected_queries']:.4g}); "
          f"warnings: {len(opened['stated_error']['warnings'])}")  # fmt: skip
    widest = covered = 0.0
    for a, b, c, d in boxes:
        low, high = 4 * (a // 4), 4 * (b // 4) + 3
        lo_i, hi_i = 8 * (c // 8), 8 * (d // 8) + 7
        sql = (
            f"SELECT COUNT(*) AS n FROM panel WHERE age BETWEEN {low} AND {high} "
            f"AND income BETWEEN {lo_i} AND {hi_i}"
        )
        ((start, end),) = session.execute(sql).intervals["n"]
        widest = max(widest, end - start)
        covered += _covered(start, end, raw.execute(sql.replace("AS n", "")).fetchone()[0])
    print(f"PMW 2-D boxes: widest interval {widest:.4g} (table: {rows} rows; "
          f"{'never wider' if widest <= rows else 'WIDER'}), coverage "
          f"{covered / len(boxes):.3f} of {len(boxes)}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--persons", type=int, default=3000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path, raw = _database(Path(directory), args.persons)
        try:
            started = time.perf_counter()
            with seeded_connect(path, analyst="a", rng=np.random.default_rng(7)) as session:
                derived(session, raw, args.runs, args.epsilon)
                targets(session, raw, args.runs)
                streams(session, raw, args.runs, args.epsilon)
            print(f"\n{time.perf_counter() - started:.0f} s in all")
        finally:
            raw.close()


if __name__ == "__main__":
    main()
