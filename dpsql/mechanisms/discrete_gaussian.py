"""The discrete Gaussian: exact sampling, exact tails, and its (ε, δ) guarantee through zCDP.

``N_Z(0, σ²)`` has ``P(Z = z) = exp(-z²/(2σ²)) / Σ_y exp(-y²/(2σ²))`` on the integers (Canonne,
Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020; CKS below).

Sampling (CKS Algorithm 3) with rational ``σ² = p/q``: ``t = ⌊σ⌋ + 1``; draw ``Y`` from the discrete
Laplace with scale ``t`` (CKS Algorithm 2, :func:`dpsql.mechanisms.laplace.sample_discrete_laplace`)
and accept it with probability ``exp(-(|Y| - σ²/t)²/(2σ²))``, that is ``exp(-x²/D)`` with the
integers ``x = |Y|·q·t - p`` and ``D = 2·p·q·t²``. The Bernoulli is exact and integer-only: with
``x² = k·D + r``, accept iff a geometric count of Bernoulli(e⁻¹) successes is at least ``k``
(probability ``e^{-k}``) and Bernoulli(exp(-r/D)) succeeds (CKS Algorithm 1). Every draw comes
from the caller's generator (the engine's is ChaCha20 keyed by the OS CSPRNG,
:mod:`dpsql.mechanisms.random`). Rounds run on whole arrays; an element whose ``x²`` would not fit
in int64 is handled with Python integers (probability below ``e^{-13}`` per draw at the largest σ).

Privacy (CKS Theorem 14): adding independent ``N_Z(0, σ²)`` to each entry of an integer vector whose
L2 sensitivity is ``Δ₂`` is ``ρ``-zCDP with ``ρ = Δ₂²/(2σ²)``, the Rényi curve of the continuous
Gaussian. :func:`zcdp_delta` turns ρ-zCDP into (ε, δ)-DP by CKS Corollary 13 (Proposition 12 of
the arXiv version): ``δ = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α``; any α gives a valid
δ, so minimising over a grid only costs tightness, never privacy.

Tails (:func:`tail_at_least`) are sums of the normalised mass, computed in log space over a window
of ``12σ + 64`` integers past the first term, with the rest bounded by a geometric series and added,
and rounded up by a relative ``1e-10``: upper bounds, never below the exact value.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.laplace import (
    _bernoulli_exp_neg_fraction,
    _geometric_exp_neg_one,
    sample_discrete_laplace,
)
from dpsql.mechanisms.random import resolve_rng

__all__ = [
    "MAX_SIGMA_SQUARED",
    "expected_abs",
    "interval_half_width",
    "quantised",
    "sample_discrete_gaussian",
    "tail_at_least",
    "tails_at_least",
    "zcdp_delta",
]

MAX_SIGMA_SQUARED = 2**30
"""Largest σ² sampled (σ ≤ 32768): keeps ``D = 2·p·q·t²`` within int64 for small ``q``."""

_INT64_BOUND = 2**62
_ROUND_UP = 1.0 + 1e-10


def quantised(sigma_squared: float) -> Fraction:
    """``σ²`` rounded up to a multiple of 1/16 (to an integer above 2**24): small denominators
    keep the exact sampler in int64. Rounding up only adds noise.

    >>> quantised(2.01), quantised(2**25 + 0.5)
    (Fraction(33, 16), Fraction(33554433, 1))
    """
    if sigma_squared > 2**24:
        return Fraction(math.ceil(sigma_squared))
    return Fraction(math.ceil(sigma_squared * 16), 16)


def _sigma_squared(value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | Fraction):
        raise ParameterError(f"sigma_squared must be an int or Fraction, got {value!r}")
    value = Fraction(value)
    if not 0 < value <= MAX_SIGMA_SQUARED:
        raise ParameterError(f"sigma_squared must be in (0, 2**30], got {value}")
    return value


def sample_discrete_gaussian(
    sigma_squared: Fraction | int,
    size: int,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """``size`` exact int64 samples of ``N_Z(0, sigma_squared)`` (CKS Algorithm 3; module doc).

    >>> rng = np.random.Generator(np.random.PCG64(3))
    >>> sample_discrete_gaussian(Fraction(9, 4), 4, rng).dtype
    dtype('int64')
    """
    sigma2 = _sigma_squared(sigma_squared)
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
        raise ParameterError(f"size must be a non-negative int, got {size!r}")
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1
    denominator = 2 * p * q * t * t
    if denominator > _INT64_BOUND:
        raise ParameterError(f"sigma_squared {sigma2} has too large a denominator to sample")
    rng = resolve_rng(rng)
    out = np.empty(int(size), dtype=np.int64)
    pending = np.arange(int(size))
    while pending.size:
        draws = sample_discrete_laplace(Fraction(t), pending.size, rng)
        accepted = _accept(np.abs(draws), p, q, t, denominator, rng)
        out[pending[accepted]] = draws[accepted]
        pending = pending[~accepted]
    return out


def _accept(
    magnitude: np.ndarray, p: int, q: int, t: int, denominator: int, rng: np.random.Generator
) -> np.ndarray:
    """Bernoulli(exp(-x²/D)) per element, ``x = |Y|·q·t - p`` (exact, integer-only)."""
    small = magnitude < (2**31 - p) // (q * t)
    whole = np.empty(magnitude.size, dtype=np.int64)
    rest = np.empty(magnitude.size, dtype=np.int64)
    x = magnitude[small] * (q * t) - p
    square = x * x
    whole[small], rest[small] = square // denominator, square % denominator
    for index in np.flatnonzero(~small):  # |x| >= 2**31: Python integers (rare)
        big = (int(magnitude[index]) * q * t - p) ** 2
        whole[index] = min(big // denominator, _INT64_BOUND)
        rest[index] = big % denominator
    successes = _geometric_exp_neg_one(magnitude.size, rng)
    accepted = successes >= whole
    candidates = np.flatnonzero(accepted)
    accepted[candidates] = _bernoulli_exp_neg_fraction(rest[candidates], denominator, rng)
    return accepted


@lru_cache(maxsize=4096)
def _log_mass_sum(start: int, sigma_squared: Fraction) -> float:
    """``log Σ_{z >= start} exp(-z²/(2σ²))`` for ``start >= 0``, rounded up (module doc)."""
    s2 = float(sigma_squared)
    width = math.ceil(12.0 * math.sqrt(s2)) + 64
    z = np.arange(start, start + width, dtype=np.float64)
    exponents = -(z * z) / (2.0 * s2)
    top = float(exponents[0])
    total = float(np.exp(exponents - top).sum())
    end = start + width
    # Beyond ``end``: exp(-z²/2σ²) <= exp(-end²/2σ²) · exp(-(z-end)·end/σ²), a geometric series.
    ratio = math.exp(-end / s2)
    total += math.exp(-(end * end) / (2.0 * s2) - top) / (1.0 - ratio) if ratio < 1 else math.inf
    return top + math.log(total) + math.log(_ROUND_UP)


@lru_cache(maxsize=4096)
def _log_normaliser(sigma_squared: Fraction) -> float:
    """``log Σ_z exp(-z²/(2σ²))``, rounded *down* (it divides)."""
    s2 = float(sigma_squared)
    width = math.ceil(12.0 * math.sqrt(s2)) + 64
    z = np.arange(1, width, dtype=np.float64)
    return math.log(1.0 + 2.0 * float(np.exp(-(z * z) / (2.0 * s2)).sum())) - math.log(_ROUND_UP)


def tail_at_least(n: int, sigma_squared: Fraction | int) -> float:
    """``P(Z >= n)`` for ``Z ~ N_Z(0, σ²)``, an upper bound within a relative 1e-9 (module doc).

    >>> round(tail_at_least(0, Fraction(1)), 6), round(tail_at_least(3, Fraction(1)), 6)
    (0.699471, 0.004567)
    """
    sigma2 = _sigma_squared(sigma_squared)
    if n <= 0:
        below = math.exp(_log_mass_sum(1 - n, sigma2) - _log_normaliser(sigma2))
        return min(1.0, 1.0 - below * (1.0 - 2e-10) + 1e-15)
    return min(1.0, math.exp(_log_mass_sum(n, sigma2) - _log_normaliser(sigma2)))


def tails_at_least(starts: np.ndarray, sigma_squared: Fraction | int) -> np.ndarray:
    """:func:`tail_at_least` for many ``n`` at once (one suffix sum when all are close).

    >>> tails_at_least(np.array([3, 1]), Fraction(1)).round(6).tolist()
    [0.004567, 0.300529]
    """
    sigma2 = _sigma_squared(sigma_squared)
    starts = np.asarray(starts, dtype=np.int64)
    if not starts.size:
        return np.zeros(0)
    low, high = int(starts.min()), int(starts.max())
    s2 = float(sigma2)
    if low < 1 or (high * high - low * low) / (2.0 * s2) > 600.0:
        return np.array([tail_at_least(int(n), sigma2) for n in starts])
    width = math.ceil(12.0 * math.sqrt(s2)) + 64
    z = np.arange(low, high + width, dtype=np.float64)
    exponents = -(z * z) / (2.0 * s2)
    top = float(exponents[0])
    suffix = np.cumsum(np.exp(exponents - top)[::-1])[::-1]
    end = high + width
    ratio = math.exp(-end / s2)
    rest = math.exp(-(end * end) / (2.0 * s2) - top) / (1.0 - ratio) if ratio < 1 else math.inf
    logs = top + np.log(suffix[starts - low] + rest) + math.log(_ROUND_UP)
    return np.minimum(1.0, np.exp(logs - _log_normaliser(sigma2)))


def interval_half_width(sigma_squared: Fraction | int, confidence: float = 0.95) -> int:
    """Smallest ``k`` with ``P(|Z| <= k) >= confidence`` (from the tails, rounded safely).

    >>> interval_half_width(Fraction(100))
    20
    """
    sigma2 = _sigma_squared(sigma_squared)
    if not 0.0 < confidence < 1.0:
        raise ParameterError(f"confidence must be in (0, 1), got {confidence!r}")
    k = max(0, math.floor(math.sqrt(float(sigma2)) * 1.9) - 1)
    while 2.0 * tail_at_least(k + 1, sigma2) > 1.0 - confidence:
        k += 1
    while k > 0 and 2.0 * tail_at_least(k, sigma2) <= 1.0 - confidence:
        k -= 1
    return k


@lru_cache(maxsize=256)
def expected_abs(sigma_squared: Fraction | int) -> float:
    """``E|Z|`` for ``Z ~ N_Z(0, σ²)`` (the mean absolute error a noisy count carries), summed
    over the window of the tails; about ``σ·√(2/π)`` for large σ.

    >>> round(expected_abs(Fraction(100)), 2)
    7.97
    """
    sigma2 = _sigma_squared(sigma_squared)
    s2 = float(sigma2)
    z = np.arange(1, math.ceil(12.0 * math.sqrt(s2)) + 64, dtype=np.float64)
    return 2.0 * float((z * np.exp(-(z * z) / (2.0 * s2))).sum()) / math.exp(
        _log_normaliser(sigma2)
    )


_ORDERS = 1.0 + np.exp(np.linspace(math.log(1e-4), math.log(1e5), 6001))


def zcdp_delta(rho: float, epsilon: float) -> float:
    """δ of a ρ-zCDP mechanism at ε (CKS Corollary 13), minimised over a fine grid of orders α.

    >>> round(zcdp_delta(0.5, 1.0), 4)
    0.2468
    """
    if not (rho > 0 and math.isfinite(rho)) or not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ParameterError(f"need rho > 0 and epsilon >= 0, got rho={rho!r}, epsilon={epsilon!r}")
    a = _ORDERS
    logs = (a - 1.0) * (a * rho - epsilon + np.log1p(-1.0 / a)) - np.log(a)
    return min(1.0, math.exp(float(logs.min())) * _ROUND_UP)
