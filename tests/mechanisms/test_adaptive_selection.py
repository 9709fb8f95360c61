"""Tests for dpsql.mechanisms.adaptive_selection (mad2r): plan, round-2 weights, privacy with
broken twins (rerouting without the L2 cap, wrong σ, threshold off), counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql.errors import ParameterError
from dpsql.mechanisms import adaptive_selection as ad
from dpsql.mechanisms import discrete_gaussian as dg
from dpsql.mechanisms import weighted_selection as ws
from dpsql.mechanisms.threshold import Contribution
from tests.mechanisms.test_threshold import Z


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


@pytest.mark.parametrize(
    ("epsilon", "delta", "bounds"),
    [
        (1.0, 1e-6, Contribution(10, 1, 10)),
        (0.5, 1e-5, Contribution(4, 2)),
        (2.0, 1e-7, Contribution(3, 1)),
    ],
)
def test_plan_spends_at_most_delta_within_the_weighted_rho(epsilon, delta, bounds) -> None:
    chosen = ad.plan(epsilon, delta, bounds)
    base = ws.plan(epsilon, delta, bounds)
    assert chosen is not None and chosen.delta <= delta
    assert chosen.selection_rho <= base.selection_rho
    count_rho = bounds.per_key * bounds.l1 / (2 * float(chosen.count_sigma_squared))
    assert chosen.noise_delta == dg.zcdp_delta(chosen.selection_rho + count_rho, epsilon)
    first = ws.selection_delta(chosen.first_tau, chosen.first_sigma_squared, chosen.weights)
    second = ws.selection_delta(chosen.tau, chosen.selection_sigma_squared, chosen.weights)
    assert chosen.threshold_delta == first + second
    budget = delta - chosen.noise_delta
    # Both thresholds are the smallest for their share of the δ part.
    assert ws.selection_delta(chosen.first_tau - 1, chosen.first_sigma_squared, chosen.weights) > (
        ad.DEFAULT_FIRST_DELTA_SHARE * budget
    )
    assert ws.selection_delta(chosen.tau - 1, chosen.selection_sigma_squared, chosen.weights) > (
        budget - first
    )


def test_a_plan_with_round_twos_sigma_at_the_whole_selection_rho_overspends() -> None:
    """Twin (wrong σ): round 2 noised as if it had the whole selection's ρ. Its ρ's no longer
    fit δ with the thresholds' part: the check the plan passes fails."""
    bounds, delta = Contribution(10, 1, 10), 1e-6
    chosen = ad.plan(1.0, delta, bounds)
    base = ws.plan(1.0, delta, bounds)
    count_rho = bounds.per_key * bounds.l1 / (2 * float(chosen.count_sigma_squared))
    wrong_rho = ws.WEIGHT_SCALE**2 / (2 * float(chosen.first_sigma_squared)) + base.selection_rho
    assert dg.zcdp_delta(wrong_rho + count_rho, 1.0) + chosen.threshold_delta > delta
    assert dg.zcdp_delta(chosen.selection_rho + count_rho, 1.0) + chosen.threshold_delta <= delta


def test_round_two_weights_match_a_per_person_sum_and_are_bounded_in_l2() -> None:
    rng = _rng(3)
    units = np.repeat(np.arange(300), rng.integers(1, 6, 300))
    keys = rng.integers(0, 40, units.size)
    pairs = np.unique(np.stack([units, keys]), axis=1)
    found = np.array([0, 1, 2, 3, 4])
    weights = ws.unit_weights(5)
    got_keys, got = ad.second_round_weights(pairs[0], pairs[1], found, weights)
    expected: dict[int, int] = {}
    for unit in np.unique(pairs[0]):
        rest = [k for k in pairs[1][pairs[0] == unit] if k not in found]
        for key in rest:
            expected[int(key)] = expected.get(int(key), 0) + weights[len(rest) - 1]
        assert len(rest) * weights[max(len(rest), 1) - 1] ** 2 <= ws.WEIGHT_SCALE**2
    assert dict(zip(got_keys.tolist(), got.tolist(), strict=True)) == expected
    with pytest.raises(ParameterError, match="more than 2 keys"):
        ad.second_round_weights([1, 1, 1], [5, 6, 7], [], weights[:2])


# Neighbours for the privacy test: PERSONS persons, each with the two shared heavy keys 0 and 1
# (present in both inputs, far above any threshold) and two keys of their own (present only in
# the input with them). Round 1 releases the heavy keys; round 2 sees each person's own keys.
PERSONS, BOUNDS, DELTA = 40_000, Contribution(4, 1), 0.05


def _neighbour_data():
    units = np.repeat(np.arange(PERSONS), 4)
    own = 2 + np.arange(2 * PERSONS).reshape(PERSONS, 2)
    keys = np.column_stack([np.zeros(PERSONS, int), np.ones(PERSONS, int), own]).ravel()
    weight = ws.unit_weights(4)[3]
    round_one = np.concatenate([[PERSONS * weight] * 2, [weight] * (2 * PERSONS)])
    return units, keys, np.arange(2 * PERSONS + 2), round_one.astype(np.int64)


def _rerouted_without_cap(units, keys, found, weights):
    """Twin: a person's dropped weight is moved to their other keys as is (L1 rerouting), so each
    remaining key gets ``w_n·n/m``: the person's round-2 vector exceeds W in L2."""
    keep = ~np.isin(keys, found)
    per_unit = np.bincount(units, minlength=units.max() + 1)
    left = np.bincount(units[keep], minlength=units.max() + 1)
    given = (np.array(weights)[per_unit - 1] * per_unit)[units[keep]] // left[units[keep]]
    distinct, index = np.unique(keys[keep], return_inverse=True)
    return distinct, np.bincount(index, weights=given).astype(np.int64)


def _run(second_weights, *, sigma_squared=None, tau_shift=0, seed=21):
    """The mechanism's two selections (``release`` itself when nothing is broken)."""
    units, keys, all_keys, round_one = _neighbour_data()
    chosen = ad.plan(1.0, DELTA, BOUNDS)
    rng = _rng(seed)
    if second_weights is ad.second_round_weights and sigma_squared is None and not tau_shift:
        out = ad.release(
            all_keys, np.ones(all_keys.size, np.int64), round_one,
            lambda found: ad.second_round_weights(units, keys, found, chosen.weights),
            epsilon=1.0, delta=DELTA, bounds=BOUNDS, rng=rng,
        )  # fmt: skip
        return out.keys, chosen
    first = all_keys[ws.selected(round_one, chosen.first_sigma_squared, chosen.first_tau, rng)]
    second_keys, second = second_weights(units, keys, first, chosen.weights)
    picked = ws.selected(
        second, sigma_squared or chosen.selection_sigma_squared, chosen.tau + tau_shift, rng
    )
    return np.concatenate([first, second_keys[picked]]), chosen


@pytest.mark.parametrize(
    ("twin", "private"),
    [
        ({}, True),
        ({"second_weights": _rerouted_without_cap}, False),
        ({"tau_shift": -40}, False),
    ],
)
def test_a_new_persons_keys_are_released_with_probability_at_most_delta(twin, private) -> None:
    """A person's two own keys are released (in either round) with probability at most the
    plan's ``δ_τ₁ + δ_τ₂`` (here exactly ``1 − ((1 − p₁)(1 − p₂))²``, ``p₁`` for weight w_4 in
    round 1, ``p₂`` for w_2 in round 2). Rerouting without the L2 cap and a threshold lowered
    by 40 (σ/7) exceed it."""
    released, chosen = _run(**{"second_weights": ad.second_round_weights, **twin})
    assert {0, 1} <= set(released.tolist())
    weights = chosen.weights
    p1 = dg.tail_at_least(chosen.first_tau - weights[3], chosen.first_sigma_squared)
    p2 = dg.tail_at_least(chosen.tau - weights[1], chosen.selection_sigma_squared)
    exact = 1 - ((1 - p1) * (1 - p2)) ** 2
    assert exact <= chosen.threshold_delta * (1 + 1e-9)
    hit = np.zeros(2 * PERSONS + 2, dtype=bool)
    hit[released] = True
    frequency = hit[2:].reshape(PERSONS, 2).any(axis=1).mean()
    assert (frequency <= exact + Z * math.sqrt(exact * (1 - exact) / PERSONS)) == private


@pytest.mark.parametrize(("wrong", "ok"), [(False, True), (True, False)])
def test_round_two_noise_has_the_planned_sigma(wrong, ok) -> None:
    """Keys of round-2 weight ``τ₂ − 2σ₂`` are released at the rate ``P(Z₂ >= 2σ₂)`` (2.3%);
    the twin noising round 2 with the σ of the whole selection's ρ (3% smaller: wrong σ) at 2.0%.
    """
    chosen = ad.plan(1.0, DELTA, BOUNDS)
    base = ws.plan(1.0, DELTA, BOUNDS)
    gap = round(2 * chosen.selection_sigma)
    size = 400_000
    weights = np.full(size, chosen.tau - gap, dtype=np.int64)
    sigma_squared = base.selection_sigma_squared if wrong else chosen.selection_sigma_squared
    rate = ws.selected(weights, sigma_squared, chosen.tau, _rng(5)).size / size
    expected = dg.tail_at_least(gap, chosen.selection_sigma_squared)
    assert (abs(rate - expected) <= Z * math.sqrt(expected * (1 - expected) / size)) == ok


def test_counts_are_noised_and_keys_only_round_two_finds_count_zero() -> None:
    bounds = Contribution(2, 1)
    chosen = ad.plan(1.0, 1e-6, bounds)
    size = 5_000
    keys = np.arange(size)
    out = ad.release(
        keys, np.full(size, 300), np.full(size, 300 * chosen.weights[0]),
        lambda found: (np.array([size, size + 1]), np.array([10**7, 0])),
        epsilon=1.0, delta=1e-6, bounds=bounds, rng=_rng(12),
    )  # fmt: skip
    assert out.keys.size == size + 1 and out.mechanism == "mad2r"
    found = out.keys < size
    assert abs(out.values[found].std() - chosen.count_sigma) < 0.05 * chosen.count_sigma
    assert abs(np.mean((out.lower[found] <= 300) & (out.upper[found] >= 300)) - 0.95) < 0.015
    lone = out.values[~found][0]
    assert abs(lone) <= 6 * chosen.count_sigma


def test_round_one_keys_round_two_did_not_leave_out_are_released_once() -> None:
    out = ad.release(
        [1, 2], [500, 500], [500 * 128, 500 * 128], lambda found: (found, [10**7] * found.size),
        epsilon=1.0, delta=1e-6, bounds=Contribution(1, 1), rng=_rng(1),
    )  # fmt: skip
    assert sorted(out.keys.tolist()) == [1, 2]
    with pytest.raises(ParameterError, match="distinct"):
        ad.release(
            [1], [5], [5], lambda found: ([3, 3], [1, 1]),
            epsilon=1.0, delta=1e-6, bounds=Contribution(1, 1), rng=_rng(1),
        )  # fmt: skip
