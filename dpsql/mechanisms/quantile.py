"""Differentially private quantiles: the exponential mechanism over a public grid, sampled with
permute-and-flip.

Mechanism
---------
The candidates are the ``G`` public bins ``[b_j, b_{j+1})``, ``b_j = low + j (high - low) / G``,
of a column's declared bounds (the last bin also holds ``high``); a chosen bin is released as its
midpoint. The database returns a histogram of the clamped column over the bins, in weight units
(``dpsql.sql.generate``); its prefix sums give ``L_j``, the weight of rows below bin ``j``, and
``L_{j+1} = L_j + h_j``, with ``n = L_G``. For a quantile ``q = a / d`` (an exact rational) the
utility of bin ``j`` is the integer

    u_j = -max(0, d L_j - a n, a n - d L_{j+1})

(``d`` times the distance of ``q n`` from the bin's rank interval ``[L_j, L_{j+1}]``; 0 for the
bins that hold the quantile, and some bin always does). The output is drawn with
*permute-and-flip* (McKenna and Sheldon, "Permute-and-Flip: A new mechanism for differentially
private selection", NeurIPS 2020, Algorithm 1 and Theorem 1): visit the candidates in a uniformly
random order and return the first ``r`` whose coin ``Bernoulli(exp(ε (u_r - u*) / (2 Δu)))``
comes up heads, ``u*`` being the largest utility. It is ε-DP whenever the utility has sensitivity
``Δu`` and, for every input, its expected error is never larger than the exponential
mechanism's (their Theorem 2).

Sensitivity (the proof)
-----------------------
Neighbours differ by one person (privacy unit), whose kept rows weigh ``w <= Δ`` in the group
(``Δ`` from the policy alone; see ``docs/sql_shapes.md``). Adding the person changes ``L_j`` by
some ``0 <= x <= w`` (their weight below bin ``j``) and ``n`` by ``w``, so ``d L_j - a n`` changes
by ``d x - a w``, which lies in ``[-a w, (d - a) w]``: its absolute value is at most
``max(a, d - a) w``, and likewise for ``a n - d L_{j+1}``. ``max(0, s, t)`` is 1-Lipschitz in
``(s, t)`` under the largest-coordinate norm, so ``Δu = max(a, d - a) Δ`` (``Δ`` for the median,
``a = 1, d = 2``; removing the person is the same change reversed). Across the
groups of a GROUP BY over public keys the person's weights ``w_g`` sum to at most ``Δ``;
permute-and-flip run with ``ε / Δu`` on a utility that moves by at most ``max(a, d - a) w_g`` is
``(ε w_g / Δ)``-DP (the mechanism only reads the ratio ``ε / Δu``), so the groups together cost
``ε Σ w_g / Δ <= ε``. Weights in units of ``1 / weight`` row scale ``Δ`` and every utility alike.

Sampling exactly
----------------
Visiting in a random order and stopping at the first head is the same distribution as flipping
every coin (independently) and returning a uniformly random head: the order is independent of
the coins, so the first head in it is uniform among the heads. The candidate with ``u*`` always
comes up heads, so there is one. Each coin is ``Bernoulli(exp(-γ))`` with a rational
``γ = ε' (u* - u_r) / (2 Δu)``, where ``ε' <= ε`` is ε rounded *down* to a dyadic rational (a
smaller ε only adds privacy), sampled exactly as ``exp(-1)^⌊γ⌋ · exp(-{γ})``: a geometric count
of ``Bernoulli(exp(-1))`` successes reaching ``⌊γ⌋`` and one ``Bernoulli(exp(-{γ}))`` (Canonne,
Kamath and Steinke, NeurIPS 2020, Algorithm 1, as in ``dpsql.mechanisms.laplace``). All coins of
all groups are drawn in whole-array rounds; no floating-point number decides an output.

Accuracy
--------
With probability at least ``1 - β`` the chosen candidate's utility is within
``2 Δu / ε · ln(G / β)`` of the best, which is 0 (McKenna and Sheldon, Theorem 2 with the
exponential mechanism's bound): the chosen bin's rank interval ``[L_j, L_{j+1}]`` is within
``2 max(q, 1 - q) Δ / ε · ln(G / β)`` rows of ``q n``, so the released midpoint is within half a
bin of a value whose rank is that close. The bound is a property of the mechanism, not of the
data.

In the column's units the release states the chosen bin ``[b_j, b_{j+1}]``: with probability
at least ``1 - β`` it holds a value ``x`` with ``|rank(x) - q n| <= R`` (``R`` the bound above),
i.e. it meets the range between the ``q - R/n`` and ``q + R/n`` quantiles. It is a function of
the output and public constants only (the bins whose utility is within the bound are data, and
are never shown). It does *not* promise to hold the exact ``q`` quantile, and no ε-DP interval
can on every table: take neighbouring tables whose exact medians lie on either side of a gap in
the column (one person moves the median across it); their intervals' laws differ by at most a
factor ``e^ε``, so an interval that holds each table's own median with probability ``c`` spans
the gap with probability at least ``c (1 + e^-ε) - 1`` (0.30 at c = 0.95, ε = 1) on either
table, however wide the gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.laplace import (
    _bernoulli_exp_neg_fraction,
    _geometric_exp_neg_one,
    _positive_finite,
)
from dpsql.mechanisms.random import resolve_rng

__all__ = [
    "DEFAULT_CANDIDATES",
    "MAX_QUANTILE_DENOMINATOR",
    "QuantileRelease",
    "candidates",
    "epsilon_used",
    "permute_and_flip",
    "quantile_fraction",
    "rank_error_bound",
    "rank_utilities",
    "release_quantiles",
    "utility_sensitivity",
]

DEFAULT_CANDIDATES = 1024
"""Equal bins ``G`` over the declared bounds (resolution ``(high - low) / 1024``)."""

MAX_QUANTILE_DENOMINATOR = 10**6
"""A quantile is an exact decimal with at most six digits after the point."""

_EPSILON_BITS = 40
"""ε is rounded down to a multiple of ``2**-k`` keeping about this many significant bits."""

_INT64_LIMIT = 2**62
_NEVER = 2**62
"""A count of exp(-1) successes no run reaches: ``⌊γ⌋`` above it is clipped to it (same event)."""


def quantile_fraction(value: str | float | Fraction) -> Fraction:
    """``value`` (a literal's text) as an exact fraction in [0, 1]; ParameterError otherwise.

    >>> quantile_fraction("0.9")
    Fraction(9, 10)
    """
    try:
        q = Fraction(str(value)) if not isinstance(value, Fraction) else value
    except (ValueError, ZeroDivisionError):
        raise ParameterError(f"a quantile must be a number in [0, 1], got {value!r}") from None
    if not 0 <= q <= 1:
        raise ParameterError(f"a quantile must be in [0, 1], got {value}")
    if q.denominator > MAX_QUANTILE_DENOMINATOR:
        raise ParameterError(f"a quantile is given with at most six decimals, got {value!r}")
    return q


def candidates(low: float, high: float, size: int = DEFAULT_CANDIDATES) -> np.ndarray:
    """The midpoints ``low + (j + 1/2) (high - low) / size`` of the ``size`` public bins."""
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ParameterError(f"quantile bounds must be finite with low < high, got [{low}, {high}]")
    if size < 2:
        raise ParameterError(f"a quantile needs at least 2 candidates, got {size}")
    return low + (high - low) * ((np.arange(size, dtype=np.float64) + 0.5) / size)


def rank_utilities(histograms: np.ndarray, q: Fraction) -> np.ndarray:
    """``u_j = -max(0, d L_j - a n, a n - d L_{j+1})`` per group (rows) and bin (columns),
    ``q = a / d``, from histograms of non-negative integer weights, as Python integers in an
    object array when int64 could overflow."""
    counts = np.asarray(histograms)
    if counts.ndim != 2 or (counts.size and counts.min() < 0):
        raise ParameterError("histograms must be a 2-d array of non-negative weights")
    through = np.cumsum(counts, axis=1, dtype=np.int64)
    below = through - counts
    total = through[:, -1:]
    a, d = q.numerator, q.denominator
    if int(total.max(initial=0)) * d >= _INT64_LIMIT:
        below, through, total = below.astype(object), through.astype(object), total.astype(object)
    target = total * a
    return -np.maximum(np.maximum(below * d - target, target - through * d), 0)


def _dyadic_below(epsilon: Fraction, limit_bits: int) -> Fraction:
    """``epsilon`` rounded down to a multiple of ``2**-k``, ``k`` keeping about 40 significant
    bits and ``k <= limit_bits``."""
    exponent = epsilon.numerator.bit_length() - epsilon.denominator.bit_length()
    bits = max(0, min(_EPSILON_BITS - exponent, limit_bits))
    rounded = Fraction(math.floor(epsilon * 2**bits), 2**bits)
    if rounded <= 0:
        raise ParameterError(f"epsilon {float(epsilon)!r} is too small for a quantile")
    return rounded


def epsilon_used(epsilon: float | Fraction, sensitivity: int) -> Fraction:
    """The dyadic ``ε' <= ε`` permute-and-flip runs with for a utility of ``sensitivity``
    (``2 Δu 2**k < 2**62``); ParameterError when none is left."""
    exact = _positive_finite("epsilon", epsilon)
    room = 62 - (2 * sensitivity).bit_length()
    if room < 1:
        raise ParameterError(f"sensitivity {sensitivity} is too large for a quantile")
    return _dyadic_below(exact, room)


def permute_and_flip(
    utilities: np.ndarray,
    *,
    epsilon: float | Fraction,
    sensitivity: int,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """One index per row of ``utilities`` (integers), chosen by permute-and-flip with privacy
    parameter ``epsilon`` for a utility of sensitivity ``sensitivity``: exact, whole-array."""
    rng = resolve_rng(rng)
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, int) or sensitivity <= 0:
        raise ParameterError(f"sensitivity must be a positive integer, got {sensitivity!r}")
    scores = np.asarray(utilities)
    if scores.ndim != 2 or scores.shape[1] == 0:
        raise ParameterError("utilities must be a 2-d array with at least one candidate")
    rounded = epsilon_used(epsilon, sensitivity)
    span = 2 * sensitivity
    # γ = ε' (u* - u) / (2 Δu) = num / den, den = 2 Δu 2**k < 2**62.
    den = span * rounded.denominator
    gaps = (scores.max(axis=1, keepdims=True) - scores).astype(object).ravel()
    numerators = gaps * rounded.numerator
    whole = np.minimum(numerators // den, _NEVER).astype(np.int64)
    fraction = (numerators % den).astype(np.int64)
    heads = _bernoulli_exp_neg_fraction(fraction, den, rng)
    uncertain = np.flatnonzero(heads & (whole > 0))
    if uncertain.size:
        heads[uncertain] = _geometric_exp_neg_one(uncertain.size, rng) >= whole[uncertain]
    heads = heads.reshape(scores.shape)
    # The first head in a uniformly random order is a uniformly random head.
    per_row = heads.sum(axis=1)
    pick = rng.integers(0, per_row)
    return np.argmax(np.cumsum(heads, axis=1) > pick[:, None], axis=1)


def rank_error_bound(
    sensitivity: float, epsilon: float, size: int, beta: float, q: Fraction = Fraction(1)
) -> float:
    """Rows of rank error ``2 max(q, 1 - q) Δ / ε · ln(G / β)`` the chosen bin's rank interval
    stays within (from ``q n``) with probability ``>= 1 - β``."""
    return 2.0 * float(max(q, 1 - q)) * sensitivity / epsilon * math.log(size / beta)


def utility_sensitivity(q: Fraction, sensitivity: int, weight: int = 1) -> int:
    """``Δu = max(a, d - a) Δ weight`` for ``q = a / d`` (see the module's proof)."""
    return max(q.numerator, q.denominator - q.numerator) * sensitivity * weight


@dataclass(frozen=True)
class QuantileRelease:
    """The chosen bin midpoints (one per group) and the mechanism's parameters."""

    values: np.ndarray
    indices: np.ndarray
    candidates: int
    sensitivity: int
    rank_error: float
    confidence: float
    lower: np.ndarray
    """The chosen bins' low edges: with probability ``confidence`` each chosen bin
    ``[lower, upper]`` holds a value whose rank is within ``rank_error`` rows of ``q n``."""
    upper: np.ndarray


def release_quantiles(
    histograms: np.ndarray,
    *,
    q: Fraction,
    low: float,
    high: float,
    epsilon: float,
    sensitivity: int,
    weight: int = 1,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
) -> QuantileRelease:
    """The ``q`` quantile of each group's histogram over ``G = histograms.shape[1]`` equal bins of
    ``[low, high]`` (the chosen bin's midpoint); ``sensitivity`` is the person's largest weight
    in rows (Δ), ``weight`` the histogram units per row."""
    grid = candidates(low, high, histograms.shape[1])
    width = (high - low) / grid.size
    utilities = rank_utilities(histograms, q)
    chosen = permute_and_flip(
        utilities, epsilon=epsilon, sensitivity=utility_sensitivity(q, sensitivity, weight), rng=rng
    )
    return QuantileRelease(
        values=grid[chosen],
        indices=chosen,
        candidates=grid.size,
        sensitivity=sensitivity,
        rank_error=rank_error_bound(sensitivity, epsilon, grid.size, 1 - confidence, q),
        confidence=confidence,
        lower=low + chosen * width,
        upper=np.minimum(low + (chosen + 1) * width, high),
    )
