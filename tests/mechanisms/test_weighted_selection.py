"""Tests for dpsql.mechanisms.weighted_selection: weights, exact δ, plan, privacy with twins."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpsql.mechanisms import discrete_gaussian as dg
from dpsql.mechanisms import weighted_selection as ws
from dpsql.mechanisms.threshold import Contribution, ThresholdRelease
from tests.mechanisms.test_discrete_gaussian import _brute_tail
from tests.mechanisms.test_threshold import Z


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def test_unit_weights_are_the_largest_integers_of_norm_at_most_w() -> None:
    for n, weight in enumerate(ws.unit_weights(60), start=1):
        assert n * weight**2 <= ws.WEIGHT_SCALE**2 < n * (weight + 1) ** 2


def test_selection_delta_matches_the_brute_force_sum() -> None:
    from fractions import Fraction

    sigma_squared, tau, weights = Fraction(40_000), 900, ws.unit_weights(6)
    exact = max(
        1 - (1 - _brute_tail(tau - w, sigma_squared)) ** n for n, w in enumerate(weights, 1)
    )
    computed = ws.selection_delta(tau, sigma_squared, weights)
    assert exact <= computed <= exact * (1 + mpmath.mpf("1e-8"))


@pytest.mark.parametrize(
    ("epsilon", "delta", "bounds"),
    [
        (1.0, 1e-6, Contribution(10, 1, 10)),
        (0.5, 1e-5, Contribution(4, 2)),
        (2.0, 1e-7, Contribution(3, 1)),
    ],
)
def test_plan_spends_at_most_delta_and_tau_is_smallest(epsilon, delta, bounds) -> None:
    chosen = ws.plan(epsilon, delta, bounds)
    assert chosen is not None and chosen.delta <= delta
    rho = ws.WEIGHT_SCALE**2 / (2 * float(chosen.selection_sigma_squared)) + (
        bounds.per_key * bounds.l1
    ) / (2 * float(chosen.count_sigma_squared))
    assert chosen.noise_delta == dg.zcdp_delta(rho, epsilon)
    budget = delta - chosen.noise_delta
    assert ws.selection_delta(chosen.tau - 1, chosen.selection_sigma_squared, chosen.weights) > (
        budget
    )


def _unbounded_weights(keys, counts, weights, *, epsilon, delta, bounds, rng):
    """Twin: every kept key of a person gets the full weight W, whatever their number of keys
    (weights not bounded in L2), with the plan made for bounded weights."""
    chosen = ws.plan(epsilon, delta, bounds)
    full = np.where(weights > 0, ws.WEIGHT_SCALE * np.round(weights / chosen.weights[-1]), 0)
    return _select(keys, full.astype(np.int64), chosen, rng)


def _off_by_one(keys, counts, weights, *, epsilon, delta, bounds, rng):
    """Twin: selects at a threshold lowered by 5% (τ is in weight units: W = 128 per person)."""
    chosen = ws.plan(epsilon, delta, bounds)
    return _select(keys, weights, chosen, rng, shift=-max(1, chosen.tau // 20))


def _select(keys, weights, chosen, rng, shift=0) -> ThresholdRelease:
    noisy = weights + dg.sample_discrete_gaussian(chosen.selection_sigma_squared, keys.size, rng)
    kept = noisy >= chosen.tau + shift
    return ThresholdRelease(
        keys=keys[kept], values=noisy[kept], tau=chosen.tau, scale=chosen.scale, epsilon=1.0,
        delta=0.0, max_groups_per_unit=1, max_rows_per_group=1, key_kind="int", half_width=0,
        confidence=0.95,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("mechanism", "private"),
    [(ws.release, True), (_unbounded_weights, False), (_off_by_one, False)],
)
def test_a_new_persons_keys_are_released_with_probability_at_most_delta(mechanism, private) -> None:
    """Neighbours: a person with K = 4 keys of their own (weight w_4 each) present vs absent.
    60,000 such keys (15,000 persons); at δ = 0.05 the release probability is measurable. The
    private mechanism stays within δ_τ; unbounded weights (W per key) and a lowered threshold
    exceed it."""
    bounds, persons = Contribution(4, 1), 15_000
    chosen = ws.plan(1.0, 0.05, bounds)
    size = 4 * persons
    weights = np.full(size, chosen.weights[3], dtype=np.int64)
    out = mechanism(
        np.arange(size), np.ones(size, dtype=np.int64), weights, epsilon=1.0, delta=0.05,
        bounds=bounds, rng=_rng(11),
    )  # fmt: skip
    released = np.zeros(size, dtype=bool)
    released[out.keys] = True
    frequency = released.reshape(persons, 4).any(axis=1).mean()
    exact = (
        1
        - (1 - dg.tail_at_least(chosen.tau - chosen.weights[3], chosen.selection_sigma_squared))
        ** 4
    )
    assert exact <= chosen.threshold_delta * (1 + 1e-9)
    assert (frequency <= exact + Z * math.sqrt(exact * (1 - exact) / persons)) == private


def test_counts_of_selected_keys_are_noised_with_the_counts_sigma() -> None:
    bounds = Contribution(10, 1, 10)
    size = 20_000
    out = ws.release(
        np.arange(size), np.full(size, 300), np.full(size, 300 * 40),
        epsilon=1.0, delta=1e-6, bounds=bounds, rng=_rng(12),
    )  # fmt: skip
    chosen = ws.plan(1.0, 1e-6, bounds)
    assert out.keys.size == size  # weight 12,000 is far above τ
    assert abs(out.values.std() - chosen.count_sigma) < 0.03 * chosen.count_sigma
    assert abs(np.mean((out.lower <= 300) & (out.upper >= 300)) - 0.95) < 0.01
