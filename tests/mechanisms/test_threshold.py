"""Tests for dpsql.mechanisms.threshold: exact τ/δ, release rule, pure-DP false positives, privacy.

Privacy tests compare the output distribution of one key on neighbouring inputs. Every key's output
depends only on its own count and independent noise, so one release over many keys with the same
count yields many independent samples of that key's output distribution ("copies"). The statistic is
the largest lower confidence bound (z = 4, Haldane-corrected log ratio of bin frequencies) of the
privacy loss over output bins; it must not exceed ε for the mechanism and must exceed it for the
deliberately broken twins.
"""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import ParameterError
from dpsql.mechanisms import threshold
from dpsql.mechanisms.hashing import hash_keys
from dpsql.mechanisms.laplace import noise_scale, sample_discrete_laplace
from dpsql.mechanisms.threshold import HashDomain, IntegerDomain, ThresholdRule

Z = 4.0


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def _decimal_tail(n: int, scale: Fraction, digits: int = 50) -> Decimal:
    """``P(Z >= n)`` by summing the discrete Laplace PMF term by term in 50-digit decimals."""
    getcontext().prec = digits
    a = (Decimal(-scale.denominator) / Decimal(scale.numerator)).exp()
    norm = (1 - a) / (1 + a)
    total, z = Decimal(0), n
    while True:
        term = norm * a ** abs(z)
        total += term
        if z > 0 and term < Decimal(10) ** (-digits + 5):
            return total
        z += 1


def _loss_lower_bound(sample_a: np.ndarray, sample_b: np.ndarray, min_count: int = 300) -> float:
    """max over bins of |log(p_a/p_b)| - Z·se, over bins where either side has ``min_count``."""
    bins = np.union1d(sample_a, sample_b)
    counts_a = np.array([np.count_nonzero(sample_a == b) for b in bins], dtype=float)
    counts_b = np.array([np.count_nonzero(sample_b == b) for b in bins], dtype=float)
    keep = np.maximum(counts_a, counts_b) >= min_count
    ca, cb = counts_a[keep] + 0.5, counts_b[keep] + 0.5
    log_ratio = np.abs(np.log(ca / sample_a.size) - np.log(cb / sample_b.size))
    se = np.sqrt(1 / ca + 1 / cb)
    return float(np.max(log_ratio - Z * se))


ABSENT = np.iinfo(np.int64).min


def _outcomes(out: threshold.ThresholdRelease, keys: np.ndarray) -> np.ndarray:
    """Per key: its released value, or ABSENT."""
    values = dict(zip(out.keys.tolist(), out.values.tolist(), strict=True))
    return np.array([values.get(k, ABSENT) for k in keys.tolist()], dtype=np.int64)


# --- τ and δ, computed by the same rule for the exact discrete noise --------------------------


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(5, 2), noise_scale(3, 0.7)])
@pytest.mark.parametrize("n", [-4, 0, 1, 7, 30])
def test_noise_tail_matches_direct_pmf_sum(scale: Fraction, n: int) -> None:
    exact = _decimal_tail(n, scale)
    assert threshold.noise_at_least(n, scale) == pytest.approx(float(exact), rel=1e-12)


def test_rule_probability_is_the_probability_of_the_release_predicate() -> None:
    scale, tau, count = Fraction(3, 2), 9, 4
    rule = ThresholdRule(tau, scale)
    z = np.arange(-300, 300)
    a = math.exp(-1 / float(scale))
    pmf = (1 - a) / (1 + a) * a ** np.abs(z)
    assert rule.release_probability(count) == pytest.approx(
        math.fsum(pmf[rule.released(count + z)]), rel=1e-12
    )
    assert rule.released(np.array([tau - 1, tau])).tolist() == [False, True]


@pytest.mark.parametrize(
    ("epsilon", "groups", "rows", "tau"),
    [(1.0, 1, 1, 12), (0.5, 3, 2, 40), (0.1, 10, 5, 2000), (2.0, 1, 7, 9)],
)
def test_delta_is_exact_for_discrete_noise_with_bounds(
    epsilon: float, groups: int, rows: int, tau: int
) -> None:
    delta = threshold.delta_for_tau(
        tau=tau, epsilon=epsilon, max_groups_per_unit=groups, max_rows_per_group=rows
    )
    new_key = _decimal_tail(tau - rows, noise_scale(groups * rows, epsilon))
    exact = float(1 - (1 - new_key) ** groups)
    assert exact <= delta <= exact * (1 + 1e-10)


@pytest.mark.parametrize(
    ("epsilon", "delta", "groups", "rows"),
    [(1.0, 1e-6, 1, 1), (0.3, 1e-9, 4, 3), (5.0, 0.01, 2, 1), (1.0, 1e-300, 1, 1)],
)
def test_tau_for_delta_is_the_smallest_tau_meeting_delta(
    epsilon: float, delta: float, groups: int, rows: int
) -> None:
    bounds = {"epsilon": epsilon, "max_groups_per_unit": groups, "max_rows_per_group": rows}
    tau = threshold.tau_for_delta(delta=delta, **bounds)
    assert threshold.delta_for_tau(tau=tau, **bounds) <= delta
    assert threshold.delta_for_tau(tau=tau - 1, **bounds) > delta
    for other in (tau - 3, tau, tau + 5):
        assert (
            threshold.tau_for_delta(delta=threshold.delta_for_tau(tau=other, **bounds), **bounds)
            == other
        )


def test_tau_for_false_positives_round_trip() -> None:
    bounds = {"epsilon": 0.5, "max_groups_per_unit": 2, "max_rows_per_group": 3}
    for domain in (HashDomain(), IntegerDomain(-(10**9), 10**9)):
        tau = threshold.tau_for_false_positives(
            domain=domain, expected_false_positives=0.1, **bounds
        )
        assert threshold.expected_false_positives_for_tau(tau=tau, domain=domain, **bounds) <= 0.1
        assert (
            threshold.expected_false_positives_for_tau(tau=tau - 1, domain=domain, **bounds) > 0.1
        )


# --- approximate DP --------------------------------------------------------------------------


def test_key_exactly_at_tau_counts_the_mass_at_tau() -> None:
    out = threshold.release(
        np.arange(40_000),
        np.full(40_000, 15),
        epsilon=1.0,
        delta=1e-6,
        max_groups_per_unit=1,
        max_rows_per_group=1,
        rng=_rng(1),
    )
    assert out.tau == 15
    a = math.exp(-1.0)
    frequency = out.keys.size / 40_000
    se = math.sqrt(0.25 / 40_000)
    assert abs(frequency - 1 / (1 + a)) < Z * se  # P(Z >= 0): "at least τ" is released
    assert frequency - a / (1 + a) > 20 * se  # not P(Z > 0)
    assert out.values.min() == 15


def test_low_counts_are_rarely_released() -> None:
    out = threshold.release(
        np.arange(200_000),
        np.ones(200_000, dtype=np.int64),
        epsilon=1.0,
        delta=1e-5,
        max_groups_per_unit=1,
        max_rows_per_group=1,
        rng=_rng(2),
    )
    assert out.keys.size <= 8  # expected at most 200_000 * 1e-5 = 2
    assert out.delta <= 1e-5


def test_keys_come_out_in_random_order_with_string_keys() -> None:
    keys = np.array([f"url-{i:05d}" for i in range(2000)], dtype=object)
    out = threshold.release(
        keys,
        np.full(2000, 1000),
        epsilon=1.0,
        delta=1e-6,
        max_groups_per_unit=1,
        max_rows_per_group=1,
        rng=_rng(3),
    )
    assert sorted(out.keys.tolist()) == keys.tolist()
    ranks = np.array([int(k[4:]) for k in out.keys])
    assert abs(stats.spearmanr(ranks, np.arange(ranks.size)).statistic) < 0.1


def _broken_off_by_one(
    keys, counts, *, epsilon, delta, max_groups_per_unit, max_rows_per_group, rng
):
    """Twin: τ computed as if a key at exactly τ were not released (ignores the mass at τ)."""
    scale = noise_scale(max_groups_per_unit * max_rows_per_group, epsilon)
    tau = threshold.tau_for_delta(
        epsilon=epsilon,
        delta=delta,
        max_groups_per_unit=max_groups_per_unit,
        max_rows_per_group=max_rows_per_group,
    )
    noisy = counts + sample_discrete_laplace(scale, counts.size, rng)
    kept = ThresholdRule(tau - 1, scale).released(noisy)
    return threshold.ThresholdRelease(
        keys=keys[kept],
        values=noisy[kept],
        tau=tau - 1,
        scale=scale,
        epsilon=epsilon,
        delta=delta,
        max_groups_per_unit=max_groups_per_unit,
        max_rows_per_group=max_rows_per_group,
        key_kind="int",
        half_width=0,
        confidence=0.95,
    )


def _broken_continuous(
    keys, counts, *, epsilon, delta, max_groups_per_unit, max_rows_per_group, rng
):
    """Twin: τ from the continuous Laplace tail ``exp(-n/t)/2`` but discrete noise is added."""
    scale = noise_scale(max_groups_per_unit * max_rows_per_group, epsilon)
    tau = max_rows_per_group + math.ceil(float(scale) * math.log(1 / (2 * delta)))
    noisy = counts + sample_discrete_laplace(scale, counts.size, rng)
    kept = noisy >= tau
    return threshold.ThresholdRelease(
        keys=keys[kept],
        values=noisy[kept],
        tau=tau,
        scale=scale,
        epsilon=epsilon,
        delta=delta,
        max_groups_per_unit=max_groups_per_unit,
        max_rows_per_group=max_rows_per_group,
        key_kind="int",
        half_width=0,
        confidence=0.95,
    )


# δ slightly above the continuous tail at n = 3: the discrete rule needs n = 4, the twins use 3.
TIGHT_DELTA = 0.5 * math.exp(-3.0) * 1.001


@pytest.mark.parametrize(
    ("mechanism", "private"),
    [(threshold.release, True), (_broken_off_by_one, False), (_broken_continuous, False)],
)
def test_new_key_release_probability_is_at_most_delta(mechanism, private: bool) -> None:
    """Neighbours: a key with count L∞ present vs absent; absent means never released."""
    trials, rows = 60_000, 2
    out = mechanism(
        np.arange(trials),
        np.full(trials, rows),
        epsilon=1.0,
        delta=TIGHT_DELTA,
        max_groups_per_unit=1,
        max_rows_per_group=rows,
        rng=_rng(4),
    )
    frequency = out.keys.size / trials
    upper_noise = Z * math.sqrt(TIGHT_DELTA * (1 - TIGHT_DELTA) / trials)
    assert (frequency <= TIGHT_DELTA + upper_noise) == private


def test_delta_is_the_release_probability_not_just_a_bound() -> None:
    bounds = {"epsilon": 1.0, "max_groups_per_unit": 1, "max_rows_per_group": 3}
    delta = threshold.delta_for_tau(tau=7, **bounds)
    trials = 60_000
    out = threshold.release(
        np.arange(trials), np.full(trials, 3), delta=delta, rng=_rng(5), **bounds
    )
    assert out.tau == 7
    assert abs(out.keys.size / trials - delta) < Z * math.sqrt(delta / trials)


def _broken_half_scale(
    keys, counts, *, epsilon, delta, max_groups_per_unit, max_rows_per_group, rng
):
    """Twin: noise for sensitivity 1 although a unit may add ``max_rows_per_group`` rows."""
    return threshold.release(
        keys,
        counts,
        epsilon=epsilon,
        delta=delta,
        max_groups_per_unit=max_groups_per_unit,
        max_rows_per_group=1,
        rng=rng,
    )


@pytest.mark.parametrize(
    ("mechanism", "private"), [(threshold.release, True), (_broken_half_scale, False)]
)
def test_values_of_shared_keys_are_epsilon_private(mechanism, private: bool) -> None:
    """Neighbours: a key with count 40 vs 42 (a unit adds L∞ = 2 rows); ε = 1, τ = 29."""
    loss = _shared_key_loss(mechanism, ((40, 6), (42, 7)), delta=1e-6, groups=1, rows=2)
    assert (loss <= 1.0) == private


def _shared_key_loss(mechanism, neighbours, *, delta: float, groups: int, rows: int) -> float:
    """Empirical privacy loss (lower bound) of 40,000 keys' outcomes at ε = 1 between the
    neighbouring counts ``neighbours`` (``(count, seed)`` pairs)."""
    trials = 40_000
    samples = []
    for count, seed in neighbours:
        keys = np.arange(trials)
        out = mechanism(
            keys,
            np.full(trials, count),
            epsilon=1.0,
            delta=delta,
            max_groups_per_unit=groups,
            max_rows_per_group=rows,
            rng=_rng(seed),
        )
        samples.append(_outcomes(out, keys))
    return _loss_lower_bound(*samples)


# --- pure DP over a domain -------------------------------------------------------------------


def _pure(keys, counts, rng, **extra):
    return threshold.release(
        keys,
        counts,
        epsilon=1.0,
        delta=0.0,
        max_groups_per_unit=1,
        max_rows_per_group=1,
        rng=rng,
        **extra,
    )


def test_pure_output_matches_noising_every_entry() -> None:
    """d = 40, k = 4, τ = 2: false positives, their keys and values vs brute force on all d."""
    d, tau, runs = 40, 2, 1500
    keys = np.array([3, 11, 25, 38])
    counts = np.array([1, 2, 5, 9])
    domain = IntegerDomain(0, d - 1)
    rng = _rng(8)
    false_counts, false_keys, false_values = [], [], []
    for _ in range(runs):
        out = _pure(keys, counts, rng, domain=domain, tau=tau)
        zero = ~np.isin(out.keys, keys)
        false_counts.append(np.count_nonzero(zero))
        false_keys.append(out.keys[zero])
        false_values.append(out.values[zero])
    scale = noise_scale(1, 1.0)
    full = np.zeros(d, dtype=np.int64)
    full[keys] = counts
    brute = full + sample_discrete_laplace(scale, (runs, d), _rng(9))
    zero_columns = np.setdiff1d(np.arange(d), keys)
    brute_zero = brute[:, zero_columns]
    brute_counts = np.count_nonzero(brute_zero >= tau, axis=1)

    p0 = threshold.noise_at_least(tau, scale)
    binomial = stats.binom(d - keys.size, p0)
    edges = np.array([0, 1, 2, 3, 4, 5, 6, 8, 100])
    expected = np.diff(binomial.cdf(edges - 1)) * runs
    expected[-1] += runs - expected.sum()
    for sample in (np.array(false_counts), brute_counts):
        observed = np.histogram(sample, bins=edges)[0]
        assert stats.chisquare(observed, expected).pvalue > 1e-3
    per_key = np.bincount(np.concatenate(false_keys), minlength=d)[zero_columns]
    assert stats.chisquare(per_key).pvalue > 1e-3  # uniform choice among the zero keys
    ours = np.concatenate(false_values)
    assert ours.min() >= tau
    a = math.exp(-1 / float(scale))
    tail_law = np.append((1 - a) * a ** np.arange(5), a**5)  # tau .. tau+4, then >= tau+5
    for values in (ours, brute_zero[brute_zero >= tau]):
        observed = np.append(np.bincount(values - tau, minlength=5)[:5], 0)
        observed[-1] = values.size - observed.sum()
        assert stats.chisquare(observed, tail_law * values.size).pvalue > 1e-3


def test_pure_hash_domain_samples_false_positives_among_2_to_the_64() -> None:
    bounds = {"epsilon": 1.0, "max_groups_per_unit": 1, "max_rows_per_group": 1}
    tau = threshold.tau_for_false_positives(
        domain=HashDomain(), expected_false_positives=4.0, **bounds
    )
    expected = threshold.expected_false_positives_for_tau(tau=tau, domain=HashDomain(), **bounds)
    keys = np.array(["alpha", "beta", "gamma"], dtype=object)
    rng = _rng(10)
    sizes = []
    for _ in range(400):
        out = _pure(keys, np.array([1000, 0, 2]), rng, domain=HashDomain(), seed=99, tau=tau)
        sizes.append(out.keys.size - int(hash_keys(["alpha"], 99)[0] in out.keys))
    assert out.keys.dtype == np.uint64 and out.key_kind == "hash" and out.seed == 99
    assert abs(np.mean(sizes) - expected) < Z * math.sqrt(expected / 400)


def test_binomial_sampler_handles_tiny_probabilities_and_huge_trials() -> None:
    rng = _rng(11)
    draws = [threshold._binomial(2**64, 2.0**-62, rng) for _ in range(2000)]
    assert abs(np.mean(draws) - 4.0) < Z * math.sqrt(4.0 / 2000)
    assert abs(np.var(draws) - 4.0) < 0.6
    moderate = np.array([threshold._binomial(50, 0.3, rng) for _ in range(4000)])
    observed = np.bincount(moderate, minlength=51)[5:26]
    expected = stats.binom(50, 0.3).pmf(np.arange(5, 26)) * 4000
    assert stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3


def _broken_no_false_positives(keys, counts, rng, **extra):
    """Twin: thresholds only the non-zero keys (approximate-DP rule) but claims pure DP."""
    scale = noise_scale(1, 1.0)
    noisy = counts + sample_discrete_laplace(scale, counts.size, rng)
    kept = noisy >= extra["tau"]
    return threshold.ThresholdRelease(
        keys=keys[kept],
        values=noisy[kept],
        tau=extra["tau"],
        scale=scale,
        epsilon=1.0,
        delta=0.0,
        max_groups_per_unit=1,
        max_rows_per_group=1,
        key_kind="int",
        half_width=0,
        confidence=0.95,
    )


@pytest.mark.parametrize(
    ("mechanism", "private"), [(_pure, True), (_broken_no_false_positives, False)]
)
def test_pure_release_is_epsilon_private_for_present_vs_absent(mechanism, private: bool) -> None:
    """Neighbours: a key with count 1 vs count 0 (absent), ε = 1, τ = 2; one run, many copies."""
    copies = 60_000
    keys = np.arange(2 * copies)
    counts = np.concatenate([np.ones(copies, dtype=np.int64), np.zeros(copies, dtype=np.int64)])
    present = counts > 0
    out = mechanism(
        keys[present] if mechanism is _broken_no_false_positives else keys,
        counts[present] if mechanism is _broken_no_false_positives else counts,
        _rng(12),
        domain=IntegerDomain(0, 2 * copies - 1),
        tau=2,
    )
    outcome = _outcomes(out, keys)
    assert (_loss_lower_bound(outcome[:copies], outcome[copies:]) <= 1.0) == private


# --- validation and serialization -----------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"delta": float("nan")}, "delta"),
        ({"delta": 0.0}, "domain"),
        ({"domain": HashDomain()}, "domain"),
        ({"max_groups_per_unit": 0}, "max_groups_per_unit"),
        ({"max_rows_per_group": 1.5}, "max_rows_per_group"),
        ({"counts": [1, -1]}, "counts"),
        ({"counts": [1.5, 2]}, "counts"),
        ({"keys": ["a", "a"]}, "distinct"),
        ({"keys": [1.0, 2.0]}, "keys"),
        ({"delta": 0.0, "domain": IntegerDomain(0, 10), "tau": 0}, "tau"),
        ({"delta": 0.0, "domain": HashDomain(), "tau": 5}, "too low"),
    ],
)
def test_invalid_arguments_raise_parameter_error(changes: dict, message: str) -> None:
    arguments = {
        "keys": ["a", "b"],
        "counts": [1, 2],
        "epsilon": 1.0,
        "delta": 1e-6,
        "max_groups_per_unit": 1,
        "max_rows_per_group": 1,
    }
    if (
        "domain" in changes
        and "keys" not in changes
        and isinstance(changes["domain"], IntegerDomain)
    ):
        arguments["keys"] = [1, 2]
    arguments.update(changes)
    keys, counts = arguments.pop("keys"), arguments.pop("counts")
    with pytest.raises(ParameterError, match=message):
        threshold.release(keys, counts, rng=_rng(0), **arguments)


def test_integer_domain_drops_keys_outside_and_offsets_correctly() -> None:
    out = _pure(
        np.array([-5, 7, 12, 10**12]),
        np.array([500, 500, 500, 500]),
        _rng(13),
        domain=IntegerDomain(-10, 10),
        tau=30,
    )
    assert sorted(out.keys.tolist()) == [-5, 7]


@pytest.mark.parametrize("kind", ["str", "int", "hash"])
def test_serialization_round_trip(kind: str) -> None:
    keys = {"str": np.array(["ä/€", "b", "c"], dtype=object), "int": np.array([5, -7, 9])}
    if kind == "hash":
        out = _pure(
            np.array(["x", "y"], dtype=object),
            np.array([100, 3]),
            _rng(14),
            domain=HashDomain(),
            expected_false_positives=2.0,
        )
    else:
        out = threshold.release(
            keys[kind],
            np.array([100, 200, 1]),
            epsilon=1.0,
            delta=1e-6,
            max_groups_per_unit=1,
            max_rows_per_group=1,
            rng=_rng(14),
        )
    back = threshold.ThresholdRelease.from_bytes(out.to_bytes())
    assert back.keys.tolist() == out.keys.tolist() and back.keys.dtype == out.keys.dtype
    assert back.values.tolist() == out.values.tolist()
    for field in ("tau", "scale", "epsilon", "delta", "key_kind", "domain", "seed", "half_width"):
        assert getattr(back, field) == getattr(out, field)
    with pytest.raises(ParameterError):
        threshold.ThresholdRelease.from_bytes(out.to_bytes()[:-1] if kind != "str" else b"junk")


# --- max_rows_per_unit: the same sensitivity rule as every other GROUP BY -----------------------


def test_max_rows_per_unit_caps_the_sensitivity_and_the_new_keys() -> None:
    """8 groups × 8 rows but 8 rows per unit: Δ = 8 (not 64), new keys ≤ 8 with count ≤ 8."""
    capped = {"epsilon": 0.3, "max_groups_per_unit": 8, "max_rows_per_group": 8}
    scale = threshold.noise_scale_for(**capped, max_rows_per_unit=8)
    assert scale == noise_scale(8, 0.3)
    assert threshold.noise_scale_for(**capped) == noise_scale(64, 0.3)
    out = threshold.release(
        np.arange(3), np.full(3, 1000), delta=1e-5, max_rows_per_unit=8, rng=_rng(1), **capped
    )
    assert out.scale == scale and out.max_rows_per_unit == 8
    assert out.tau == threshold.tau_for_delta(delta=1e-5, max_rows_per_unit=8, **capped)
    # Two rows per unit: a unit creates at most 2 keys, each of count at most 2.
    assert threshold.delta_for_tau(
        tau=30, epsilon=1.0, max_groups_per_unit=5, max_rows_per_group=5, max_rows_per_unit=2
    ) == threshold.delta_for_tau(
        tau=30, epsilon=1.0, max_groups_per_unit=2, max_rows_per_group=2, max_rows_per_unit=2
    )
    again = threshold.ThresholdRelease.from_bytes(out.to_bytes())
    assert again.max_rows_per_unit == 8


def _rows_per_unit(cap: int):
    """``threshold.release`` with ``max_rows_per_unit = cap``: 3 is the policy's below, 1 a broken
    twin that noises for one row although a unit may add 3."""

    def mechanism(keys, counts, **bounds):
        return threshold.release(keys, counts, max_rows_per_unit=cap, **bounds)

    return mechanism


@pytest.mark.parametrize(
    ("mechanism", "private"), [(_rows_per_unit(3), True), (_rows_per_unit(1), False)]
)
def test_values_are_epsilon_private_with_a_rows_per_unit_cap(mechanism, private: bool) -> None:
    """Neighbours: a key with count 40 vs 43 (a unit adds its max_rows_per_unit = 3 rows to one
    of its 4 × 4 possible cells); ε = 1 with Δ = min(16, 3) = 3."""
    loss = _shared_key_loss(mechanism, ((40, 8), (43, 9)), delta=1e-3, groups=4, rows=4)
    assert (loss <= 1.0) == private
