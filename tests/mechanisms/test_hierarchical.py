"""Tests for the hierarchical histogram (``dpsql.mechanisms.hierarchical``): fixed seeds, stated
tolerances. Privacy: Clopper–Pearson lower bounds on the log-ratio of output events on
neighbouring inputs (``privacy_loss.max_log_ratio_lower_bound``, level 1e-3)."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql.errors import ParameterError
from dpsql.mechanisms.hierarchical import (
    HierarchicalHistogram,
    choose_branching,
    release_hierarchical,
)
from dpsql.mechanisms.laplace import noise_scale, sample_discrete_laplace
from tests.mechanisms.privacy_loss import max_log_ratio_lower_bound

EPSILON = 1.0


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def _levels(leaves: np.ndarray, branching: int) -> list[np.ndarray]:
    levels = [leaves]
    while levels[-1].size > 1:
        levels.append(levels[-1].reshape(-1, branching).sum(axis=1))
    return levels


# --- privacy ----------------------------------------------------------------------------------


def _path_outputs(tree_levels: list[np.ndarray]) -> list[tuple[int, int]]:
    """Per run: the root and the sum of the noisy counts on leaf 0's path (post-processing)."""
    root = tree_levels[-1][:, 0]
    path = sum(level[:, 0] for level in tree_levels)
    return list(zip(root.tolist(), np.clip(path, -60, 60).tolist(), strict=True))


def _real_runs(counts: np.ndarray, runs: int, seed: int) -> list[np.ndarray]:
    """``runs`` releases through the real code (one sampler call for all runs)."""
    rng = _rng(seed)
    trees = [
        release_hierarchical(counts, epsilon=EPSILON, branching=2, rng=rng) for _ in range(runs)
    ]
    return [np.stack([t.noisy[level] for t in trees]) for level in range(trees[0].height + 1)]


def _twin_exact_internal_nodes(counts: np.ndarray, runs: int, seed: int) -> list[np.ndarray]:
    """BROKEN: noise on the leaves only, internal nodes are exact counts."""
    rng = _rng(seed)
    exact = _levels(np.asarray(counts, dtype=np.int64), 2)
    scale = noise_scale(len(exact), EPSILON)
    leaves = exact[0] + sample_discrete_laplace(scale, (runs, exact[0].size), rng)
    return [leaves] + [np.tile(level, (runs, 1)) for level in exact[1:]]


NEIGHBOURS = (np.array([3, 1, 2, 0]), np.array([4, 1, 2, 0]))


def test_tree_privacy_loss_within_epsilon() -> None:
    """ε = 1 over 3 levels: no event on the root or the path sum exceeds ε (1,500 runs each)."""
    first = _path_outputs(_real_runs(NEIGHBOURS[0], 1500, 1))
    second = _path_outputs(_real_runs(NEIGHBOURS[1], 1500, 2))
    assert max_log_ratio_lower_bound(first, second) <= EPSILON
    roots = ([r for r, _ in first], [r for r, _ in second])
    assert max_log_ratio_lower_bound(*roots) <= EPSILON


def test_tree_without_noise_at_internal_nodes_is_flagged() -> None:
    first = _path_outputs(_twin_exact_internal_nodes(NEIGHBOURS[0], 4000, 1))
    second = _path_outputs(_twin_exact_internal_nodes(NEIGHBOURS[1], 4000, 2))
    assert max_log_ratio_lower_bound(first, second) > 3 * EPSILON


# --- consistency and weights --------------------------------------------------------------------


def _tree(cells: int, branching: int, seed: int) -> tuple[HierarchicalHistogram, np.ndarray]:
    counts = _rng(seed).integers(0, 50, cells)
    return release_hierarchical(
        counts, epsilon=EPSILON, branching=branching, rng=_rng(seed)
    ), counts


@pytest.mark.parametrize(("cells", "branching"), [(9, 3), (16, 4), (7, 2)])
def test_consistent_leaves_are_the_least_squares_estimate(cells: int, branching: int) -> None:
    """Hay et al. Thm 3: the two passes give the least-squares fit of leaves to all node counts."""
    tree, _ = _tree(cells, branching, 7)
    leaves = tree.noisy[0].size
    rows = [np.eye(leaves)]
    while rows[-1].shape[0] > 1:
        rows.append(rows[-1].reshape(-1, branching, leaves).sum(axis=1))
    design = np.vstack(rows)
    noisy = np.concatenate(tree.noisy).astype(float)
    expected, *_ = np.linalg.lstsq(design, noisy, rcond=None)
    np.testing.assert_allclose(tree.consistent(), expected, atol=1e-9)


def test_weights_are_the_derivatives_of_the_answer() -> None:
    tree, _ = _tree(9, 3, 11)
    weights = tree.weights(2, 7)
    base = tree.estimate(2, 7)
    for level, noisy in enumerate(tree.noisy):
        for index in range(noisy.size):
            bumped = [n.copy() for n in tree.noisy]
            bumped[level][index] += 1
            other = HierarchicalHistogram(
                tree.cells, tree.branching, tuple(bumped), tree.scale, tree.epsilon, 1
            )
            assert other.estimate(2, 7) - base == pytest.approx(weights[level][index], abs=1e-9)


# --- accuracy -----------------------------------------------------------------------------------


def test_intervals_cover_with_the_stated_probability() -> None:
    """500 releases × 4 ranges at 90%: coverage ≥ 90% minus 3 standard errors (it is a Chernoff
    bound, so in practice it over-covers), and the interval is at most 3× the empirical 90%
    error quantile (it is not vacuous)."""
    counts = _rng(3).integers(0, 1000, 300)
    ranges = [(0, 300), (17, 18), (40, 200), (123, 129)]
    rng = _rng(4)
    covered, widths, errors = [], [], []
    for _ in range(500):
        tree = release_hierarchical(counts, epsilon=EPSILON, rng=rng)
        for lo, hi in ranges:
            answer = tree.answer(lo, hi, confidence=0.9)
            truth = int(counts[lo:hi].sum())
            covered.append(answer.lower <= truth <= answer.upper)
            widths.append((answer.upper - answer.lower) / 2)
            errors.append(abs(answer.value - truth))
    assert np.mean(covered) >= 0.9 - 3 * np.sqrt(0.09 / len(covered))
    per_range = np.array(errors).reshape(-1, len(ranges))
    width = np.array(widths).reshape(-1, len(ranges))[0]
    assert np.all(width <= 3 * np.quantile(per_range, 0.9, axis=0))


def test_range_error_is_far_below_per_query_laplace() -> None:
    """A 10⁴-cell tree at ε = 1 answers 200 random ranges with a mean absolute error below 60,
    where 200 Laplace queries at ε/200 each have a mean absolute error of 200."""
    rng = _rng(8)
    counts = rng.integers(0, 100, 10_000)
    tree = release_hierarchical(counts, epsilon=EPSILON, rng=rng)
    prefix = np.concatenate([[0], np.cumsum(counts)])
    ends = np.sort(rng.integers(0, 10_001, (200, 2)), axis=1)
    errors = [abs(tree.estimate(int(lo), int(hi)) - (prefix[hi] - prefix[lo])) for lo, hi in ends]
    assert np.mean(errors) < 60


# --- parameters and storage ---------------------------------------------------------------------


def test_branching_follows_qardaji() -> None:
    assert choose_branching(1_000_000) == 16
    assert choose_branching(2**20) == 16
    assert choose_branching(4) == 4  # H = 1: a flat histogram plus its total


def test_round_trip_and_scale() -> None:
    tree, _ = _tree(100, 10, 1)
    again = HierarchicalHistogram.from_bytes(tree.to_bytes())
    assert again.scale == tree.scale == noise_scale(3, EPSILON)
    np.testing.assert_array_equal(again.consistent(), tree.consistent())
    assert again.answer(3, 40) == tree.answer(3, 40)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.answer(5, 2), "range"),
        (lambda t: t.answer(0, 101), "range"),
        (lambda t: t.answer(0.5, 3), "lo"),
        (lambda t: t.answer(0, 3, confidence=1.0), "confidence"),
    ],
)
def test_bad_ranges_are_refused(call, message: str) -> None:
    tree, _ = _tree(100, 10, 1)
    with pytest.raises(ParameterError, match=message):
        call(tree)


def test_bad_release_parameters_are_refused() -> None:
    with pytest.raises(ParameterError, match="counts"):
        release_hierarchical(np.array([1.5, 2.0]), epsilon=1.0)
    with pytest.raises(ParameterError, match="branching"):
        release_hierarchical(np.array([1, 2]), epsilon=1.0, branching=1)
    with pytest.raises(ParameterError, match="epsilon"):
        release_hierarchical(np.array([1, 2]), epsilon=0.0)


def test_a_union_of_ranges_adds_values_and_weights() -> None:
    tree, _ = _tree(100, 10, 2)
    selected = np.zeros(100, dtype=bool)
    selected[3:20] = selected[50:61] = True
    union = tree.answer_cells(selected)
    assert union.value == pytest.approx(tree.estimate(3, 20) + tree.estimate(50, 61))
    assert union.upper - union.value <= tree.half_width(3, 20) + tree.half_width(50, 61)
    assert union.upper - union.value >= max(tree.half_width(3, 20), tree.half_width(50, 61)) / 2
    whole = tree.answer_cells(np.ones(100, dtype=bool))
    assert whole.value == pytest.approx(tree.estimate(0, 100))


def test_a_kept_half_width_is_the_one_computed_for_that_selection() -> None:
    """``cells_half_width`` keeps widths by selection (routing states one, the answer reuses it):
    each selection, asked in any order, again, or at another confidence, gets the width a tree
    that kept nothing computes."""
    tree, _ = _tree(100, 10, 3)
    rng = _rng(4)
    selections = [rng.random(100) < p for p in (0.1, 0.5, 0.9)] + [np.eye(100, dtype=bool)[7]]

    def fresh(selected: np.ndarray, confidence: float) -> float:
        return HierarchicalHistogram.from_bytes(tree.to_bytes()).cells_half_width(
            selected, confidence
        )

    asked = [(s, c) for c in (0.95, 0.5) for s in selections]
    expected = [fresh(s, c) for s, c in asked]
    assert len(set(expected)) == len(expected)  # the selections' widths differ
    for _ in range(2):
        for (selected, confidence), width in zip(asked, expected, strict=True):
            assert tree.cells_half_width(selected, confidence) == width
            assert tree.answer_cells(selected, confidence).upper == pytest.approx(
                tree.answer_cells(selected, confidence).value + width
            )
