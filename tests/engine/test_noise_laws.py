"""Noise laws of released values and of their combinations (``dpsql.engine.noise_laws``),
checked against the law computed by brute force: the pmfs of the discrete Laplace noises
convolved on their lattice."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpsql.engine.noise_laws import (
    DiscreteLaplaceLaw,
    RatioLaw,
    combination_half_width,
    ratio_interval,
)


def _pmf(scale: float, reach: int) -> np.ndarray:
    a = np.exp(-1 / scale)
    k = np.arange(-reach, reach + 1)
    return (1 - a) / (1 + a) * a ** np.abs(k)


def _smallest_half_width(weights: list[int], scales: list[float], level: float) -> int:
    """The least integer t with P(|Σ w_i X_i| <= t) >= level, by convolution (integer
    weights: the sums lie on the integers)."""
    reach = 60 * int(max(scales)) + 60
    total = np.array([1.0])
    for weight, scale in zip(weights, scales, strict=True):
        spread = np.zeros(2 * reach * abs(weight) + 1)
        spread[:: abs(weight)] = _pmf(scale, reach)
        total = np.convolve(total, spread)
    centre = total.size // 2
    mass = total[centre]
    t = 0
    while mass < level:
        t += 1
        mass += total[centre + t] + total[centre - t]
    return t


@pytest.mark.parametrize(
    ("weights", "scales"), [([1, -1], [10.0, 10.0]), ([1, 1], [3.0, 16.0]), ([2, -1], [4.5, 7.0])]
)
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_two_noises_are_exact(weights: list[int], scales: list[float], level: float) -> None:
    laws = [DiscreteLaplaceLaw(Fraction(s)) for s in scales]
    combined = combination_half_width(list(zip(map(float, weights), laws, strict=True)), level)
    assert combined.kind == "exact"
    assert combined.half_width == _smallest_half_width(weights, scales, level)


def test_a_half_width_from_the_wrong_scale_covers_less_than_its_level() -> None:
    """The broken twin: the half-width of half the noise scale, checked against the true law."""
    true = _smallest_half_width([1, -1], [10.0, 10.0], 0.95)
    twin = combination_half_width(
        [(1.0, DiscreteLaplaceLaw(Fraction(5))), (-1.0, DiscreteLaplaceLaw(Fraction(5)))], 0.95
    )
    assert twin.half_width < true


def test_sums_on_different_grids_are_exact_and_cover() -> None:
    """Two sums whose grids differ (weights that are not one lattice): the stated half-width
    covers the simulated noise at its level and a 3% narrower one does not."""
    laws = [DiscreteLaplaceLaw(Fraction(1500), 0.25), DiscreteLaplaceLaw(Fraction(1100), 2**-10)]
    combined = combination_half_width([(1.0, laws[0]), (-3.0, laws[1])], 0.95)
    assert combined.kind == "exact"
    rng = np.random.default_rng(3)
    draws = 400_000
    noise = sum(
        w * law.grid * (rng.geometric(1 - np.exp(-1 / float(law.scale)), draws)
                        - rng.geometric(1 - np.exp(-1 / float(law.scale)), draws))
        for w, law in zip((1.0, -3.0), laws, strict=True)
    )  # fmt: skip
    tolerance = 3 * np.sqrt(0.95 * 0.05 / draws)
    assert np.mean(np.abs(noise) <= combined.half_width) >= 0.95 - tolerance
    assert np.mean(np.abs(noise) <= 0.97 * combined.half_width) < 0.95 - tolerance


def test_three_noises_are_simulated_at_least_at_the_level() -> None:
    """Three terms: the simulated half-width is at least the exact one and within 5% of it."""
    weights, scales = [1, -2, 1], [6.0, 4.0, 9.0]
    laws = [DiscreteLaplaceLaw(Fraction(s)) for s in scales]
    combined = combination_half_width(list(zip(map(float, weights), laws, strict=True)), 0.95)
    exact = _smallest_half_width(weights, scales, 0.95)
    assert combined.kind == "approximate"
    assert exact <= combined.half_width <= 1.05 * exact
    assert "draws" in combined.method


def test_one_noise_is_its_own_interval() -> None:
    law = DiscreteLaplaceLaw(Fraction(10), 0.5)
    combined = combination_half_width([(-4.0, law)], 0.95)
    assert combined.half_width == 4 * law.half_width(0.95)
    low, high = law.intervals(np.array([1.0, 2.0]), 0.95)
    assert (high - low).tolist() == [2 * law.half_width(0.95)] * 2


def test_a_mean_at_a_higher_level_is_wider_and_keeps_its_rows() -> None:
    total, rows = DiscreteLaplaceLaw(Fraction(40)), DiscreteLaplaceLaw(Fraction(2))
    law = RatioLaw(np.array([900.0, 10.0, 5000.0]), np.array([100.0, 1.0, 400.0]), total, rows,
                   0.0, 20.0)  # fmt: skip
    low95, high95 = law.intervals(np.zeros(3), 0.95)
    low99, high99 = law.intervals(np.zeros(3), 0.99)
    assert np.all(low99 <= low95) and np.all(high95 <= high99)
    assert (low95[1], high95[1]) == (0.0, 20.0)  # the count may be below one row: any mean
    kept = law.kept([2])
    assert kept.sums.tolist() == [5000.0]
    values, _, _ = ratio_interval(kept.sums, kept.counts, 1.0, 1.0, 0.0, 20.0)
    assert values.tolist() == [12.5]
