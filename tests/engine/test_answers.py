"""Released answers (``dpsql.engine.answers``): intervals of quantities that cannot be negative
start at 0, and say so; the noisy values stay unclamped (unbiased)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpsql.engine.answers import COUNT_INTERVALS
from tests.conftest import make_database, seeded_connect

POLICY = """
[dataset]
epsilon = 1000.0
[analysts.a]
epsilon = 1000.0
[tables.t]
privacy_unit = "uid"
max_groups_per_unit = 2
[tables.t.columns.g]
public_keys = ["big", "empty"]
[tables.t.columns.v]
bounds = [0, 100]
"""


def test_count_and_nonnegative_sum_intervals_start_at_zero(tmp_path: Path) -> None:
    frame = pd.DataFrame({"uid": np.arange(50), "g": "big", "v": 10.0})
    database = make_database(tmp_path / "t.duckdb", {"t": frame}, POLICY)
    sql = "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM t GROUP BY g"
    negative_values = 0
    for seed in range(30):
        with seeded_connect(database, analyst="a", rng=np.random.default_rng(seed)) as db:
            result = db.execute(sql, epsilon=0.05)
        for name in ("n", "s"):
            assert all(low >= 0 for low, _ in result.intervals[name])
        (empty,) = [row for row in result.rows if row[0] == "empty"]
        negative_values += empty[1] < 0  # the value itself is not clamped
        assert result.details["intervals"] == COUNT_INTERVALS
    assert negative_values > 0
