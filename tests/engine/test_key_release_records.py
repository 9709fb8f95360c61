"""What a key release records: hash seeds, the combined split, the noise scale used ."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsql.engine.session import database_ledger
from tests.conftest import make_database, seeded_connect
from tests.engine.test_sparse_histograms import POLICY, _by_hash, hits


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_database(tmp_path / "h.duckdb", {"hits": hits()}, POLICY)


def test_pure_threshold_over_hashes_records_its_seed(database: Path, rng) -> None:
    """delta = 0, mechanism = threshold: the released hashes' seed is in the result and the
    ledger entry (drawn before the charge), and an analyst can match candidate keys."""
    with seeded_connect(database, analyst="a", rng=rng) as db:
        result = db.execute(
            "SELECT url, COUNT(*) AS n FROM hits GROUP BY url",
            epsilon=1.0,
            delta=0.0,
            mechanism="threshold",
        )
    entry = database_ledger(database)[-1]
    seed = entry["plan"]["key_release"]["key_hash_seed"]
    assert result.details["key_hash_seed"] == seed
    url_of = _by_hash([f"/heavy/{i}" for i in range(10)], seed)
    assert {key for key, _ in result.rows} <= set(url_of)
    assert len({key for key, _ in result.rows} & set(url_of)) >= 8
    assert "delta = 0" in entry["plan"]["reason"]


def test_approximate_hashed_release_records_its_seed(database: Path, rng) -> None:
    with seeded_connect(database, analyst="a", rng=rng) as db:
        result = db.execute("SELECT url, COUNT(*) FROM hits GROUP BY url", epsilon=1, delta=1e-6)
    seed = database_ledger(database)[-1]["plan"]["key_release"]["key_hash_seed"]
    assert result.details["key_hash_seed"] == seed


def test_combined_plan_records_the_split_and_the_scale_it_uses(database: Path, rng) -> None:
    sql = "SELECT url, COUNT(*) AS n FROM hits GROUP BY url"
    with seeded_connect(database, analyst="a", rng=rng) as db:
        explained = db.explain(sql, epsilon=1.0, delta=0.0, mechanism="alp")
        result = db.execute(sql, epsilon=1.0, delta=0.0, mechanism="alp")
        (synopsis,) = db.synopses()
    plan = database_ledger(database)[-1]["plan"]
    release = plan["key_release"]
    share = release["sketch"]["threshold_share"]
    # Δ = 2, pure DP over 2**64 hashes: the sketch helps, at the split the rule chose.
    assert release["sketch"]["sketch_beats_zero"] is True
    assert release["threshold_epsilon"] == pytest.approx(share)
    assert release["sketch"]["sketch_epsilon"] == pytest.approx(1.0 - share)
    assert release["noise_scale"] == pytest.approx(2 / share, rel=1e-6)
    assert plan["measurements"][0]["noise_scale"] == release["noise_scale"]
    assert plan["measurements"][0]["epsilon"] == release["threshold_epsilon"]
    assert result.noise_scale["n"] == release["noise_scale"]
    assert explained["plan"]["key_release"]["tau"] == release["tau"]
    assert synopsis["params"]["seed"] == release["key_hash_seed"] == result.details["key_hash_seed"]
    assert synopsis["params"]["split"] == share
