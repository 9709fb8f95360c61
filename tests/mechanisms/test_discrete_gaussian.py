"""Tests for dpsql.mechanisms.discrete_gaussian: exact sampler, exact tails, zCDP conversion."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpsql.errors import ParameterError
from dpsql.mechanisms import discrete_gaussian as dg


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def _brute_tail(n: int, sigma_squared: Fraction) -> mpmath.mpf:
    """``P(Z >= n)`` summing the PMF term by term over ±(60σ + 60) in 40-digit arithmetic."""
    mpmath.mp.dps = 40
    s2 = mpmath.mpf(sigma_squared.numerator) / sigma_squared.denominator
    reach = int(60 * float(sigma_squared) ** 0.5) + 60
    weights = {z: mpmath.exp(-mpmath.mpf(z) ** 2 / (2 * s2)) for z in range(-reach, reach + 1)}
    norm = mpmath.fsum(weights.values())
    return mpmath.fsum(w for z, w in weights.items() if z >= n) / norm


@pytest.mark.parametrize("sigma_squared", [Fraction(1, 4), Fraction(9, 4), Fraction(100)])
@pytest.mark.parametrize("n", [-7, -1, 0, 1, 3, 12, 40])
def test_tail_is_an_upper_bound_within_1e9_of_the_brute_force_sum(sigma_squared, n) -> None:
    exact = _brute_tail(n, sigma_squared)
    computed = dg.tail_at_least(n, sigma_squared)
    if exact < mpmath.mpf("1e-300"):
        return
    assert computed >= exact * (1 - mpmath.mpf("1e-14"))
    assert computed <= exact * (1 + mpmath.mpf("1e-9")) + mpmath.mpf("1e-15")


@pytest.mark.parametrize("sigma_squared", [Fraction(9, 4), Fraction(2000, 16)])
def test_samples_follow_the_discrete_gaussian_pmf(sigma_squared) -> None:
    """Chi-square goodness of fit of 200,000 exact samples against the PMF (float64 suffices for
    a fit; the exact tails are checked above)."""
    draws = dg.sample_discrete_gaussian(sigma_squared, 200_000, _rng(1))
    values, observed = np.unique(draws, return_counts=True)
    s2 = float(sigma_squared)
    support = np.arange(-int(60 * s2**0.5) - 60, int(60 * s2**0.5) + 61)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * s2))
    pmf = weights[values - support[0]] / weights.sum()
    expected = pmf * draws.size
    keep = expected >= 20
    rest_observed = observed[~keep].sum()
    rest_expected = draws.size - expected[keep].sum()
    chi = np.concatenate([observed[keep], [rest_observed]])
    exp = np.concatenate([expected[keep], [rest_expected]])
    assert stats.chisquare(chi, exp * chi.sum() / exp.sum()).pvalue > 1e-4
    assert abs(draws.mean()) < 4 * float(sigma_squared) ** 0.5 / np.sqrt(draws.size)


def test_interval_half_width_is_the_smallest_covering_one() -> None:
    sigma_squared = Fraction(49)
    k = dg.interval_half_width(sigma_squared, 0.95)
    inside = lambda j: 1 - 2 * _brute_tail(j + 1, sigma_squared)  # noqa: E731
    assert inside(k) >= 0.95 > inside(k - 1)


@pytest.mark.parametrize(
    ("rho", "epsilon"), [(0.5, 1.0), (0.02, 1.0), (0.005, 0.5), (1 / 46, 1.0), (2.0, 5.0)]
)
def test_zcdp_conversion_matches_dp_accounting(rho: float, epsilon: float) -> None:
    """Against Google's dp-accounting (its RDP-to-DP conversion, CKS Prop. 12) on a fine grid of
    orders of the zCDP curve ``αρ``: the same bound within 0.1% (ours uses a coarser grid of
    orders, which can only over-state δ, and never the library's KL-divergence shortcut)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_delta

    orders = 1 + np.geomspace(1e-4, 1e5, 20_000)
    library, _ = compute_delta(orders, orders * rho, epsilon)
    ours = dg.zcdp_delta(rho, epsilon)
    assert abs(ours / library - 1) <= 1e-3


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ParameterError, match="sigma_squared"):
        dg.sample_discrete_gaussian(0.5, 3)  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="sigma_squared"):
        dg.tail_at_least(1, Fraction(2**31))
    with pytest.raises(ParameterError, match="rho"):
        dg.zcdp_delta(0.0, 1.0)


@pytest.mark.parametrize("sigma_squared", [Fraction(9, 4), Fraction(40_000)])
def test_vectorised_tails_agree_with_the_scalar_ones(sigma_squared) -> None:
    starts = np.array([1, 5, 30, 200, 900, 17])
    scalar = np.array([dg.tail_at_least(int(n), sigma_squared) for n in starts])
    np.testing.assert_allclose(dg.tails_at_least(starts, sigma_squared), scalar, rtol=1e-9)
