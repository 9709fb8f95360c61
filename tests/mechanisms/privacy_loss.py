"""Shared statistics for privacy tests on neighbouring inputs."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

from scipy import stats


def max_log_ratio_lower_bound(
    first: Sequence[Hashable], second: Sequence[Hashable], level: float = 1e-3
) -> float:
    """Largest lower confidence bound, over outputs and both directions, of log(P1(o)/P2(o)),
    from samples of the outputs on two neighbouring inputs: Clopper-Pearson bounds at ``level``
    split over all outputs, so a mechanism within a privacy bound passes with probability
    >= 1 - level."""
    counts = (Counter(first), Counter(second))
    sizes = (len(first), len(second))
    outputs = set(counts[0]) | set(counts[1])
    split = level / (2 * len(outputs))
    best = -math.inf
    for output in outputs:
        for top, bottom in ((0, 1), (1, 0)):
            hits, misses = counts[top][output], counts[bottom][output]
            if hits == 0:
                continue
            low = stats.beta.ppf(split, hits, sizes[top] - hits + 1)
            high = (
                1.0
                if misses == sizes[bottom]
                else stats.beta.ppf(1.0 - split, misses + 1, sizes[bottom] - misses)
            )
            best = max(best, math.log(low) - math.log(high))
    return best
