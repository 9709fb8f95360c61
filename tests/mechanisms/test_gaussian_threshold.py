"""Tests for dpsql.mechanisms.gaussian_threshold: exact δ, the plan, privacy with broken twins.

As in ``test_threshold.py``, each key's output depends only on its own count and independent
noise, so one release over many keys with the same count gives many samples of one key's output.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpsql.mechanisms import discrete_gaussian as dg
from dpsql.mechanisms import gaussian_threshold as gt
from dpsql.mechanisms.threshold import Contribution, ThresholdRelease
from tests.mechanisms.test_discrete_gaussian import _brute_tail
from tests.mechanisms.test_threshold import Z, _loss_lower_bound, _outcomes


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


@pytest.mark.parametrize(
    ("tau", "sigma_squared", "bounds"),
    [
        (30, Fraction(49), Contribution(10, 1)),
        (12, Fraction(9, 4), Contribution(3, 2)),
        (80, Fraction(3364, 16), Contribution(10, 1, 10)),
        (20, Fraction(25), Contribution(8, 8, 4)),
    ],
)
def test_threshold_delta_matches_the_brute_force_sum(tau, sigma_squared, bounds) -> None:
    """δ_τ = 1 − (1 − P(L∞' + Z >= τ))^{L0'} against a 40-digit term-by-term PMF sum."""
    per_key = _brute_tail(tau - bounds.per_key, sigma_squared)
    exact = 1 - (1 - per_key) ** bounds.new_keys
    computed = gt.threshold_delta(tau, sigma_squared, bounds)
    assert exact <= computed <= exact * (1 + mpmath.mpf("1e-8"))


@pytest.mark.parametrize(
    ("epsilon", "delta", "bounds"),
    [
        (1.0, 1e-6, Contribution(10, 1, 10)),
        (0.5, 1e-6, Contribution(1, 1)),
        (2.0, 1e-9, Contribution(50, 1, 50)),
        (1.0, 1e-5, Contribution(8, 8, 4)),
        (0.1, 1e-6, Contribution(5, 10, 50)),  # large σ: τ far from the first estimate
    ],
)
def test_plan_meets_delta_with_the_smallest_tau_for_its_sigma(epsilon, delta, bounds) -> None:
    chosen = gt.plan(epsilon, delta, bounds)
    assert chosen is not None
    assert chosen.l2_sensitivity == pytest.approx(math.sqrt(bounds.per_key * bounds.l1))
    assert chosen.noise_delta == gt.noise_delta(chosen.sigma_squared, epsilon, bounds)
    assert chosen.threshold_delta == gt.threshold_delta(chosen.tau, chosen.sigma_squared, bounds)
    assert chosen.delta <= delta
    budget = delta - chosen.noise_delta
    assert gt.threshold_delta(chosen.tau - 1, chosen.sigma_squared, bounds) > budget


@pytest.mark.parametrize("sigma_squared", [Fraction(9, 4), Fraction(400), Fraction(90_000)])
@pytest.mark.parametrize("budget", [1e-3, 1e-7, 1e-12])
def test_tau_search_finds_the_smallest_tau_a_linear_scan_finds(sigma_squared, budget) -> None:
    bounds = Contribution(5, 10, 50)
    tau = gt._tau_for(sigma_squared, budget, bounds)
    sigma = math.sqrt(float(sigma_squared))
    # Every τ from well below the answer up to it: only the answer and above fit.
    scan = range(max(bounds.per_key, tau - int(3 * sigma) - 3), tau + 1)
    fitting = [t for t in scan if gt.threshold_delta(t, sigma_squared, bounds) <= budget]
    assert fitting == [tau]


def test_benchmark_setting_threshold_is_about_half_of_laplace() -> None:
    """L0 = 10, L∞ = 1, ε = 1, δ = 1e-6: L2 sensitivity √10 instead of L1 10."""
    chosen = gt.plan(1.0, 1e-6, Contribution(10, 1, 10))
    assert chosen is not None and chosen.tau <= 85 and 13 < chosen.sigma < 16


def _broken_off_by_one(keys, counts, *, epsilon, delta, bounds, rng):
    """Twin: releases at ``noisy >= τ − 1``."""
    chosen = gt.plan(epsilon, delta, bounds)
    return _threshold(keys, counts, chosen.sigma_squared, chosen.tau - 1, rng)


def _broken_no_threshold(keys, counts, *, epsilon, delta, bounds, rng):
    """Twin: every present key is released with its noisy count."""
    chosen = gt.plan(epsilon, delta, bounds)
    return _threshold(keys, counts, chosen.sigma_squared, -(2**62), rng)


def _broken_sigma(keys, counts, *, epsilon, delta, bounds, rng):
    """Twin: σ and τ planned for L∞ = 1 although a unit may add ``max_rows_per_group`` rows."""
    chosen = gt.plan(epsilon, delta, replace(bounds, max_rows_per_group=1))
    return _threshold(keys, counts, chosen.sigma_squared, chosen.tau, rng)


def _threshold(keys, counts, sigma_squared, tau, rng) -> ThresholdRelease:
    noisy = counts + dg.sample_discrete_gaussian(sigma_squared, counts.size, rng)
    kept = noisy >= tau
    return ThresholdRelease(
        keys=keys[kept],
        values=noisy[kept],
        tau=tau,
        scale=Fraction(1),
        epsilon=1.0,
        delta=0.0,
        max_groups_per_unit=1,
        max_rows_per_group=1,
        key_kind="int",
        half_width=0,
        confidence=0.95,
    )


@pytest.mark.parametrize(
    ("mechanism", "private"),
    [(gt.release, True), (_broken_off_by_one, False), (_broken_no_threshold, False)],
)
def test_a_new_key_is_released_with_probability_at_most_its_delta(mechanism, private) -> None:
    """Neighbours: a key with count L∞ = 1 present vs absent (absent is never released). At
    δ = 0.02 the exact release probability δ_τ is large enough to measure with 60,000 keys."""
    trials, bounds = 60_000, Contribution(1, 1)
    chosen = gt.plan(1.0, 0.02, bounds)
    out = mechanism(
        np.arange(trials), np.ones(trials, dtype=np.int64), epsilon=1.0, delta=0.02,
        bounds=bounds, rng=_rng(4),
    )  # fmt: skip
    frequency = out.keys.size / trials
    exact = chosen.threshold_delta
    assert (frequency <= exact + Z * math.sqrt(exact * (1 - exact) / trials)) == private


@pytest.mark.parametrize(("mechanism", "private"), [(gt.release, True), (_broken_sigma, False)])
def test_values_of_shared_keys_keep_the_privacy_loss_within_epsilon(mechanism, private) -> None:
    """Neighbours: a key with count 200 vs 204 (a unit adds L∞ = 4 rows; L0 = 1). Over outcomes
    seen at least 300 times in 200,000 keys the loss stays within ε = 1 (the δ part is the rare
    tail); the twin's σ is a quarter of the needed one and its loss exceeds ε."""
    bounds, trials = Contribution(1, 4), 200_000
    samples = []
    for count, seed in ((200, 6), (204, 7)):
        keys = np.arange(trials)
        out = mechanism(
            keys, np.full(trials, count), epsilon=1.0, delta=1e-6, bounds=bounds, rng=_rng(seed)
        )
        samples.append(_outcomes(out, keys))
    assert (_loss_lower_bound(*samples) <= 1.0) == private


def test_release_matches_its_plan_and_covers_with_its_intervals() -> None:
    bounds = Contribution(10, 1, 10)
    counts = np.full(20_000, 500)
    out = gt.release(
        np.arange(counts.size), counts, epsilon=1.0, delta=1e-6, bounds=bounds, rng=_rng(9)
    )
    chosen = gt.plan(1.0, 1e-6, bounds)
    assert (out.tau, out.scale, out.delta) == (chosen.tau, chosen.scale, chosen.delta)
    assert out.keys.size == counts.size and np.all(out.values >= out.tau)
    covered = np.mean((out.lower <= 500) & (out.upper >= 500))
    assert abs(covered - 0.95) < 0.01
    assert abs(out.values.std() - chosen.sigma) < 0.03 * chosen.sigma
