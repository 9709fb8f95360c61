"""Joint selection: keys chosen on noisy weights and noisy counts together, released with those
noisy counts (``mechanism='joint'``).

Weighted selection (:mod:`dpsql.mechanisms.weighted_selection`) spends most of its budget on
weights that are not counts, so its released counts need a second, noisier release; Gaussian
thresholding (:mod:`dpsql.mechanisms.gaussian_threshold`) spends all of it on the counts, which
then also decide the keys, but a person with one key weighs no more than a person with ten.
Joint selection noises both and decides each key on a linear combination of the two, so the
budget bought for the counts also buys keys:

1. **Weights and counts.** Each person keeps at most ``K = min(L0, R)`` of their keys (the
   engine's salted per-person order, as for every GROUP BY) and gives each of their ``n <= K``
   kept keys the weight ``w_n = ⌊√(W²/n)⌋`` (:func:`dpsql.mechanisms.weighted_selection.
   unit_weights`). Every key present gets ``X_w = weight + N_Z(0, σ_w²)`` and
   ``X_c = bounded count + N_Z(0, σ_c²)`` (independent, exact discrete Gaussian noise).
2. **Selection.** A key is released iff ``T = X_w + λ·X_c >= τ`` (``λ`` a positive integer).
3. **Counts.** The released keys' ``X_c`` are their released counts: no second release.

Privacy. Let D' be D plus one person u. Every other person's kept keys, weights and counts
depend on their own rows only, so on the keys present in D the weight vector moves by u's own
vector, of L2 norm ``√(n·w_n²) <= W``, and the count vector by ``Δ₂ = √(L∞'·l1)`` in L2 (as for
Gaussian thresholding): the two noisy vectors are ``ρ = W²/(2σ_w²) + Δ₂²/(2σ_c²)``-zCDP together
(CKS 2020 Theorem 14 for each, composed by Bun and Steinke 2016, Lemma 2.3), hence
``(ε, δ_noise)``-DP by CKS Corollary 13, and the selection and the released ``X_c`` are
post-processing of them. A key present only in D' holds u's weight ``w_n`` and at most ``L∞'``
of u's rows, so it is released with probability at most ``P(w_n + λ·L∞' + Z_w + λ·Z_c >= τ)``;
over u's at most ``n`` such keys (independent noise) the probability that one is released is at
most ``δ_τ = max_{1<=n<=K} 1 − (1 − P(w_n + λ·L∞' + Z_w + λ·Z_c >= τ))^n``. Keys absent from both
inputs are never noised nor released. As for thresholding (Korolova et al. 2009; Gopi et al.,
*Differentially Private Set Union*, ICML 2020, for the weighted Gaussian) the release is
``(ε, δ_noise + δ_τ)``-DP. The tail of ``Z_w + λ·Z_c`` is a sum over ``Z_c``'s window of its exact
mass times ``Z_w``'s exact tail, plus ``Z_c``'s mass outside the window: an upper bound
(:func:`sum_tails`).

:func:`plan` gives the weights a share of ρ (``selection_share``; the counts get the rest, so
the share sets the counts' error), takes the largest ρ whose ``δ_noise`` leaves room for a
threshold, and chooses ``λ`` and ``τ`` so that the fewest persons with ``m = ⌈K/2⌉`` keys each
(each adding ``r = ⌈L∞'/2⌉`` rows) reach ``τ`` (the reference of
:mod:`dpsql.engine.key_mechanisms`). With a share near 0 it is Gaussian thresholding; near 1,
weighted selection with its counts used twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms import discrete_gaussian as dg
from dpsql.mechanisms import weighted_selection as ws
from dpsql.mechanisms.hashing import fraction_in_open_unit, positive_finite
from dpsql.mechanisms.random import resolve_rng
from dpsql.mechanisms.search import least_above, least_between
from dpsql.mechanisms.threshold import Contribution, ThresholdRelease

__all__ = ["DEFAULT_SELECTION_SHARE", "JointPlan", "plan", "release", "sum_tails"]

DEFAULT_SELECTION_SHARE = 0.5
"""The weights' share of ρ when a query names ``mechanism='joint'`` without one."""

_NOISE_PARTS = (0.75, 0.6, 0.45)
"""Shares of δ tried for the noise (ρ the largest within it); the threshold gets the rest."""
_ROUND_UP = 1.0 + 1e-10
_MULTIPLIERS = (0.8, 1.0, 1.25, 1.8)
"""λ tried around its estimate ``λ̂ = r·σ_w² / (w_m·σ_c²)`` (the weight that maximises a reference
person's signal against the noise of ``T``): ``λ̂ · m`` for each ``m`` here."""


@lru_cache(maxsize=64)
def _suffix(sigma_squared: Fraction) -> tuple[int, np.ndarray]:
    """``Z``'s tails around its window: (``low``, ``tails``) with ``tails[0] = 1`` (every integer
    below the window), ``tails[j] >= P(Z >= low + j - 1)`` across the window, and last an upper
    bound of ``P(Z >` the window``)``: upper bounds throughout."""
    s2 = float(sigma_squared)
    width = math.ceil(12.0 * math.sqrt(s2)) + 64
    z = np.arange(-width, width + 1, dtype=np.float64)
    mass = np.exp(-(z * z) / (2.0 * s2))
    # Beyond the window: exp(-z²/2σ²) <= exp(-w²/2σ²)·exp(-(z-w)·w/σ²), a geometric series.
    ratio = math.exp(-width / s2)
    rest = math.exp(-(width * width) / (2.0 * s2)) * ratio / (1.0 - ratio) if ratio < 1 else 1.0
    normaliser = math.exp(dg._log_normaliser(sigma_squared))  # rounded down: bounds go up
    inside = (np.cumsum(mass[::-1])[::-1] + rest) / normaliser * _ROUND_UP
    beyond = rest / normaliser * _ROUND_UP
    return -width, np.minimum(np.concatenate([[1.0], inside, [beyond]]), 1.0)


def _tails(starts: np.ndarray, sigma_squared: Fraction) -> np.ndarray:
    """Upper bounds of ``P(Z >= n)`` for ``Z ~ N_Z(0, σ²)`` and every ``n`` in ``starts``."""
    low, tails = _suffix(sigma_squared)
    return tails[np.clip(starts - (low - 1), 0, tails.size - 1)]


def sum_tails(
    starts: np.ndarray, weight_sigma_squared: Fraction, count_sigma_squared: Fraction, lam: int
) -> np.ndarray:
    """Upper bounds of ``P(Z_w + λ·Z_c >= t)`` for each ``t`` in ``starts`` (independent
    ``Z_w ~ N_Z(0, σ_w²)``, ``Z_c ~ N_Z(0, σ_c²)``): the sum over ``Z_c``'s window of its mass
    (normaliser rounded down) times ``Z_w``'s tail, plus ``Z_c``'s mass outside the window.

    >>> from fractions import Fraction
    >>> float(sum_tails(np.array([0]), Fraction(4), Fraction(1), 3)[0]) > 0.5
    True
    """
    z, mass, outside = _window(count_sigma_squared)
    starts = np.asarray(starts, dtype=np.int64)
    shifted = starts[:, None] - int(lam) * z[None, :]
    total = _tails(shifted.ravel(), weight_sigma_squared).reshape(shifted.shape) @ mass
    return np.minimum(1.0, (total + outside) * _ROUND_UP)


@lru_cache(maxsize=64)
def _window(sigma_squared: Fraction) -> tuple[np.ndarray, np.ndarray, float]:
    """``Z``'s window of 8σ + 8 each side, its mass there (normaliser rounded down: upper
    bounds) and an upper bound of its mass outside (below 1e-14, added whole)."""
    width = math.ceil(8.0 * math.sqrt(float(sigma_squared))) + 8
    z = np.arange(-width, width + 1, dtype=np.int64)
    normaliser = math.exp(dg._log_normaliser(sigma_squared))
    squares = z.astype(np.float64) ** 2
    mass = np.exp(-squares / (2.0 * float(sigma_squared))) / normaliser * _ROUND_UP
    outside = 2.0 * float(_tails(np.array([width + 1]), sigma_squared)[0])
    return z, mass, outside


@dataclass(frozen=True)
class JointPlan(ws.WeightedPlan):
    """Weighted selection's fields (``selection_sigma_squared`` is σ_w², ``tau`` is τ in units
    of ``T = X_w + λ·X_c``, ``count_sigma_squared`` σ_c²) and the counts' multiplier λ."""

    multiplier: int = 1
    per_key: int = 1
    """``L∞'``: the rows one person adds to one key at most."""

    def release_probability(self, persons: int, keys_each: int, rows_each: int) -> float:
        """``P`` that a key of ``persons`` persons, each with ``keys_each`` kept keys and adding
        ``rows_each`` rows to it, is released."""
        weight = self.weights[min(keys_each, len(self.weights)) - 1]
        statistic = persons * (weight + self.multiplier * rows_each)
        return float(
            sum_tails(
                np.array([self.tau - statistic]),
                self.selection_sigma_squared,
                self.count_sigma_squared,
                self.multiplier,
            )[0]
        )

    def persons_released_with_probability(
        self, probability: float, keys_each: int = 1, rows_each: int = 1
    ) -> int:
        """The fewest persons (``keys_each`` keys each, ``rows_each`` rows to the key) whose
        key is released with at least ``probability``."""
        per_person = self.weights[min(keys_each, len(self.weights)) - 1]
        per_person += self.multiplier * rows_each
        persons = max(1, math.ceil(self.tau / per_person) - 1)
        while self.release_probability(persons, keys_each, rows_each) < probability:
            persons += 1
        while persons > 1 and self.release_probability(persons - 1, keys_each, rows_each) >= (
            probability
        ):
            persons -= 1
        return persons

    def units_needed(self, keys_per_unit: int, rows_per_unit: int = 1) -> float:
        """Persons with ``keys_per_unit`` keys each (adding ``rows_per_unit`` rows) whose key's
        statistic is τ on average (released half the time)."""
        weight = self.weights[min(keys_per_unit, len(self.weights)) - 1]
        return self.tau / (weight + self.multiplier * rows_per_unit)


def threshold_delta(
    tau: int, weight_sigma_squared: Fraction, count_sigma_squared: Fraction, lam: int,
    weights: tuple[int, ...], per_key: int,
) -> float:  # fmt: skip
    """``δ_τ = max_n 1 − (1 − P(w_n + λ·L∞' + Z_w + λ·Z_c >= τ))^n``, rounded up (module doc)."""
    shifted = int(tau) - np.array(weights, dtype=np.int64) - int(lam) * int(per_key)
    per_key_release = sum_tails(shifted, weight_sigma_squared, count_sigma_squared, lam)
    if per_key_release.max() >= 1.0:
        return 1.0
    counts = np.arange(1, len(weights) + 1)
    worst = float(np.max(-np.expm1(counts * np.log1p(-per_key_release))))
    return min(1.0, worst * _ROUND_UP)


def _smallest_tau(
    weight_sigma_squared: Fraction, count_sigma_squared: Fraction, lam: int, budget: float,
    weights: tuple[int, ...], per_key: int,
) -> int:  # fmt: skip
    """The smallest integer τ with ``threshold_delta(τ) <= budget`` (it decreases in τ): from
    the normal estimate, steps of σ/8 that double until they bracket it, then bisection."""
    sigma = math.sqrt(float(weight_sigma_squared) + lam * lam * float(count_sigma_squared))
    lone = weights[0] + lam * per_key  # a lone new key passes half the time here
    per_release = max(budget / len(weights), 1e-300)
    guess = lone + max(1, math.floor(sigma * math.sqrt(2.0 * math.log(1.0 / per_release))))

    def fits(tau: int) -> bool:
        found = threshold_delta(
            tau, weight_sigma_squared, count_sigma_squared, lam, weights, per_key
        )
        return found <= budget

    step = max(1, int(sigma // 8))
    if not fits(guess):
        return least_above(fits, guess, step)
    low = guess - step
    while low > lone and fits(low):
        step *= 2
        guess, low = low, low - step
    return least_between(fits, max(low, lone - 1), guess)


@lru_cache(maxsize=128)
def plan(
    epsilon: float, delta: float, bounds: Contribution, selection_share: float = 0.5
) -> JointPlan | None:
    """σ_w², σ_c², λ and τ at (ε, δ) for ``bounds`` (module doc) with the weights' share
    ``selection_share`` of ρ (:data:`DEFAULT_SELECTION_SHARE`); None when no σ² <= 2**30 fits.

    >>> chosen = plan(1.0, 1e-6, Contribution(10, 1, 10), 0.2)
    >>> chosen.delta <= 1e-6, round(chosen.count_sigma, 1)
    (True, 16.4)
    """
    epsilon = float(positive_finite("epsilon", epsilon))
    delta = fraction_in_open_unit("delta", delta)
    share = fraction_in_open_unit("selection_share", selection_share)
    weights = ws.unit_weights(bounds.new_keys)
    count_l2_squared = float(bounds.per_key * bounds.l1)
    keys_each = max(1, math.ceil(bounds.new_keys / 2))
    rows_each = max(1, math.ceil(bounds.per_key / 2))

    split = ws.RhoSplit(epsilon, share, count_l2_squared)
    best: JointPlan | None = None
    for part in _NOISE_PARTS:  # the share of δ left to the noise; the threshold gets the rest
        rho = split.largest_rho(part * delta)
        if rho is None:
            continue
        selection, count = split.sigmas(rho)
        used = split.spent(rho)
        # λ maximising the signal of a reference person against the noise of T, then nearby.
        estimate = rows_each * float(selection) / (weights[keys_each - 1] * float(count))
        for lam in sorted({max(1, round(estimate * m)) for m in _MULTIPLIERS}):
            tau = _smallest_tau(selection, count, lam, delta - used, weights, bounds.per_key)
            candidate = JointPlan(
                epsilon=epsilon, selection_share=share, weights=weights,
                selection_sigma_squared=selection, tau=tau, count_sigma_squared=count,
                count_l2_sensitivity=math.sqrt(count_l2_squared), noise_delta=used,
                threshold_delta=threshold_delta(
                    tau, selection, count, lam, weights, bounds.per_key
                ),
                multiplier=lam, per_key=bounds.per_key,
            )  # fmt: skip
            needed = candidate.units_needed(keys_each, rows_each)
            if best is None or needed < best.units_needed(keys_each, rows_each):
                best = candidate
    return best


def release(
    keys: object, counts: object, weights: object, *, epsilon: float, delta: float,
    bounds: Contribution, selection_share: float = DEFAULT_SELECTION_SHARE,
    confidence: float = 0.95, rng: np.random.Generator | None = None,
) -> ThresholdRelease:  # fmt: skip
    """Keys whose ``X_w + λ·X_c`` reaches τ (random order), with their noisy counts ``X_c``.

    ``weights`` are the keys' summed unit weights, ``counts`` their bounded counts;
    ``ThresholdRelease.tau`` is τ in units of ``T`` and ``scale`` the counts' σ.

    >>> out = release([7, 8, 9], [500, 2, 1], [500 * 90, 180, 90], epsilon=1.0, delta=1e-6,
    ...               bounds=Contribution(2, 1), selection_share=0.3,
    ...               rng=np.random.Generator(np.random.PCG64(2)))
    >>> out.keys.tolist(), out.mechanism
    ([7], 'joint')
    """
    kind, key_array, count_array, weight_array = ws.inputs(keys, counts, weights)
    chosen = plan(epsilon, delta, bounds, selection_share)
    if chosen is None:
        raise ParameterError(f"no joint selection meets delta={delta} at epsilon={epsilon}")
    rng = resolve_rng(rng)
    present = np.flatnonzero(weight_array > 0)
    noisy_weights = weight_array[present] + dg.sample_discrete_gaussian(
        chosen.selection_sigma_squared, present.size, rng
    )
    noisy_counts = count_array[present] + dg.sample_discrete_gaussian(
        chosen.count_sigma_squared, present.size, rng
    )
    kept = np.flatnonzero(noisy_weights + chosen.multiplier * noisy_counts >= chosen.tau)
    kept = kept[rng.permutation(kept.size)]
    return ws.counted(
        key_array[present[kept]], noisy_counts[kept], chosen, kind=kind, epsilon=epsilon,
        bounds=bounds, confidence=confidence, mechanism="joint", rng=rng, noisy=True,
    )  # fmt: skip
