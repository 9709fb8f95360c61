"""Tests for online private multiplicative weights (``dpsql.mechanisms.pmw``): fixed seeds, stated
tolerances. Privacy: Clopper–Pearson lower bounds on the log-ratio of output events on
neighbouring histograms (``privacy_loss.max_log_ratio_lower_bound``, level 1e-3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql.errors import ParameterError
from dpsql.mechanisms.pmw import OnlinePMW, PMWState, StreamExhaustedError, warm_prior
from dpsql.mechanisms.svt import plan
from tests.mechanisms.privacy_loss import max_log_ratio_lower_bound

EPSILON = 1.0


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


# --- privacy ----------------------------------------------------------------------------------


class _UpdatesOnTheTrueAnswer(OnlinePMW):
    """BROKEN: the multiplicative-weights step moves towards the true count, not the noisy one."""

    def _update(self, mask: np.ndarray, measured: float, synthetic: float) -> None:
        super()._update(mask, float(self._histogram[mask].sum()), synthetic)


CELL = np.array([True, False])


def _inferred_step_target(pmw: OnlinePMW, first: float, second: float) -> int:
    """What a synthetic answer after one update reveals about the value the update moved to:
    ``s2 = n̂·σ(step)`` with ``step = (target − s1)/(2n̂)`` over two cells (post-processing)."""
    share = min(max(second / pmw.n_hat, 1e-12), 1 - 1e-12)
    return round(2 * pmw.n_hat * math.log(share / (1 - share)) + first)


def _transcripts(kind: type[OnlinePMW], histogram: list[int], runs: int, seed: int) -> list:
    """Per run: whether the first query updated, and what the synthetic answer then reveals."""
    rng = _rng(seed)
    outputs = []
    for _ in range(runs):
        pmw = kind(np.array(histogram), epsilon=EPSILON, updates=2, threshold=5, rng=rng)
        before = pmw.synthetic_answer(CELL)
        first = pmw.ask(CELL)
        revealed = None
        if first.updated and pmw.n_hat > 0:
            revealed = _inferred_step_target(pmw, before, pmw.synthetic_answer(CELL))
        outputs.append((first.updated, revealed))
    return outputs


NEIGHBOURS = ([300, 100], [301, 100])


def test_pmw_privacy_loss_within_epsilon() -> None:
    """The transcript (and what the synthetic answer reveals) stays within ε (600 runs each)."""
    first = _transcripts(OnlinePMW, NEIGHBOURS[0], 600, 1)
    second = _transcripts(OnlinePMW, NEIGHBOURS[1], 600, 2)
    assert max_log_ratio_lower_bound(first, second) <= EPSILON


def test_pmw_updating_on_the_true_answer_is_flagged() -> None:
    """The twin's synthetic answer reveals the true count exactly: loss far above ε."""
    first = _transcripts(_UpdatesOnTheTrueAnswer, NEIGHBOURS[0], 600, 1)
    second = _transcripts(_UpdatesOnTheTrueAnswer, NEIGHBOURS[1], 600, 2)
    assert max_log_ratio_lower_bound(first, second) > 3 * EPSILON


def test_a_resumed_stream_keeps_its_noisy_threshold() -> None:
    """Persisting and resuming (another process) continues the same SVT epoch and the same p̂:
    the noisy threshold, ⊤ count, queries seen, n̂ and every synthetic answer are unchanged. A
    stream that redrew the threshold on resume would be Sparse with the threshold redrawn per
    query (test_svt's ``threshold_per_query`` twin, flagged there)."""
    histogram = _rng(0).integers(0, 200, 50)
    rng = _rng(9)
    pmw = OnlinePMW(histogram, epsilon=EPSILON, updates=20, threshold=40, rng=rng)
    for k in range(1, 50, 3):
        pmw.ask(np.arange(50) < k)
        state = PMWState.from_bytes(pmw.state().to_bytes())
        resumed = OnlinePMW(
            histogram, epsilon=EPSILON, updates=20, threshold=40, rng=rng, state=state
        )
        assert resumed._sparse.snapshot() == pmw._sparse.snapshot()
        assert (resumed.n_hat, resumed.updates_left) == (pmw.n_hat, pmw.updates_left)
        np.testing.assert_array_equal(resumed.synthetic, pmw.synthetic)
        pmw = resumed
    assert pmw.queries_seen == 17 and pmw.updates_left < 20


# --- accuracy -----------------------------------------------------------------------------------


def _ranges(rng: np.random.Generator, cells: int, queries: int) -> list[np.ndarray]:
    ends = np.sort(rng.integers(0, cells + 1, (queries, 2)), axis=1)
    index = np.arange(cells)
    return [(index >= lo) & (index < hi) for lo, hi in ends]


def test_every_answer_is_within_alpha_with_the_stated_probability() -> None:
    """20 streams × 200 range queries over a skewed 256-cell histogram (n ≈ 60,000): every stream
    answers every query within ``alpha(200, β = 0.05)`` (expected failures ≤ 1 of 20; 2 allowed)."""
    rng = _rng(5)
    histogram = rng.zipf(1.6, 60_000).clip(max=256) - 1
    histogram = np.bincount(histogram, minlength=256)
    failures = 0
    for seed in range(20):
        run_rng = _rng(100 + seed)
        pmw = OnlinePMW(histogram, epsilon=EPSILON, updates=30, threshold=1500, rng=run_rng)
        alpha = pmw.alpha(200, 0.05)
        worst = 0.0
        for mask in _ranges(run_rng, 256, 200):
            if pmw.halted:
                break
            worst = max(worst, abs(pmw.ask(mask).value - int(histogram[mask].sum())))
        failures += worst > alpha
    assert failures <= 2


def test_the_synthetic_distribution_learns() -> None:
    """On a skewed 256-cell histogram of 100,000 rows, 400 random ranges at ε = 1 (c = 40,
    T = 1200, 20 replay sweeps) spend fewer than 30 updates, and the mean absolute error is below
    320 rows, where per-query discrete Laplace at ε/400 has a mean absolute error of 400."""
    rng = _rng(6)
    histogram = np.bincount(rng.zipf(1.4, 100_000).clip(max=256) - 1, minlength=256)
    pmw = OnlinePMW(histogram, epsilon=EPSILON, updates=40, threshold=1200, replays=20, rng=_rng(7))
    errors, updates = [], 0
    for mask in _ranges(rng, 256, 400):
        answer = pmw.ask(mask)
        updates += answer.updated
        errors.append(abs(answer.value - int(histogram[mask].sum())))
    assert updates < 30
    assert np.mean(errors) < 320


def test_stream_exhaustion() -> None:
    """With a threshold far below the noise every query updates: c answers, then a refusal."""
    histogram = np.array([1000, 0, 0, 0])
    pmw = OnlinePMW(histogram, epsilon=EPSILON, updates=3, threshold=-10_000, rng=_rng(1))
    answers = [pmw.ask(np.array([True, False, False, False])) for _ in range(3)]
    assert [a.updated for a in answers] == [True, True, True]
    assert [a.updates_left for a in answers] == [2, 1, 0]
    assert pmw.halted
    with pytest.raises(StreamExhaustedError, match="spent its 3 updates"):
        pmw.ask(np.array([True, False, False, False]))


def test_cost_and_bounds_are_stated() -> None:
    pmw = OnlinePMW(np.arange(100), epsilon=2.0, updates=10, threshold=100, rng=_rng(1))
    assert pmw.cost == pytest.approx((2.0, 0.0))
    advanced = OnlinePMW(
        np.arange(100), epsilon=2.0, delta=1e-6, updates=2000, threshold=100, rng=_rng(1)
    )
    assert advanced.cost[1] > 0 and advanced.cost[0] <= 2.0 + 1e-12
    assert pmw.alpha(1000) > pmw.alpha(10) > pmw.threshold
    # The MW bound: infinite when the threshold is within the noise, finite otherwise.
    assert pmw.updates_bound(100) == math.inf
    big = OnlinePMW(np.full(16, 10**6), epsilon=1.0, updates=10, threshold=50_000, rng=_rng(1))
    assert 0 < big.updates_bound(100) < math.inf


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"histogram": np.array([1.5, 2.0])}, "histogram"),
        ({"histogram": np.array([-1, 2])}, "histogram"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"updates": 0}, "c must be"),
        ({"sensitivity": 0}, "sensitivity"),
        ({"count_share": 1.0}, "count_share"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, object], message: str) -> None:
    arguments = {
        "histogram": np.array([1, 2]),
        "epsilon": 1.0,
        "updates": 2,
        "threshold": 10,
        **kwargs,
    }
    with pytest.raises(ParameterError, match=message):
        OnlinePMW(**arguments)  # type: ignore[arg-type]


def test_queries_are_masks_over_the_domain() -> None:
    pmw = OnlinePMW(np.array([1, 2, 3]), epsilon=1.0, updates=2, threshold=10, rng=_rng(1))
    with pytest.raises(ParameterError, match="boolean mask over the 3"):
        pmw.ask(np.array([1, 0, 1]))


def test_the_projection_step_matches_the_measured_answer() -> None:
    """``update="project"``: after an update the synthetic answer of that query is the released
    noisy count (the KL projection), and p̂ stays a distribution."""
    histogram = np.array([5000, 100, 100, 4800])
    pmw = OnlinePMW(
        histogram, epsilon=EPSILON, updates=3, threshold=100, update="project", rng=_rng(2)
    )
    mask = np.array([True, False, False, False])
    answer = pmw.ask(mask)
    assert answer.updated
    assert pmw.synthetic_answer(mask) == pytest.approx(answer.value, rel=1e-9)
    assert pmw.synthetic.sum() == pytest.approx(pmw.n_hat)
    with pytest.raises(ParameterError, match="update must be"):
        OnlinePMW(histogram, epsilon=1.0, updates=2, threshold=1, update="gradient")


# --- warm start -----------------------------------------------------------------------------------


class _WarmStartFromTheData(OnlinePMW):
    """BROKEN: the warm start is the exact histogram (no noisy tree)."""

    def _warm_start(self) -> tuple[np.ndarray, float]:
        exact = self._histogram.astype(np.float64)
        return exact / exact.sum(), float(exact.sum())


def _warm_transcripts(kind: type[OnlinePMW], histogram: list[int], runs: int, seed: int) -> list:
    """Per run: the first synthetic answer (what the warm start reveals, rounded, clipped to a
    window around the neighbours' counts) and whether the first query updated."""
    rng = _rng(seed)
    outputs = []
    for _ in range(runs):
        pmw = kind(
            np.array(histogram), epsilon=EPSILON, updates=2, threshold=5, warm_share=0.5, rng=rng
        )
        revealed = min(max(round(pmw.synthetic_answer(CELL)), 290), 312)
        outputs.append((revealed, pmw.ask(CELL).updated))
    return outputs


def test_a_warm_started_pmw_stays_within_epsilon() -> None:
    """Warm start (ε/2: a noisy tree) + online PMW (ε/2): the first synthetic answer and the
    transcript stay within ε on neighbours (600 runs each); the total cost is ε."""
    first = _warm_transcripts(OnlinePMW, NEIGHBOURS[0], 600, 3)
    second = _warm_transcripts(OnlinePMW, NEIGHBOURS[1], 600, 4)
    assert max_log_ratio_lower_bound(first, second) <= EPSILON
    pmw = OnlinePMW(np.arange(64), epsilon=2.0, updates=5, threshold=9, warm_share=0.8)
    assert pmw.cost == pytest.approx((2.0, 0.0)) and pmw.warm_epsilon == pytest.approx(1.6)
    assert pmw.count_epsilon == 0  # n̂ is the tree's total


def test_a_warm_start_from_the_exact_histogram_is_flagged() -> None:
    first = _warm_transcripts(_WarmStartFromTheData, NEIGHBOURS[0], 600, 3)
    second = _warm_transcripts(_WarmStartFromTheData, NEIGHBOURS[1], 600, 4)
    assert max_log_ratio_lower_bound(first, second) > 3 * EPSILON


def test_warm_prior_is_a_distribution_that_keeps_the_tree_s_block_totals() -> None:
    """Top-down non-negative rescaling: each block gets its parent's value split in proportion to
    the positive estimates of its children; the padding cells' mass is dropped."""
    leaves = np.array([4.0, -1.0, 2.0, 2.0, -3.0, -1.0, 0.0, 0.0, 8.0])
    # Blocks [4, -1, 2] -> 5, [2, -3, -1] -> -2 (nothing below it), [0, 0, 8] -> 8 (padding).
    prior = warm_prior(leaves, 3, 8)
    np.testing.assert_allclose(prior, [2 / 3, 0, 1 / 3, 0, 0, 0, 0, 0], rtol=1e-12)
    assert warm_prior(np.array([-1.0, -2.0, -3.0, -4.0]), 2, 4).tolist() == [0.25] * 4


def test_a_warm_start_answers_ranges_more_accurately() -> None:
    """On a concentrated 4,096-cell histogram of 200,000 rows, 300 random ranges at ε = 1 (the
    engine's default thresholds): a warm start (ε·0.8) answers all of them with a mean absolute
    error below 1/10 of the uniform start's (which runs out of updates), and every answer is
    still within the stated alpha (β = 0.05)."""
    rng = _rng(12)
    values = np.clip(rng.normal(1200, 150, 200_000), 0, 4095).astype(np.int64)
    histogram = np.bincount(values, minlength=4096)
    queries = _ranges(rng, 4096, 300)
    errors = {}
    for share in (0.0, 0.8):
        # The engine's default threshold: the comparisons' noise scale times ln(queries).
        comparisons = plan(epsilon=EPSILON * (1 - share if share else 0.95) * 8 / 9, c=40)
        threshold = float(comparisons.query_scale) * math.log(300)
        pmw = OnlinePMW(
            histogram,
            epsilon=EPSILON,
            updates=40,
            threshold=threshold,
            warm_share=share,
            rng=_rng(13),
        )
        alpha, found = pmw.alpha(300, 0.05), []
        for mask in queries:
            if pmw.halted:
                break
            found.append(abs(pmw.ask(mask).value - int(histogram[mask].sum())))
        assert max(found) <= alpha
        errors[share] = float(np.mean(found))
        answered = len(found)
    assert answered == 300  # the warm-started stream did not run out of updates
    assert errors[0.8] < errors[0.0] / 10
