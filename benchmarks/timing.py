"""Shared timing helper for the benchmark scripts (run them as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    """Median wall-clock seconds of ``repeats`` calls."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
