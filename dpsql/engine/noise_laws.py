"""The noise law behind each released column, for intervals at any confidence level.

A released COUNT or SUM is its true (bounded) value plus discrete Laplace noise of a scale the plan
fixes (``dpsql.mechanisms.laplace``); an AVG is the ratio of such a sum and count, clamped to the
column's bounds. Post-processing (``dpsql.engine.derived_intervals``) combines several released
values in one output (a ratio, a difference, a variance); to keep the output's confidence at the
answer's level it needs each component's interval at a *higher* level (a union bound) or the exact
law of a combination, so the release keeps each column's law beside its values. The laws are
functions of the plan (scales, grids, bounds) and of released values only, never of the data.

Linear combinations of discrete Laplace noises have a known law: ``combination_half_width`` gives
the half-width of ``Σ c_i X_i`` at a level, exactly (two terms: a sum over the support of one
noise against the closed-form distribution function of the other) or by simulation from the noise
laws with a stated error (three or more terms).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.laplace import interval_half_width

__all__ = [
    "MONTE_CARLO_DRAWS",
    "MONTE_CARLO_FAILURE",
    "Combination",
    "DiscreteLaplaceLaw",
    "RatioLaw",
    "combination_half_width",
    "ratio_interval",
]

_TAIL = 1e-12
"""Noise mass left out of an exact sum over a support (counted as a miss: conservative)."""

_MOST_SUPPORT = 2_000_000
"""The largest support an exact two-term sum runs over; beyond it, simulation."""

_SAFETY = 1e-9
"""Probability added to the level an exact computation must reach (float rounding)."""

MONTE_CARLO_DRAWS = 200_000
"""Draws of a simulated combination of noises."""

MONTE_CARLO_FAILURE = 1e-6
"""The probability, over the simulation, that a simulated quantile is below the stated level:
the empirical quantile is taken at the level plus the Dvoretzky-Kiefer-Wolfowitz margin
``sqrt(ln(2 / α) / (2 N))`` (Massart's constant), so that with probability ``1 - α`` the true
distribution function there is at least the level."""


@dataclass(frozen=True)
class DiscreteLaplaceLaw:
    """Discrete Laplace noise of ``scale`` noise units, each worth ``grid`` output units (1 for a
    count, the sum's power-of-two grid for a sum): what ``release_counts`` and
    ``release_grid_sums`` add."""

    scale: Fraction
    grid: float = 1.0

    kind = "exact"

    def half_width(self, level: float) -> float:
        """The smallest half-width (in output units) covering the noise with ``level``."""
        return float(interval_half_width(self.scale, level)) * self.grid

    def intervals(self, values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
        """Each released value's interval at ``level``."""
        half = self.half_width(level)
        return values - half, values + half


@dataclass(frozen=True, eq=False)
class RatioLaw:
    """An AVG: noisy ``sums`` over noisy ``counts`` (one per released row) with their laws,
    clamped to ``[low, high]`` (``ratio_interval``)."""

    sums: np.ndarray
    counts: np.ndarray
    total: DiscreteLaplaceLaw
    rows: DiscreteLaplaceLaw
    low: float
    high: float

    kind = "conservative"

    def intervals(self, values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
        """Each row's interval at ``level`` (a union bound over its sum and count)."""
        half = (1 + level) / 2
        _, lower, upper = ratio_interval(
            self.sums,
            self.counts,
            self.total.half_width(half),
            self.rows.half_width(half),
            self.low,
            self.high,
        )
        return lower, upper

    def kept(self, rows: Sequence[int]) -> RatioLaw:
        """The law of the rows ``rows`` only (after HAVING)."""
        index = np.asarray(rows, dtype=np.int64)
        return RatioLaw(
            self.sums[index], self.counts[index], self.total, self.rows, self.low, self.high
        )


def ratio_interval(
    sums: np.ndarray,
    counts: np.ndarray,
    sum_half: float,
    count_half: float,
    low: float,
    high: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AVG = noisy SUM / noisy COUNT, clamped to the bounds; the interval joins the two
    (1+c)/2 intervals (union bound), so it covers with probability at least c. Where the count's
    interval reaches below one row (an empty group, say) nothing rules out any mean: the
    interval is the whole bounds and the value their midpoint, not whichever bound the ratio of
    two noisy numbers happens to hit."""
    values = np.clip(sums / np.maximum(counts, 1), low, high)
    count_low = counts - count_half
    count_high = counts + count_half
    corners = np.stack(
        [
            (sums + s) / c
            for s in (-sum_half, sum_half)
            for c in (np.maximum(count_low, 1), np.maximum(count_high, 1))
        ]
    )
    lower = np.where(count_low >= 1, np.clip(corners.min(axis=0), low, high), low)
    upper = np.where(count_low >= 1, np.clip(corners.max(axis=0), low, high), high)
    values = np.where(count_low >= 1, values, (low + high) / 2)
    return values, lower, upper


@dataclass(frozen=True)
class Combination:
    """The half-width of a linear combination of independent noises at a level, and how it was
    found: ``"exact"`` or ``"approximate"`` (simulated, ``method`` says with what error)."""

    half_width: float
    kind: str
    method: str


def _tail_above(law: DiscreteLaplaceLaw, points: np.ndarray) -> np.ndarray:
    """``P(X >= j)`` for integers ``j`` (as floats) of discrete Laplace ``X``: ``a^j / (1 + a)``
    for ``j >= 1``, ``a = exp(-1/scale)``; one minus that of ``1 - j`` below."""
    scale = float(law.scale)
    a = math.exp(-1.0 / scale)
    positive = np.exp(-np.maximum(points, 1.0) / scale) / (1 + a)
    negative = 1.0 - np.exp(-np.maximum(1.0 - points, 1.0) / scale) / (1 + a)
    return np.where(points >= 1, positive, negative)


class _Pair:
    """``P(|w1 X1 + w2 X2| <= t + 1e-9 w2)`` (``w`` > 0) as a function of ``t``, summed over
    ``X1``'s support (the mass beyond it, at most ``_TAIL``, counted as outside) against the
    closed-form distribution function of ``X2``. The slack makes a ``t`` on the sums' lattice
    count its own points whatever the rounding; a half-width found with it is widened by it
    (``_exact_pair``)."""

    def __init__(
        self, outer: DiscreteLaplaceLaw, outer_weight: float, inner: DiscreteLaplaceLaw,
        inner_weight: float,
    ):  # fmt: skip
        scale = float(outer.scale)
        a = math.exp(-1.0 / scale)
        reach = math.ceil(scale * math.log(2 / ((1 + a) * _TAIL)))
        k = np.arange(-reach, reach + 1, dtype=np.float64)
        self.mass = (1 - a) / (1 + a) * np.exp(-np.abs(k) / scale)
        self.shift = outer_weight * k / inner_weight
        self.inner = inner
        self.inner_weight = inner_weight

    def within(self, t: float) -> float:
        reach = t / self.inner_weight
        top = np.floor(reach - self.shift + 1e-9)
        bottom = np.ceil(-reach - self.shift - 1e-9)
        inside = np.clip(
            _tail_above(self.inner, bottom) - _tail_above(self.inner, top + 1), 0.0, 1.0
        )
        return float(np.sum(self.mass * np.where(top >= bottom, inside, 0.0)))


@functools.lru_cache(maxsize=256)
def _exact_pair(
    terms: tuple[tuple[float, DiscreteLaplaceLaw], ...], level: float
) -> Combination | None:
    """Two terms: bisection on t of ``_Pair.within`` (a step function)."""
    (w1, law1), (w2, law2) = ((abs(w) * law.grid, law) for w, law in terms)
    if float(law1.scale) > float(law2.scale):
        (w1, law1), (w2, law2) = (w2, law2), (w1, law1)
    if float(law1.scale) * math.log(4 / _TAIL) > _MOST_SUPPORT:
        return None
    pair = _Pair(law1, w1, law2, w2)
    wanted = min(level + _SAFETY, 1.0)
    split = (1 + level) / 2
    high = sum(
        w * interval_half_width(law.scale, split) for w, law in ((w1, law1), (w2, law2))
    )
    if pair.within(high) < wanted:
        return None  # the union bound itself is too tight for the computed mass
    low = max(w * interval_half_width(law.scale, level) for w, law in ((w1, law1), (w2, law2)))
    low = min(low, high) * 0.5
    for _ in range(60):
        middle = (low + high) / 2
        if pair.within(middle) >= wanted:
            high = middle
        else:
            low = middle
        if high - low <= 1e-9 * max(high, 1e-300):
            break
    unit = min(w1, w2)
    ratio = max(w1, w2) / unit
    snapped = math.floor(high / unit + 1e-9) * unit
    if ratio == round(ratio) and pair.within(snapped) >= wanted:
        high = float(snapped)  # one lattice, of unit w1 or w2 > the slack: nothing between
    else:
        high += 2e-9 * max(w1, w2)  # what the slack counted in
    return Combination(
        high,
        "exact",
        "the exact law of the sum of two independent discrete Laplace noises",
    )


@functools.lru_cache(maxsize=256)
def _simulated(
    terms: tuple[tuple[float, DiscreteLaplaceLaw], ...], level: float
) -> Combination | None:
    """Three or more terms: the quantile of ``|Σ w_i X_i|`` from ``MONTE_CARLO_DRAWS`` draws,
    taken at the level plus the DKW margin (``MONTE_CARLO_FAILURE``). The draws simulate public
    laws (no data) from a fixed seed, so the same query states the same width."""
    margin = math.sqrt(math.log(2 / MONTE_CARLO_FAILURE) / (2 * MONTE_CARLO_DRAWS))
    if level + margin >= 1:
        return None
    rng = np.random.Generator(np.random.PCG64(20_240_601))
    total = np.zeros(MONTE_CARLO_DRAWS)
    for weight, law in terms:
        success = -math.expm1(-1.0 / float(law.scale))
        noise = rng.geometric(success, MONTE_CARLO_DRAWS) - rng.geometric(
            success, MONTE_CARLO_DRAWS
        )
        total += weight * law.grid * noise
    half = float(np.quantile(np.abs(total), level + margin, method="higher"))
    return Combination(
        half,
        "approximate",
        f"simulated from the noise laws ({MONTE_CARLO_DRAWS} draws, quantile at the level plus "
        f"{margin:.4f}: below the level with probability at most {MONTE_CARLO_FAILURE:g})",
    )


def combination_half_width(
    terms: Sequence[tuple[float, DiscreteLaplaceLaw]], level: float
) -> Combination | None:
    """The half-width at ``level`` of ``Σ w_i X_i`` for independent discrete Laplace noises
    ``X_i`` with weights ``w_i`` (in output units per noise unit: the weight times the grid is
    applied here); None when neither an exact sum nor a simulation applies.

    >>> law = DiscreteLaplaceLaw(Fraction(10))
    >>> combination_half_width([(1.0, law)], 0.95).half_width == law.half_width(0.95)
    True
    >>> pair = combination_half_width([(1.0, law), (-1.0, law)], 0.95)
    >>> pair.kind, law.half_width(0.95) < pair.half_width < 2 * law.half_width(0.975)
    ('exact', True)
    """
    terms = [(w, law) for w, law in terms if w != 0]
    if not terms:
        return Combination(0.0, "exact", "no noise")
    if len(terms) == 1:
        ((weight, law),) = terms
        return Combination(
            abs(weight) * law.half_width(level), "exact", "the released noise's own law"
        )
    if len(terms) == 2:
        exact = _exact_pair(tuple(terms), level)
        if exact is not None:
            return exact
    return _simulated(tuple(terms), level)
