"""Statistical and privacy tests for the discrete Laplace mechanism (fixed seeds, stated bounds)."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import ParameterError
from dpsql.mechanisms import laplace
from dpsql.mechanisms.laplace import (
    NoisyRelease,
    choose_grid,
    interval_half_width,
    noise_scale,
    release_counts,
    release_grid_sums,
    sample_discrete_laplace,
)


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def _reference(scale: Fraction) -> stats.rv_discrete:
    """SciPy's discrete Laplace, ``P(x) ∝ exp(-a|x|)``, ``a = 1/scale``: an independent oracle."""
    return stats.dlaplace(1.0 / float(scale))


# --- the sampler matches the discrete Laplace PMF ---------------------------------------------


@pytest.mark.parametrize(
    ("scale", "seed"), [(Fraction(3, 7), 11), (Fraction(5, 2), 12), (Fraction(40), 13)]
)
def test_sampler_matches_discrete_laplace_pmf(scale: Fraction, seed: int) -> None:
    """Chi-square goodness of fit (p > 1e-3) and total variation distance < 0.03, 200k draws."""
    draws = 200_000
    samples = sample_discrete_laplace(scale, draws, _rng(seed))
    assert samples.dtype == np.int64 and samples.shape == (draws,)
    reference = _reference(scale)
    limit = int(reference.isf(5.0 / draws))  # every inner bin expects >= ~5 draws
    support = np.arange(-limit, limit + 1)
    inner = np.array([np.count_nonzero(samples == x) for x in support])
    observed = np.concatenate([[np.count_nonzero(samples < -limit)], inner])
    observed = np.append(observed, np.count_nonzero(samples > limit))
    tail = reference.cdf(-limit - 1)
    probabilities = np.concatenate([[tail], reference.pmf(support), [tail]])
    expected = probabilities * draws
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    p_value = stats.chi2.sf(statistic, df=observed.size - 1)
    assert p_value > 1e-3, (scale, statistic, observed.size)
    total_variation = 0.5 * float(np.sum(np.abs(observed / draws - probabilities)))
    assert total_variation < 0.03, (scale, total_variation)


def _variance_matches(samples: np.ndarray, scale: Fraction, tolerance: float = 0.05) -> bool:
    """Sample variance within ``tolerance`` (relative) of ``2a/(1-a)^2``, ``a = exp(-1/scale)``."""
    a = math.exp(-1.0 / float(scale))
    theoretical = 2.0 * a / (1.0 - a) ** 2
    return abs(float(np.var(samples)) / theoretical - 1.0) < tolerance


def test_variance_detects_wrong_scale() -> None:
    """Relative SE of the variance at 200k draws is ~0.5%; a 30% scale error moves it by > 40%."""
    scale = Fraction(10)
    draws = 200_000
    assert _variance_matches(sample_discrete_laplace(scale, draws, _rng(21)), scale)
    for factor in (Fraction(7, 10), Fraction(13, 10)):
        twin = sample_discrete_laplace(scale * factor, draws, _rng(21))
        assert not _variance_matches(twin, scale), factor
    assert abs(float(np.mean(sample_discrete_laplace(scale, draws, _rng(22))))) < 0.15  # ~5 SE


def test_sampler_shapes_and_empty() -> None:
    samples = sample_discrete_laplace(Fraction(5, 3), (4, 5, 6), _rng(1))
    assert samples.shape == (4, 5, 6) and samples.dtype == np.int64
    assert sample_discrete_laplace(Fraction(5, 3), 0, _rng(1)).shape == (0,)
    assert sample_discrete_laplace(Fraction(5, 3), (3, 0), _rng(1)).shape == (3, 0)


@pytest.mark.parametrize(
    ("numerator", "denominator"), [(0, 7), (3, 7), (7, 7), (2**61, 2**62), (2**62 - 1, 2**62)]
)
def test_bernoulli_exp_neg_fraction(numerator: int, denominator: int) -> None:
    """CKS Alg. 1 has mean exp(-n/d) within 5 SE; ``d = 2**62`` takes the overflow-safe path."""
    draws = 100_000
    numerators = np.full(draws, numerator, dtype=np.int64)
    mean = float(np.mean(laplace._bernoulli_exp_neg_fraction(numerators, denominator, _rng(5))))
    target = math.exp(-numerator / denominator)
    assert abs(mean - target) <= 5.0 * math.sqrt(target * (1 - target) / draws) + 1e-12


# --- confidence intervals ---------------------------------------------------------------------


def test_interval_half_width_is_smallest_covering_integer() -> None:
    """Checked against SciPy's CDF for many scales and confidences (1e-9 slack for its floats)."""
    scales = [Fraction(1, 64), Fraction(3, 7), Fraction(1), Fraction(5, 2), Fraction(10)]
    scales += [noise_scale(1.0, e) for e in (0.01, 0.05, 0.3, 0.7, 2.0)] + [Fraction(4000)]
    for scale in scales:
        reference = _reference(scale)
        for confidence in (0.5, 0.8, 0.9, 0.95, 0.99, 0.999):
            k = interval_half_width(scale, confidence)
            covered = reference.cdf(k) - reference.cdf(-k - 1)
            assert covered >= confidence - 1e-9, (scale, confidence, k, covered)
            if k > 0:
                narrower = reference.cdf(k - 1) - reference.cdf(-k)
                assert narrower < confidence + 1e-9, (scale, confidence, k, narrower)


def test_release_intervals_cover_at_nominal_rate() -> None:
    """Coverage of 40k intervals is >= 95% minus 4 binomial SE (~0.44%) and < 99% (not too wide)."""
    trials = 40_000
    truth = np.full(trials, 1_000, dtype=np.int64)
    release = release_counts(truth, epsilon=0.1, sensitivity=1, rng=_rng(31))
    covered = float(np.mean((release.lower <= truth) & (truth <= release.upper)))
    assert covered >= 0.95 - 4.0 * math.sqrt(0.95 * 0.05 / trials), covered
    assert covered < 0.99, covered
    sums = release_grid_sums(
        truth, epsilon=0.5, sensitivity_units=64, grid=2.0**-6, rng=_rng(32), confidence=0.9
    )
    covered = float(np.mean(np.abs(sums.values - truth * 2.0**-6) <= sums.half_width))
    assert 0.9 - 4.0 * math.sqrt(0.9 * 0.1 / trials) <= covered < 0.96, covered


# --- privacy on neighbouring inputs -----------------------------------------------------------


Release = Callable[[np.ndarray, float, int, np.random.Generator], np.ndarray]


def _correct(counts: np.ndarray, epsilon: float, sensitivity: int, rng) -> np.ndarray:
    return release_counts(counts, epsilon=epsilon, sensitivity=sensitivity, rng=rng).values


def _broken_half_scale(counts: np.ndarray, epsilon: float, sensitivity: int, rng) -> np.ndarray:
    """Broken twin: noise scale Δ/(2ε), i.e. actually 2ε-DP."""
    return counts + sample_discrete_laplace(
        noise_scale(sensitivity, 2 * epsilon), counts.shape, rng
    )


def _broken_ignores_sensitivity(
    counts: np.ndarray, epsilon: float, sensitivity: int, rng
) -> np.ndarray:
    """Broken twin: scale 1/ε regardless of Δ, i.e. actually Δε-DP."""
    return counts + sample_discrete_laplace(noise_scale(1, epsilon), counts.shape, rng)


def _empirical_privacy_loss(first: np.ndarray, second: np.ndarray, min_count: int = 1_000) -> float:
    """Largest ``|ln(p/q)| - 4 SE`` over output bins holding >= ``min_count`` draws in both runs.

    ``SE = sqrt(1/n_p + 1/n_q)`` is the delta-method standard error of the log count ratio, so a
    correct mechanism stays <= ε with overwhelming probability while a 2ε mechanism exceeds it.
    """
    offset = min(first.min(), second.min())
    size = max(first.max(), second.max()) - offset + 1
    counts_first = np.bincount(first - offset, minlength=size)
    counts_second = np.bincount(second - offset, minlength=size)
    populated = (counts_first >= min_count) & (counts_second >= min_count)
    assert np.count_nonzero(populated) >= 10
    p, q = counts_first[populated], counts_second[populated]
    log_ratio = np.abs(np.log(p / q))
    return float(np.max(log_ratio - 4.0 * np.sqrt(1.0 / p + 1.0 / q)))


@pytest.mark.parametrize(
    ("mechanism", "private"),
    [(_correct, True), (_broken_half_scale, False), (_broken_ignores_sensitivity, False)],
)
def test_privacy_loss_on_neighbouring_counts(mechanism: Release, private: bool) -> None:
    """Counts c and c + Δ (Δ = 3, ε = 0.5), 200k seeded runs each; twins must fail this check."""
    epsilon, sensitivity, runs = 0.5, 3, 200_000
    base = np.full(runs, 100, dtype=np.int64)
    first = mechanism(base, epsilon, sensitivity, _rng(41))
    second = mechanism(base + sensitivity, epsilon, sensitivity, _rng(42))
    loss = _empirical_privacy_loss(first, second)
    assert (loss <= epsilon) == private, loss


# --- parameters, rounding and grids -----------------------------------------------------------


def test_noise_scale_never_below_sensitivity_over_epsilon() -> None:
    """2000 log-uniform pairs: exact rational check, power-of-two denominator, relative excess."""
    rng = _rng(51)
    sensitivities = np.exp(rng.uniform(math.log(1e-6), math.log(1e6), 2_000))
    epsilons = np.exp(rng.uniform(math.log(1e-4), math.log(1e3), 2_000))
    for sensitivity, epsilon in zip(sensitivities.tolist(), epsilons.tolist(), strict=True):
        exact = Fraction(sensitivity) / Fraction(epsilon)
        scale = noise_scale(sensitivity, epsilon)
        assert scale >= exact
        assert scale.denominator & (scale.denominator - 1) == 0
        assert scale.denominator <= 2**32 and scale.numerator <= 2**48
        if exact >= Fraction(1, 4):
            assert (scale - exact) / exact < Fraction(1, 2**28)
    assert noise_scale(1, 0.1) == 10 and noise_scale(3, 0.25) == 12 and noise_scale(2, 1) == 2
    assert noise_scale(1e-300, 1.0) == Fraction(1, 2**32)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, -math.inf, "1", None, True])
def test_bad_parameters_raise_naming_the_parameter(bad: object) -> None:
    with pytest.raises(ParameterError, match="sensitivity"):
        noise_scale(bad, 1.0)
    with pytest.raises(ParameterError, match="epsilon"):
        noise_scale(1.0, bad)
    with pytest.raises(ParameterError, match="epsilon"):
        choose_grid(1.0, bad)
    with pytest.raises(ParameterError, match="epsilon"):
        release_counts(np.array([1]), epsilon=bad, sensitivity=1, rng=_rng(0))
    with pytest.raises(ParameterError, match="scale"):
        sample_discrete_laplace(bad, 3, _rng(0))


def test_other_bad_arguments() -> None:
    counts = np.array([1, 2])
    with pytest.raises(ParameterError, match="sensitivity"):
        release_counts(counts, epsilon=1.0, sensitivity=0)
    with pytest.raises(ParameterError, match="sensitivity"):
        release_counts(counts, epsilon=1.0, sensitivity=1.5)
    with pytest.raises(ParameterError, match="confidence"):
        release_counts(counts, epsilon=1.0, sensitivity=1, confidence=1.0)
    with pytest.raises(ParameterError, match="counts"):
        release_counts(np.array([1.5]), epsilon=1.0, sensitivity=1)
    with pytest.raises(ParameterError, match="counts"):
        release_counts(np.array(["a"]), epsilon=1.0, sensitivity=1)
    with pytest.raises(ParameterError, match="grid"):
        release_grid_sums(counts, epsilon=1.0, sensitivity_units=4, grid=0.3)
    with pytest.raises(ParameterError, match="sensitivity_units"):
        release_grid_sums(counts, epsilon=1.0, sensitivity_units=-4, grid=0.25)
    with pytest.raises(ParameterError, match="size"):
        sample_discrete_laplace(Fraction(2), -1, _rng(0))
    with pytest.raises(ParameterError, match="scale"):
        sample_discrete_laplace(Fraction(2**60), 1, _rng(0))
    with pytest.raises(ParameterError, match="epsilon"):
        noise_scale(1.0, 1e-15)
    with pytest.raises(ParameterError, match="confidence"):
        interval_half_width(Fraction(2), 0.0)


def test_grid_sums_are_exact_multiples_of_grid() -> None:
    grid = 2.0**-7
    sums = _rng(61).integers(-(10**12), 10**12, size=5_000)
    release = release_grid_sums(sums, epsilon=0.3, sensitivity_units=1000, grid=grid, rng=_rng(62))
    assert release.values.dtype == np.float64
    units = release.values / grid
    assert np.all(units == np.round(units))
    assert np.all(units.astype(np.int64).astype(np.float64) * grid == release.values)
    assert release.sensitivity == 1000 * grid and release.delta == 0.0
    assert release.scale == float(noise_scale(1000, 0.3)) * grid
    assert release.mechanism == "discrete_laplace"
    floats = release_grid_sums(
        sums.astype(np.float64), epsilon=0.3, sensitivity_units=1000, grid=grid, rng=_rng(62)
    )
    assert np.array_equal(floats.values, release.values)


def test_choose_grid_puts_noise_scale_near_two_to_the_ten() -> None:
    rng = _rng(71)
    for sensitivity, epsilon in zip(
        np.exp(rng.uniform(-20, 20, 500)).tolist(),
        np.exp(rng.uniform(-8, 5, 500)).tolist(),
        strict=True,
    ):
        grid = choose_grid(sensitivity, epsilon)
        assert math.frexp(grid)[0] == 0.5
        assert 2**10 * (1 - 1e-12) <= sensitivity / (grid * epsilon) < 2**11 * (1 + 1e-12)


def test_release_fields_and_secure_default() -> None:
    """rng=None uses the ChaCha20 CSPRNG: it runs and two releases of 1000 zeros differ."""
    zeros = np.zeros(1_000, dtype=np.int64)
    first = release_counts(zeros, epsilon=1.0, sensitivity=1)
    second = release_counts(zeros, epsilon=1.0, sensitivity=1)
    assert isinstance(first, NoisyRelease) and first.values.dtype == np.int64
    assert not np.array_equal(first.values, second.values)
    assert first.epsilon == 1.0 and first.delta == 0.0 and first.scale == 1.0
    assert first.half_width == interval_half_width(Fraction(1), 0.95)
    assert np.array_equal(first.upper - first.lower, np.full(1_000, 2 * first.half_width))
    assert sample_discrete_laplace(Fraction(7, 3), 10).shape == (10,)


def test_expected_abs_is_zero_for_a_scale_too_small_to_move_a_count() -> None:
    """At a huge epsilon the noise's scale is tiny and exp(-1/scale) underflows to 0: the mean
    error is 0 (EXPLAIN's key-release line divided by log(0) before)."""
    from fractions import Fraction

    from dpsql.mechanisms.laplace import expected_abs

    assert expected_abs(Fraction(1, 10**6)) == 0.0
    assert expected_abs(Fraction(10)) == pytest.approx(9.983, abs=1e-3)


@pytest.mark.parametrize(
    "scale",
    [Fraction(1), Fraction(1, 3), Fraction(7, 2), Fraction(100), Fraction(2**40 + 1, 2**5)],
)
def test_few_draws_are_the_vectorized_draws(scale: Fraction) -> None:
    """Up to ``_FEW`` values take the list path; it must be the vectorized sampler draw for
    draw (same values, generator left in the same state) at every size, so its distribution is
    the one the PMF test checks and fixed-seed answers do not depend on the path."""
    t, s = scale.numerator, scale.denominator
    for size in range(laplace._FEW + 3):
        few = np.random.Generator(np.random.PCG64(size))
        many = np.random.Generator(np.random.PCG64(size))
        listed = [x for _ in range(60) for x in laplace._few_discrete_laplace(t, s, size, few)]
        arrays = [
            x for _ in range(60) for x in laplace._many_discrete_laplace(t, s, size, many).tolist()
        ]
        assert listed == arrays
        assert few.integers(0, 2**62) == many.integers(0, 2**62)
    assert sample_discrete_laplace(scale, 1, _rng(9)).tolist() == [
        laplace._few_discrete_laplace(t, s, 1, _rng(9))[0]
    ]
    # One value (an ungrouped COUNT or SUM) takes the scalar path: the same draws again.
    one, many = _rng(11), _rng(11)
    scalars = [laplace._one_discrete_laplace(t, s, one) for _ in range(400)]
    assert scalars == [laplace._many_discrete_laplace(t, s, 1, many).item() for _ in range(400)]
    assert one.integers(0, 2**62) == many.integers(0, 2**62)


@pytest.mark.parametrize(("numerator", "denominator"), [(3, 7), (2**61, 2**62)])
def test_few_bernoullis_are_the_vectorized_bernoullis(numerator: int, denominator: int) -> None:
    """Bernoulli(exp(-n/d)) on lists draws as the vectorized one does (``d = 2**62``: the
    overflow-safe path)."""
    few = np.random.Generator(np.random.PCG64(4))
    many = np.random.Generator(np.random.PCG64(4))
    numerators = [numerator, 0, numerator // 2, numerator]
    listed = [
        x
        for _ in range(200)
        for x in laplace._few_bernoulli_exp_neg_fraction(numerators, denominator, few)
    ]
    array = np.array(numerators, dtype=np.int64)
    arrays = [
        bool(x)
        for _ in range(200)
        for x in laplace._bernoulli_exp_neg_fraction(array, denominator, many)
    ]
    assert listed == arrays and len(set(listed)) == 2
    assert few.integers(0, 2**62) == many.integers(0, 2**62)
    one, many = np.random.Generator(np.random.PCG64(5)), np.random.Generator(np.random.PCG64(5))
    for value in numerators * 100:
        single = np.array([value], dtype=np.int64)
        assert laplace._one_bernoulli_exp_neg_fraction(value, denominator, one) == bool(
            laplace._bernoulli_exp_neg_fraction(single, denominator, many)[0]
        )
        assert laplace._one_bernoulli_exp_neg_one(one) == bool(
            laplace._bernoulli_exp_neg_one(1, many)[0]
        )
    assert one.integers(0, 2**62) == many.integers(0, 2**62)
