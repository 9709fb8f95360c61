"""Weighted partition selection with Gaussian noise, then noisy counts of the selected keys.

Policy-free weighted Gaussian selection (Gopi, Gulhane, Kulkarni, Shen, Shokouhi, Yekhanin,
"Differentially Private Set Union", ICML 2020, Sec. 3, the Gaussian weighting with
``ρ_Gauss = max_t (1/√t + σ Φ⁻¹((1 − δ)^{1/t}))``), in integers so the noise is exact:

1. **Weights.** Each privacy unit keeps at most ``K = min(L0, R)`` of its keys (the engine's salted
   per-unit order, the same bounding as every GROUP BY) and gives each of its ``n <= K`` kept keys
   the integer weight ``w_n = ⌊√(W²/n)⌋`` (``W`` = :data:`WEIGHT_SCALE`), the largest integer with
   ``n·w_n² <= W²``. A key's weight is the sum over units: one SQL pass in the database.
2. **Selection.** Each key present gets ``N_Z(0, σ_s²)`` noise on its weight and is selected iff
   the noisy weight is at least ``τ`` (integer, in weight units).
3. **Counts.** Each selected key's bounded count gets independent ``N_Z(0, σ_c²)`` noise: a second
   release, about a set of keys that is the public output of step 2.

Sensitivity. A unit's weights depend on its own keys only, so adding or removing it changes the
weight vector by its own contribution, of L2 norm ``√(n·w_n²) <= W``: the weights of keys present
in both inputs are ``ρ_s = W²/(2σ_s²)``-zCDP (CKS Theorem 14). A key only the unit has gets weight
``w_n`` from it alone; it is released with probability at most ``δ_τ = max_{1<=n<=K} 1 − (1 −
P(w_n + Z >= τ))^n`` (exact discrete Gaussian tails, :func:`selection_delta`). The counts vector of
the selected keys moves by ``Δ₂ = √(L∞'·l1)`` in L2 (as in :mod:`dpsql.mechanisms.
gaussian_threshold`): ``ρ_c = Δ₂²/(2σ_c²)``-zCDP, composed adaptively with step 2 (zCDP composes
adaptively, Bun and Steinke 2016, Lemma 2.3). The shared-key parts are ``ρ_s + ρ_c``-zCDP, hence
``(ε, δ_noise)`` by CKS Corollary 13, and with the new keys' event the whole release is ``(ε,
δ_noise + δ_τ)``-DP (basic composition of the two independent parts, as for thresholding). Keys
absent from both inputs are never noised nor released. The proof is written out in
``docs/weighted_selection.md``.

:func:`plan` gives the selection a share (default :data:`DEFAULT_SELECTION_SHARE`) of the total ρ
and chooses ρ and τ from ε, δ and the bounds alone.
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
from dpsql.mechanisms.search import least_above
from dpsql.mechanisms.threshold import (
    _EXACT_LIMIT,
    Contribution,
    ThresholdRelease,
    _count_array,
    _unique,
)

__all__ = [
    "DEFAULT_SELECTION_SHARE",
    "WEIGHT_SCALE",
    "RhoSplit",
    "WeightedPlan",
    "plan",
    "release",
    "selection_delta",
    "smallest_tau",
    "unit_weights",
]

WEIGHT_SCALE = 128
"""``W``: a unit's weights have L2 norm at most W (integers; ``w_n = ⌊√(W²/n)⌋``)."""

DEFAULT_SELECTION_SHARE = 0.8
"""Share of the zCDP budget ρ spent on selecting keys; the counts get the rest."""

_ROUND_UP = 1.0 + 1e-10
_GRID = 12


def unit_weights(max_keys: int) -> tuple[int, ...]:
    """``w_n = ⌊√(W²/n)⌋`` for ``n = 1..max_keys``: the largest integers with ``n·w_n² <= W²``.

    >>> unit_weights(4)
    (128, 90, 73, 64)
    """
    return tuple(math.isqrt(WEIGHT_SCALE**2 // n) for n in range(1, max_keys + 1))


def selection_delta(tau: int, sigma_squared: Fraction, weights: tuple[int, ...]) -> float:
    """``max_n 1 − (1 − P(w_n + Z >= τ))^n``, rounded up: a new unit's keys' release probability.

    >>> selection_delta(3000, Fraction(250_000), unit_weights(10)) < 1e-6
    True
    """
    per_key = dg.tails_at_least(int(tau) - np.array(weights, dtype=np.int64), sigma_squared)
    if per_key.max() >= 1.0:
        return 1.0
    counts = np.arange(1, len(weights) + 1)
    worst = float(np.max(-np.expm1(counts * np.log1p(-per_key))))
    return min(1.0, worst * _ROUND_UP)


def smallest_tau(sigma_squared: Fraction, budget: float, weights: tuple[int, ...]) -> int:
    """The smallest integer τ with ``selection_delta(τ) <= budget`` (it decreases in τ)."""
    # at τ = w_1 a lone key passes half the time: never within a small budget
    return least_above(
        lambda tau: selection_delta(tau, sigma_squared, weights) <= budget,
        weights[0],
        max(1, math.isqrt(int(sigma_squared))),
    )


@dataclass(frozen=True)
class WeightedPlan:
    """Noise, threshold and δ parts of a weighted selection and its counts."""

    epsilon: float
    selection_share: float
    weights: tuple[int, ...]
    selection_sigma_squared: Fraction
    tau: int
    count_sigma_squared: Fraction
    count_l2_sensitivity: float
    noise_delta: float
    threshold_delta: float

    @property
    def delta(self) -> float:
        return self.noise_delta + self.threshold_delta

    @property
    def count_sigma(self) -> float:
        return math.sqrt(float(self.count_sigma_squared))

    @property
    def scale(self) -> Fraction:
        """σ of the counts' noise (shown as the noise scale)."""
        return Fraction(self.count_sigma).limit_denominator(2**20)

    @property
    def selection_rho(self) -> float:
        """zCDP ρ of the selection (weights of L2 norm at most W)."""
        return _rho(self.selection_sigma_squared, WEIGHT_SCALE**2)

    @property
    def selection_sigma(self) -> float:
        return math.sqrt(float(self.selection_sigma_squared))

    def release_probability(self, persons: int, keys_each: int = 1) -> float:
        """``P`` that a key of ``persons`` persons with ``keys_each`` kept keys each is
        selected."""
        weight = self.weights[min(keys_each, len(self.weights)) - 1]
        return dg.tail_at_least(self.tau - persons * weight, self.selection_sigma_squared)

    def persons_released_with_probability(self, probability: float, keys_each: int = 1) -> int:
        """The fewest persons with ``keys_each`` keys each whose key is released with at least
        ``probability``."""
        weight = self.weights[min(keys_each, len(self.weights)) - 1]
        persons = max(1, math.ceil(self.tau / weight) - 1)
        while self.release_probability(persons, keys_each) < probability:
            persons += 1
        while persons > 1 and self.release_probability(persons - 1, keys_each) >= probability:
            persons -= 1
        return persons

    def units_needed(self, keys_per_unit: int) -> float:
        """Units with ``keys_per_unit`` keys each that give a key weight τ (released half the
        time)."""
        return self.tau / self.weights[min(keys_per_unit, len(self.weights)) - 1]


@dataclass(frozen=True)
class RhoSplit:
    """The zCDP budget ρ split between weights (``share``, L2 norm at most W) and counts (L2
    sensitivity ``√count_l2_squared``), as noise variances and the δ they spend at ε."""

    epsilon: float
    share: float
    count_l2_squared: float

    def sigmas(self, rho: float) -> tuple[Fraction, Fraction]:
        """σ² of the weights and of the counts (rounded up) at ``rho``."""
        return (
            dg.quantised(WEIGHT_SCALE**2 / (2.0 * self.share * rho)),
            dg.quantised(self.count_l2_squared / (2.0 * (1.0 - self.share) * rho)),
        )

    def spent(self, rho: float) -> float:
        """``δ_noise`` of both noises at ε (1 when a σ² is beyond the sampler)."""
        selection, count = self.sigmas(rho)
        if max(selection, count) > dg.MAX_SIGMA_SQUARED:
            return 1.0
        total = _rho(selection, WEIGHT_SCALE**2) + _rho(count, self.count_l2_squared)
        return dg.zcdp_delta(total, self.epsilon)

    def largest_rho(self, noise: float) -> float | None:
        """The largest ρ (to a relative 1e-4) whose ``δ_noise`` is below ``noise``, by
        bisection from the smallest ρ whose σ²'s are sampled; None when even that spends it."""
        low = (
            1.01
            * max(WEIGHT_SCALE**2 / self.share, self.count_l2_squared / (1.0 - self.share))
            / (2.0 * dg.MAX_SIGMA_SQUARED)
        )
        high = 1e3
        if self.spent(low) >= noise:
            return None
        for _ in range(200):
            middle = math.sqrt(low * high)
            if self.spent(middle) < noise:
                low = middle
            else:
                high = middle
            if high / low < 1.0001:
                break
        return low


def _rho(sigma_squared: Fraction, sensitivity_squared: float) -> float:
    return sensitivity_squared / (2.0 * float(sigma_squared))


@lru_cache(maxsize=128)
def plan(
    epsilon: float,
    delta: float,
    bounds: Contribution,
    selection_share: float = DEFAULT_SELECTION_SHARE,
) -> WeightedPlan | None:
    """σ's and τ at (ε, δ) for ``bounds`` (module doc); None when no σ² <= 2**30 fits δ.

    >>> chosen = plan(1.0, 1e-6, Contribution(10, 1, 10))
    >>> chosen.delta <= 1e-6, round(chosen.tau / WEIGHT_SCALE, 1), round(chosen.count_sigma, 1)
    (True, 28.2, 33.4)
    """
    epsilon = float(positive_finite("epsilon", epsilon))
    delta = fraction_in_open_unit("delta", delta)
    share = fraction_in_open_unit("selection_share", selection_share)
    weights = unit_weights(bounds.new_keys)
    count_l2_squared = float(bounds.per_key * bounds.l1)

    split = RhoSplit(epsilon, share, count_l2_squared)
    low = split.largest_rho(delta)
    if low is None:
        return None
    sigmas, spent = split.sigmas, split.spent
    best: WeightedPlan | None = None
    for factor in np.geomspace(1.0, 0.4, _GRID):
        selection, count = sigmas(low * float(factor))
        used = spent(low * float(factor))
        if used >= delta:
            continue
        tau = smallest_tau(selection, delta - used, weights)
        if best is None or tau < best.tau:
            best = WeightedPlan(
                epsilon,
                share,
                weights,
                selection,
                tau,
                count,
                math.sqrt(count_l2_squared),
                used,
                selection_delta(tau, selection, weights),
            )
    return best


def release(
    keys: object,
    counts: object,
    weights: object,
    *,
    epsilon: float,
    delta: float,
    bounds: Contribution,
    selection_share: float = DEFAULT_SELECTION_SHARE,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
) -> ThresholdRelease:
    """Keys whose noisy weight reaches τ (random order), with separately noised counts.

    ``weights`` are the keys' summed unit weights (``unit_weights``), ``counts`` their bounded
    counts; ``ThresholdRelease.tau`` is τ in weight units and ``scale`` the counts' σ.

    >>> rng = np.random.Generator(np.random.PCG64(5))
    >>> out = release(["a", "b"], [900, 1], [900 * 128, 128], epsilon=1.0, delta=1e-6,
    ...               bounds=Contribution(1, 1), rng=rng)
    >>> out.keys.tolist(), out.mechanism
    (['a'], 'weighted')
    """
    chosen = plan(epsilon, delta, bounds, selection_share)
    if chosen is None:
        raise ParameterError(f"no weighted selection meets delta={delta} at epsilon={epsilon}")
    kind, key_array, count_array, weight_array = inputs(keys, counts, weights)
    rng = resolve_rng(rng)
    chosen_keys = selected(weight_array, chosen.selection_sigma_squared, chosen.tau, rng)
    return counted(
        key_array[chosen_keys],
        count_array[chosen_keys],
        chosen,
        kind=kind,
        epsilon=epsilon,
        bounds=bounds,
        confidence=confidence,
        mechanism="weighted",
        rng=rng,
    )


def inputs(
    keys: object, counts: object, weights: object
) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """The keys' kind and array, and their counts and summed weights as integer arrays of the
    same length; refused unless the keys are distinct."""
    kind, key_array = as_key_array(keys)
    count_array = _count_array(counts, key_array.size)
    weight_array = _count_array(weights, key_array.size)
    if not _unique(key_array):
        raise ParameterError("keys must be distinct (aggregate counts per key first)")
    return kind, key_array, count_array, weight_array


def selected(
    weights: np.ndarray, sigma_squared: Fraction, tau: int, rng: np.random.Generator
) -> np.ndarray:
    """Indices of the keys with weight > 0 whose weight plus discrete Gaussian noise of
    variance ``sigma_squared`` reaches ``tau``."""
    present = np.flatnonzero(weights > 0)
    noisy = weights[present] + dg.sample_discrete_gaussian(sigma_squared, present.size, rng)
    return present[noisy >= tau]


def counted(
    keys: np.ndarray,
    counts: np.ndarray,
    chosen: WeightedPlan,
    *,
    kind: str,
    epsilon: float,
    bounds: Contribution,
    confidence: float,
    mechanism: str,
    rng: np.random.Generator,
    noisy: bool = False,
) -> ThresholdRelease:
    """The selected ``keys`` in random order, with their bounded ``counts`` released separately
    under discrete Gaussian noise of variance ``chosen.count_sigma_squared``; with ``noisy``,
    ``counts`` are noisy already and ``keys`` in random order (joint selection's)."""
    if not noisy:
        order = rng.permutation(keys.size)
        noise = dg.sample_discrete_gaussian(chosen.count_sigma_squared, keys.size, rng)
        keys, counts = keys[order], counts[order] + noise
    return ThresholdRelease(
        keys=keys,
        values=np.clip(counts, -_EXACT_LIMIT, _EXACT_LIMIT),
        tau=chosen.tau,
        scale=chosen.scale,
        epsilon=float(epsilon),
        delta=chosen.delta,
        max_groups_per_unit=bounds.max_groups_per_unit,
        max_rows_per_group=bounds.max_rows_per_group,
        max_rows_per_unit=bounds.max_rows_per_unit,
        key_kind=kind,
        half_width=dg.interval_half_width(chosen.count_sigma_squared, confidence),
        confidence=confidence,
        mechanism=mechanism,
    )
