"""ALP sketch and combined synopsis: build/lookup speed, space, accuracy (paper Fig. 3), utility.

Run: ``python benchmarks/bench_alp.py [--quick]``. Everything uses the default secure generator
(ChaCha20) unless stated; baselines are measured in the same run:

* build: ``alp.project`` vs building a Python ``dict`` and a ``pandas.Index`` from the same keys;
* lookup: batched ``sketch.estimate`` vs ``dict`` lookups and ``Index.get_indexer`` (exact, not
  private: they hold the raw keys, which the sketch never does);
* space: sketch bytes per non-zero key vs the raw keys' UTF-8 bytes plus an 8-byte count;
* accuracy: the paper's Fig. 3 simulation (ε = 1, α = 3, collision probability 0.1, x uniform in
  [0, β = 5000], 10^6 trials; paper: mean |error| 6.4, std 11, 90th percentile 15.78) and without
  collisions (paper: slightly below 5 for s >= 100k), using our flips and estimator;
* utility: a Zipf(1) URL table (1M rows, 200k users, 100k URLs, <= 10 URLs per user,
  ε = 1, δ = 1e-6) at the library level: released keys and mean error of released counts.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pandas as pd

from dpsql.mechanisms import alp, combined, threshold
from dpsql.mechanisms.random import secure_generator


def _seconds(run) -> tuple[float, object]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def _urls(count: int, offset: int = 0) -> np.ndarray:
    return np.array([f"https://example.com/p/{i + offset}" for i in range(count)], dtype=object)


def bench_sketch(sizes: list[int]) -> None:
    print("== ALP sketch (defaults: α = 10/3, s from a noisy key count, β = 87.3/ε), ε = 1")
    print(
        f"{'k':>9} {'build keys/s':>13} {'dict keys/s':>12} {'lookup µs/key':>14} "
        f"{'dict µs/key':>12} {'Index µs/key':>13} {'bytes/key':>10} {'raw bytes/key':>14} "
        f"{'m':>4} {'mean|err| x<=β':>15}"
    )
    for size in sizes:
        keys = _urls(size)
        counts = np.minimum(np.random.default_rng(1).zipf(1.3, size), 10**6)
        build, sketch = _seconds(
            lambda keys=keys, counts=counts: alp.project(keys, counts, epsilon=1.0)
        )
        dict_build, table = _seconds(
            lambda keys=keys, counts=counts: dict(zip(keys, counts, strict=True))
        )
        queries = np.concatenate([keys, _urls(size, offset=10**9)])
        lookup, estimates = _seconds(
            lambda queries=queries, sketch=sketch: sketch.estimate(queries)
        )
        dict_lookup, _ = _seconds(
            lambda queries=queries, table=table: [table.get(q, 0) for q in queries]
        )
        index = pd.Index(keys)
        index_lookup, _ = _seconds(lambda queries=queries, index=index: index.get_indexer(queries))
        raw = sum(len(k.encode()) for k in keys) / size + 8
        small = counts <= sketch.beta
        error = np.abs(estimates[:size] - counts)[small].mean()
        print(
            f"{size:>9,} {size / build:>13,.0f} {size / dict_build:>12,.0f} "
            f"{lookup / queries.size * 1e6:>14.2f} {dict_lookup / queries.size * 1e6:>12.2f} "
            f"{index_lookup / queries.size * 1e6:>13.2f} {sketch.nbytes / size:>10.1f} "
            f"{raw:>14.1f} {sketch.m:>4} {error:>15.2f}"
        )


def bench_combined(sizes: list[int]) -> None:
    print(
        "\n== combined synopsis (split 1/2), ε = 1; build, batched lookup of present + absent keys"
    )
    print(f"{'k':>9} {'variant':>12} {'build keys/s':>13} {'lookup µs/key':>14} {'τ':>5} "
          f"{'released':>9} {'bytes/key':>10} {'mean|err| all':>14}")  # fmt: skip
    variants = {"approx 1e-6": {"delta": 1e-6}, "pure 2^64": {"domain": threshold.HashDomain()}}
    for size in sizes:
        keys = _urls(size)
        counts = np.minimum(np.random.default_rng(2).zipf(1.3, size), 10**6)
        queries = np.concatenate([keys, _urls(size, offset=10**9)])
        truth = np.concatenate([counts, np.zeros(size)])
        for name, extra in variants.items():
            build, out = _seconds(
                lambda keys=keys, counts=counts, extra=extra: combined.release(
                    keys, counts, epsilon=1.0, **extra
                )
            )
            lookup, answers = _seconds(lambda queries=queries, out=out: out.lookup(queries))
            print(
                f"{size:>9,} {name:>12} {size / build:>13,.0f} "
                f"{lookup / queries.size * 1e6:>14.2f} {out.threshold.tau:>5} "
                f"{out.threshold.keys.size:>9,} {len(out.to_bytes()) / size:>10.1f} "
                f"{np.abs(answers - truth).mean():>14.2f}"
            )


def bench_fig3(trials: int) -> None:
    print(f"\n== paper Fig. 3 simulation, {trials:,} trials, ε = 1, α = 3, β = 5000")
    flip = alp.flip_probability(3)
    alpha = float(alp.effective_alpha(flip))
    m = math.ceil(5000.0 / alpha)
    for collision in (0.1, 0.0):
        rng = secure_generator()
        errors = []
        for start in range(0, trials, 10_000):
            n = min(10_000, trials - start)
            x = rng.uniform(0, 5000.0, n)
            scaled = x / alpha
            y = np.floor(scaled) + (rng.random(n) < scaled - np.floor(scaled))
            embedding = np.arange(m) < y[:, None]
            if collision:
                embedding |= rng.random((n, m)) < collision
            flips = alp._bernoulli_words(flip, math.ceil(n * m / 64), rng)
            flips = np.unpackbits(flips.view(np.uint8))[: n * m].reshape(n, m)
            errors.append(alp.walk_estimate(embedding.astype(np.uint8) ^ flips) * alpha - x)
        error = np.concatenate(errors)
        print(
            f"collision {collision:.1f}: mean |error| {np.abs(error).mean():.2f}, std "
            f"{error.std():.2f}, 90th percentile |error| {np.percentile(np.abs(error), 90):.2f}"
        )


def bench_utility() -> None:
    print("\n== utility: 1M rows, 200k users (<= 10 rows), Zipf(1) over 100k URLs, ε = 1, δ = 1e-6")
    rng = np.random.default_rng(3)
    rows_per_user = rng.integers(1, 11, 200_000)
    scale = 1_000_000 / rows_per_user.sum()
    rows_per_user = np.maximum(1, np.round(rows_per_user * scale)).astype(int)
    users = np.repeat(np.arange(200_000), rows_per_user)
    ranks = np.arange(1, 100_001)
    urls = rng.choice(100_000, size=users.size, p=(1 / ranks) / np.sum(1 / ranks))
    pairs = pd.DataFrame({"user": users, "url": urls}).drop_duplicates()
    pairs = pairs[pairs.groupby("user").cumcount() < 10]  # L0 = 10 distinct URLs, L∞ = 1
    counts = pairs.groupby("url").size()
    print(f"{users.size:,} rows, {counts.size:,} distinct URLs after bounding (L0 = 10, L∞ = 1)")
    for name, release in (
        ("threshold only", lambda: threshold.release(
            counts.index.to_numpy(), counts.to_numpy(), epsilon=1.0, delta=1e-6,
            max_groups_per_unit=10, max_rows_per_group=1)),
        ("combined 1/2", lambda: combined.release(
            counts.index.to_numpy(), counts.to_numpy(), epsilon=1.0, delta=1e-6,
            max_groups_per_unit=10, max_rows_per_group=1).threshold),
    ):  # fmt: skip
        out = release()
        truth = counts.reindex(out.keys).to_numpy()
        print(
            f"{name:>15}: τ = {out.tau}, released {out.keys.size} keys, mean |error| of released "
            f"counts {np.abs(out.values - truth).mean():.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, 10^5 Fig. 3 trials")
    quick = parser.parse_args().quick
    sizes = [10**3, 10**4, 10**5] if quick else [10**3, 10**4, 10**5, 10**6]
    bench_sketch(sizes)
    bench_combined(sizes)
    bench_fig3(10**5 if quick else 10**6)
    bench_utility()


if __name__ == "__main__":
    main()
