"""Answers for a fixed seed, one query of every shape, against a recorded file.

A refactoring of the query path must not change a single released number: each query below runs
on the demo table (20,000 rows) in a fresh session whose generator is seeded, and its columns,
rows, intervals, noise scales, cost and plan summary must equal what
``fixed_seed_answers.json`` holds. Set ``DPSQL_RECORD_ANSWERS=1`` to write the file anew (only
when a change of the numbers is intended, and say so in the commit).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from dpsql.engine.demo import build_demo
from dpsql.engine.session import set_policy
from tests.conftest import seeded_connect

RECORD = Path(__file__).with_name("fixed_seed_answers.json")

POLICY = """
[dataset]
name = "demo"
epsilon = 1e6
delta = 1e-3
default_query_epsilon = 0.5
[analysts.alice]
epsilon = 1e6
delta = 1e-3
[tables.requests]
privacy_unit = "user_id"
max_groups_per_unit = 5
max_rows_per_group = 1
max_rows_per_unit = 20
[tables.requests.columns.bytes]
bounds = [0, 100000]
[tables.requests.columns.latency_ms]
bounds = [0, 2000]
[tables.requests.columns.country]
public_keys = ["DK", "NO", "SE", "FI", "IS"]
[tables.requests.columns.status]
public_keys = [200, 301, 404, 500]
[tables.requests.columns.age]
bounds = [18, 80]
[tables.requests.columns.url]
expected_keys = 2000
[public_tables.age_bands]
description = "age bands"
"""

QUERIES: dict[str, str] = {
    "count": "SELECT COUNT(*) AS n FROM requests",
    "sum_avg_where": "SELECT SUM(bytes) AS b, AVG(latency_ms) AS l FROM requests "
    "WHERE device = 'mobile' AND age BETWEEN 30 AND 50",
    "public_keys": "SELECT country, COUNT(*) AS n, SUM(bytes) AS b FROM requests GROUP BY country",
    "two_key_columns": "SELECT country, status, COUNT(*) AS n FROM requests "
    "WHERE day >= '2026-10-15' GROUP BY country, status",
    "bins_and_condition": "SELECT FLOOR(age / 10) * 10 AS decade, latency_ms > 100 AS slow, "
    "COUNT(*) AS n FROM requests GROUP BY ALL",
    "persons": "SELECT country, COUNT(DISTINCT user_id) AS people FROM requests GROUP BY country",
    "expressions": "SELECT SUM(CASE WHEN status = 404 THEN bytes ELSE 0 END) AS missing, "
    "COUNT(*) FILTER (WHERE device = 'tablet') AS tablets, AVG(latency_ms * 2 - 1) AS l2 "
    "FROM requests",
    "quantiles": "SELECT MEDIAN(latency_ms) AS m, quantile_cont(bytes, 0.9) AS q FROM requests",
    "having_public": "SELECT country, COUNT(*) AS n FROM requests GROUP BY country "
    "HAVING COUNT(*) > 500",
    "threshold": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, "
    "mechanism='threshold') url, COUNT(*) AS n FROM requests GROUP BY url",
    "threshold_gaussian": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, "
    "mechanism='threshold_gaussian') url, COUNT(*) AS n FROM requests GROUP BY url",
    "weighted": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, "
    "mechanism='weighted') url, COUNT(*) AS n FROM requests GROUP BY url",
    "mad2r": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, mechanism='mad2r') "
    "url, COUNT(*) AS n FROM requests GROUP BY url",
    "alp": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-8, mechanism='alp') "
    "url, COUNT(*) AS n FROM requests WHERE device = 'desktop' GROUP BY url",
    "range_join": "SELECT b.lo, b.hi, COUNT(*) AS n FROM requests r JOIN age_bands b "
    "ON r.age BETWEEN b.lo AND b.hi GROUP BY b.lo, b.hi HAVING COUNT(*) > 2000",
    "post_processing": "SELECT country, COUNT(*) AS n, COUNT(*) * 100.0 / 20000 AS pct "
    "FROM requests GROUP BY country ORDER BY n DESC LIMIT 3",
    "cte_and_unit_filter": "WITH mobile AS (SELECT * FROM requests WHERE device = 'mobile') "
    "SELECT COUNT(*) AS n FROM mobile WHERE user_id IN "
    "(SELECT user_id FROM requests WHERE status = 500)",
    "accuracy": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(accuracy=50) COUNT(*) AS n "
    "FROM requests WHERE country = 'DK'",
    # Added last, so the queries above keep their seeds.
    "default_keys": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6) "
    "url, COUNT(*) AS n FROM requests GROUP BY url",
    "joint": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, mechanism='joint') "
    "url, COUNT(*) AS n FROM requests GROUP BY url",
    "prefer_keys": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, "
    "prefer='keys') url, COUNT(*) AS n FROM requests GROUP BY url",
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_demo(tmp_path_factory.mktemp("golden") / "demo.duckdb", rows=20_000, users=2_000)
    connection = duckdb.connect(str(path))
    connection.execute(
        "CREATE TABLE age_bands AS SELECT * FROM (VALUES (18, 29), (30, 49), (40, 59), (60, 80)) "
        "AS b(lo, hi)"
    )
    connection.close()
    set_policy(path, POLICY)
    return path


def _plain(value: Any) -> Any:
    """JSON-safe and exact: floats as their repr (NaN and infinities included)."""
    if isinstance(value, float):
        return repr(value) if not math.isfinite(value) else value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


def _answer(demo: Path, sql: str, seed: int) -> dict[str, Any]:
    with seeded_connect(demo, analyst="alice", rng=np.random.default_rng(seed)) as db:
        explained = db.explain(sql)
        result = db.execute(sql)
    return _plain(
        {
            "columns": list(result.columns),
            "rows": [list(row) for row in result.rows],
            "intervals": result.intervals,
            "noise_scale": result.noise_scale,
            "cost": [result.epsilon, result.delta],
            "mechanism": result.mechanism,
            "measures": result.measures,
            "explained": [explained.get("mechanism"), explained.get("cost")],
            "expected_error": explained.get("expected_error"),
        }
    )


def _streamed(demo: Path, seed: int) -> dict[str, Any]:
    """A range tree opened, then two counts answered from it."""
    with seeded_connect(demo, analyst="alice", rng=np.random.default_rng(seed)) as db:
        db.open_stream("requests", [("age", 1)], epsilon=1.0, mechanism="range_tree",
                       name="ages")
        answers = [
            db.execute(f"SELECT COUNT(*) AS n FROM requests WHERE age BETWEEN {low} AND {high}")
            for low, high in ((20, 30), (31, 70))
        ]
    return _plain({"rows": [a.rows for a in answers], "intervals": [a.intervals for a in answers]})


def _contributions(demo: Path, seed: int) -> dict[str, Any]:
    with seeded_connect(demo, analyst="alice", rng=np.random.default_rng(seed)) as db:
        result = db.contributions("requests", group_by=["country"], epsilon=1.0)
    return _plain({"columns": list(result.columns), "rows": [list(r) for r in result.rows]})


def _all(demo: Path) -> dict[str, Any]:
    answers = {name: _answer(demo, sql, seed) for seed, (name, sql) in enumerate(QUERIES.items())}
    answers["stream"] = _streamed(demo, 101)
    answers["contributions"] = _contributions(demo, 102)
    return answers


def test_answers_for_a_fixed_seed_are_unchanged(demo: Path) -> None:
    answers = _all(demo)
    if os.environ.get("DPSQL_RECORD_ANSWERS"):
        RECORD.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(RECORD.read_text())
    assert sorted(answers) == sorted(recorded)
    for name, answer in answers.items():
        assert json.loads(json.dumps(answer)) == recorded[name], name
