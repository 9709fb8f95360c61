"""The least integer meeting a monotone condition: thresholds, noise levels and budget units.

Each condition here holds from some point on (a larger threshold or budget fails less often), so
doubling steps bracket the answer and bisection finds it in ``O(log)`` evaluations, each of them
an exact tail sum or a plan, never a scan over every integer.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["least_above", "least_between"]


def least_between(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The least integer in ``(low, high]`` where ``fits`` holds, given it holds at ``high``,
    not at ``low`` (or ``low`` is a bound below every candidate), and from some point on."""
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def least_above(fits: Callable[[int], bool], low: int, step: int) -> int:
    """The least integer above ``low`` where ``fits`` holds, given it does not at ``low``:
    steps of ``step``, doubling, until it holds, then bisection."""
    high = low + step
    while not fits(high):
        low, step = high, step * 2
        high = low + step
    return least_between(fits, low, high)
