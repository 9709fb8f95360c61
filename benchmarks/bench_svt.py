"""Time to scan 10**6 query answers with the sparse vector technique, against plain NumPy.

Run: ``python benchmarks/bench_svt.py``. Every timing is measured in the same run on the same
answers; the ratios are what matter, not the absolute numbers:

* ``numpy threshold``: ``np.flatnonzero(answers >= T)[:c]``, no privacy at all (the floor);
* ``numpy laplace + threshold``: the same after adding NumPy's float Laplace noise (inexact,
  not floating-point safe; the textbook sketch without SVT's threshold noise or cut-off);
* ``sparse`` / ``above_threshold`` / ``numeric_sparse``: dpsql, exact discrete Laplace noise;
* ``SparseVector.ask``: the interactive form, one query at a time (10**4 queries);
* ``(exact discrete laplace only)``: drawing 10**6 exact samples, the bulk of every SVT scan.

Answers are counts with a few large ones (the sparse regime the technique is for), so the scan
runs over the whole stream; generators are ChaCha20 (the secure default) and PCG64.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.laplace import sample_discrete_laplace
from dpsql.mechanisms.random import secure_generator
from dpsql.mechanisms.svt import SparseVector, above_threshold, numeric_sparse, sparse

QUERIES = 10**6
INTERACTIVE_QUERIES = 10**4
THRESHOLD = 10_000
CUTOFF = 10
EPSILON = 1.0
REPEATS = 3


def _best_seconds(run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _answers() -> np.ndarray:
    data = np.random.Generator(np.random.PCG64(7))
    answers = data.poisson(2_000, QUERIES).astype(np.int64)
    answers[data.choice(QUERIES, 5, replace=False)] = 50_000  # fewer than c: scan everything
    return answers


def _interactive(rng: np.random.Generator, answers: np.ndarray) -> None:
    vector = SparseVector(threshold=THRESHOLD, epsilon=EPSILON, c=CUTOFF, rng=rng)
    for answer in answers[:INTERACTIVE_QUERIES].tolist():
        if vector.halted:
            break
        vector.ask(answer)


def main() -> None:
    answers = _answers()
    generators = {
        "ChaCha20": secure_generator,
        "PCG64": lambda: np.random.Generator(np.random.PCG64(2024)),
    }
    for name, make in generators.items():
        rng = make()
        floor = _best_seconds(lambda: np.flatnonzero(answers >= THRESHOLD)[:CUTOFF])
        noisy = _best_seconds(
            lambda rng=rng: np.flatnonzero(
                answers + rng.laplace(0.0, 4 * CUTOFF / EPSILON, QUERIES) >= THRESHOLD
            )[:CUTOFF]
        )
        sampling = _best_seconds(
            lambda rng=rng: sample_discrete_laplace(Fraction(4 * CUTOFF), QUERIES, rng)
        )
        timings = {
            "numpy laplace + threshold": noisy,
            "(exact discrete laplace only)": sampling,
            f"sparse (c={CUTOFF})": _best_seconds(
                lambda rng=rng: sparse(
                    answers, threshold=THRESHOLD, epsilon=EPSILON, c=CUTOFF, rng=rng
                )
            ),
            "above_threshold": _best_seconds(
                lambda rng=rng: above_threshold(answers, threshold=60_000, epsilon=EPSILON, rng=rng)
            ),
            f"numeric_sparse (c={CUTOFF})": _best_seconds(
                lambda rng=rng: numeric_sparse(
                    answers, threshold=THRESHOLD, epsilon=EPSILON, c=CUTOFF, rng=rng
                )
            ),
        }
        print(f"{name}: numpy threshold (no privacy) {QUERIES:,} answers in {floor * 1e3:8.2f} ms")
        for label, seconds in timings.items():
            print(
                f"{name}: {label:30s} {seconds * 1e3:8.1f} ms  "
                f"{QUERIES / seconds:12,.0f} answers/s  {seconds / floor:7.0f}x numpy threshold  "
                f"{seconds / noisy:5.1f}x numpy laplace"
            )
        interactive = _best_seconds(lambda rng=rng: _interactive(rng, answers))
        per_query = interactive / INTERACTIVE_QUERIES
        print(
            f"{name}: SparseVector.ask             {per_query * 1e6:8.1f} us/query "
            f"{1 / per_query:12,.0f} answers/s  {per_query * QUERIES / floor:7.0f}x numpy threshold"
        )


if __name__ == "__main__":
    main()
