"""Tests for the sparse vector technique (``dpsql.mechanisms.svt``): fixed seeds, stated tolerances.

Privacy is tested on neighbouring answer vectors (each answer moves by at most the sensitivity):
a pattern of five answers moving up by one and five moving down (``"up_down"``) and the database
patterns of StatDP (Ding et al., "Detecting Violations of Differential Privacy", CCS 2018), which
were designed around the SVT variants of Lyu, Su and Li (VLDB 2017). For every output event ``E``
the test bounds ``P[E | D] / P[E | D']`` from below with one-sided Clopper–Pearson bounds and flags
the mechanism when that lower bound exceeds ``e^ε``.

Confidence: each bound has level ``EVENT_LEVEL``; a check uses at most ``MAX_EVENTS`` (event,
direction) pairs from a family fixed in advance (output patterns, value cut-points in
``[-VALUE_WINDOW, VALUE_WINDOW]``), so an ε-DP mechanism is flagged with probability at most
``2 · EVENT_LEVEL · MAX_EVENTS = 1e-3`` (Bonferroni). The runs of one configuration share one
noise draw across patterns, inputs and broken twins (common random numbers): each estimate keeps
its marginal distribution, which is all the Bonferroni bound needs, and it saves sampling time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import ParameterError, PrivacyError
from dpsql.mechanisms import svt
from dpsql.mechanisms.laplace import sample_discrete_laplace
from dpsql.mechanisms.svt import (
    SparseResult,
    SparseVector,
    SparseVectorHaltedError,
    above_threshold,
    above_threshold_release,
    numeric_sparse,
    numeric_sparse_release,
    plan,
    sparse,
    sparse_release,
)

EPSILON = 2.0
THRESHOLD = 1
RUNS = 200_000
EVENT_LEVEL = 1e-8
MAX_EVENTS = 50_000
VALUE_WINDOW = 60
MIN_COUNT = 5

PATTERNS: dict[str, tuple[list[float], list[float]]] = {
    "up_down": ([1] * 5 + [0] * 5, [2] * 5 + [-1] * 5),
    "one_above": ([1] * 10, [2] + [1] * 9),
    "one_below": ([1] * 10, [0] + [1] * 9),
    "one_above_rest_below": ([1] * 10, [2] + [0] * 9),
    "one_below_rest_above": ([1] * 10, [0] + [2] * 9),
    "half_half": ([1] * 10, [0] * 5 + [2] * 5),
    "all_above": ([1] * 10, [2] * 10),
    "all_below": ([1] * 10, [0] * 10),
    "x_shape": ([1] * 5 + [0] * 5, [0] * 5 + [1] * 5),
}
QUERIES = 10
MONOTONE_PATTERNS = ("one_above", "one_below", "all_above", "all_below")


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


# --- the privacy-loss estimator -------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """``R`` runs of a mechanism: ``(R, slots)`` ⊤ indices (``-1`` unused), optional values."""

    indices: np.ndarray
    values: np.ndarray | None = None


@dataclass(frozen=True)
class LossEstimate:
    """Largest lower confidence bound and largest point estimate of ``ln P[E|D]/P[E|D']``."""

    lower: float
    point: float
    events: int


def _keys(indices: np.ndarray) -> np.ndarray:
    """One int64 per run encoding its whole sequence of ⊤ indices."""
    radix = QUERIES + 1
    return ((indices + 1) * radix ** np.arange(indices.shape[1], dtype=np.int64)).sum(axis=1)


def _event_counts(inverse: np.ndarray, patterns: int, values: np.ndarray | None) -> np.ndarray:
    """Counts per event: each output pattern, and with values also ``value <= u`` / ``>= u``."""
    if values is None:
        return np.bincount(inverse, minlength=patterns)
    width = 2 * VALUE_WINDOW + 3
    cell = np.clip(values, -VALUE_WINDOW - 1, VALUE_WINDOW + 1) + VALUE_WINDOW + 1
    grid = np.bincount(inverse * width + cell, minlength=patterns * width).reshape(patterns, width)
    at_most = np.cumsum(grid, axis=1)[:, 1:-1]
    at_least = np.cumsum(grid[:, ::-1], axis=1)[:, ::-1][:, 1:-1]
    return np.concatenate([grid.sum(axis=1), at_most.ravel(), at_least.ravel()])


def privacy_loss(first: Output, second: Output) -> LossEstimate:
    """Max over events and both directions of the Clopper–Pearson lower bound on the log ratio."""
    runs = first.indices.shape[0]
    keys = np.concatenate([_keys(first.indices), _keys(second.indices)])
    unique, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.ravel()
    value_columns = (
        (None, None) if first.values is None else (first.values[:, 0], second.values[:, 0])
    )
    counts_a = _event_counts(inverse[:runs], unique.size, value_columns[0])
    counts_b = _event_counts(inverse[runs:], unique.size, value_columns[1])
    x = np.concatenate([counts_a, counts_b]).astype(np.float64)
    y = np.concatenate([counts_b, counts_a]).astype(np.float64)
    point = np.log(np.maximum(x, 0.5) / np.maximum(y, 0.5))
    events = int(np.count_nonzero(x >= MIN_COUNT))
    # The lower bound never exceeds the point estimate x/y, so only events whose point estimate
    # is above ε/2 can matter; computing bounds for those alone saves time.
    keep = (x >= MIN_COUNT) & (point > EPSILON / 2)
    x, y = x[keep], y[keep]
    if x.size == 0:
        return LossEstimate(lower=-math.inf, point=float(point.max()), events=events)
    lower_x = stats.beta.ppf(EVENT_LEVEL, x, runs - x + 1)
    upper_y = np.where(
        y < runs, stats.beta.ppf(1 - EVENT_LEVEL, y + 1, np.maximum(runs - y, 1)), 1.0
    )
    return LossEstimate(
        lower=float(np.max(np.log(lower_x / upper_y))), point=float(point.max()), events=events
    )


Mechanism = Callable[[list[float]], Output]


def worst_pattern(mechanism: Mechanism, patterns: tuple[str, ...]) -> dict[str, LossEstimate]:
    """The estimate for each named pattern (both neighbours run on the same shared noise)."""
    estimates = {name: privacy_loss(*(mechanism(a) for a in PATTERNS[name])) for name in patterns}
    assert sum(e.events for e in estimates.values()) <= MAX_EVENTS
    return estimates


def flagged(estimates: dict[str, LossEstimate], epsilon: float) -> list[str]:
    return [name for name, estimate in estimates.items() if estimate.lower > epsilon]


# --- shared noise and the mechanisms under test ---------------------------------------------------


@dataclass(frozen=True, eq=False)
class Setup:
    plan: svt.SparseVectorPlan
    noise: svt._Noise
    extra_thresholds: np.ndarray


@functools.cache
def above_threshold_setup() -> Setup:
    """``RUNS`` runs of AboveThreshold's noise (the real sampler and scales), plus per-query
    thresholds at the same scale for the twins that redraw the threshold."""
    svt_plan = plan(epsilon=EPSILON, c=1)
    rng = _rng(2024)
    noise = svt._draw_noise(svt_plan, RUNS, QUERIES, rng)
    extra = sample_discrete_laplace(svt_plan.threshold_scale, (RUNS, QUERIES), rng)
    return Setup(svt_plan, noise, extra)


@functools.cache
def setup_for(c: int, numeric: bool, monotone: bool, seed: int) -> Setup:
    svt_plan = plan(epsilon=EPSILON, c=c, numeric=numeric, monotone=monotone)
    noise = svt._draw_noise(svt_plan, RUNS, QUERIES, _rng(seed))
    return Setup(svt_plan, noise, np.empty((0, 0)))


def real(setup: Setup, threshold: float = THRESHOLD) -> Mechanism:
    """The implementation's own code path on the shared noise."""

    def run(answers: list[float]) -> Output:
        array, base = svt._prepare(answers, threshold, setup.plan)
        indices, values = svt._apply_noise(array, base, setup.noise)
        return Output(indices, values)

    return run


def _base(setup: Setup, answers: list[float]) -> np.ndarray:
    return svt._prepare(answers, THRESHOLD, setup.plan)[1]


def twin_no_threshold_noise(setup: Setup) -> Mechanism:
    """BROKEN: compares against the bare threshold T (Lyu–Su–Li: not private for any ε)."""

    def run(answers: list[float]) -> Output:
        noisy = _base(setup, answers) + setup.noise.queries
        zeros = np.zeros_like(setup.noise.thresholds)
        return Output(svt._first_crossings(noisy, zeros))

    return run


def twin_releases_noisy_value(setup: Setup) -> Mechanism:
    """BROKEN: also outputs ``f_i + ν_i`` of the ⊤ query, the very noise used in the comparison."""

    def run(answers: list[float]) -> Output:
        noisy = _base(setup, answers) + setup.noise.queries
        indices = svt._first_crossings(noisy, setup.noise.thresholds)
        taken = np.take_along_axis(noisy, np.maximum(indices, 0), axis=1) + THRESHOLD
        return Output(indices, np.where(indices >= 0, taken, 0))

    return run


def twin_no_cutoff(setup: Setup) -> Mechanism:
    """BROKEN: priced as c = 1 but keeps answering after the first ⊤ (threshold redrawn)."""

    def run(answers: list[float]) -> Output:
        noisy = _base(setup, answers) + setup.noise.queries
        return Output(svt._first_crossings(noisy, setup.extra_thresholds))

    return run


def twin_threshold_per_query(setup: Setup) -> Mechanism:
    """BROKEN: draws a fresh threshold noise for every query instead of once per epoch."""

    def run(answers: list[float]) -> Output:
        noisy = _base(setup, answers) + setup.noise.queries - setup.extra_thresholds
        zeros = np.zeros_like(setup.noise.thresholds)
        return Output(svt._first_crossings(noisy, zeros))

    return run


TWINS = {
    "no_threshold_noise": twin_no_threshold_noise,
    "releases_noisy_value": twin_releases_noisy_value,
    "no_cutoff": twin_no_cutoff,
    "threshold_per_query": twin_threshold_per_query,
}


# --- privacy: the real mechanisms pass, the broken twins are flagged ------------------------------


def test_above_threshold_privacy_loss_within_epsilon() -> None:
    """AboveThreshold (ε = 2, discrete noise): no event's lower bound exceeds ε on any pattern."""
    estimates = worst_pattern(real(above_threshold_setup()), tuple(PATTERNS))
    assert flagged(estimates, EPSILON) == [], estimates
    assert max(e.point for e in estimates.values()) > 0.8 * EPSILON  # the patterns are near-tight


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_broken_twin_is_flagged(twin: str) -> None:
    """The same check on the same noise flags every known non-private variant on some pattern."""
    estimates = worst_pattern(TWINS[twin](above_threshold_setup()), tuple(PATTERNS))
    assert flagged(estimates, EPSILON), estimates


def test_float_answers_privacy_loss_within_epsilon() -> None:
    """Real-valued answers (exact ``floor(f − T)`` + integer noise), neighbours 0.9 apart."""
    run = real(above_threshold_setup(), threshold=0.75)
    pairs = {
        "floats": ([0.6] * 5 + [-0.3] * 5, [1.5] * 5 + [-1.2] * 5),
        "floats_x": ([1.7] * 5 + [0.2] * 5, [0.8] * 5 + [1.1] * 5),
    }
    for name, (first, second) in pairs.items():
        estimate = privacy_loss(run(first), run(second))
        assert estimate.lower <= EPSILON, (name, estimate)


def test_sparse_with_two_answers_privacy_loss_within_epsilon() -> None:
    estimates = worst_pattern(real(setup_for(2, False, False, 7)), tuple(PATTERNS))
    assert flagged(estimates, EPSILON) == [], estimates


def test_numeric_sparse_privacy_loss_within_epsilon() -> None:
    """NumericSparse (c = 1, 8/9 : 1/9 split): events on the index *and* the released value."""
    estimates = worst_pattern(real(setup_for(1, True, False, 8)), tuple(PATTERNS))
    assert flagged(estimates, EPSILON) == [], estimates


def test_monotone_noise_private_only_for_monotone_queries() -> None:
    """Lap(σ) query noise passes on monotone neighbours and is flagged on non-monotone ones."""
    run = real(setup_for(1, False, True, 9))
    assert flagged(worst_pattern(run, MONOTONE_PATTERNS), EPSILON) == []
    assert flagged(worst_pattern(run, ("x_shape", "up_down")), EPSILON)


def test_continuous_mode_privacy_loss_within_epsilon() -> None:
    """Non-integer sensitivity (0.5): NumPy Laplace comparisons; answers scaled by 0.5."""
    svt_plan = plan(epsilon=EPSILON, c=1, sensitivity=0.5)
    assert not svt_plan.discrete
    noise = svt._draw_noise(svt_plan, RUNS, QUERIES, _rng(10))
    setup = Setup(svt_plan, noise, np.empty((0, 0)))
    run = real(setup, threshold=0.5)

    def halved(answers: list[float]) -> Output:
        return run([0.5 * a for a in answers])

    estimates = worst_pattern(halved, ("up_down", "x_shape", "half_half", "all_below"))
    assert flagged(estimates, EPSILON) == [], estimates


# --- exact output distribution of AboveThreshold with discrete noise ------------------------------


def _at_most(x: np.ndarray, scale: float) -> np.ndarray:
    """``P(X <= x)`` for discrete Laplace; ``P(X <= x) = p^-x/(1+p)`` for ``x < 0``."""
    p = math.exp(-1.0 / scale)
    return np.where(x >= 0, 1.0 - p ** (x + 1.0) / (1.0 + p), p ** (-x.astype(float)) / (1.0 + p))


def exact_above_threshold(
    base: np.ndarray, threshold_scale: float | None, query_scale: float
) -> np.ndarray:
    """``P(first ⊤ at t)`` for t < k and ``P(no ⊤)`` last, summing over the threshold noise τ.

    ``threshold_scale=None`` means no threshold noise (τ = 0). ``base`` is ``floor(f − T)``.
    """
    if threshold_scale is None:
        taus, weights = np.array([0]), np.array([1.0])
    else:
        span = int(60 * threshold_scale) + int(np.abs(base).max()) + 1
        taus = np.arange(-span, span + 1)
        p = math.exp(-1.0 / threshold_scale)
        weights = (1 - p) / (1 + p) * p ** np.abs(taus).astype(float)
    below = _at_most(taus[:, None] - base[None, :] - 1, query_scale)
    prefix = np.concatenate([np.ones((taus.size, 1)), np.cumprod(below, axis=1)], axis=1)
    first = prefix[:, :-1] * (1.0 - below)
    return weights @ np.concatenate([first, prefix[:, -1:]], axis=1)


def _exact_loss(svt_plan: svt.SparseVectorPlan, pattern: str, threshold_noise: bool) -> float:
    probabilities = []
    for answers in PATTERNS[pattern]:
        base = svt._prepare(answers, THRESHOLD, svt_plan)[1]
        scale = float(svt_plan.threshold_scale) if threshold_noise else None
        probabilities.append(exact_above_threshold(base, scale, float(svt_plan.query_scale)))
    first, second = probabilities
    assert abs(first.sum() - 1) < 1e-9 and abs(second.sum() - 1) < 1e-9
    return float(np.max(np.abs(np.log(first / second))))


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_exact_privacy_loss_of_the_discrete_design(epsilon: float) -> None:
    """Theorem 1 with discrete noise, checked exactly: every output's log ratio is <= ε."""
    svt_plan = plan(epsilon=epsilon, c=1)
    monotone = plan(epsilon=epsilon, c=1, monotone=True)
    for pattern in PATTERNS:
        assert _exact_loss(svt_plan, pattern, True) <= epsilon * (1 + 1e-9), pattern
    for pattern in MONOTONE_PATTERNS:
        assert _exact_loss(monotone, pattern, True) <= epsilon * (1 + 1e-9), pattern
    assert _exact_loss(monotone, "x_shape", True) > epsilon
    assert _exact_loss(svt_plan, "all_below", False) > 2 * epsilon  # no threshold noise


def _chi_square_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * counts.sum()
    pooled = expected >= 5
    observed = np.append(counts[pooled], counts[~pooled].sum())
    expected = np.append(expected[pooled], expected[~pooled].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    return float(stats.chisquare(observed, expected).pvalue)


def _exact_for(svt_plan: svt.SparseVectorPlan, answers: list[float]) -> np.ndarray:
    base = svt._prepare(answers, THRESHOLD, svt_plan)[1]
    return exact_above_threshold(base, float(svt_plan.threshold_scale), float(svt_plan.query_scale))


def test_batch_output_distribution_is_exact() -> None:
    """The vectorized runs match the exact distribution (chi-square p > 1e-4, TV < 0.005)."""
    setup = above_threshold_setup()
    for answers in PATTERNS["up_down"]:
        indices = real(setup)(answers).indices[:, 0]
        counts = np.bincount(np.where(indices < 0, QUERIES, indices), minlength=QUERIES + 1)
        exact = _exact_for(setup.plan, answers)
        assert _chi_square_p(counts, exact) > 1e-4
        assert 0.5 * np.abs(counts / RUNS - exact).sum() < 0.005


def test_interactive_output_distribution_is_exact() -> None:
    """``SparseVector.ask`` one query at a time has the same distribution (2000 runs, p > 1e-4)."""
    answers = PATTERNS["up_down"][1]
    rng = _rng(31)
    counts = np.zeros(QUERIES + 1, dtype=np.int64)
    for _ in range(2000):
        vector = SparseVector(threshold=THRESHOLD, epsilon=EPSILON, c=1, rng=rng)
        outcome = next((i for i, a in enumerate(answers) if vector.ask(a)), QUERIES)
        counts[outcome] += 1
    assert _chi_square_p(counts, _exact_for(plan(epsilon=EPSILON, c=1), answers)) > 1e-4


# --- accuracy: Theorems 2 and 4 -------------------------------------------------------------------


def _mistakes(
    indices: np.ndarray, answers: np.ndarray, threshold: float, alpha: float
) -> np.ndarray:
    """Per run: some ⊤ on an answer below ``T − α``, or some ⊥ on an answer above ``T + α``.

    A run answers ⊥ to every query it scanned that is not one of its ⊤ answers; it scans up to
    its c-th ⊤ (or to the end).
    """
    runs = indices.shape[0]
    k = answers.size
    positive = np.zeros((runs, k), dtype=bool)
    rows, slots = np.nonzero(indices >= 0)
    positive[rows, indices[rows, slots]] = True
    halted = (indices >= 0).all(axis=1)
    last = np.where(halted, indices[:, -1], k - 1)
    scanned = np.arange(k)[None, :] <= last[:, None]
    wrong_top = positive & (answers < threshold - alpha)[None, :]
    wrong_bottom = scanned & ~positive & (answers > threshold + alpha)[None, :]
    return (wrong_top | wrong_bottom).any(axis=1)


def _accuracy_runs(
    svt_plan: svt.SparseVectorPlan, answers: np.ndarray, threshold: float, runs: int, seed: int
) -> tuple[np.ndarray, np.ndarray | None]:
    array, base = svt._prepare(answers, threshold, svt_plan)
    noise = svt._draw_noise(svt_plan, runs, array.size, _rng(seed))
    return svt._apply_noise(array, base, noise)


BETA = 0.05


def test_above_threshold_accuracy_theorem_2() -> None:
    """k = 500, all but the last query just below T − α: mistake rate <= β over 2000 runs.

    Teeth: the same checker at α/6 (queries moved to T ± α/6) sees mistakes in > β of the runs.
    """
    svt_plan = plan(epsilon=1.0, c=1)
    k, threshold = 500, 1000.0
    alpha = svt_plan.alpha(k, BETA)
    assert math.isclose(alpha, svt_plan.comparison_alpha(k, BETA))
    for bound, expect_ok in ((alpha, True), (alpha / 6, False)):
        answers = np.full(k, math.floor(threshold - bound) - 1, dtype=np.int64)
        answers[-1] = math.ceil(threshold + bound) + 1
        indices, _ = _accuracy_runs(svt_plan, answers, threshold, 2000, 41)
        rate = _mistakes(indices, answers, threshold, bound).mean()
        assert bool(rate <= BETA) is expect_ok, (bound, rate)


@pytest.mark.parametrize(("c", "delta"), [(3, 0.0), (150, 1e-3)])
def test_sparse_accuracy_theorem_4(c: int, delta: float) -> None:
    """At most c queries at or above T − α (here exactly c, spread out): mistake rate <= β."""
    svt_plan = plan(epsilon=1.0, c=c, delta=delta)
    assert svt_plan.composition == ("advanced" if delta else "basic")
    k, threshold = 3 * c + 300, 0.0
    alpha = svt_plan.alpha(k, BETA)
    answers = np.full(k, math.floor(threshold - alpha) - 1, dtype=np.int64)
    answers[np.linspace(0, k - 1, c).astype(int)] = math.ceil(threshold + alpha) + 1
    indices, _ = _accuracy_runs(svt_plan, answers, threshold, 500, 43)
    assert _mistakes(indices, answers, threshold, alpha).mean() <= BETA


def test_numeric_sparse_accuracy() -> None:
    """Released values are within α of the answers, jointly with the ⊤/⊥ guarantee, in >= 1 − β."""
    svt_plan = plan(epsilon=1.0, c=2, numeric=True)
    k, threshold = 200, 5000.0
    alpha = svt_plan.alpha(k, BETA)
    assert alpha == max(svt_plan.comparison_alpha(k, BETA), svt_plan.value_alpha(BETA))
    answers = np.full(k, math.floor(threshold - alpha) - 1, dtype=np.int64)
    answers[[50, 150]] = math.ceil(threshold + alpha) + 1
    indices, values = _accuracy_runs(svt_plan, answers, threshold, 2000, 47)
    errors = np.where(indices >= 0, np.abs(values - answers[np.maximum(indices, 0)]), 0)
    failed = _mistakes(indices, answers, threshold, alpha) | (errors > alpha).any(axis=1)
    assert failed.mean() <= BETA


def test_alpha_is_theorem_2_and_4() -> None:
    """Continuous noise: exactly Kamath's Theorems 2 and 4; discrete: plus the tail factor term."""
    k, beta, c, epsilon, delta = 1000, 0.1, 5, 0.7, 1e-6
    theorem_2 = 8 * (math.log(k) + math.log(2 / beta)) / epsilon
    continuous = plan(epsilon=epsilon, c=1, sensitivity=0.5)
    assert math.isclose(continuous.alpha(k, beta), 0.5 * theorem_2, rel_tol=1e-6)
    theorem_4 = 8 * c * (math.log(k) + math.log(2 * c / beta)) / epsilon
    assert math.isclose(
        plan(epsilon=epsilon, c=c, sensitivity=0.5).alpha(k, beta), 0.5 * theorem_4, rel_tol=1e-6
    )
    discrete = plan(epsilon=epsilon, c=1)
    kappa = 2 / (1 + math.exp(-1 / float(discrete.threshold_scale)))
    expected = theorem_2 + 2 * float(discrete.query_scale) * math.log(kappa)
    assert math.isclose(discrete.alpha(k, beta), expected, rel_tol=1e-6)
    c = 400
    advanced = plan(epsilon=epsilon, c=c, delta=delta, sensitivity=0.5)
    assert advanced.composition == "advanced"
    theorem_4_delta = (
        math.sqrt(512 * c * math.log(1 / delta)) * (math.log(k) + math.log(2 * c / beta)) / epsilon
    )
    assert math.isclose(advanced.alpha(k, beta), 0.5 * theorem_4_delta, rel_tol=1e-6)


# --- plan: scales and proven cost -----------------------------------------------------------------


def test_plan_scales_follow_kamath_algorithm_2() -> None:
    assert plan(epsilon=0.5, c=3).threshold_scale == Fraction(12)  # 2c/ε
    assert plan(epsilon=0.5, c=3).query_scale == Fraction(24)  # 4c/ε
    assert plan(epsilon=0.5, c=3, sensitivity=2).query_scale == Fraction(48)
    assert plan(epsilon=0.5, c=3, monotone=True).query_scale == Fraction(12)
    numeric = plan(epsilon=1.0, c=2, numeric=True)
    assert numeric.threshold_scale == Fraction(9, 2)  # 2c/(8ε/9)
    assert 18 <= numeric.value_scale < 18 * (1 + 1e-8)  # c/(ε/9), ε/9 rounded down in binary
    assert (numeric.epsilon, numeric.delta) == (1.0, 0.0)


def test_plan_uses_advanced_composition_only_where_proven_and_smaller() -> None:
    small_c = plan(epsilon=1.0, c=10, delta=1e-6)  # c < 8 ln(1/δ): the pure scale is smaller
    assert (small_c.composition, small_c.delta) == ("basic", 0.0)
    assert small_c.threshold_scale == Fraction(20)
    large_c = plan(epsilon=1.0, c=1000, delta=1e-6)
    assert (large_c.composition, large_c.delta) == ("advanced", 1e-6)
    sigma = float(large_c.threshold_scale)
    assert sigma >= math.sqrt(32 * 1000 * math.log(1e6))  # Kamath's σ (Alg. 2), rounded up
    step = 2 / sigma  # each epoch is AboveThreshold with ε0 = 2Δ/σ
    composed = math.sqrt(2 * 1000 * math.log(1e6)) * step + 1000 * step * math.expm1(step)
    assert composed <= 1.0
    unproven = plan(epsilon=200.0, c=1000, delta=1e-6)  # Theorem 3's bound fails at huge ε
    assert (unproven.composition, unproven.delta) == ("basic", 0.0)
    numeric = plan(epsilon=1.0, c=1000, delta=1e-6, numeric=True)
    assert numeric.delta == pytest.approx(1e-6)  # δ/2 comparisons + δ/2 values
    assert float(numeric.value_scale) < 1000 * 9  # advanced beats c/(ε/9)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0, "c": 1},
        {"epsilon": -1.0, "c": 1},
        {"epsilon": float("nan"), "c": 1},
        {"epsilon": float("inf"), "c": 1},
        {"epsilon": 1.0, "c": 0},
        {"epsilon": 1.0, "c": 1.5},
        {"epsilon": 1.0, "c": True},
        {"epsilon": 1.0, "c": 1, "delta": 1.0},
        {"epsilon": 1.0, "c": 1, "delta": -0.1},
        {"epsilon": 1.0, "c": 1, "sensitivity": 0},
        {"epsilon": 1.0, "c": 1, "numeric": True, "value_share": 1.0},
        {"epsilon": 1.0, "c": 1, "numeric": True, "sensitivity": 0.5},
    ],
)
def test_plan_rejects_bad_parameters(kwargs: dict[str, object]) -> None:
    with pytest.raises(ParameterError):
        plan(**kwargs)


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(ParameterError, match="epsilon"):
        sparse([1, 2], threshold=1, epsilon=-1, c=1)
    with pytest.raises(ParameterError, match="threshold"):
        above_threshold([1, 2], threshold=float("nan"), epsilon=1)
    with pytest.raises(ParameterError, match="beta"):
        sparse_release([1], threshold=0, epsilon=1, c=1, beta=0)
    with pytest.raises(ParameterError, match="finite"):
        above_threshold([1.0, float("inf")], threshold=0, epsilon=1)
    with pytest.raises(ParameterError, match="integer"):
        numeric_sparse([1.0, 2.0], threshold=0, epsilon=1, c=1)
    with pytest.raises(ParameterError, match="one-dimensional"):
        sparse([[1, 2]], threshold=0, epsilon=1, c=1)
    with pytest.raises(ParameterError, match="numeric"):
        sparse(["a"], threshold=0, epsilon=1, c=1)


# --- exact integer comparisons --------------------------------------------------------------------


def test_floor_difference_is_exact() -> None:
    """``floor(f − T)`` equals the exact rational computation, including rounding-edge cases."""
    rng = _rng(51)
    answers = np.concatenate(
        [
            rng.normal(0, 10, 5000),
            rng.normal(0, 1e15, 1000),
            np.array([-1e-20, 1e-20, -0.0, 0.75, 0.7500000000000001, 2.0**53 + 2, -(2.0**55)]),
            np.nextafter(np.arange(-5.0, 5.0) + 0.75, np.inf),
            np.nextafter(np.arange(-5.0, 5.0) + 0.75, -np.inf),
        ]
    )
    for threshold in (0.0, 0.75, -3.1, 1e-17, 12345.678, 2.0**51 + 0.5):
        got = svt._floor_difference(answers, threshold)
        expected = [math.floor(Fraction(float(a)) - Fraction(threshold)) for a in answers]
        assert got.tolist() == expected, threshold
    integers = np.array([-3, 0, 7, 2**40], dtype=np.int64)
    assert svt._floor_difference(integers, 0.25).tolist() == [-4, -1, 6, 2**40 - 1]


# --- behaviour of the batch functions -------------------------------------------------------------


def test_sparse_halts_after_c_and_reports_cost() -> None:
    answers = np.full(1000, 10_000, dtype=np.int64)
    result = sparse_release(answers, threshold=0, epsilon=1.0, c=4, rng=_rng(1))
    assert isinstance(result, SparseResult)
    assert result.indices == (0, 1, 2, 3) and result.halted and result.queries_scanned == 4
    assert (result.epsilon, result.delta, result.values) == (1.0, 0.0, None)
    assert result.alpha == result.plan.alpha(4, 0.05)
    none = sparse_release(np.zeros(50, dtype=np.int64), threshold=10_000, epsilon=1.0, c=4)
    assert none.indices == () and not none.halted and none.queries_scanned == 50


def test_wrappers_and_types() -> None:
    answers = [0, 0, 50_000, 0, 60_000, 70_000]
    assert above_threshold(answers, threshold=10_000, epsilon=1.0, rng=_rng(2)) == 2
    assert above_threshold([0, 1], threshold=10_000, epsilon=1.0, rng=_rng(2)) is None
    assert above_threshold([], threshold=0, epsilon=1.0) is None
    assert sparse(answers, threshold=10_000, epsilon=1.0, c=2, rng=_rng(3)) == [2, 4]
    pairs = numeric_sparse(answers, threshold=10_000, epsilon=1.0, c=5, rng=_rng(4))
    assert [i for i, _ in pairs] == [2, 4, 5]
    assert all(type(v) is int and abs(v - answers[i]) < 500 for i, v in pairs)
    release = numeric_sparse_release(answers, threshold=10_000, epsilon=1.0, c=5, rng=_rng(4))
    assert list(zip(release.indices, release.values, strict=True)) == pairs  # same seed
    assert above_threshold_release(answers, threshold=10_000, epsilon=1.0).indices == (2,)
    assert sparse([5, 9_000, 3], threshold=1_000.5, epsilon=1.0, c=1, sensitivity=0.5) == [1]


def test_seeded_runs_are_reproducible() -> None:
    answers = np.arange(-20, 20)
    first = sparse(answers, threshold=5, epsilon=0.5, c=3, rng=_rng(9))
    assert first == sparse(answers, threshold=5, epsilon=0.5, c=3, rng=_rng(9))


# --- the interactive form -------------------------------------------------------------------------


def test_interactive_halts_and_refuses() -> None:
    vector = SparseVector(threshold=100, epsilon=1.0, c=2, rng=_rng(61))
    assert vector.cost == (1.0, 0.0)
    assert [vector.ask(a) for a in (0, 5_000, 3, 7_000)] == [False, True, False, True]
    assert vector.halted and vector.positives == 2 and vector.queries_seen == 4
    with pytest.raises(SparseVectorHaltedError) as error:
        vector.ask(0)
    assert isinstance(error.value, PrivacyError)
    assert vector.queries_seen == 4
    assert vector.accuracy(0.05) == vector.plan.alpha(4, 0.05)


def test_interactive_numeric_and_adaptive_use() -> None:
    """Each query may depend on earlier answers; values are integers near the answer."""
    vector = SparseVector(threshold=1_000, epsilon=1.0, c=3, numeric=True, rng=_rng(62))
    answer, seen = 0, []
    while not vector.halted:
        above, value = vector.ask(answer)
        seen.append((above, value))
        answer = 0 if above else answer + 400  # adaptively chosen next query
    tops = [(a, v) for a, v in seen if a]
    assert len(tops) == 3 and all(type(v) is int for _, v in tops)
    assert all(v is None for a, v in seen if not a)


def test_interactive_rejects_bad_answers_without_consuming() -> None:
    vector = SparseVector(threshold=0, epsilon=1.0, c=1, numeric=True, rng=_rng(63))
    for bad in (1.5, float("nan"), "3", True):
        with pytest.raises(ParameterError):
            vector.ask(bad)
    assert vector.queries_seen == 0
    real_valued = SparseVector(threshold=0.5, epsilon=1.0, c=1, rng=_rng(64))
    assert real_valued.ask(-1e6) is False and real_valued.ask(1e6) is True
    with pytest.raises(ParameterError):
        SparseVector(threshold=0, epsilon=1.0, c=1, numeric=True, sensitivity=0.5)


def test_default_generator_is_secure_and_works() -> None:
    vector = SparseVector(threshold=0, epsilon=1.0, c=1)
    assert vector.ask(10**6) is True
    assert sparse([0, 10**6], threshold=1000, epsilon=1.0, c=1) == [1]


def test_absurd_cutoffs_are_refused_and_noise_is_drawn_for_the_epochs_a_run_can_use() -> None:
    """c = 10**7 was 1.2 GB of noise drawn up front; now it is refused, and a run over k
    queries draws at most min(c, k) epoch thresholds and values (same outputs: a run never
    reaches epoch k + 1)."""
    with pytest.raises(ParameterError, match="at most 1,000,000"):
        svt.plan(epsilon=1.0, c=10**7)
    numeric = svt.plan(epsilon=1.0, c=svt.MAX_CUTOFF, numeric=True)
    noise = svt._draw_noise(numeric, 1, 5, np.random.default_rng(1))
    assert noise.thresholds.shape == (1, 5) and noise.values.shape == (1, 5)
    released = svt.numeric_sparse_release(
        [10**9] * 5, threshold=0, epsilon=1.0, c=svt.MAX_CUTOFF, rng=np.random.default_rng(2)
    )
    assert released.indices == (0, 1, 2, 3, 4) and not released.halted
