"""The reads after the charge: a plan's bounded SQL, written once per plan and filled in with
each query's salt, is the text written afresh with that salt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dpsql
from dpsql.engine import release
from dpsql.engine.planner import with_key_hash_seed
from dpsql.sql.generate import bounded_aggregate

QUERIES = [
    ("SELECT COUNT(*) FROM requests", {}),
    ("SELECT SUM(bytes) FROM requests WHERE age BETWEEN 30 AND 50 AND device = 'mobile'", {}),
    ("SELECT country, COUNT(*), AVG(latency_ms) FROM requests GROUP BY country", {}),
    ("SELECT status, country, SUM(bytes) FROM requests GROUP BY status, country", {}),
    (
        "SELECT device, COUNT(*) FROM requests GROUP BY device",
        {"mechanism": "threshold", "delta": 1e-7},
    ),
    ("SELECT device, COUNT(*) FROM requests GROUP BY device", {"delta": 1e-7}),
    ("SELECT user_id, COUNT(*) FROM requests GROUP BY user_id", {"delta": 1e-7}),
]


@pytest.mark.parametrize(("sql", "options"), QUERIES)
def test_a_plans_sql_is_the_text_written_with_each_salt(
    demo_db: Path, sql: str, options: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """For plans of every family that reads a bounded aggregation (public groups, a key
    release with its weights, key hashes drawn per query), each call's text is the one
    ``bounded_aggregate`` writes with its salt, the first time and from the kept template."""
    salts = np.random.Generator(np.random.PCG64(3)).integers(0, 2**62, size=6)
    with dpsql.connect(demo_db, analyst="alice") as db:
        plan = db.plan(sql, epsilon=0.5, **options)  # type: ignore[arg-type]
        for index, salt in enumerate(salts):
            seeded = with_key_hash_seed(plan, db.rng) if index % 2 else plan
            expected = bounded_aggregate(
                seeded.shape, **release.aggregation(seeded, int(salt)), dialect="duckdb"
            )
            assert release.bounded_sql(seeded, int(salt), "duckdb") == expected
            assert release.bounded_sql(seeded, int(salt), "duckdb") == expected
            # Spark's text is transpiled from DuckDB's, written afresh.
            assert release.bounded_sql(seeded, int(salt), "spark") == bounded_aggregate(
                seeded.shape, **release.aggregation(seeded, int(salt)), dialect="spark"
            )
        # From the second use on, the text comes from the template alone.
        expected = bounded_aggregate(plan.shape, **release.aggregation(plan, 99), dialect="duckdb")
        monkeypatch.setattr(release, "bounded_aggregate", _not_written)
        assert release.bounded_sql(plan, 99, "duckdb") == expected


def _not_written(*arguments: object, **options: object) -> str:
    raise AssertionError("the SQL was written afresh")
