"""Intervals of post-processed columns (``dpsql.engine.derived_intervals``): coverage over many
draws of the real mechanisms' noise, and the broken twin.

Each case releases the true aggregates of a hundred groups with the discrete Laplace mechanism
(``release_counts`` / ``release_grid_sums``, seeded), keeps their noise laws as the release does,
and post-processes them; the truth of a derived column is the same outer query run by DuckDB on
the *true* aggregates. Every kind of interval must cover the truth in at least 95% of the cells
less a 3-sigma binomial tolerance. The twin states the same intervals from noise laws whose scale
is a tenth of the real one (and released intervals to match): it fails the same check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dpsql.engine.derived import _run, post_processed
from dpsql.engine.noise_laws import DiscreteLaplaceLaw
from dpsql.engine.results import QueryResult
from dpsql.mechanisms.laplace import choose_grid, noise_scale, release_counts, release_grid_sums
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse
from dpsql.sql.postprocess import ROW, PostProcess
from tests.conftest import released_answer

CATALOG = {"t": {"id": "BIGINT", "k": "INTEGER", "x": "INTEGER", "y": "INTEGER"}}
GROUPS = 100
DRAWS = 5
LEVEL = 0.95
EPSILON = 0.3
SHRINK = 10
TOLERANCE = 3 * math.sqrt(LEVEL * (1 - LEVEL) / (GROUPS * DRAWS))


@dataclass(frozen=True)
class Truth:
    """One aggregate's true value per group (in grid units for a sum) and how it is noised."""

    values: np.ndarray
    sensitivity: float
    is_sum: bool

    @property
    def grid(self) -> float:
        return choose_grid(self.sensitivity, EPSILON) if self.is_sum else 1.0

    @property
    def units(self) -> int:
        return round(self.sensitivity / self.grid)


def _truths() -> dict[str, Truth]:
    """A hundred groups of 150 to 400 rows of x in [0, 100] and y in [0, 50], one row per person."""
    rng = np.random.default_rng(5)
    data = [
        (rng.integers(0, 101, n), rng.integers(0, 51, n)) for n in rng.integers(150, 400, GROUPS)
    ]

    def each(function) -> np.ndarray:
        return np.array([function(x, y) for x, y in data], dtype=np.int64)

    return {
        "COUNT(*)": Truth(each(lambda x, y: x.size), 1, False),
        "COUNT(x)": Truth(each(lambda x, y: x.size), 1, False),
        "COUNT(*) FILTER(WHERE y > 25)": Truth(each(lambda x, y: np.sum(y > 25)), 1, False),
        "SUM(x)": Truth(each(lambda x, y: x.sum()), 100, True),
        "SUM(y)": Truth(each(lambda x, y: y.sum()), 50, True),
        "SUM((x) * (x))": Truth(each(lambda x, y: (x * x).sum()), 10_000, True),
    }


TRUTHS = _truths()


def _post(sql: str) -> PostProcess:
    post = analyze(parse(sql), CATALOG).post
    assert post is not None
    return post


def _result(
    post: PostProcess, values: dict[str, list], intervals: dict, laws: dict
) -> QueryResult:
    names = list(post.released_columns)
    rows = list(zip(*(values[n] for n in names), strict=True))
    return released_answer(names, rows, intervals, confidence=LEVEL).with_noise_laws(laws)


def _truth_of(post: PostProcess) -> list[tuple]:
    """The outer query run by DuckDB on the true aggregates."""
    frame = pd.DataFrame({ROW: np.arange(GROUPS)})
    for name, text in post.released_columns.items():
        if name in post.aggregates:
            truth = TRUTHS[text]
            frame[name] = truth.values * truth.grid if truth.is_sum else truth.values
        else:
            frame[name] = np.arange(GROUPS, dtype=np.int32)
    frame = frame[[*post.types, ROW]]
    return _run(post, frame, post.outer)[1]


def _draw(post: PostProcess, rng: np.random.Generator, shrink: int) -> QueryResult:
    """One release of the aggregates ``post`` reads; with ``shrink`` > 1 its laws and
    intervals are those of a noise scale ``shrink`` times too small (the twin)."""
    values: dict[str, list] = {}
    intervals: dict[str, list] = {}
    laws: dict[str, DiscreteLaplaceLaw] = {}
    for name, text in post.released_columns.items():
        if name not in post.aggregates:
            values[name] = list(range(GROUPS))
            continue
        truth = TRUTHS[text]
        common = {"epsilon": EPSILON, "rng": rng, "confidence": LEVEL}
        if truth.is_sum:
            release = release_grid_sums(
                truth.values, sensitivity_units=truth.units, grid=truth.grid, **common
            )
        else:
            release = release_counts(truth.values, sensitivity=truth.units, **common)
        law = DiscreteLaplaceLaw(noise_scale(truth.units, EPSILON) / shrink, truth.grid)
        low, high = law.intervals(release.values, LEVEL)
        values[name] = release.values.tolist()
        intervals[name] = list(zip(low.tolist(), high.tolist(), strict=True))
        laws[name] = law
    return _result(post, values, intervals, laws)


CASES = {
    "ratio": ("SELECT k, SUM(x) / COUNT(*) AS v FROM t GROUP BY k ORDER BY k", "conservative"),
    "rate": (
        "SELECT k, COUNT(*) FILTER (WHERE y > 25) * 1.0 / COUNT(*) AS v FROM t GROUP BY k "
        "ORDER BY k",
        "conservative",
    ),
    "difference": ("SELECT k, SUM(x) - SUM(y) AS v FROM t GROUP BY k ORDER BY k", "exact"),
    "lag_difference": (
        "SELECT k, COUNT(*) - LAG(COUNT(*)) OVER (ORDER BY k) AS v FROM t GROUP BY k ORDER BY k",
        "exact",
    ),
    "product_with_constants": (
        "SELECT k, COUNT(*) * 2.5 - 10 AS v FROM t GROUP BY k ORDER BY k",
        "exact",
    ),
    "three_noises": (
        "SELECT k, SUM(x) - 2 * SUM(y) + COUNT(*) AS v FROM t GROUP BY k ORDER BY k",
        "approximate",
    ),
    "stddev": ("SELECT k, STDDEV(x) AS v FROM t GROUP BY k ORDER BY k", "conservative"),
    "variance": ("SELECT k, VAR_POP(x) AS v FROM t GROUP BY k ORDER BY k", "conservative"),
    "share_of_total": (
        "SELECT k, COUNT(*) / SUM(COUNT(*)) OVER () AS v FROM t GROUP BY k ORDER BY k",
        "conservative",
    ),
    "lag_of_a_ratio": (
        "SELECT k, SUM(x) / COUNT(*) - LAG(SUM(x) / COUNT(*)) OVER (ORDER BY k) AS v FROM t "
        "GROUP BY k ORDER BY k",
        "conservative",
    ),
}


def _coverage(sql: str, shrink: int, seed: int) -> tuple[float, set[str]]:
    post = _post(sql)
    truth = [row[post.columns.index("v")] for row in _truth_of(post)]
    rng = np.random.default_rng(seed)
    covered = total = 0
    kinds: set[str] = set()
    for _ in range(DRAWS):
        result = post_processed(_draw(post, rng, shrink), post)
        kinds.add(result.details["intervals"]["v"]["kind"])
        for want, (low, high) in zip(truth, result.intervals["v"], strict=True):
            if want is None:  # LAG's first row
                continue
            total += 1
            covered += (low is None or low <= want) and (high is None or want <= high)
    return covered / total, kinds


@pytest.mark.parametrize("case", list(CASES))
def test_each_kind_covers_at_its_level_and_the_twin_does_not(case: str) -> None:
    sql, kind = CASES[case]
    coverage, kinds = _coverage(sql, 1, seed=len(case))
    assert kinds == {kind}
    assert coverage >= LEVEL - TOLERANCE, coverage
    twin, _ = _coverage(sql, SHRINK, seed=len(case))
    assert twin < LEVEL - TOLERANCE, twin


def test_a_denominator_whose_interval_holds_zero_leaves_the_ratio_unbounded() -> None:
    post = _post("SELECT k, SUM(x) / COUNT(*) AS v FROM t GROUP BY k ORDER BY k")
    names = list(post.released_columns)
    by_text = {post.released_columns[n]: n for n in post.aggregates}
    count, total = by_text["COUNT(*)"], by_text["SUM(x)"]
    law = DiscreteLaplaceLaw(Fraction(10))
    values = {names[0]: [0, 1], count: [2, 500], total: [40.0, 9000.0]}
    intervals = {count: [(-28, 32), (470, 530)], total: [(0.0, 80.0), (8000.0, 10000.0)]}
    result = post_processed(
        _result(post, values, intervals, {count: law, total: DiscreteLaplaceLaw(Fraction(20))}),
        post,
    )
    (small, large) = result.intervals["v"]
    assert small == (None, None)  # any mean: the count may be 0 or negative
    assert large[0] < 18 < large[1]
    assert "unbounded" in result.details["intervals"]["unbounded_ends"]


def test_a_window_ordered_by_a_noisy_value_gets_no_interval_and_says_why() -> None:
    post = _post("SELECT k, RANK() OVER (ORDER BY COUNT(*)) AS v FROM t GROUP BY k")
    result = post_processed(_draw(post, np.random.default_rng(1), 1), post)
    assert "v" not in result.intervals
    assert result.details["intervals"]["v"]["kind"] == "none"
    assert "order" in result.measures["v"]


def test_a_combination_of_values_without_a_known_law_gets_no_interval() -> None:
    """Released values whose law the release did not keep (a key release's counts, say) combine
    only one at a time (their released interval at the answer's level)."""
    post = _post("SELECT k, SUM(x) - SUM(y) AS v, SUM(x) * 2 AS w FROM t GROUP BY k ORDER BY k")
    drawn = _draw(post, np.random.default_rng(2), 1)
    result = post_processed(drawn.with_noise_laws({}), post)
    assert "v" not in result.intervals and "no interval" in result.measures["v"]
    assert result.details["intervals"]["w"]["kind"] == "as released"
    for row, (low, high) in zip(result.rows, result.intervals["w"], strict=True):
        assert low < row[result.columns.index("w")] < high
