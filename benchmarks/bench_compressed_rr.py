"""Benchmark of compressed randomized response (dpsql.mechanisms.compressed_rr).

Prints, on a generated user×item table with n = 87,585 items and d = 10 … 3,000 items per person:

1. message size per person and per item at final ε ∈ {0.2, 1, 2} (Elias gamma, whole bytes as
   stored; also unpadded gamma and delta bits), against plain RR (n bits) and the non-private
   list d·⌈log2 n⌉, and against the seed paper's slope (about 2 bits per item at ε = 1) and the
   reference implementation in the notes (1.28 bits per item at final ε = 1);
2. encoder time per person (median, p99), batched encoder throughput, and decoder time per entry
   (full row and single entries), each next to plain RR measured in the same run;
3. the encoder's tail for α ∈ {1.5, 2, 4}: per-person time p50 / p99 / max and PPR points per
   chunk, for the completing encoder (default) and for full enumeration (notes S2.5: infinite
   mean for α <= 2; capped here, censored instances counted).

Chunks come from the public d of each stratum (``suggest_chunks``, β = 2), as a deployment with
a declared bound per stratum would do. Run: ``python benchmarks/bench_compressed_rr.py [--quick]``.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dpsql.errors import ExecutionError
from dpsql.mechanisms import elias, ppr
from dpsql.mechanisms.compressed_rr import CompressedRR, suggest_chunks

N_ITEMS = 87_585
SEED = 20_240_601


def _table(rng: np.random.Generator, d: int, persons: int) -> list[np.ndarray]:
    """Item sets with a Zipf-like popularity (exponent 0.8), d distinct items per person."""
    weights = 1.0 / np.arange(1, N_ITEMS + 1) ** 0.8
    weights /= weights.sum()
    labels = rng.permutation(N_ITEMS)
    return [labels[rng.choice(N_ITEMS, d, replace=False, p=weights)] for _ in range(persons)]


def _percentiles(values: list[float] | np.ndarray) -> str:
    array = np.asarray(values)
    return (
        f"p50 {np.percentile(array, 50):8.2f}  p99 {np.percentile(array, 99):8.2f}  "
        f"max {array.max():8.2f}"
    )


def size_and_speed(quick: bool) -> None:
    rng = np.random.default_rng(SEED)
    strata = {10: 200, 100: 100, 1000: 30, 3000: 12}
    if quick:
        strata = {10: 50, 100: 30, 1000: 8, 3000: 4}
    log_n = math.ceil(math.log2(N_ITEMS))
    print(f"== 1. message size, n = {N_ITEMS}, α = 2, β = 2 (Elias gamma, whole bytes) ==")
    print(
        f"{'ε':>5} {'d':>5} {'chunks':>6} {'bits/person':>12} {'bits/item':>10} "
        f"{'unpadded':>9} {'delta':>7} {'non-private':>12} {'plain RR':>9} {'vs list':>8}"
    )
    tables = {d: _table(rng, d, persons) for d, persons in strata.items()}
    for epsilon in (0.2, 1.0, 2.0):
        for d, item_sets in tables.items():
            chunks = suggest_chunks(n=N_ITEMS, epsilon=epsilon, public_d=d)
            codec = CompressedRR(n=N_ITEMS, epsilon=epsilon, chunks=chunks, public_seed=SEED)
            ids = list(range(len(item_sets)))
            messages = codec.encode_many(item_sets, user_ids=ids, rng=rng)
            indices = np.stack([codec.unpack(m) for m in messages])
            stored = np.mean([8 * len(m) for m in messages])
            gamma = elias.code_lengths(indices.ravel(), code="gamma").sum() / len(messages)
            delta = elias.code_lengths(indices.ravel(), code="delta").sum() / len(messages)
            print(
                f"{epsilon:5.1f} {d:5d} {chunks:6d} {stored:12.1f} {stored / d:10.2f} "
                f"{gamma / d:9.2f} {delta / d:7.2f} {d * log_n:12d} {N_ITEMS:9d} "
                f"{stored / (d * log_n):8.3f}"
            )
    print("seed paper: ~2 bits/item at ε = 1 (slope of Fig. 1); notes' reference: 0.24 / 1.28 /")
    print("2.68 bits/item at final ε = 0.2 / 1 / 2; non-private list: ⌈log2 n⌉ = 17 bits/item.\n")

    print("== 2. speed at final ε = 1, α = 2 (per person, single encode calls) ==")
    print(
        f"{'d':>5} {'encode ms p50':>14} {'p99':>8} {'batched ms/person':>18} "
        f"{'plain RR ms':>12} {'decode ns/entry':>16} {'entry ns':>9} {'plain RR ns/entry':>18}"
    )
    for d, item_sets in tables.items():
        chunks = suggest_chunks(n=N_ITEMS, epsilon=1.0, public_d=d)
        codec = CompressedRR(n=N_ITEMS, epsilon=1.0, chunks=chunks, public_seed=SEED)
        codec.decode(codec.encode([], user_id=-1, rng=rng), user_id=-1)  # build public tables
        times, messages = [], []
        for person, items in enumerate(item_sets):
            start = time.perf_counter()
            messages.append(codec.encode(items, user_id=person, rng=rng))
            times.append(1e3 * (time.perf_counter() - start))
        start = time.perf_counter()
        codec.encode_many(item_sets, user_ids=list(range(len(item_sets))), rng=rng)
        batched = 1e3 * (time.perf_counter() - start) / len(item_sets)
        start = time.perf_counter()
        for items in item_sets:
            truth = np.zeros(N_ITEMS, dtype=bool)
            truth[items] = True
            _ = truth ^ (rng.random(N_ITEMS) < codec.flip_probability)
        plain = 1e3 * (time.perf_counter() - start) / len(item_sets)
        start = time.perf_counter()
        codec.decode_many(messages, user_ids=list(range(len(messages))))
        decode_ns = 1e9 * (time.perf_counter() - start) / (len(messages) * N_ITEMS)
        wanted = rng.integers(0, N_ITEMS, size=2000)
        start = time.perf_counter()
        for person, message in enumerate(messages):
            codec.decode_entries(message, wanted, user_id=person)
        entry_ns = 1e9 * (time.perf_counter() - start) / (len(messages) * wanted.size)
        print(
            f"{d:5d} {np.percentile(times, 50):14.2f} {np.percentile(times, 99):8.2f} "
            f"{batched:18.2f} {plain:12.2f} {decode_ns:16.1f} {entry_ns:9.1f} "
            f"{1e6 * plain / N_ITEMS:18.1f}"
        )
    print()


def encoder_tail(quick: bool) -> None:
    rng = np.random.default_rng(SEED + 1)
    d, persons = 100, (60 if quick else 400)
    item_sets = _table(rng, d, persons)
    print(f"== 3. encoder tail, final ε = 1, d = {d}, chunks from public d ==")
    for alpha in (1.5, 2.0, 4.0):
        chunks = suggest_chunks(n=N_ITEMS, epsilon=1.0, public_d=d, alpha=alpha)
        codec = CompressedRR(n=N_ITEMS, epsilon=1.0, chunks=chunks, public_seed=SEED, alpha=alpha)
        codec.encode([], user_id=-1, rng=rng)
        times, points = [], []
        for person, items in enumerate(item_sets):
            start = time.perf_counter()
            _, work = codec._encode(np.zeros(d, np.int64), np.asarray(items), [person], rng)
            times.append(1e3 * (time.perf_counter() - start))
            points.append(work.ravel())
        flat = np.concatenate(points)
        print(
            f"α = {alpha}: {chunks} chunks; ms/person {_percentiles(times)}; "
            f"points/chunk p50 {np.percentile(flat, 50):.0f} p99.9 "
            f"{np.percentile(flat, 99.9):.0f} max {flat.max()}"
        )

    instances = 20_000 if quick else 100_000
    cap = 1 << 18
    print(f"PPR points per instance, P = Q (empty chunks), {instances} instances, cap {cap}:")

    def flat_ratio(instances_: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        return np.zeros(ranks.shape)

    for alpha in (1.5, 2.0, 4.0):
        for method in ("complete", "enumerate"):
            block = 500
            work, censored = [], 0
            start = time.perf_counter()
            for _ in range(instances // block):
                try:
                    result = ppr.encode(
                        flat_ratio,
                        np.zeros(block),
                        alpha=alpha,
                        rng=rng,
                        method=method,
                        max_points=cap,
                    )
                    work.append(result.points)
                except ExecutionError:
                    censored += 1
                if method == "enumerate" and time.perf_counter() - start > (10 if quick else 60):
                    break
            seconds = time.perf_counter() - start
            all_points = np.concatenate(work) if work else np.zeros(1)
            print(
                f"  α = {alpha} {method:9}: points p50 {np.percentile(all_points, 50):6.0f} "
                f"p99 {np.percentile(all_points, 99):8.0f} max {all_points.max():9.0f}; "
                f"{censored} blocks of {block} hit the cap; "
                f"{len(work) * block} instances in {seconds:.1f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer persons, shorter tail runs")
    arguments = parser.parse_args()
    size_and_speed(arguments.quick)
    encoder_tail(arguments.quick)


if __name__ == "__main__":
    main()
