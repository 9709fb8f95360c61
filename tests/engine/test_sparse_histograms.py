"""GROUP BY over keys without a public key set: thresholding, the combined synopsis, lookups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine.session import database_ledger, database_synopses
from dpsql.errors import UnsupportedQueryError
from dpsql.mechanisms.hashing import hash_keys
from tests.conftest import make_database, seeded_connect

POLICY = """
[dataset]
epsilon = 50.0
delta = 1e-5
[analysts.a]
epsilon = 50.0
delta = 1e-5
[tables.hits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_group = 1
max_rows_per_unit = 5
[tables.hits.columns.url]
key_domain = "hash64"
expected_keys = 2000
[tables.hits.columns.item]
key_domain = [0, 999]
expected_keys = 1000
"""


def hits() -> pd.DataFrame:
    """Heavy URLs h0..h9 with 300 + 50*i users each; 1500 light URLs with one user each."""
    rows = []
    user = 0
    for i in range(10):
        for _ in range(300 + 50 * i):
            rows.append((user, f"/heavy/{i}", i, "web"))
            user += 1
    for j in range(1500):
        rows.append((user, f"/light/{j}", 100 + j % 800, "app"))
        user += 1
    return pd.DataFrame(rows, columns=["user_id", "url", "item", "channel"])


def _by_hash(keys: list[str], seed: int) -> dict[str, str]:
    """What each key is shown as under ``seed``."""
    return {f"0x{int(h):016x}": key for key, h in zip(keys, hash_keys(keys, seed), strict=True)}


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_database(tmp_path / "h.duckdb", {"hits": hits()}, POLICY)


def test_threshold_releases_heavy_keys_only(database: Path, rng) -> None:
    with seeded_connect(database, analyst="a", rng=rng) as db:
        result = db.execute(
            "SELECT url, COUNT(*) AS n FROM hits GROUP BY url",
            epsilon=1.0,
            delta=1e-6,
            mechanism="threshold",
        )
    assert result.mechanism == "threshold" and (result.epsilon, result.delta) == (1.0, 1e-6)
    # key_domain = "hash64": keys are shown as hashes under a public seed, even with delta > 0
    # (a public seed); an analyst can check the keys they know, and read no others.
    url_of = _by_hash([f"/heavy/{i}" for i in range(10)], result.details["key_hash_seed"])
    assert {key for key, _ in result.rows} == set(url_of)
    for (key, value), (low, high) in zip(result.rows, result.intervals["n"], strict=True):
        truth = 300 + 50 * int(url_of[key].rsplit("/", 1)[1])
        assert low <= value <= high and abs(value - truth) <= 20
    assert database_synopses(database) == []  # thresholding alone stores nothing


def test_combined_structure_is_stored_and_answers_point_queries_for_free(
    database: Path, rng
) -> None:
    with seeded_connect(database, analyst="a", rng=rng) as db:
        result = db.execute(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=2, delta=1e-6, mechanism='alp') "
            "url, COUNT(*) AS n FROM hits WHERE channel = 'web' GROUP BY url"
        )
        assert result.mechanism == "combined"
        heavy_hashes = _by_hash([f"/heavy/{i}" for i in range(10)], result.details["key_hash_seed"])
        assert {k for k, _ in result.rows} <= set(heavy_hashes)
        (synopsis,) = database_synopses(database)
        assert synopsis["filters"] == ["\"channel\" = 'web'"] and synopsis["key_column"] == "url"
        spent = db.budget().dataset.epsilon_spent
        heavy = db.execute("SELECT COUNT(*) FROM hits WHERE channel = 'web' AND url = '/heavy/3'")
        light = db.execute("SELECT COUNT(*) FROM hits WHERE url = '/heavy/9' AND channel = 'web'")
        assert heavy.mechanism == f"synopsis:{synopsis['name']}" and heavy.epsilon == 0.0
        assert abs(heavy.rows[0][0] - 450) <= 20 and abs(light.rows[0][0] - 750) <= 20
        assert db.budget().dataset.epsilon_spent == spent
        # Different filters, or an explicit request for fresh noise, are charged as usual.
        other = db.execute("SELECT COUNT(*) FROM hits WHERE url = '/heavy/3'", epsilon=0.5)
        fresh = db.execute(
            "SELECT COUNT(*) FROM hits WHERE channel = 'web' AND url = '/heavy/3'",
            epsilon=0.5,
            mechanism="laplace",
        )
        assert other.mechanism == fresh.mechanism == "discrete_laplace"
    entries = database_ledger(database)
    free = [e for e in entries if e["mechanism"] == "synopsis"]
    assert len(free) == 2 and all(e["epsilon"] == 0 for e in free)
    assert free[0]["payload"] == {
        "type": "post_processing",
        "source": f"synopsis:{synopsis['name']}",
        "label": "COUNT(*)",
    }


def test_absent_keys_get_small_alp_estimates(database: Path, rng) -> None:
    with seeded_connect(database, analyst="a", rng=rng) as db:
        db.execute(
            "SELECT url, COUNT(*) FROM hits GROUP BY url", epsilon=2.0, delta=1e-6, mechanism="alp"
        )
        values = [
            db.execute(f"SELECT COUNT(*) FROM hits WHERE url = '/light/{j}'").rows[0][0]
            for j in range(40)
        ]
        missing = db.execute("SELECT COUNT(*) FROM hits WHERE url = '/never-seen'").rows[0][0]
    assert np.mean(np.abs(np.array(values) - 1)) < 15 and abs(missing) < 40


def test_pure_dp_needs_a_declared_domain(database: Path, rng) -> None:
    with seeded_connect(database, analyst="a", rng=rng) as db:
        pure = db.execute("SELECT item, COUNT(*) AS n FROM hits GROUP BY item", epsilon=1.0)
        assert pure.mechanism == "combined" and pure.delta == 0.0
        assert {k for k, _ in pure.rows} <= set(range(10)) | set(range(100, 900))
        hashed = db.execute("SELECT url, COUNT(*) FROM hits GROUP BY url", epsilon=1.0)
        assert all(k.startswith("0x") and len(k) == 18 for k, _ in hashed.rows)  # hashes only
        with pytest.raises(UnsupportedQueryError, match="needs delta > 0"):
            db.execute("SELECT channel, COUNT(*) FROM hits GROUP BY channel", epsilon=1.0)


def test_explain_names_the_mechanism_without_charging(database: Path) -> None:
    with dpsql.connect(database, analyst="a") as db:
        report = db.explain("SELECT url, COUNT(*) FROM hits GROUP BY url", epsilon=1, delta=1e-6)
        # L0 = 2, R = 5: weighted selection needs a few fewer persons per key, not 10% fewer:
        # the Laplace threshold stays the default.
        assert report["plan"]["mechanism"] == "threshold"
        assert report["plan"]["key_release"]["default_choice"].startswith("default: threshold")
        assert report["cost"] == {"epsilon": 1.0, "delta": 1e-6}
    assert len(database_ledger(database)) == 1


def test_a_seeded_release_is_reproducible(database: Path) -> None:
    def release() -> list[tuple]:
        with seeded_connect(database, analyst="a", rng=np.random.default_rng(9)) as db:
            result = db.execute(
                "SELECT url, COUNT(*) FROM hits GROUP BY url", epsilon=1, delta=1e-6
            )
        return sorted(result.rows)

    assert release() == release()


def test_synopsis_answers_carry_their_error_bound(database: Path, rng) -> None:
    """Every synopsis answer has an interval; a key absent from the data is answered within
    [0, c* - 1] (never more than the threshold lets through) and says how good the sketch is."""
    with seeded_connect(database, analyst="a", rng=rng) as db:
        db.execute(
            "SELECT url, COUNT(*) FROM hits GROUP BY url", epsilon=2.0, delta=1e-6, mechanism="alp"
        )
        absent = db.execute("SELECT COUNT(*) FROM hits WHERE url = 'Astronaut'")
        heavy = db.execute("SELECT COUNT(*) FROM hits WHERE url = '/heavy/9'")
        both = db.execute("SELECT COUNT(*) FROM hits WHERE url IN ('/heavy/9', '/light/3')")
    ((low, high),) = absent.intervals[absent.columns[0]]
    details = absent.details
    assert low == 0 and high == details["unreleased_count_at_most"]
    assert 0 <= absent.rows[0][0] <= high
    assert details["released_by_threshold"] == [False]
    assert details["sketch_expected_error_bound"] > 0 and "sketch_beats_zero" in details
    ((low, high),) = heavy.intervals[heavy.columns[0]]
    assert heavy.details["released_by_threshold"] == [True] and low <= 750 <= high
    ((low, high),) = both.intervals[both.columns[0]]
    assert low <= 751 <= high
    assert "at most 1 per person per key" in heavy.measures[heavy.columns[0]]


def test_a_stored_synopsis_is_read_back_once_and_a_newer_one_replaces_it(
    database: Path, rng, monkeypatch
) -> None:
    """A session reads a stored synopsis once (it is never changed); a newer synopsis over the
    same column answers from then on, read in turn, with the answers it gives itself."""
    from dpsql.mechanisms.combined import CombinedRelease

    reads: list[int] = []
    from_bytes = CombinedRelease.from_bytes.__func__  # type: ignore[attr-defined]

    def counted(cls, data):  # type: ignore[no-untyped-def]
        reads.append(len(data))
        return from_bytes(cls, data)

    monkeypatch.setattr(CombinedRelease, "from_bytes", classmethod(counted))
    point = "SELECT COUNT(*) FROM hits WHERE url = '/heavy/9'"
    group = "SELECT url, COUNT(*) FROM hits GROUP BY url"
    with seeded_connect(database, analyst="a", rng=rng) as db:
        db.execute(group, epsilon=2.0, delta=1e-6, mechanism="alp")
        first = [db.execute(point) for _ in range(3)]
        assert len(reads) == 1
        assert len({(a.mechanism, a.rows[0], str(a.intervals)) for a in first}) == 1
        db.execute(group, epsilon=4.0, delta=1e-6, mechanism="alp")
        second = [db.execute(point) for _ in range(2)]
        assert len(reads) == 2
        assert second[0].mechanism != first[0].mechanism
        assert second[0].rows == second[1].rows
    with seeded_connect(database, analyst="a", rng=rng) as other:  # a session reads it afresh
        assert other.execute(point).rows == second[0].rows
    assert len(reads) == 3
