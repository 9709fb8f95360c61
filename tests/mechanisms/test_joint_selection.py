"""Tests for dpsql.mechanisms.joint_selection: exact tails of the sum, the plan, privacy on
neighbouring inputs with broken twins, and its counts."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpsql.mechanisms import discrete_gaussian as dg
from dpsql.mechanisms import joint_selection as js
from dpsql.mechanisms import weighted_selection as ws
from dpsql.mechanisms.threshold import Contribution, ThresholdRelease
from tests.mechanisms.test_threshold import Z, _loss_lower_bound, _outcomes


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def _brute_sum_tail(t: int, weight: Fraction, count: Fraction, lam: int) -> mpmath.mpf:
    """``P(Z_w + λ·Z_c >= t)`` from both PMFs term by term in 40-digit arithmetic."""
    mpmath.mp.dps = 40

    def pmf(sigma_squared: Fraction) -> dict[int, mpmath.mpf]:
        s2 = mpmath.mpf(sigma_squared.numerator) / sigma_squared.denominator
        reach = int(40 * float(sigma_squared) ** 0.5) + 40
        mass = {z: mpmath.exp(-mpmath.mpf(z) ** 2 / (2 * s2)) for z in range(-reach, reach + 1)}
        total = mpmath.fsum(mass.values())
        return {z: m / total for z, m in mass.items()}

    weights, counts = pmf(weight), pmf(count)
    ordered = sorted(weights)
    suffix, running = {}, mpmath.mpf(0)
    for z in reversed(ordered):
        running += weights[z]
        suffix[z] = running
    low, high = ordered[0], ordered[-1]

    def tail(n: int) -> mpmath.mpf:
        return mpmath.mpf(1) if n <= low else (suffix[n] if n <= high else mpmath.mpf(0))

    return mpmath.fsum(m * tail(t - lam * z) for z, m in counts.items())


@pytest.mark.parametrize(
    ("weight", "count", "lam"),
    [
        (Fraction(400), Fraction(9), 7),
        (Fraction(49, 4), Fraction(25), 1),
        (Fraction(900), Fraction(4), 30),
    ],
)
@pytest.mark.parametrize("t", [-40, 0, 25, 90, 160])
def test_sum_tails_are_upper_bounds_within_1e8_of_the_brute_force_sum(weight, count, lam, t):
    exact = _brute_sum_tail(t, weight, count, lam)
    computed = js.sum_tails(np.array([t]), weight, count, lam)[0]
    if exact < mpmath.mpf("1e-250"):
        return
    assert computed >= exact * (1 - mpmath.mpf("1e-14"))
    assert computed <= exact * (1 + mpmath.mpf("1e-8")) + mpmath.mpf("1e-14")


@pytest.mark.parametrize(
    ("epsilon", "delta", "bounds", "share"),
    [
        (1.0, 1e-6, Contribution(10, 1, 10), 0.2),
        (0.5, 1e-5, Contribution(4, 2), 0.5),
        (2.0, 1e-7, Contribution(3, 1), 0.1),
    ],
)
def test_plan_spends_at_most_delta_and_tau_is_smallest(epsilon, delta, bounds, share) -> None:
    chosen = js.plan(epsilon, delta, bounds, share)
    assert chosen is not None and chosen.delta <= delta
    rho = ws.WEIGHT_SCALE**2 / (2 * float(chosen.selection_sigma_squared)) + (
        bounds.per_key * bounds.l1
    ) / (2 * float(chosen.count_sigma_squared))
    assert chosen.noise_delta == dg.zcdp_delta(rho, epsilon)
    assert chosen.selection_rho + chosen.count_l2_sensitivity**2 / (
        2 * float(chosen.count_sigma_squared)
    ) == pytest.approx(rho, rel=1e-12)
    arguments = (
        chosen.selection_sigma_squared, chosen.count_sigma_squared, chosen.multiplier,
        chosen.weights, bounds.per_key,
    )  # fmt: skip
    budget = delta - chosen.noise_delta
    assert js.threshold_delta(chosen.tau, *arguments) <= budget
    assert js.threshold_delta(chosen.tau - 1, *arguments) > budget


def _new_key_release(keys, counts, weights, *, epsilon, delta, bounds, rng, tau=None, full=False):
    """The selection step with the plan's noise, at ``tau`` (default: the plan's), weights
    replaced by W per kept key when ``full``."""
    chosen = js.plan(epsilon, delta, bounds, 0.5)
    if full:
        weights = np.where(weights > 0, ws.WEIGHT_SCALE, 0)
    noisy_w = weights + dg.sample_discrete_gaussian(chosen.selection_sigma_squared, keys.size, rng)
    noisy_c = counts + dg.sample_discrete_gaussian(chosen.count_sigma_squared, keys.size, rng)
    kept = noisy_w + chosen.multiplier * noisy_c >= (chosen.tau if tau is None else tau)
    return ThresholdRelease(
        keys=keys[kept], values=noisy_c[kept], tau=chosen.tau, scale=chosen.scale, epsilon=1.0,
        delta=0.0, max_groups_per_unit=1, max_rows_per_group=1, key_kind="int", half_width=0,
        confidence=0.95,
    )  # fmt: skip


def _private(keys, counts, weights, **kwargs):
    return js.release(keys, counts, weights, selection_share=0.5, **kwargs)


def _unbounded_weights(keys, counts, weights, **kwargs):
    """Twin: every kept key of a person weighs W, whatever their number of keys."""
    return _new_key_release(keys, counts, weights, full=True, **kwargs)


def _counts_left_out(keys, counts, weights, *, epsilon, delta, bounds, rng):
    """Twin: τ set as if a new key's own rows added nothing to ``T`` (the ``λ·L∞'`` term of
    δ_τ forgotten)."""
    chosen = js.plan(epsilon, delta, bounds, 0.5)
    tau = js._smallest_tau(
        chosen.selection_sigma_squared, chosen.count_sigma_squared, chosen.multiplier,
        delta - chosen.noise_delta, chosen.weights, 0,
    )  # fmt: skip
    return _new_key_release(
        keys, counts, weights, epsilon=epsilon, delta=delta, bounds=bounds, rng=rng, tau=tau
    )


@pytest.mark.parametrize(
    ("mechanism", "private"),
    [(_private, True), (_unbounded_weights, False), (_counts_left_out, False)],
)
def test_a_new_persons_keys_are_released_with_probability_at_most_delta(mechanism, private) -> None:
    """Neighbours: a person with K = 4 keys of their own (weight w_4 and one row each) present
    vs absent. 60,000 such keys (15,000 persons) at δ = 0.05, where the release probability is
    measurable: the mechanism stays within δ_τ; weights of W per key and a τ that forgets the
    new keys' own count exceed it."""
    bounds, persons = Contribution(4, 1), 15_000
    chosen = js.plan(1.0, 0.05, bounds, 0.5)
    size = 4 * persons
    out = mechanism(
        np.arange(size), np.ones(size, dtype=np.int64),
        np.full(size, chosen.weights[3], dtype=np.int64), epsilon=1.0, delta=0.05, bounds=bounds,
        rng=_rng(11),
    )  # fmt: skip
    released = np.zeros(size, dtype=bool)
    released[out.keys] = True
    frequency = released.reshape(persons, 4).any(axis=1).mean()
    single = js.sum_tails(
        np.array([chosen.tau - chosen.weights[3] - chosen.multiplier]),
        chosen.selection_sigma_squared, chosen.count_sigma_squared, chosen.multiplier,
    )[0]  # fmt: skip
    exact = 1 - (1 - single) ** 4
    assert exact <= chosen.threshold_delta * (1 + 1e-9)
    assert (frequency <= exact + Z * math.sqrt(exact * (1 - exact) / persons)) == private


def _count_sigma_for_one_row(keys, counts, weights, *, epsilon, delta, bounds, rng):
    """Twin: the plan of L∞ = 1 (the counts' σ a quarter of the needed one) although a person
    adds ``max_rows_per_group`` rows."""
    return js.release(
        keys, counts, weights, epsilon=epsilon, delta=delta, rng=rng, selection_share=0.5,
        bounds=replace(bounds, max_rows_per_group=1),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("mechanism", "private"), [(_private, True), (_count_sigma_for_one_row, False)]
)
def test_values_of_shared_keys_keep_the_privacy_loss_within_epsilon(mechanism, private) -> None:
    """Neighbours: a key held by 40 persons (weight W each, 4 rows each) against the same key
    with one person more (weight +W, count +4; L0 = 1, L∞ = 4). Each key's output (its noisy
    count, or absent) depends only on its own statistics, so 200,000 keys give 200,000 samples;
    over outcomes seen at least 300 times the loss stays within ε = 1; the twin's exceeds it."""
    bounds, trials = Contribution(1, 4), 200_000
    samples = []
    for persons, seed in ((40, 6), (41, 7)):
        keys = np.arange(trials)
        out = mechanism(
            keys, np.full(trials, 4 * persons), np.full(trials, ws.WEIGHT_SCALE * persons),
            epsilon=1.0, delta=1e-6, bounds=bounds, rng=_rng(seed),
        )  # fmt: skip
        samples.append(_outcomes(out, keys))
    assert (_loss_lower_bound(*samples) <= 1.0) == private


def test_counts_are_the_noisy_counts_with_the_counts_sigma_and_cover() -> None:
    bounds, size = Contribution(10, 1, 10), 20_000
    out = js.release(
        np.arange(size), np.full(size, 300), np.full(size, 300 * 40),
        epsilon=1.0, delta=1e-6, bounds=bounds, selection_share=0.2, rng=_rng(12),
    )  # fmt: skip
    chosen = js.plan(1.0, 1e-6, bounds, 0.2)
    assert out.keys.size == size  # far above τ: every key released, no selection bias
    assert (out.tau, out.scale, out.mechanism) == (chosen.tau, chosen.scale, "joint")
    assert abs(out.values.std() - chosen.count_sigma) < 0.03 * chosen.count_sigma
    assert abs(np.abs(out.values - 300).mean() - dg.expected_abs(chosen.count_sigma_squared)) < 0.3
    assert abs(np.mean((out.lower <= 300) & (out.upper >= 300)) - 0.95) < 0.01


def test_a_small_share_is_gaussian_thresholding_and_a_large_one_selects_on_weights() -> None:
    """λ follows the shares: large when the weights are noisy (the counts decide), small when
    the counts are (the weights decide)."""
    bounds = Contribution(10, 1, 10)
    small, large = js.plan(1.0, 1e-6, bounds, 0.05), js.plan(1.0, 1e-6, bounds, 0.8)
    assert small.multiplier > 100 > 10 > large.multiplier
    assert small.count_sigma < large.count_sigma
    assert small.units_needed(5) > large.units_needed(5)
