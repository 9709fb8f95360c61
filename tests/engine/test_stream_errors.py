"""What streams state (``dpsql.engine.stream_errors``): the PMW's warm-tree interval covers the
count at its level over many draws and a twin from a third of the noise scale does not; stated
errors are what the answers then state, computed without the data."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from dpsql.engine.stream_errors import opening_errors, pmw_interval
from dpsql.mechanisms.pmw import OnlinePMW, stated_alpha

CELLS = 120
LEVEL = 0.95
DRAWS = 40
QUERIES = 10


def _coverage(shrink: int) -> float:
    """PMW streams warm started on a skewed histogram, each asked random ranges: how often the
    stated interval holds the true count (with ``shrink`` > 1, the tree's noise scale is
    understated that many times: the twin)."""
    data = np.random.default_rng(3)
    histogram = (data.gamma(2.0, 30.0, CELLS)).astype(np.int64)
    covered = total = 0
    for seed in range(DRAWS):
        rng = np.random.default_rng(seed)
        pmw = OnlinePMW(
            histogram, epsilon=0.5, updates=10, threshold=60.0, warm_share=0.8, replays=2, rng=rng
        )
        tree = pmw.warm_tree
        assert tree is not None
        if shrink > 1:
            tree = dataclasses.replace(tree, scale=tree.scale / shrink)
        for _ in range(QUERIES):
            low, high = sorted(rng.integers(0, CELLS + 1, 2))
            mask = np.zeros(CELLS, dtype=bool)
            mask[low : max(high, low + 1)] = True
            answer = pmw.ask(mask)
            alpha = pmw.alpha(pmw.queries_seen, 1 - LEVEL)
            (lower, upper), _ = pmw_interval(answer.value, mask, LEVEL, alpha, tree)
            assert lower <= answer.value <= upper
            truth = int(histogram[mask].sum())
            covered += lower <= truth <= upper
            total += 1
    return covered / total


def test_the_warm_tree_interval_covers_at_its_level_and_its_twin_does_not() -> None:
    tolerance = 3 * math.sqrt(LEVEL * (1 - LEVEL) / (DRAWS * QUERIES))
    assert _coverage(1) >= LEVEL - tolerance
    assert _coverage(3) < LEVEL - tolerance


def test_the_stated_alpha_is_the_streams_own_without_data() -> None:
    """``stated_alpha`` from the public parameters equals ``OnlinePMW.alpha``; opening states it
    for the expected queries, and a warm start's tree half-widths."""
    histogram = np.arange(200, dtype=np.int64)
    params = {
        "updates": 20, "threshold": 150.0, "sensitivity": 3, "count_share": 0.05,
        "value_share": 1 / 9, "warm_share": 0.8, "replays": 2,
    }  # fmt: skip
    pmw = OnlinePMW(
        histogram, epsilon=1.0, delta=1e-6, rng=np.random.default_rng(1),
        **{k: v for k, v in params.items() if k != "count_share"},
    )  # fmt: skip
    public = {k: v for k, v in params.items() if k != "replays"}
    for queries in (1, 40, 1000):
        assert stated_alpha(
            epsilon=1.0, delta=1e-6, queries=queries, beta=0.05, **public
        ) == pmw.alpha(queries, 0.05)
    shown = opening_errors("pmw", 200, 1.0, 1e-6, params, 1000, 0.95)
    assert shown["alpha_after_expected_queries"] == pmw.alpha(1000, 0.05)
    assert pmw.warm_tree is not None
    whole = pmw.warm_tree.cells_half_width(np.ones(200, dtype=bool), 0.95)
    assert shown["tree_whole_domain"] == pytest.approx(whole)
    assert shown["stated"] == min(shown["tree_inner_range"], shown["alpha_after_expected_queries"])
