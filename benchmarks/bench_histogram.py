"""DP GROUP BY over keys without public keys: end-to-end cost vs raw DuckDB, and utility.

Part 1 (speed). For each ``--rows`` size, build a ``requests(user_id, url, item)`` table inside
DuckDB (no download; about 5 rows per user, URL ranks log-uniform over ``rows/8`` keys, i.e.
Zipf(1)-like), then time in the same run, interleaved, ``SELECT url, COUNT(*) FROM requests GROUP
BY url`` raw on DuckDB (fetched with ``.df()`` like the engine's backend) and through dpsql with the
threshold (δ = 1e-6) and the combined threshold + ALP synopsis (``mechanism="alp"``). Medians of
wall seconds and of CPU seconds (``getrusage(RUSAGE_SELF)`` user + sys, which counts DuckDB's
worker threads). Each dpsql run is split into: ``sql`` (the generated bounded SQL in DuckDB,
including the fetch), ``mech`` (``threshold.release`` / ``combined.release``), ``ledger`` (the
charge), ``store`` (saving the synopsis) and ``rest`` (parse, plan, conversions, result). One run
each of diagnostic SQL follows: the engine's captured SQL alone, ``COUNT(DISTINCT user_id)`` (the
least any L∞ = 1 bounding must do), and two hand-written bounding queries with the same semantics
(rank every unit's keys in salted-MD5 order, as the engine does; rank only the units with more than
``max_groups_per_unit`` keys, the suggested fix), checked to return the identical result.

Part 2 (utility). Its table: 200k users with up to 10 rows each (1M rows), URLs Zipf(1) over
100k, ε = 1, δ = 1e-6, ``max_groups_per_unit`` = 10, ``max_rows_per_group`` = 1. The truth is the
bounded count (distinct users per URL; no user has more than 10 URLs, so it is exact). Reported:
keys released and mean |error| of released counts through the engine (threshold and combined, the
latter's lookups of unreleased keys from the stored synopsis too), then at library level: a sweep
of the combined structure's budget split, the ``max_groups_per_unit`` policy lever, and an analytic
what-if for Gaussian thresholding (not a dpsql mechanism).

    python benchmarks/bench_histogram.py                  # 1M and 10M rows + utility
    python benchmarks/bench_histogram.py --quick          # 1M rows, 1 repeat, fewer trials
    python benchmarks/bench_histogram.py --rows 1000000 --repeats 5 --key item
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
from scipy import optimize, stats

import dpsql
from dpsql.engine.backends import DUCKDB_CONFIG
from dpsql.engine.session import ledger_path
from dpsql.engine.synopses import SynopsisStore
from dpsql.mechanisms import (
    combined,
    gaussian_threshold,
    joint_selection,
    threshold,
    weighted_selection,
)
from dpsql.mechanisms.combined import CombinedRelease
from dpsql.mechanisms.laplace import noise_scale
from dpsql.mechanisms.random import _seeded_for_tests

EPSILON, DELTA = 1.0, 1e-6
MAX_GROUPS, MAX_ROWS = 10, 1
SECTIONS = ("sql", "mech", "ledger", "store")

POLICY = """
[dataset]
epsilon = 1000000.0
delta = 0.5
[analysts.bench]
epsilon = 1000000.0
delta = 0.5
[tables.{table}]
privacy_unit = "user_id"
max_groups_per_unit = {groups}
max_rows_per_group = {rows}
max_rows_per_unit = {groups}
[tables.{table}.columns.{column}]
expected_keys = {keys}
"""


def cpu_seconds() -> float:
    """User + system CPU of this process, all threads (DuckDB's workers included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Meter:
    """Wall and CPU seconds per named section of one run."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), cpu_seconds()
        try:
            yield
        finally:
            self.wall[name] += time.perf_counter() - wall
            self.cpu[name] += cpu_seconds() - cpu


class Instrumented:
    """Time the stages of ``Session.execute`` by wrapping its seams (no engine code changed).

    The session's backend ``run`` and ledger ``charge`` are wrapped on the instance; during
    :meth:`execute` the mechanisms' ``release`` functions and ``SynopsisStore.save`` are wrapped
    where they are defined, so the engine's internal layout does not matter (nested calls, such as
    ``combined.release`` calling ``threshold.release``, count once).
    """

    def __init__(self, session: dpsql.Session):
        self.session = session
        self.meter = Meter()
        self.last_sql = ""
        run, charge = session.backend.run, session.ledger_store.charge

        def timed_run(sql: str) -> pd.DataFrame:
            self.last_sql = sql
            with self.meter.section("sql"):
                return run(sql)

        def timed_charge(**kwargs: Any) -> Any:
            with self.meter.section("ledger"):
                return charge(**kwargs)

        session.backend.run = timed_run  # type: ignore[method-assign]
        session.ledger_store.charge = timed_charge  # type: ignore[method-assign]

    def _timed(
        self, function: Callable[..., Any], section: str, depth: list[int]
    ) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return function(*args, **kwargs)
            depth[0] += 1
            try:
                with self.meter.section(section):
                    return function(*args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        modules = (threshold, combined, gaussian_threshold, weighted_selection, joint_selection)
        targets: list[tuple[Any, str, str]] = [(module, "release", "mech") for module in modules]
        targets.append((SynopsisStore, "save", "store"))
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
        depth = [0]
        for owner, name, section in targets:
            setattr(owner, name, self._timed(getattr(owner, name), section, depth))
        try:
            yield
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    def execute(self, sql: str, **options: Any) -> tuple[Meter, Any]:
        self.meter = Meter()
        with self.patched(), self.meter.section("total"):
            result = self.session.execute(sql, **options)
        if "mech" not in self.meter.wall or "sql" not in self.meter.wall:
            raise RuntimeError("the engine no longer calls the wrapped seams; update Instrumented")
        return self.meter, result


# --------------------------------------------------------------------------------------- part 1
def build_requests(path: Path, rows: int, users: int, key_space: int) -> None:
    """``rows`` rows: user = hash mod ``users``; URL rank = floor(key_space^U), P(rank) ~ 1/rank."""
    connection = duckdb.connect(str(path))
    connection.execute(
        f"""
        CREATE TABLE requests AS
        SELECT user_id, item, 'https://example.com/p/' || item AS url
        FROM (
            SELECT (hash(i) % {users})::BIGINT AS user_id,
                   CAST(floor(exp((hash(i * 7) % 1000000007) / 1000000007.0
                                  * ln({key_space}))) AS BIGINT) AS item
            FROM range({rows}) t(i)
        )
        """
    )
    connection.close()


def bounding_sql(key: str, salt: int, rank_all: bool) -> str:
    """Contribution bounding (L0 groups per unit in salted-MD5 order, L∞ rows per group) and the
    per-key counts, written by hand for ``requests``.

    ``rank_all`` ranks every unit's cells (the engine's semantics); otherwise only units with more
    than L0 cells are ranked and the others keep every cell, which is the same result (a unit with
    at most L0 cells keeps them all under ``ROW_NUMBER() <= L0``) for less work: the suggested fix.
    """
    order = f"MD5('{int(salt)}' || '|' || CAST(__key0 AS VARCHAR)), __key0"
    cells = (
        f"cells AS (SELECT user_id AS __unit, {key} AS __key0, COUNT(*) AS __rows "
        f"FROM requests WHERE {key} IS NOT NULL GROUP BY user_id, {key})"
    )
    ranked = (
        f"SELECT __key0, __rows FROM (SELECT __key0, __rows, ROW_NUMBER() OVER "
        f"(PARTITION BY __unit ORDER BY {order}) AS __group_rank FROM {{source}}) "
        f"WHERE __group_rank <= {MAX_GROUPS}"
    )
    if rank_all:
        kept = ranked.format(source="cells")
        ctes = [cells]
    else:
        heavy = f"SELECT __unit FROM cells GROUP BY __unit HAVING COUNT(*) > {MAX_GROUPS}"
        ctes = [cells, f"heavy AS ({heavy})"]
        kept = (
            "SELECT __key0, __rows FROM cells ANTI JOIN heavy USING (__unit) UNION ALL "
            + ranked.format(source="cells SEMI JOIN heavy USING (__unit)")
        )
    return (
        f"WITH {', '.join(ctes)}, kept AS ({kept}) "
        f"SELECT __key0 AS {key}, SUM(LEAST(__rows, {MAX_ROWS})) AS n FROM kept GROUP BY __key0"
    )


def _once(run: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    out = run()
    return time.perf_counter() - wall, cpu_seconds() - cpu, out


def bench_speed(rows: int, repeats: int, key: str, diagnose: bool, directory: Path) -> None:
    path = directory / f"requests_{rows}.duckdb"
    users, key_space = max(1, rows // 5), max(10, rows // 8)
    wall, _, _ = _once(lambda: build_requests(path, rows, users, key_space))
    dpsql.set_policy(
        path,
        POLICY.format(
            table="requests", groups=MAX_GROUPS, rows=MAX_ROWS, column=key, keys=key_space
        ),
    )
    raw = duckdb.connect(str(path), read_only=True, config=dict(DUCKDB_CONFIG))
    distinct, units = raw.execute(
        f"SELECT COUNT(DISTINCT {key}), COUNT(DISTINCT user_id) FROM requests"
    ).fetchone()
    print(
        f"\n== {rows:,} rows, {units:,} users, {distinct:,} distinct {key} keys "
        f"(key space {key_space:,}); built in {wall:.1f}s; ε = {EPSILON}, δ = {DELTA}, "
        f"L0 = {MAX_GROUPS}, L∞ = {MAX_ROWS}; median of {repeats}; load {os.getloadavg()[0]:.1f}"
    )
    plain = f"SELECT {key}, COUNT(*) FROM requests GROUP BY {key}"
    private = f"SELECT {key}, COUNT(*) FROM requests GROUP BY {key}"
    modes: dict[str, dict[str, Any]] = {
        "threshold": {"epsilon": EPSILON, "delta": DELTA, "mechanism": "threshold"},
        "default": {"epsilon": EPSILON, "delta": DELTA},
        "alp": {"epsilon": EPSILON, "delta": DELTA, "mechanism": "alp"},
    }
    with dpsql.connect(path, analyst="bench") as session:
        instrumented = Instrumented(session)
        raw.execute(plain).df()  # warm the buffer pool (shared with dpsql's read-only instance)
        if rows <= 2_000_000:
            for options in modes.values():
                instrumented.execute(private, **options)
        samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
        meters: dict[str, list[Meter]] = defaultdict(list)
        released: dict[str, list[int]] = defaultdict(list)
        for _ in range(repeats):  # interleaved, so load from other jobs hits every mode alike
            w, c, _ = _once(lambda: raw.execute(plain).df())
            samples["raw"].append((w, c))
            for mode, options in modes.items():
                meter, result = instrumented.execute(private, **options)
                samples[mode].append((meter.wall["total"], meter.cpu["total"]))
                meters[mode].append(meter)
                released[mode].append(len(result.rows))
        raw_wall = statistics.median(w for w, _ in samples["raw"])
        raw_cpu = statistics.median(c for _, c in samples["raw"])
        print(
            f"{'':16} {'wall s':>7} {'cpu s':>7} {'wall/raw':>8} {'cpu/raw':>8} | "
            f"{'cpu s: sql':>10} {'mech':>6} {'ledger':>6} {'store':>6} {'rest':>6} | "
            f"{'wall s: sql':>11} {'mech':>6} {'rest':>6} | released"
        )
        print(f"{'raw DuckDB':16} {raw_wall:7.3f} {raw_cpu:7.3f} {1:8.2f}x {1:8.2f}x |")
        for mode in modes:
            w = statistics.median(s[0] for s in samples[mode])
            c = statistics.median(s[1] for s in samples[mode])
            part = {
                (kind, name): statistics.median(getattr(m, kind)[name] for m in meters[mode])
                for kind in ("wall", "cpu")
                for name in (*SECTIONS, "total")
            }

            def rest(kind: str, part: dict = part) -> float:
                return part[(kind, "total")] - sum(part[(kind, name)] for name in SECTIONS)

            wall_rest = rest("wall") + part[("wall", "ledger")] + part[("wall", "store")]
            print(
                f"{'dpsql ' + mode:16} {w:7.3f} {c:7.3f} {w / raw_wall:8.2f}x "
                f"{c / raw_cpu:8.2f}x | {part[('cpu', 'sql')]:10.3f} {part[('cpu', 'mech')]:6.3f} "
                f"{part[('cpu', 'ledger')]:6.3f} {part[('cpu', 'store')]:6.3f} "
                f"{rest('cpu'):6.3f} | {part[('wall', 'sql')]:11.3f} "
                f"{part[('wall', 'mech')]:6.3f} {wall_rest:6.3f} | "
                f"{statistics.median(released[mode]):,.0f}"
            )
        if diagnose:
            diagnostics(raw, instrumented.last_sql, key, raw_cpu, reference=rows <= 2_000_000)
    raw.close()


def diagnostics(
    raw: duckdb.DuckDBPyConnection, engine_sql: str, key: str, raw_cpu: float, reference: bool
) -> None:
    """One run each: where the SQL time goes, and what a cheaper bounding query would save.

    ``reference`` also times the hand-written rank-every-unit query and checks that the proposed
    one returns the identical result (skipped for large tables to keep the run short).
    """
    heavy = raw.execute(
        f"""SELECT COUNT(*) FILTER (WHERE n > {MAX_GROUPS}) / COUNT(*),
                   SUM(n) FILTER (WHERE n > {MAX_GROUPS}) / SUM(n)
            FROM (SELECT user_id, COUNT(DISTINCT {key}) AS n FROM requests GROUP BY user_id)"""
    ).fetchone()
    print(
        f"diagnostics, one run each, CPU s (× raw): units with > L0 keys {heavy[0]:.1%}, "
        f"holding {heavy[1]:.1%} of (unit, key) cells"
    )
    candidates = {
        "engine's bounded SQL alone": engine_sql,
        f"COUNT(DISTINCT user_id) GROUP BY {key} (no L0 bound)": (
            f"SELECT {key}, COUNT(DISTINCT user_id) FROM requests GROUP BY {key}"
        ),
        "proposed: rank only units with > L0 cells": bounding_sql(key, 7, False),
    }
    if reference:
        candidates["hand-written, rank every unit (engine's semantics)"] = bounding_sql(
            key, 7, True
        )
    frames = {}
    for name, sql in candidates.items():
        _, cpu, frames[name] = _once(lambda sql=sql: raw.execute(sql).df())
        print(f"  {name:55} {cpu:7.3f} ({cpu / raw_cpu:5.1f}x)")
    if reference:
        first, second = (
            frames[name].sort_values(key).reset_index(drop=True) for name in list(candidates)[2:]
        )
        print(f"  the two hand-written queries return the identical result: {first.equals(second)}")


# --------------------------------------------------------------------------------------- part 2
def zipf_visits(seed: int = 3) -> pd.DataFrame:
    """The table (as in bench_alp): 200k users, 1-10 rows each, ~1M rows, Zipf(1) URLs."""
    rng = np.random.default_rng(seed)
    rows_per_user = rng.integers(1, 11, 200_000)
    rows_per_user = np.maximum(1, np.round(rows_per_user * 1_000_000 / rows_per_user.sum()))
    users = np.repeat(np.arange(200_000), rows_per_user.astype(int))
    ranks = np.arange(1, 100_001)
    ranked = rng.choice(100_000, size=users.size, p=(1 / ranks) / np.sum(1 / ranks))
    return pd.DataFrame({"user_id": users, "url": URLS[ranked]})


URLS = np.array([f"https://example.com/p/{i}" for i in range(100_000)], dtype=object)


def _released_error(keys: np.ndarray, values: np.ndarray, truth: pd.Series) -> tuple[float, float]:
    exact = truth.reindex(keys).fillna(0).to_numpy()
    return float(np.abs(values - exact).mean()), float((values - exact).mean())


def _lookup_errors(structure: CombinedRelease, truth: np.ndarray) -> dict[str, float]:
    """Mean |error| of lookups over all 100k URLs, by true count, for unreleased keys."""
    released = structure.released(URLS)
    answers = structure.lookup(URLS)
    out = {}
    buckets = {"0": (0, 1), "1-9": (1, 10), "10-99": (10, 100), "≥100": (100, 2**62)}
    for name, (low, high) in buckets.items():
        chosen = ~released & (truth >= low) & (truth < high)
        out[name] = float(np.abs(answers[chosen] - truth[chosen]).mean())
    unreleased = ~released
    out["all"] = float(np.abs(answers[unreleased] - truth[unreleased]).mean())
    out["zero"] = float(truth[unreleased].mean())
    out["n≥100"] = int((unreleased & (truth >= 100)).sum())
    out["zero≥100"] = float(truth[unreleased & (truth >= 100)].mean())
    return out


def _format_lookup(errors: dict[str, float]) -> str:
    return (
        f"unreleased lookups mean|err| {errors['all']:.1f} (answering 0: {errors['zero']:.1f}); "
        f"by true count 0: {errors['0']:.1f}, 1-9: {errors['1-9']:.1f}, "
        f"10-99: {errors['10-99']:.1f}, ≥100: {errors['≥100']:.1f} ({errors['n≥100']:.0f} keys; "
        f"answering 0: {errors['zero≥100']:.1f})"
    )


def utility_engine(directory: Path, visits: pd.DataFrame, trials: int) -> pd.Series:
    """Through dpsql: threshold and combined on a DuckDB table; returns the bounded truth."""
    path = directory / "visits.duckdb"
    connection = duckdb.connect(str(path))
    connection.register("frame", visits)
    connection.execute("CREATE TABLE visits AS SELECT user_id::BIGINT AS user_id, url FROM frame")
    most = connection.execute(
        "SELECT MAX(n) FROM (SELECT COUNT(DISTINCT url) AS n FROM visits GROUP BY user_id)"
    ).fetchone()[0]
    assert most <= MAX_GROUPS, "the L0 bound would bind: truth would need the engine's order"
    truth = connection.execute(
        "SELECT url, COUNT(DISTINCT user_id) AS n FROM visits GROUP BY url"
    ).df()
    connection.close()
    truth = truth.set_index("url")["n"].astype(np.int64)
    dpsql.set_policy(
        path,
        POLICY.format(table="visits", groups=MAX_GROUPS, rows=MAX_ROWS, column="url", keys=100_000),
    )
    print(
        f"{len(visits):,} rows, {visits.user_id.nunique():,} users, {truth.size:,} distinct URLs; "
        f"bounded truth = distinct users per URL (max {most} URLs per user)"
    )
    sql = "SELECT url, COUNT(*) AS n FROM visits GROUP BY url"
    every = truth.reindex(URLS).fillna(0).to_numpy()
    for mode, options in (("threshold", {"mechanism": "threshold"}), ("alp", {"mechanism": "alp"})):
        counts, errors, biases, lookups = [], [], [], []
        for trial in range(trials):
            rng = np.random.default_rng(100 + trial)
            with _seeded_for_tests(rng), dpsql.connect(path, analyst="bench") as session:
                result = session.execute(sql, epsilon=EPSILON, delta=DELTA, **options)
                keys = np.array([row[0] for row in result.rows], dtype=object)
                values = np.array([row[1] for row in result.rows], dtype=np.float64)
                error, bias = _released_error(keys, values, truth)
                counts.append(keys.size)
                errors.append(error)
                biases.append(bias)
                if mode == "alp":
                    lookups.append(_engine_lookups(session, path, result.ledger_entry, every))
        line = (
            f"engine {mode:10}: released {np.mean(counts):.0f} keys (range {min(counts)}-"
            f"{max(counts)}, {trials} runs), mean|err| of released {np.mean(errors):.2f} "
            f"(mean signed {np.mean(biases):+.2f})"
        )
        print(line)
        if lookups:
            merged = {k: float(np.mean([e[k] for e in lookups])) for k in lookups[0]}
            print(f"{'':19}  {_format_lookup(merged)}")
    return truth


def _engine_lookups(
    session: dpsql.Session, path: Path, entry: int, every: np.ndarray
) -> dict[str, float]:
    """Errors of the stored synopsis, and a check that engine point queries answer from it."""
    store = SynopsisStore(ledger_path(path))
    try:
        (synopsis,) = [s for s in store.all() if s.ledger_entry == entry]
    finally:
        store.close()
    structure = CombinedRelease.from_bytes(synopsis.data)
    for url in URLS[[0, 500, 5_000, 50_000]]:
        answer = session.execute(f"SELECT COUNT(*) FROM visits WHERE url = '{url}'")
        expected = float(structure.lookup([url])[0])
        assert answer.epsilon == 0 and math.isclose(float(answer.rows[0][0]), expected), url
    return _lookup_errors(structure, every)


def utility_library(truth: pd.Series, trials: int) -> None:
    """Library-level: threshold vs combined splits, the L0 policy lever, Gaussian what-if."""
    keys, counts = truth.index.to_numpy(dtype=object), truth.to_numpy()
    every = truth.reindex(URLS).fillna(0).to_numpy()
    common = {"max_groups_per_unit": MAX_GROUPS, "max_rows_per_group": MAX_ROWS}
    print("library, same truth (s = 10 × 100k rows for the sketch, as the engine):")
    runs = [
        threshold.release(keys, counts, epsilon=EPSILON, delta=DELTA, **common, rng=_seeded(t))
        for t in range(trials)
    ]
    _print_release("threshold (all ε)", runs, truth)
    for split in (0.5, 0.7, 0.8, 0.9):
        structures = [
            combined.release(
                keys,
                counts,
                epsilon=EPSILON,
                delta=DELTA,
                split=split,
                s=1_000_000,
                **common,
                rng=_seeded(t),
            )
            for t in range(trials)
        ]
        _print_release(
            f"combined split {split}", [s.threshold for s in structures], truth, structures[0]
        )
        lookups = [_lookup_errors(s, every) for s in structures]
        merged = {k: float(np.mean([e[k] for e in lookups])) for k in lookups[0]}
        print(f"{'':24}  {_format_lookup(merged)}")
    expected = laplace_expected_released(counts)
    print(f"analytic E[released] of the threshold (exact tail of the noise used): {expected:.1f}")
    policy_lever(truth, trials)
    gaussian_what_if(counts)


def _seeded(trial: int) -> np.random.Generator:
    return np.random.default_rng(1_000 + trial)


def _print_release(
    name: str,
    runs: list[threshold.ThresholdRelease],
    truth: pd.Series,
    structure: CombinedRelease | None = None,
) -> None:
    sizes = [r.keys.size for r in runs]
    errors = [_released_error(r.keys, r.values, truth) for r in runs]
    sketch = "" if structure is None else f", sketch m = {structure.sketch.m}"
    print(
        f"  {name:22}: τ = {runs[0].tau}{sketch}, released {np.mean(sizes):.0f} keys "
        f"(range {min(sizes)}-{max(sizes)}), mean|err| of released "
        f"{np.mean([e[0] for e in errors]):.2f} (signed {np.mean([e[1] for e in errors]):+.2f})"
    )


def laplace_expected_released(counts: np.ndarray) -> float:
    """Σ_keys P(count + Z >= τ), with the library's own τ and tail probability."""
    tau = threshold.tau_for_delta(
        epsilon=EPSILON, delta=DELTA, max_groups_per_unit=MAX_GROUPS, max_rows_per_group=MAX_ROWS
    )
    rule = threshold.ThresholdRule(tau, noise_scale(MAX_GROUPS * MAX_ROWS, EPSILON))
    values, multiplicity = np.unique(counts, return_counts=True)
    return float(
        sum(m * rule.release_probability(int(v)) for v, m in zip(values, multiplicity, strict=True))
    )


def policy_lever(truth: pd.Series, trials: int) -> None:
    """Lower ``max_groups_per_unit``: more keys pass τ, but counts estimate a smaller quantity."""
    visits = zipf_visits()
    pairs = visits.drop_duplicates().sample(frac=1.0, random_state=7)  # random order per user
    print(
        "policy lever (changes the query: each user keeps a random L0 of their URLs), threshold, "
        "error vs that L0's bounded truth and vs the L0 = 10 truth:"
    )
    for groups in (1, 2, 3, 5, 10):
        bounded = pairs[pairs.groupby("user_id").cumcount() < groups].groupby("url").size()
        runs = [
            threshold.release(
                bounded.index.to_numpy(dtype=object),
                bounded.to_numpy(),
                epsilon=EPSILON,
                delta=DELTA,
                max_groups_per_unit=groups,
                max_rows_per_group=MAX_ROWS,
                rng=_seeded(t),
            )
            for t in range(trials)
        ]
        own = np.mean([_released_error(r.keys, r.values, bounded)[0] for r in runs])
        full = np.mean([_released_error(r.keys, r.values, truth)[0] for r in runs])
        print(
            f"  L0 = {groups:2}: τ = {runs[0].tau:3}, released "
            f"{np.mean([r.keys.size for r in runs]):5.0f}, mean|err| {own:6.2f} (own truth), "
            f"{full:7.2f} (L0 = 10 truth)"
        )


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest σ of the Gaussian mechanism that is (ε, δ)-DP (Balle & Wang 2018, Thm 8)."""

    def excess(sigma: float) -> float:
        a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
        return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b) - delta

    return float(optimize.brentq(excess, 1e-3, 1e6))


def gaussian_what_if(counts: np.ndarray) -> None:
    """Expected keys released by Gaussian thresholding ("stability histogram", add-the-deltas
    analysis: Gaussian noise on present keys, L2 sensitivity √L0·L∞, (ε, δ1); a new key passes τ
    with probability ≤ 1-(1-P(L∞+N ≥ τ))^L0 = δ2; total (ε, δ1 + δ2)). Continuous noise, analytic
    expectation only: not a dpsql mechanism (it would need a discrete Gaussian sampler)."""
    best = None
    for share in (0.1, 0.25, 0.5, 0.75, 0.9):
        sigma = analytic_gaussian_sigma(EPSILON, share * DELTA, math.sqrt(MAX_GROUPS) * MAX_ROWS)
        per_key = -math.expm1(math.log1p(-(1 - share) * DELTA) / MAX_GROUPS)
        tau = MAX_ROWS + sigma * stats.norm.isf(per_key)
        expected = float(stats.norm.sf((tau - counts) / sigma).sum())
        if best is None or expected > best[0]:
            best = (expected, share, sigma, tau)
    expected, share, sigma, tau = best  # type: ignore[misc]
    print(
        f"what-if, Gaussian thresholding (analytic, not in dpsql): best δ split {share:.2f} to the "
        f"noise, σ = {sigma:.2f}, τ = {tau:.1f}, E[released] = {expected:.0f} keys; "
        f"mean|noise| {sigma * math.sqrt(2 / math.pi):.1f} (discrete Laplace scale 10: ≈ 10.0)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed runs per mode (default 3; 2 above 2M rows)"
    )
    parser.add_argument("--key", choices=("url", "item"), default="url", help="VARCHAR or BIGINT")
    parser.add_argument("--trials", type=int, default=3, help="utility runs per variant")
    parser.add_argument("--quick", action="store_true", help="1M rows, 1 repeat, 2 trials")
    parser.add_argument("--no-diagnose", action="store_true", help="skip the diagnostic SQL")
    parser.add_argument("--skip-utility", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats, args.trials = [1_000_000], 1, 2
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        if not args.skip_speed:
            print("== part 1: SELECT key, COUNT(*) ... GROUP BY key, dpsql vs raw DuckDB")
            for rows in args.rows:
                repeats = args.repeats or (3 if rows <= 2_000_000 else 2)
                bench_speed(rows, repeats, args.key, not args.no_diagnose, directory)
        if not args.skip_utility:
            print(
                f"\n== part 2: utility, ε = {EPSILON}, δ = {DELTA}, L0 = {MAX_GROUPS}, "
                f"L∞ = {MAX_ROWS}"
            )
            truth = utility_engine(directory, zipf_visits(), args.trials)
            utility_library(truth, args.trials)
    print(f"\ntotal {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
