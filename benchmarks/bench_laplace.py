"""Throughput of the exact discrete Laplace sampler against NumPy's (inexact, float) Laplace.

Run: ``python benchmarks/bench_laplace.py``. Both samplers draw 10**6 values from the same kind of
generator in the same run; the ratio is what matters, not the absolute numbers.
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.laplace import noise_scale, sample_discrete_laplace
from dpsql.mechanisms.random import secure_generator

DRAWS = 10**6
REPEATS = 3


def _best_seconds(run) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    generators = {
        "PCG64": lambda: np.random.Generator(np.random.PCG64(2024)),
        "ChaCha20": secure_generator,
    }
    scales = [Fraction(3, 7), Fraction(1), noise_scale(1.0, 0.3), Fraction(1000)]
    for name, make in generators.items():
        rng = make()
        baseline = _best_seconds(lambda rng=rng: rng.laplace(0.0, 1.0, DRAWS))
        print(f"{name}: numpy rng.laplace  {DRAWS / baseline:14,.0f} samples/s")
        for scale in scales:
            seconds = _best_seconds(
                lambda scale=scale, rng=rng: sample_discrete_laplace(scale, DRAWS, rng)
            )
            print(
                f"{name}: discrete scale {float(scale):9.4g}  {DRAWS / seconds:14,.0f} samples/s"
                f"  ({seconds / baseline:5.1f}x slower than rng.laplace)"
            )


if __name__ == "__main__":
    main()
