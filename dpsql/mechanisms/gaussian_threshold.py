"""Gaussian thresholding: discrete Gaussian noise on the keys present, released at ``>= τ``.

Keys present in the data get independent ``N_Z(0, σ²)`` noise (exact sampling,
:mod:`dpsql.mechanisms.discrete_gaussian`); a key is released iff its noisy count is at least
``τ`` (the mass at ``τ`` counts as released everywhere). Neighbours differ by one privacy unit
(:class:`dpsql.mechanisms.threshold.Contribution`): it changes the counts of keys present in both
inputs by at most ``L∞' = min(L∞, R)`` each and ``l1 = min(L0·L∞, R)`` in all, so by at most
``Δ₂ = sqrt(L∞'·l1)`` in L2 (``Σc² <= max c · Σc``; ``√L0·L∞`` without R), and it adds at most
``L0' = min(L0, R)`` keys of its own, each with count at most ``L∞'``.

Guarantee: the noisy counts of shared keys are ``ρ = Δ₂²/(2σ²)``-zCDP (CKS Theorem 14), hence
``(ε, δ_noise)``-DP with ``δ_noise = zcdp_delta(ρ, ε)`` (CKS Corollary 13); thresholding them is
post-processing. The new keys are absent from one input and released from the other only if one
passes τ, with probability at most ``δ_τ = 1 − (1 − P(L∞' + Z >= τ))^{L0'}`` (independent noise),
an exact computation from the discrete Gaussian's tail, never an approximation by the continuous
one. Composing the two independent parts (Dwork and Roth, Theorem 3.16) the release is ``(ε,
δ_noise + δ_τ)``-DP: the argument of Korolova et al. (2009) and Alg. 9 of the full version of
Aumüller, Lebeda, Pagh (CCS'21), with L2 in place of L1 sensitivity for the shared keys.

:func:`plan` chooses ``σ²`` and ``τ`` from ε, δ and the bounds alone (no data): over a grid of
``σ²`` from the smallest with ``δ_noise < δ`` up to 4 times it, ``τ`` is the smallest integer with
``δ_τ <= δ − δ_noise``, and the pair with the smallest ``τ`` (the smallest count released half the
time; ties: the smaller σ²) is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms import discrete_gaussian as dg
from dpsql.mechanisms.hashing import as_key_array, fraction_in_open_unit, positive_finite
from dpsql.mechanisms.random import resolve_rng
from dpsql.mechanisms.search import least_above, least_between
from dpsql.mechanisms.threshold import (
    _EXACT_LIMIT,
    Contribution,
    ThresholdRelease,
    _count_array,
    _unique,
)

__all__ = [
    "GaussianThreshold",
    "l2_sensitivity_squared",
    "noise_delta",
    "plan",
    "release",
    "threshold_delta",
]

_ROUND_UP = 1.0 + 1e-10
_GRID = 64


def l2_sensitivity_squared(bounds: Contribution) -> int:
    """``Δ₂² = L∞'·l1`` (``L0·L∞²`` without ``max_rows_per_unit``).

    >>> l2_sensitivity_squared(Contribution(10, 1))
    10
    """
    return bounds.per_key * bounds.l1


def noise_delta(sigma_squared: Fraction, epsilon: float, bounds: Contribution) -> float:
    """δ of the shared keys' noisy counts at ε: ``zcdp_delta(Δ₂²/(2σ²), ε)``."""
    rho = l2_sensitivity_squared(bounds) / (2.0 * float(sigma_squared))
    return dg.zcdp_delta(rho, epsilon)


def threshold_delta(tau: int, sigma_squared: Fraction, bounds: Contribution) -> float:
    """``1 − (1 − P(L∞' + Z >= τ))^{L0'}``, rounded up: a new key's release probability.

    >>> threshold_delta(40, Fraction(100), Contribution(1, 1)) < 1e-4
    True
    """
    per_key = dg.tail_at_least(int(tau) - bounds.per_key, sigma_squared)
    if per_key >= 1.0:
        return 1.0
    return min(1.0, -math.expm1(bounds.new_keys * math.log1p(-per_key)) * _ROUND_UP)


def _tau_for(sigma_squared: Fraction, budget: float, bounds: Contribution) -> int:
    """The smallest integer τ with ``threshold_delta(τ) <= budget`` (it decreases in τ).

    From the Gaussian-tail estimate, steps double until they bracket the answer, then bisection:
    a few dozen exact tails instead of one per integer (``σ/8`` steps up, then one at a time down).
    """
    sigma = math.sqrt(float(sigma_squared))
    per_key = max(budget / bounds.new_keys, 1e-300)
    guess = bounds.per_key + max(1, math.floor(sigma * math.sqrt(2.0 * math.log(1.0 / per_key))))

    def fits(tau: int) -> bool:
        return threshold_delta(tau, sigma_squared, bounds) <= budget

    step = max(1, int(sigma // 8))
    if not fits(guess):
        return least_above(fits, guess, step)
    high, low = guess, guess - step
    while fits(low):
        high, step = low, step * 2
        low = high - step
    return least_between(fits, low, high)


@dataclass(frozen=True)
class GaussianThreshold:
    """The chosen noise and threshold, and the two parts of δ they spend."""

    epsilon: float
    sigma_squared: Fraction
    tau: int
    noise_delta: float
    threshold_delta: float
    l2_sensitivity: float

    @property
    def delta(self) -> float:
        return self.noise_delta + self.threshold_delta

    @property
    def sigma(self) -> float:
        return math.sqrt(float(self.sigma_squared))

    @property
    def scale(self) -> Fraction:
        """σ as a Fraction (shown as the noise scale; sampling uses the exact ``sigma_squared``)."""
        return Fraction(self.sigma).limit_denominator(2**20)

    def release_probability(self, count: int) -> float:
        """``P(count + Z >= τ)``."""
        return dg.tail_at_least(self.tau - int(count), self.sigma_squared)

    def count_released_with_probability(self, probability: float) -> int:
        """The smallest count released with probability at least ``probability``."""
        count = self.tau
        while self.release_probability(count) < probability:
            count += 1
        while self.release_probability(count - 1) >= probability:
            count -= 1
        return count


@lru_cache(maxsize=256)
def plan(epsilon: float, delta: float, bounds: Contribution) -> GaussianThreshold | None:
    """σ² and τ for (ε, δ) and ``bounds`` (module doc); None when no σ² <= 2**30 fits δ.

    >>> chosen = plan(1.0, 1e-6, Contribution(10, 1, 10))
    >>> chosen.tau, round(chosen.sigma, 1), chosen.delta <= 1e-6
    (81, 14.5, True)
    """
    epsilon = float(positive_finite("epsilon", epsilon))
    delta = fraction_in_open_unit("delta", delta)
    low, high = 1e-4, float(dg.MAX_SIGMA_SQUARED)
    if noise_delta(dg.quantised(high), epsilon, bounds) >= delta:
        return None
    for _ in range(200):  # bisection on log σ² for the smallest with δ_noise < δ
        middle = math.sqrt(low * high)
        if noise_delta(dg.quantised(middle), epsilon, bounds) < delta:
            high = middle
        else:
            low = middle
        if high / low < 1.0001:
            break
    best: GaussianThreshold | None = None
    for factor in np.geomspace(1.0, 4.0, _GRID):
        sigma_squared = dg.quantised(min(high * float(factor), dg.MAX_SIGMA_SQUARED))
        spent = noise_delta(sigma_squared, epsilon, bounds)
        if spent >= delta:
            continue
        tau = _tau_for(sigma_squared, delta - spent, bounds)
        if best is None or tau < best.tau:
            best = GaussianThreshold(
                epsilon,
                sigma_squared,
                tau,
                spent,
                threshold_delta(tau, sigma_squared, bounds),
                math.sqrt(l2_sensitivity_squared(bounds)),
            )
    return best


def release(
    keys: object,
    counts: object,
    *,
    epsilon: float,
    delta: float,
    bounds: Contribution,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
) -> ThresholdRelease:
    """The keys present whose count plus ``N_Z(0, σ²)`` reaches τ, in random order, with those
    noisy counts; ``(ε, δ)``-DP (module doc). ``ThresholdRelease.scale`` holds σ.

    >>> rng = np.random.Generator(np.random.PCG64(5))
    >>> out = release(["a", "b"], [1000, 1], epsilon=1.0, delta=1e-6,
    ...               bounds=Contribution(1, 1), rng=rng)
    >>> out.keys.tolist(), out.mechanism
    (['a'], 'threshold_gaussian')
    """
    chosen = plan(epsilon, delta, bounds)
    if chosen is None:
        raise ParameterError(
            f"no discrete Gaussian with sigma <= 32768 meets delta={delta} at epsilon={epsilon}"
        )
    kind, key_array = as_key_array(keys)
    count_array = _count_array(counts, key_array.size)
    if not _unique(key_array):
        raise ParameterError("keys must be distinct (aggregate counts per key first)")
    rng = resolve_rng(rng)
    present = np.flatnonzero(count_array > 0)
    noise = dg.sample_discrete_gaussian(chosen.sigma_squared, present.size, rng)
    noisy = np.clip(count_array[present] + noise, -_EXACT_LIMIT, _EXACT_LIMIT)
    kept = np.flatnonzero(noisy >= chosen.tau)
    kept = kept[rng.permutation(kept.size)]
    return ThresholdRelease(
        keys=key_array[present[kept]],
        values=noisy[kept],
        tau=chosen.tau,
        scale=chosen.scale,
        epsilon=float(epsilon),
        delta=chosen.delta,
        max_groups_per_unit=bounds.max_groups_per_unit,
        max_rows_per_group=bounds.max_rows_per_group,
        max_rows_per_unit=bounds.max_rows_per_unit,
        key_kind=kind,
        half_width=dg.interval_half_width(chosen.sigma_squared, confidence),
        confidence=confidence,
        mechanism="threshold_gaussian",
    )
