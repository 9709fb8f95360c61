"""Key releases (GROUP BY over keys without public keys): speed at scale, and keys against
count error on independent Zipf data, each measured against a baseline in the same run.

``speed`` generates ``--rows`` rows as Parquet (inside DuckDB, in a child process): persons
with 1-10 rows each (``--shape visits``, the partition-selection benchmark's shape: nobody has
more than L0 = 10 keys) or 10 rows each over a log-uniform key (``--shape heavy``, L0 = 5:
everybody has more), keys log-uniform (Zipf(1)) over ``--items``. For each query it prints the
median wall and CPU seconds (this process: DuckDB runs in it) of

- ``default``: ``Session.execute`` with the default mechanism (and ``prefer='keys'``);
- ``threshold``: the same with ``mechanism='threshold'`` (the Laplace threshold);
- ``threshold SQL raw``: the bounded SQL the threshold sent, run on a plain DuckDB backend;
- ``every unit ranked``: that SQL as the engine generated it before it ranked only the persons
  over a bound (``bounded_aggregate(..., rank_every_unit=True)``), run raw.

Targets: default ≤ 1.5x threshold; threshold ≤ 1.1x its own bounding SQL run raw.

``accuracy`` builds an independent table (not ``bench_histogram.zipf_visits``): 300k persons
with a geometric number of rows (mean 5.6, capped at 40), keys Zipf(1.1) over 500k, bounded as
the engine bounds them (each person keeps a random L0 = 10 of their keys, one row per key). At
ε = 1, δ = 1e-6 each mechanism is run at library level (``--trials`` seeds): keys released
against the Laplace threshold's *expected* number of keys (the sum of each key's release
probability, exact), and the mean |error| of the released counts on the 500 largest keys and on
all released keys. Target: the default releases >= 2x the Laplace expectation with count error
<= 25 (and its count error within 1.3x the best: ``dpsql.engine.key_mechanisms``).

    python benchmarks/bench_key_release.py speed [--rows 10000000] [--shape visits] [--repeats 3]
    python benchmarks/bench_key_release.py accuracy [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

EPSILON, DELTA = 1.0, 1e-6

POLICY = """
dataset = {{ epsilon = 1e6, delta = 0.5 }}
analysts = {{ bench = {{ epsilon = 1e6, delta = 0.5 }} }}
[tables.visits]
privacy_unit = "user_id"
source = "visits/*.parquet"
max_groups_per_unit = {l0}
max_rows_per_group = 1
max_rows_per_unit = {l0}
"""


def generate(directory: Path, rows: int, items: int, shape: str) -> None:
    """``rows`` rows of (user_id, url) as Parquet under ``directory/visits`` (DuckDB)."""
    import duckdb

    (directory / "visits").mkdir(parents=True, exist_ok=True)
    per_user = "1 + hash(u * 3) % 10" if shape == "visits" else "10"
    users = rows // (55 if shape == "visits" else 100) * 10
    connection = duckdb.connect()
    connection.execute(
        f"""
        COPY (
            SELECT u AS user_id,
                   (floor(pow({items}, (hash(u * 37 + j) % 1000000) / 1000000.0)) - 1)::BIGINT
                       AS url
            FROM range({users}) AS t(u), range(10) AS r(j)
            WHERE j < {per_user}
        ) TO '{directory / "visits"}' (FORMAT parquet, PER_THREAD_OUTPUT true, OVERWRITE true)
        """
    )
    connection.close()


def speed(args: argparse.Namespace) -> None:
    from bench_scale import timed_with_cpu

    import dpsql
    from dpsql.engine.backends import DuckDBBackend
    from dpsql.engine.policy import parse_policy
    from dpsql.engine.release import aggregation
    from dpsql.sql.generate import bounded_aggregate

    l0 = 10 if args.shape == "visits" else 5
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        subprocess.run(
            [sys.executable, __file__, "generate", name, str(args.rows), str(args.items),
             args.shape],
            check=True,
        )  # fmt: skip
        database = directory / "bench"
        policy = parse_policy(POLICY.format(l0=l0))
        dpsql.set_policy(database, policy)
        raw = DuckDBBackend.for_policy(database, policy)
        backend = Recording(DuckDBBackend.for_policy(database, policy))
        sql = "SELECT url, COUNT(*) AS n FROM visits GROUP BY url"
        print(
            f"{args.rows:,} rows ({args.shape}, L0 = {l0}), median of {args.repeats}; load "
            f"average {os.getloadavg()[0]:.2f}"
        )
        print(f"{'query':28s} {'wall s':>8s} {'cpu s':>8s}  keys")
        results: dict[str, tuple[float, float]] = {}
        with dpsql.Session(database, analyst="bench", backend=backend) as db:
            runs = {
                "default": {},
                "threshold": {"mechanism": "threshold"},
                "prefer='keys'": {"prefer": "keys"},
            }
            for label, options in runs.items():
                prefer = options.pop("prefer", None)
                text = sql if prefer is None else sql.replace(
                    "SELECT ", f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(prefer='{prefer}') "
                )  # fmt: skip
                result = db.execute(text, epsilon=EPSILON, delta=DELTA, **options)  # warm
                if label == "threshold":
                    plan = db.plan(sql, epsilon=EPSILON, delta=DELTA, mechanism="threshold")
                    bounded = backend.last
                    old = bounded_aggregate(
                        plan.shape, **aggregation(plan, 7), rank_every_unit=True
                    )
                results[label] = timed_with_cpu(
                    lambda t=text, o=options: db.execute(t, epsilon=EPSILON, delta=DELTA, **o),
                    args.repeats,
                )
                print(f"{label:28s} {results[label][0]:8.2f} {results[label][1]:8.2f}  "
                      f"{len(result.rows)} ({result.mechanism})")  # fmt: skip
            raw.run(bounded)
            results["threshold SQL raw"] = timed_with_cpu(lambda: raw.run(bounded), args.repeats)
            results["every unit ranked"] = timed_with_cpu(lambda: raw.run(old), args.repeats)
            for label in ("threshold SQL raw", "every unit ranked"):
                print(f"{label:28s} {results[label][0]:8.2f} {results[label][1]:8.2f}")
        raw.close()
    for column, index in (("wall", 0), ("cpu", 1)):
        default, threshold = results["default"][index], results["threshold"][index]
        own, old = results["threshold SQL raw"][index], results["every unit ranked"][index]
        print(
            f"{column}: default / threshold {default / threshold:.2f}x (target <= 1.5); "
            f"threshold / its SQL raw {threshold / own:.2f}x (target <= 1.1); every unit "
            f"ranked / over-bound units ranked {old / own:.2f}x"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


class Recording:
    """A backend remembering the last SQL it ran (the bounded aggregation)."""

    def __init__(self, backend):  # type: ignore[no-untyped-def]
        self.backend, self.dialect, self.last = backend, backend.dialect, ""

    def catalog(self):  # type: ignore[no-untyped-def]
        return self.backend.catalog()

    def run(self, sql, progress=None):  # type: ignore[no-untyped-def]
        self.last = sql
        return self.backend.run(sql, progress)

    def rows(self, sql, progress=None):  # type: ignore[no-untyped-def]
        self.last = sql
        return self.backend.rows(sql, progress)

    def scratch(self):  # type: ignore[no-untyped-def]
        return self.backend.scratch()

    def close(self) -> None:
        self.backend.close()


def independent_visits(seed: int = 2027) -> pd.DataFrame:
    """300k persons, geometric rows (p = 0.18, at most 40), keys Zipf(1.1) over 500k."""
    rng = np.random.default_rng(seed)
    users = 300_000
    per_user = np.minimum(rng.geometric(0.18, users), 40)
    ranks = np.arange(1, 500_001, dtype=np.float64)
    p = ranks**-1.1
    ids = rng.choice(ranks.size, size=int(per_user.sum()), p=p / p.sum())
    return pd.DataFrame({"user_id": np.repeat(np.arange(users), per_user), "url": ids})


def accuracy(args: argparse.Namespace) -> None:
    from bench_partition_selection import bounded, per_key

    from dpsql.engine.key_mechanisms import candidates, choose_default
    from dpsql.mechanisms import (
        adaptive_selection,
        gaussian_threshold,
        joint_selection,
        threshold,
        weighted_selection,
    )
    from dpsql.mechanisms import discrete_gaussian as dg
    from dpsql.mechanisms.threshold import Contribution

    groups = 10
    bounds = Contribution(groups, 1, groups)
    pairs = bounded(independent_visits(), groups)
    keys, counts, weights = per_key(pairs, groups)
    truth = pd.Series(counts, index=keys)
    largest = set(truth.nlargest(500).index.tolist())
    rule = threshold.ThresholdRule(
        threshold.tau_for_delta(
            epsilon=EPSILON, delta=DELTA, max_groups_per_unit=groups, max_rows_per_group=1,
            max_rows_per_unit=groups,
        ),
        threshold.noise_scale_for(
            epsilon=EPSILON, max_groups_per_unit=groups, max_rows_per_group=1
        ),
    )  # fmt: skip
    expectation = float(sum(rule.release_probability(int(c)) for c in counts))
    default = choose_default(EPSILON, DELTA, bounds)
    keys_end = choose_default(EPSILON, DELTA, bounds, "keys")

    def planned_error(name: str, share: float | None) -> float:
        """Mean |noise| of a released count, from the plan (no data)."""
        if name in ("threshold", "threshold_gaussian"):
            return {c.mechanism: c for c in candidates(EPSILON, DELTA, bounds)}[name].count_error
        module = {"joint": joint_selection, "weighted": weighted_selection}.get(
            name, adaptive_selection
        )
        chosen = module.plan(EPSILON, DELTA, bounds, share)
        return dg.expected_abs(chosen.count_sigma_squared)
    units, urls = pairs["user_id"].to_numpy(), pairs["url"].to_numpy()
    table = weighted_selection.unit_weights(groups)
    common = {"epsilon": EPSILON, "delta": DELTA, "bounds": bounds}

    def run(name: str, share: float | None, rng: np.random.Generator):  # type: ignore[no-untyped-def]
        if name == "threshold":
            return threshold.release(
                keys, counts, epsilon=EPSILON, delta=DELTA, rng=rng, max_groups_per_unit=groups,
                max_rows_per_group=1, max_rows_per_unit=groups,
            )  # fmt: skip
        if name == "threshold_gaussian":
            return gaussian_threshold.release(keys, counts, **common, rng=rng)
        if name == "joint":
            return joint_selection.release(
                keys, counts, weights, **common, rng=rng, selection_share=share
            )
        if name == "mad2r":
            return adaptive_selection.release(
                keys, counts, weights,
                lambda found: adaptive_selection.second_round_weights(units, urls, found, table),
                **common, rng=rng, selection_share=share,
            )  # fmt: skip
        return weighted_selection.release(
            keys, counts, weights, **common, rng=rng, selection_share=share
        )

    rows = [
        ("threshold", None),
        ("threshold_gaussian", None),
        ("joint", default.selection_share if default.mechanism == "joint" else 0.2),
        ("joint", 0.3),
        ("joint", 0.5),
        ("weighted", 0.8),
        ("mad2r", 0.3),
        ("mad2r", keys_end.selection_share or 0.8),
    ]
    print(
        f"independent Zipf(1.1) table: {len(pairs):,} bounded pairs, {keys.size:,} keys; "
        f"eps = {EPSILON}, delta = {DELTA}, L0 = {groups}; Laplace threshold expectation "
        f"{expectation:.0f} keys; default {default.mechanism} (share "
        f"{default.selection_share}), prefer='keys' {keys_end.mechanism}; {args.trials} trials"
    )
    print("| mechanism | share | keys | x Laplace expectation | error, 500 largest | error, all "
          "| planned count error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, share in rows:
        found = []
        for trial in range(args.trials):
            out = run(name, share, np.random.Generator(np.random.PCG64(100 * trial + 1)))
            error = np.abs(out.values - truth.reindex(out.keys).fillna(0).to_numpy())
            top = np.array([k in largest for k in out.keys.tolist()])
            found.append((out.keys.size, error[top].mean(), error.mean()))
        size, top_error, all_error = np.mean(np.array(found, dtype=float), axis=0)
        marks = [
            label
            for label, choice in (("default", default), ("prefer='keys'", keys_end))
            if name == choice.mechanism and share == choice.selection_share
        ]
        mark = ", ".join(marks)
        planned = planned_error(name, share)
        print(
            f"| {name}{f' ({mark})' if mark else ''} | {share if share is not None else ''} | "
            f"{size:.0f} | {size / expectation:.2f} | {top_error:.1f} | {all_error:.1f} | "
            f"{planned:.1f} |"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "generate":
        directory, rows, items, shape = sys.argv[2:6]
        generate(Path(directory), int(rows), int(items), shape)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    timing = commands.add_parser("speed")
    timing.add_argument("--rows", type=int, default=10_000_000)
    timing.add_argument("--items", type=int, default=100_000)
    timing.add_argument("--shape", choices=["visits", "heavy"], default="visits")
    timing.add_argument("--repeats", type=int, default=3)
    quality = commands.add_parser("accuracy")
    quality.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    speed(args) if args.command == "speed" else accuracy(args)


if __name__ == "__main__":
    main()
