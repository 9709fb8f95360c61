"""Benchmark of ``dpsql publish-rr`` and its post-processing queries (dpsql.engine.publishing).

On a generated user×item table (n = 87,585 items as integer bounds, d per person log-uniform in
[10, 300], public cap D = 300) it prints, for person-level ε ∈ {1, 10, 20}:

1. publish time against its parts measured in the same run: reading the distinct pairs from
   DuckDB, and the library encoder (``CompressedRR.encode_pairs``) on the same pairs and
   parameters; chunks chosen, charged δ, bits per person and per item;
2. popularity time (one ε) against the library's ``noisy_counts`` on the same messages;
3. a check of the δ bound (``overflow_delta``): with the PPR index limit lowered from 2**60 to
   2**6, the encoder's refusal rate per chunk against the per-chunk bound ``C·G^d`` it uses.

Run: ``python benchmarks/bench_publish.py [--quick]``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from dpsql.engine import publishing as published
from dpsql.engine.session import set_policy
from dpsql.errors import ExecutionError
from dpsql.mechanisms import ppr
from dpsql.mechanisms.compressed_rr import CompressedRR

N_ITEMS = 87_585
CAP = 300
SEED = 20_260_601


def _database(path: Path, persons: int, rng: np.random.Generator) -> Path:
    weights = 1.0 / np.arange(1, N_ITEMS + 1) ** 0.8
    weights /= weights.sum()
    labels = rng.permutation(N_ITEMS)
    sizes = np.exp(rng.uniform(math.log(10), math.log(CAP), persons)).astype(int)
    items = [labels[rng.choice(N_ITEMS, d, replace=False, p=weights)] for d in sizes]
    frame = pd.DataFrame(
        {"user_id": np.repeat(np.arange(persons), sizes), "item_id": np.concatenate(items)}
    )
    with duckdb.connect(str(path)) as connection:
        connection.register("frame", frame)
        connection.execute("CREATE TABLE events AS SELECT * FROM frame")
    set_policy(
        path,
        f"""
[dataset]
epsilon = 1000.0
delta = 1e-6
[analysts.bench]
epsilon = 1000.0
delta = 1e-6
[tables.events]
privacy_unit = "user_id"
max_rows_per_unit = {CAP}
[tables.events.columns.item_id]
bounds = [0, {N_ITEMS - 1}]
""",
    )
    return path


def _read_pairs(path: Path) -> tuple[np.ndarray, np.ndarray, float]:
    start = time.perf_counter()
    with duckdb.connect(str(path), read_only=True) as connection:
        frame = connection.execute("SELECT DISTINCT user_id, item_id FROM events").df()
    return frame["user_id"].to_numpy(), frame["item_id"].to_numpy(), time.perf_counter() - start


def bench_publish(path: Path, persons: int) -> None:
    person, item, read_seconds = _read_pairs(path)
    print(f"table: {persons} persons, {person.size} (person, item) rows, n = {N_ITEMS}, D = {CAP}")
    print(f"baseline: DuckDB read of the distinct pairs {read_seconds:.2f} s")
    header = (
        f"{'eps':>4} {'chunks':>6} {'delta':>9} {'bits/person':>11} {'bits/item':>9} "
        f"{'publish s':>9} {'library s':>9} {'ratio':>6}"
    )
    print(header)
    for epsilon in (1.0, 10.0, 20.0):
        name = f"e{int(epsilon)}"
        start = time.perf_counter()
        release = published.publish_rr(
            path, analyst="bench", table="events", unit="user_id", item="item_id",
            epsilon=epsilon, name=name,
        )  # fmt: skip  (noise from the session's secure generator: no seed can be given)
        publish_seconds = time.perf_counter() - start
        codec = CompressedRR(
            n=N_ITEMS, epsilon=release.epsilon_per_item, chunks=release.chunks,
            public_seed=release.public_seed, alpha=release.alpha,
        )  # fmt: skip
        start = time.perf_counter()
        messages = codec.encode_pairs(
            person, item, user_ids=list(range(persons)), rng=np.random.default_rng(SEED)
        )
        library_seconds = time.perf_counter() - start
        bits = 8.0 * release.message_bytes
        print(
            f"{epsilon:>4g} {release.chunks:>6} {release.delta:>9.2g} "
            f"{bits / persons:>11.1f} {bits / person.size:>9.3f} {publish_seconds:>9.2f} "
            f"{library_seconds:>9.2f} {publish_seconds / library_seconds:>6.2f}"
        )
    start = time.perf_counter()
    published.release_popularity(path, analyst="bench", name=name)
    popularity_seconds = time.perf_counter() - start
    start = time.perf_counter()
    codec.noisy_counts(messages, user_ids=list(range(persons)))
    counts_seconds = time.perf_counter() - start
    print(
        f"popularity (eps = {epsilon:g}): {popularity_seconds:.2f} s; library noisy_counts on "
        f"the same messages {counts_seconds:.2f} s; ratio {popularity_seconds / counts_seconds:.2f}"
    )
    list_bits = math.ceil(math.log2(N_ITEMS))
    print(f"plain RR: {N_ITEMS} bits per person; non-private list: {list_bits} bits per item")


def bench_overflow_bound(trials: int) -> None:
    """Refusal rate per chunk with the index limit at 2**6 (instead of 2**60) against C·G^d."""
    limit_bits = 6
    saved = ppr._LOG_RANK_LIMIT
    ppr._LOG_RANK_LIMIT = limit_bits * math.log(2.0)
    alpha, epsilon_rr = 2.0, 0.5
    print(f"\nδ bound check: index limit 2**{limit_bits}, alpha = {alpha}, eps_rr = {epsilon_rr}")
    print(f"{'d':>3} {'refusals':>9} {'rate':>7} {'99.9% lower':>11} {'bound C·G^d':>11} {'':>8}")
    try:
        codec = CompressedRR(n=64, epsilon=2 * alpha * epsilon_rr, chunks=1, public_seed=5)
        e = codec.epsilon_rr
        g = (math.exp(-alpha * e) + math.exp((alpha + 1) * e)) / (1 + math.exp(e))
        constant = math.gamma(alpha + 1) * 2.0 ** (-limit_bits * (alpha - 1)) / (alpha - 1)
        rng = np.random.default_rng(SEED)
        for d in (0, 2, 4):
            refusals = 0
            for trial in range(trials):
                try:
                    codec.encode(range(d), user_id=trial, rng=rng)
                except ExecutionError:
                    refusals += 1
            rate = refusals / trials
            lower = rate - 3.1 * math.sqrt(max(rate * (1 - rate), 1.0 / trials) / trials)
            bound = constant * (g * math.exp(alpha * e)) ** d
            verdict = "VIOLATED" if lower > bound else "holds"
            print(f"{d:>3} {refusals:>9} {rate:>7.4f} {lower:>11.4f} {bound:>11.4f} {verdict:>8}")
    finally:
        ppr._LOG_RANK_LIMIT = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer persons and trials")
    args = parser.parse_args()
    persons = 300 if args.quick else 1_000
    rng = np.random.default_rng(SEED)
    with tempfile.TemporaryDirectory() as directory:
        path = _database(Path(directory) / "bench.duckdb", persons, rng)
        bench_publish(path, persons)
    bench_overflow_bound(500 if args.quick else 3_000)


if __name__ == "__main__":
    main()
