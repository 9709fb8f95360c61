"""Released answers (``dpsql.engine.results``): clamping a count into the range it cannot
leave keeps the value inside its interval and the interval over the truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpsql.engine.results import QueryResult
from tests.conftest import released_answer, seeded_connect
from tests.engine.panel import build_panel, truth


def _result(rows: list[tuple], intervals: list[tuple]) -> QueryResult:
    return released_answer(
        ["k", "n", "s"], rows, {"n": intervals, "s": [(-5.0, 5.0)] * len(rows)}
    )


def test_clamping_moves_value_and_interval_together_and_keeps_the_raw_values() -> None:
    released = _result([("a", -3, -1.5), ("b", 40, 2.0)], [(-33, 27), (10, 70)])
    clamped = released.with_noise_laws({}, {"n": (0, None), "s": (None, 0)}).clamped()
    assert clamped.rows == [("a", 0, -1.5), ("b", 40, 0.0)]
    assert clamped.intervals["n"] == [(0, 27), (10, 70)]
    assert clamped.intervals["s"] == [(-5.0, 0.0), (-5.0, 0.0)]
    assert clamped.details["unclamped"] == {"n": [-3, 40], "s": [-1.5, 2.0]}
    assert "cannot be negative" in clamped.details["clamped"]
    for row, (low, high) in zip(clamped.rows, clamped.intervals["n"], strict=True):
        assert low <= row[1] <= high
    assert released.clamped() is released  # no known range: unchanged


@pytest.fixture(scope="module")
def panel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_panel(tmp_path_factory.mktemp("clamp"))


def test_small_counts_are_never_negative_and_their_intervals_still_cover(panel: Path) -> None:
    """Counts of a few rows per year at ε = 0.2: no value or interval end below 0, every value
    inside its interval, and the clamped intervals cover the truth in >= 90% of 20 x 8 cells."""
    sql = "SELECT year, COUNT(*) AS n FROM males WHERE hours > 3990 GROUP BY year ORDER BY year"
    want = dict(truth(panel, sql))
    covered = total = clamped = 0
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(4)) as session:
        for _ in range(20):
            result = session.execute(sql, epsilon=0.2)
            clamped += "unclamped" in result.details
            for (year, n), (low, high) in zip(result.rows, result.intervals["n"], strict=True):
                assert 0 <= low <= n <= high
                covered += low <= want.get(year, 0) <= high
                total += 1
    assert clamped > 0  # the test reaches the clamp
    assert covered / total >= 0.9
