"""Keys released per mechanism for GROUP BY over keys without public keys.

The table (``bench_histogram.zipf_visits``: 200k users with 1-10 rows each, about 1M rows,
Zipf(1) URLs over 100k) and a heavier-tailed one (Zipf(0.8) over 1M URLs), bounded as the engine
bounds them: each user keeps at most L0 of their URLs (a random L0, as the salted order does), one
row per URL. For ε ∈ {0.5, 1, 2}, δ = 1e-6, L0 ∈ {1, 10, 50}, every mechanism is run at library
level on the same bounded data (``--trials`` seeds each): keys released, mean and median |error| of
the released counts (against the bounded truth), and mean |error| on the keys today's Laplace
threshold releases in the same trial (``on_laplace``). ``default`` marks the mechanism the engine
picks (:func:`dpsql.engine.key_mechanisms.choose_default`, no data used). ``mad2r`` is the
two-round adaptive weighting (its round 2 computed from the bounded pairs, as the engine's second
SQL pass does). Then the count-error frontier (``--frontier``: the selection's share of ρ against
keys released and the error on Laplace's keys, at ε = 1, L0 = 10), this setting end to end
through ``dpsql.connect`` with the default mechanism, and the total ε of 100 Gaussian releases
under basic composition and under zCDP/RDP (Google's ``dp-accounting``).

    python benchmarks/bench_partition_selection.py            # both tables, 3 trials
    python benchmarks/bench_partition_selection.py --quick    # issue table, ε = 1 only, 1 trial
    python benchmarks/bench_partition_selection.py --frontier --skip-engine   # frontier only
    python benchmarks/bench_partition_selection.py --one-round --skip-engine  # why not 'mad'
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
from bench_histogram import zipf_visits

import dpsql
from dpsql.engine.key_mechanisms import choose_default
from dpsql.mechanisms import adaptive_selection, gaussian_threshold, threshold, weighted_selection
from dpsql.mechanisms.random import _seeded_for_tests
from dpsql.mechanisms.threshold import Contribution

DELTA = 1e-6


def heavy_tail_visits(seed: int = 4) -> pd.DataFrame:
    """200k users with 1-10 rows each, URLs Zipf(0.8) over 1M (a heavier tail)."""
    rng = np.random.default_rng(seed)
    per_user = rng.integers(1, 11, 200_000)
    ranks = np.arange(1, 1_000_001, dtype=np.float64)
    p = ranks**-0.8
    ids = rng.choice(ranks.size, size=int(per_user.sum()), p=p / p.sum())
    return pd.DataFrame({"user_id": np.repeat(np.arange(200_000), per_user), "url": ids})


def bounded(visits: pd.DataFrame, groups: int, seed: int = 7) -> pd.DataFrame:
    """Distinct (user, url) pairs, each user keeping a random ``groups`` of their URLs."""
    pairs = visits.drop_duplicates().sample(frac=1.0, random_state=seed)
    return pairs[pairs.groupby("user_id").cumcount() < groups]


def per_key(pairs: pd.DataFrame, groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys, bounded counts and summed unit weights (as the generated SQL computes them)."""
    weights = np.array(weighted_selection.unit_weights(groups))
    n = pairs.groupby("user_id")["url"].transform("size").to_numpy()
    frame = (
        pairs.assign(weight=weights[n - 1])
        .groupby("url")
        .agg(count=("user_id", "size"), weight=("weight", "sum"))
    )
    return frame.index.to_numpy(), frame["count"].to_numpy(), frame["weight"].to_numpy()


def run(
    name: str, pairs, keys, counts, weights, epsilon: float, bounds: Contribution, seed: int,
    share: float = weighted_selection.DEFAULT_SELECTION_SHARE,
):  # fmt: skip
    rng = np.random.Generator(np.random.PCG64(seed))
    if name == "mad2r":
        units, urls = pairs["user_id"].to_numpy(), pairs["url"].to_numpy()
        table = weighted_selection.unit_weights(bounds.new_keys)
        return adaptive_selection.release(
            keys, counts, weights,
            lambda found: adaptive_selection.second_round_weights(units, urls, found, table),
            epsilon=epsilon, delta=DELTA, bounds=bounds, rng=rng, selection_share=share,
        )  # fmt: skip
    if name == "threshold":
        return threshold.release(
            keys, counts, epsilon=epsilon, delta=DELTA, rng=rng,
            max_groups_per_unit=bounds.max_groups_per_unit, max_rows_per_group=1,
            max_rows_per_unit=bounds.max_rows_per_unit,
        )  # fmt: skip
    if name == "threshold_gaussian":
        return gaussian_threshold.release(
            keys, counts, epsilon=epsilon, delta=DELTA, bounds=bounds, rng=rng
        )
    return weighted_selection.release(
        keys, counts, weights, epsilon=epsilon, delta=DELTA, bounds=bounds, rng=rng,
        selection_share=share,
    )  # fmt: skip


def table(title: str, visits: pd.DataFrame, epsilons, groups_list, trials: int) -> None:
    print(f"\n== {title}")
    print("| L0 | ε | mechanism | keys released | mean abs err | median abs err | on_laplace |")
    print("|---|---|---|---|---|---|---|")
    for groups in groups_list:
        pairs = bounded(visits, groups)
        keys, counts, weights = per_key(pairs, groups)
        truth = pd.Series(counts, index=keys)
        bounds = Contribution(groups, 1, groups)
        for epsilon in epsilons:
            default = choose_default(epsilon, DELTA, bounds).mechanism
            stats: dict[str, list] = {}
            for trial in range(trials):
                laplace_keys = None
                for name in ("threshold", "threshold_gaussian", "weighted", "mad2r"):
                    if name in ("weighted", "mad2r") and groups == 1:
                        continue
                    out = run(name, pairs, keys, counts, weights, epsilon, bounds, 100 * trial + 1)
                    error = np.abs(out.values - truth.reindex(out.keys).to_numpy())
                    if name == "threshold":
                        laplace_keys = set(out.keys.tolist())
                    on = np.array([k in laplace_keys for k in out.keys.tolist()])
                    stats.setdefault(name, []).append(
                        (out.keys.size, error.mean(), np.median(error), error[on].mean())
                    )
            for name, rows in stats.items():
                k, mean, median, on = np.mean(np.array(rows, dtype=float), axis=0)
                mark = " (default)" if name == default else ""
                print(
                    f"| {groups} | {epsilon:g} | {name}{mark} | {k:.0f} | {mean:.1f} | "
                    f"{median:.1f} | {on:.1f} |"
                )


POLICY = """
[dataset]
epsilon = 1000000.0
delta = 0.5
[analysts.bench]
epsilon = 1000000.0
delta = 0.5
[tables.requests]
privacy_unit = "user_id"
max_groups_per_unit = 10
max_rows_per_group = 1
max_rows_per_unit = 10
"""


def end_to_end(trials: int) -> None:
    """The benchmark's setting through the engine, default mechanism (and each named one)."""
    import duckdb

    visits = zipf_visits()
    with tempfile.TemporaryDirectory() as name:
        path = Path(name) / "b.duckdb"
        con = duckdb.connect(str(path))
        con.register("v", visits)
        con.execute("CREATE TABLE requests AS SELECT * FROM v")
        con.close()
        policy = Path(name) / "policy.toml"
        policy.write_text(POLICY)
        dpsql.set_policy(path, policy)
        print("\n== end to end (dpsql.connect), ε = 1, δ = 1e-6, L0 = 10, L∞ = 1, 1M rows")
        for mechanism in (None, "threshold", "threshold_gaussian", "weighted", "mad2r"):
            released, seconds = [], []
            for trial in range(trials):
                generator = np.random.Generator(np.random.PCG64(trial + 50))
                with _seeded_for_tests(generator), dpsql.connect(path, analyst="bench") as db:
                    started = time.perf_counter()
                    result = db.execute(
                        "SELECT url, COUNT(*) FROM requests GROUP BY url",
                        epsilon=1.0, delta=DELTA, mechanism=mechanism,
                    )  # fmt: skip
                    seconds.append(time.perf_counter() - started)
                released.append(len(result.rows))
            print(
                f"  {mechanism or 'default'}: mechanism {result.mechanism}, keys released "
                f"{np.mean(released):.0f} (trials {released}), median {np.median(seconds):.2f} s"
            )


def frontier(trials: int) -> None:
    """Keys released against the error of the counts of Laplace's keys as the selection's share
    of ρ moves (ε = 1, δ = 1e-6, L0 = 10, the issue table). Laplace's own row is the target."""
    groups, epsilon = 10, 1.0
    pairs = bounded(zipf_visits(), groups)
    keys, counts, weights = per_key(pairs, groups)
    truth = pd.Series(counts, index=keys)
    bounds = Contribution(groups, 1, groups)
    print("\n== count-error frontier, issue table, ε = 1, δ = 1e-6, L0 = 10")
    print("| mechanism | selection share | keys released | mean abs err | on_laplace |")
    print("|---|---|---|---|---|")
    rows = [("threshold", None), ("threshold_gaussian", None)]
    rows += [(name, share) for name in ("weighted", "mad2r") for share in (0.3, 0.5, 0.65, 0.8)]
    for name, share in rows:
        stats = []
        for trial in range(trials):
            seed = 100 * trial + 1
            laplace = run("threshold", pairs, keys, counts, weights, epsilon, bounds, seed)
            on_keys = set(laplace.keys.tolist())
            out = run(
                name, pairs, keys, counts, weights, epsilon, bounds, seed,
                share or weighted_selection.DEFAULT_SELECTION_SHARE,
            )  # fmt: skip
            error = np.abs(out.values - truth.reindex(out.keys).to_numpy())
            on = np.array([k in on_keys for k in out.keys.tolist()])
            stats.append((out.keys.size, error.mean(), error[on].mean()))
        k, mean, on_mean = np.mean(np.array(stats, dtype=float), axis=0)
        label = "" if share is None else f"{share:g}"
        print(f"| {name} | {label} | {k:.0f} | {mean:.1f} | {on_mean:.1f} |")


def one_round(trials: int) -> None:
    """A simulation (continuous noise; not an engine mechanism) of the one-round rerouting whose
    sensitivity docs/partition_selection.md proves, ``(1 + 2λ)W``: keys with weight X above the
    cap C = τ + 3σ free λ(1 − C/X) of each person's weight on them, spread over the person's kept
    keys, and key totals are clipped at C. Against weighted selection's keys at the same ρ_s."""
    groups, epsilon = 10, 1.0
    pairs = bounded(zipf_visits(), groups)
    _, unit_index = np.unique(pairs["user_id"].to_numpy(), return_inverse=True)
    _, key_index = np.unique(pairs["url"].to_numpy(), return_inverse=True)
    per_unit = np.bincount(unit_index)
    base = weighted_selection.plan(epsilon, DELTA, Contribution(groups, 1, groups))
    given = np.array(base.weights, dtype=float)[per_unit[unit_index] - 1]
    totals = np.bincount(key_index, weights=given)
    rng = np.random.default_rng(0)
    print("\n== one-round rerouting (simulation), issue table, ε = 1, δ = 1e-6, L0 = 10")
    plain = _drawn(totals, base.selection_sigma, base.tau, rng, trials)
    print(f"  weighted selection: {plain:.0f} keys")
    for factor in (0.1, 0.25, 0.5, 1.0):
        sigma_squared = base.selection_sigma_squared * Fraction(1 + 2 * factor) ** 2
        raised = tuple(math.ceil((1 + factor) * w) for w in base.weights)
        tau = weighted_selection.smallest_tau(sigma_squared, base.threshold_delta, raised)
        sigma = math.sqrt(float(sigma_squared))
        cap = tau + 3 * sigma
        freed = factor * np.clip(1 - cap / totals, 0, None)
        per_person = np.bincount(unit_index, weights=given * freed[key_index]) / per_unit
        rerouted = np.minimum(cap, totals + np.bincount(key_index, weights=per_person[unit_index]))
        print(f"  λ = {factor:g}: {_drawn(rerouted, sigma, tau, rng, trials):.0f} keys")


def _drawn(weights: np.ndarray, sigma: float, tau: int, rng, trials: int) -> float:
    draws = [np.sum(weights + rng.normal(0, sigma, weights.size) >= tau) for _ in range(trials)]
    return float(np.mean(draws))


def composition() -> None:
    """Total ε at δ = 1e-6 of 100 Gaussian releases, each (1, 1e-6)-DP alone."""
    from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import RdpAccountant

    from dpsql.mechanisms.discrete_gaussian import zcdp_delta

    low, high = 1e-6, 10.0  # ρ of one (1, 1e-6)-DP Gaussian release
    for _ in range(100):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if zcdp_delta(middle, 1.0) < 1e-6 else (low, middle)
    accountant = RdpAccountant()
    accountant.compose(SelfComposedDpEvent(GaussianDpEvent(1 / math.sqrt(2 * low)), 100))
    print(
        f"\n== composition: 100 Gaussian releases, each (ε = 1, δ = 1e-6): basic ε = 100 "
        f"(δ = 1e-4); RDP/zCDP (dp-accounting) ε = {accountant.get_epsilon(1e-4):.2f} at δ = "
        f"1e-4, {accountant.get_epsilon(1e-6):.2f} at δ = 1e-6"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--frontier", action="store_true", help="only the count-error frontier")
    parser.add_argument("--one-round", action="store_true", help="only the one-round simulation")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.one_round:
        one_round(args.trials)
    elif args.frontier:
        frontier(args.trials)
    elif args.quick:
        table("issue table (Zipf(1) over 100k)", zipf_visits(), (1.0,), (10,), 1)
    else:
        epsilons, groups = (0.5, 1.0, 2.0), (1, 10, 50)
        table("issue table (Zipf(1) over 100k)", zipf_visits(), epsilons, groups, args.trials)
        table(
            "heavier tail (Zipf(0.8) over 1M)", heavy_tail_visits(), epsilons, groups, args.trials
        )
        frontier(args.trials)
    if not args.skip_engine:
        end_to_end(1 if args.quick else args.trials)
    composition()
    print(f"\ntotal {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
