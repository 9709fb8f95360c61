"""Splitting a total ε across queries, exactly in ledger units.

Every rule works on integers of ``EPSILON_RESOLUTION`` (10⁻⁹), so the shares sum to the total
exactly and the ledger charges what the plan printed:

- **weights**: the total in proportion to each query's weight (largest remainder rounding);
- **minimax**: the continuous optimum of *minimise the largest relative error*. A query's
  error is ``c / ε`` (its half-width at ε = 1 over its share), so the largest of
  ``c_i / (ε_i · E_i)`` (``E_i`` a public reference magnitude) is smallest when every term is
  equal, i.e. ``ε_i ∝ c_i / E_i``: the weights rule with those weights;
- **accuracy**: the least units whose error meets a target, by exponential then binary search
  over a predicate the planner evaluates (``least_units``).

>>> split_units(10, [1, 1, 1])
[4, 3, 3]
>>> sum(split_units(1_000_000_007, [0.2, 0.3, 0.5]))
1000000007
>>> least_units(lambda u: 1000 / u <= 7, ceiling=10_000)
143
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

from dpsql.errors import ParameterError
from dpsql.mechanisms.search import least_between

__all__ = ["least_units", "split_units"]


def split_units(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` integer units in proportion to ``weights`` (positive), summing exactly to it:
    each share is rounded down, and the units left go to the largest remainders (ties to the
    earlier query). Every share must get at least one unit."""
    if not weights or any(not math.isfinite(w) or w <= 0 for w in weights):
        raise ParameterError(f"weights must be positive and finite, got {list(weights)}")
    exact = [Fraction(w) for w in weights]
    whole = sum(exact)
    ideal = [total * w / whole for w in exact]
    shares = [math.floor(x) for x in ideal]
    order = sorted(range(len(ideal)), key=lambda i: (-(ideal[i] - shares[i]), i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    if min(shares) < 1:
        raise ParameterError(
            f"the total is too small to give every one of {len(shares)} queries a share"
        )
    return shares


def least_units(meets: Callable[[int], bool], *, ceiling: int) -> int | None:
    """The least ``u`` in ``[1, ceiling]`` with ``meets(u)``, for a predicate that holds from
    some point on (more budget, less noise); None when even ``ceiling`` does not meet it. The
    answer is always a ``u`` for which ``meets`` was evaluated true."""
    if not meets(ceiling):
        return None
    low, high = 0, 1  # meets(low) is false (or low = 0); meets(high) is to be found
    while high < ceiling and not meets(high):
        low, high = high, min(ceiling, high * 2)
    return least_between(meets, low, high)
